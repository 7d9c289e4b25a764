"""``partial``: the rows after a key's last delete are folded column by column with the
column's strategy (``overwrite`` takes the new value even if null, ``ignore_null`` the last
non-null, ``max``/``min``/``sum`` ignore nulls, ``append`` joins non-null strings with ",").
The system columns come from the last contributing row.

Every strategy folds associatively, so without a comparison column a run compacts to each key's
last delete plus its folded row, and seals keep a key index: a run's delete supersedes its key's
sealed rows.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from millstream.core.engines.base import KeyedEngine
from millstream.core.merge import (
    DEL,
    IDX,
    KEY_START,
    after_last_delete,
    fold_after_last_delete,
    key_starts,
)
from millstream.spec import OFFSET_COL, PARTITION_COL, TOMBSTONE_COL, TableSpec

APPEND_SEPARATOR = ","


class Partial(KeyedEngine):
    mode = "partial"

    @property
    def indexed(self) -> bool:
        return self.spec.comparison_column is None

    @property
    def merges_columns(self) -> bool:
        return True

    def _fold(self, ordered: pa.Table) -> pa.Table:
        return _partial(self.spec, ordered)

    def _compact_ordered(self, ordered: pa.Table) -> pa.Table:
        if self.spec.comparison_column is None and self.spec.dedup_ttl is None:
            return fold_after_last_delete(self.spec, ordered, self._fold)
        return ordered


def _partial(spec: TableSpec, ordered: pa.Table) -> pa.Table:
    keys = list(spec.primary_key)
    # Joins below go through KEY_START, never through the (nullable) key columns.
    ordered = ordered.append_column(KEY_START, key_starts(ordered, keys))
    live, _ = after_last_delete(ordered)
    ordered = ordered.drop_columns([KEY_START])
    if live.num_rows == 0:
        return ordered.slice(0, 0)
    value_cols = [c for c in spec.columns if c not in keys]
    aggs: list[tuple[str, str, Any]] = [(IDX, "max", None)]
    appends: list[str] = []
    picked: list[str] = []  # overwrite/ignore_null columns Arrow cannot aggregate: by position
    for c in value_cols:
        strat = spec.strategy(c)
        if strat in ("overwrite", "ignore_null") and not _aggregatable(
            ordered.schema.field(c).type
        ):
            picked.append(c)
        elif strat == "overwrite":
            aggs.append((c, "last", pc.ScalarAggregateOptions(skip_nulls=False)))
        elif strat == "ignore_null":
            aggs.append((c, "last", pc.ScalarAggregateOptions(skip_nulls=True)))
        elif strat in ("max", "min"):
            aggs.append((c, strat, None))
        elif strat == "sum":
            aggs.append((c, "sum", pc.ScalarAggregateOptions(skip_nulls=True, min_count=1)))
        else:
            appends.append(c)
    grouped = live.group_by([*keys, KEY_START], use_threads=False).aggregate(
        [(c, f, o) if o is not None else (c, f) for c, f, o in aggs]
    )
    grouped = grouped.rename_columns(_plain_names(grouped.column_names, aggs))
    for c in appends:
        nonnull = live.filter(pc.is_valid(live.column(c)))
        lists = nonnull.group_by([KEY_START], use_threads=False).aggregate([(c, "list")])
        joined = pc.binary_join(lists.column(f"{c}_list"), APPEND_SEPARATOR)
        lists = lists.select([KEY_START]).append_column(c, joined)
        grouped = grouped.join(lists, [KEY_START], join_type="left outer")
    for c in picked:  # the position of the row whose value the key keeps
        rows = live if spec.strategy(c) == "overwrite" else live.filter(pc.is_valid(live.column(c)))
        at = rows.group_by([KEY_START], use_threads=False).aggregate([(IDX, "max")])
        at = at.rename_columns([KEY_START, f"{PICK}{c}"])
        grouped = grouped.join(at, [KEY_START], join_type="left outer")
    # System columns come from the last contributing row.
    grouped = grouped.sort_by([(IDX, "ascending")])
    last_rows = ordered.take(grouped.column(IDX)).select([PARTITION_COL, OFFSET_COL])
    schema = ordered.schema
    cols = []
    for name in schema.names:
        if name in (PARTITION_COL, OFFSET_COL):
            cols.append(last_rows.column(name))
        elif name in (TOMBSTONE_COL, DEL):
            cols.append(pa.array([False] * grouped.num_rows, pa.bool_()))
        elif name in picked:  # null position (no non-null value): null
            cols.append(ordered.column(name).take(grouped.column(f"{PICK}{name}")))
        else:
            cols.append(grouped.column(name).cast(schema.field(name).type))
    return pa.table(cols, schema=schema)


#: Prefix of the position column :func:`_partial` takes an unaggregatable column's value at.
PICK = "__ms_pick_"


def _aggregatable(t: pa.DataType) -> bool:
    """Whether Arrow's hash ``last`` takes values of type ``t`` (not decimals or nested)."""
    return not (pa.types.is_decimal(t) or pa.types.is_nested(t))


def _plain_names(names: list[str], aggs: list[tuple[str, str, Any]]) -> list[str]:
    """pyarrow names aggregates ``<column>_<function>``: map them back to the column names."""
    mapping = {f"{c}_{f}": c for c, f, _ in aggs}
    mapping[f"{IDX}_max"] = IDX
    return [mapping.get(n, n) for n in names]
