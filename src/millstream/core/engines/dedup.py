"""``dedup``: the first row of a key wins; a delete removes the key's rows so the next row
wins again. With ``dedup_ttl`` a row more than the TTL after the kept row (on ``time_column``)
is kept as well; rows with a null time never expire.

Without a comparison column, a TTL or deletes among the rows, a resolve is by position
(:func:`millstream.core.merge.by_position`, each key's lowest). Keys with a delete or (with a
TTL) more than one row are folded row by row, only those. Without a comparison column seals
keep a key index: a run's delete supersedes its key's sealed rows.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from millstream.core.engines.base import KeyedEngine
from millstream.core.merge import (
    DEL,
    IDX,
    by_position,
    deletes,
    fold_after_last_delete,
    key_starts,
)
from millstream.spec import TableSpec


class Dedup(KeyedEngine):
    mode = "dedup"

    @property
    def indexed(self) -> bool:
        return self.spec.comparison_column is None

    def _by_position(self, rows: pa.Table) -> pa.Table | None:
        spec = self.spec
        if (
            spec.comparison_column is None
            and spec.dedup_ttl is None
            and not pc.any(deletes(spec, rows)).as_py()
        ):
            return by_position(spec, rows, "min")
        return None

    def _fold(self, ordered: pa.Table) -> pa.Table:
        return _dedup(self.spec, ordered)

    def _compact_ordered(self, ordered: pa.Table) -> pa.Table:
        # Without a comparison column or TTL the order is the offset, so the key's last delete
        # plus its first row after it stand for the run: a newer run's rows come after them.
        if self.spec.comparison_column is None and self.spec.dedup_ttl is None:
            return fold_after_last_delete(self.spec, ordered, self._fold)
        return ordered


def _dedup(spec: TableSpec, ordered: pa.Table) -> pa.Table:
    keys = list(spec.primary_key)
    ttl = spec.ttl
    stats = ordered.group_by(keys, use_threads=False).aggregate(
        [(IDX, "min"), (IDX, "count"), (DEL, "any")]
    )
    slow = pc.fill_null(stats.column(f"{DEL}_any"), False)
    if ttl is not None:
        slow = pc.or_(slow, pc.greater(stats.column(f"{IDX}_count"), 1))
    fast_first = pc.filter(stats.column(f"{IDX}_min"), pc.invert(slow))
    out = ordered.take(fast_first)
    if not pc.any(slow).as_py():
        return out
    slow_starts = pc.filter(stats.column(f"{IDX}_min"), slow).combine_chunks()
    slow_rows = ordered.filter(pc.is_in(key_starts(ordered, keys), value_set=slow_starts))
    kept = _dedup_sequential(
        spec, slow_rows, ttl_seconds=None if ttl is None else ttl.total_seconds()
    )
    return pa.concat_tables([out, slow_rows.take(pa.array(kept, pa.int64()))])


def _time_seconds(value: Any) -> float | None:
    if value is None:
        return None
    if hasattr(value, "timestamp"):
        return float(value.timestamp())
    if hasattr(value, "toordinal"):  # date
        return float(value.toordinal() * 86400)
    return float(value) / 1000.0  # long time columns are epoch milliseconds


def _dedup_sequential(spec: TableSpec, rows: pa.Table, *, ttl_seconds: float | None) -> list[int]:
    """Fold the few keys that need it (deletes, TTL) row by row; returns positions kept."""
    keys = list(spec.primary_key)
    key_cols = [rows.column(k).to_pylist() for k in keys]
    dels = rows.column(DEL).to_pylist()
    times = (
        rows.column(spec.time_column).to_pylist()
        if ttl_seconds is not None and spec.time_column
        else [None] * rows.num_rows
    )
    kept_by_key: dict[tuple[Any, ...], list[int]] = {}
    last_time: dict[tuple[Any, ...], float | None] = {}
    for i in range(rows.num_rows):
        key = tuple(col[i] for col in key_cols)
        if dels[i]:
            kept_by_key.pop(key, None)
            last_time.pop(key, None)
            continue
        if key in kept_by_key:
            t_new, t_old = _time_seconds(times[i]), last_time[key]
            expired = (
                ttl_seconds is not None
                and t_new is not None
                and t_old is not None
                and t_new - t_old >= ttl_seconds
            )
            if not expired:
                continue
        kept_by_key.setdefault(key, []).append(i)
        last_time[key] = _time_seconds(times[i])
    return sorted(i for idxs in kept_by_key.values() for i in idxs)
