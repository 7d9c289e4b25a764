"""Merge engines, vectorized over Arrow: resolve a set of rows to the table's current rows.

The hot ingest path keeps no per-key state (DESIGN.md "Data path"); key semantics are applied
here, when data is read and when it is sealed. The rules are the sequential model in
:mod:`millstream.testing.model`, applied per key in the **order key**:

    (comparison value, nulls last) -> partition -> offset

A row without a comparison value (a Kafka tombstone, say) is ordered after every row of the
same key that has one; among themselves such rows and ties fall back to (partition, offset).

* ``append``  every row.
* ``dedup``   the first row of a key wins; a delete removes the key's rows so the next row wins
  again; with ``dedup_ttl`` a row more than the TTL after the kept row (on ``time_column``) is
  kept as well. Rows with a null time never expire.
* ``upsert``  the last row wins; if it is a tombstone or has ``delete_column`` true the key is gone.
* ``partial`` rows after the key's last delete are folded column by column with the column's
  strategy (``overwrite`` takes the new value even if null, ``ignore_null`` the last non-null,
  ``max``/``min``/``sum`` ignore nulls, ``append`` joins non-null strings with ",").

The output keeps the system columns of the row that represents the key (for ``partial``, the
last contributing row), so row identity stays ``(partition, offset)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from millstream.spec import OFFSET_COL, PARTITION_COL, TOMBSTONE_COL, TableSpec

IDX = "__ms_idx"
DEL = "__ms_del"
KEY_START = "__ms_key_start"
APPEND_SEPARATOR = ","


def resolve(spec: TableSpec, rows: pa.Table) -> pa.Table:
    """Return the current rows of ``rows`` under the table's merge engine.

    ``rows`` has the table's columns plus the system columns. The result has the same schema
    (tombstone column all false), ordered by the order key.
    """
    ordered = _in_order(spec, rows)
    if spec.mode == "append" or ordered.num_rows == 0:
        return ordered.drop_columns([IDX, DEL])
    if spec.mode == "upsert":
        out = _upsert(spec, ordered)
    elif spec.mode == "dedup":
        out = _dedup(spec, ordered)
    else:
        out = _partial(spec, ordered)
    out = out.sort_by([(IDX, "ascending")])
    return out.drop_columns([IDX, DEL])


def order_sort_keys(spec: TableSpec) -> list[tuple[str, str]]:
    keys: list[tuple[str, str]] = [(k, "ascending") for k in spec.primary_key]
    if spec.comparison_column is not None:
        keys.append((spec.comparison_column, "ascending"))
    keys += [(PARTITION_COL, "ascending"), (OFFSET_COL, "ascending")]
    return keys


def _in_order(spec: TableSpec, rows: pa.Table) -> pa.Table:
    """Sort by (key, order key) and add the position (IDX) and the delete flag (DEL)."""
    if spec.mode == "append":
        keys = [(PARTITION_COL, "ascending"), (OFFSET_COL, "ascending")]
    else:
        keys = order_sort_keys(spec)
    idx = pc.sort_indices(rows, sort_keys=[(name, order, "at_end") for name, order in keys])
    ordered = rows.take(idx)
    is_del = pc.fill_null(ordered.column(TOMBSTONE_COL), False)
    if spec.delete_column is not None:
        is_del = pc.or_(is_del, pc.fill_null(ordered.column(spec.delete_column), False))
    ordered = ordered.append_column(IDX, pa.array(np.arange(ordered.num_rows, dtype=np.int64)))
    return ordered.append_column(DEL, is_del)


def _key_starts(ordered: pa.Table, keys: list[str]) -> pa.Array:
    """For each row, the position (IDX) of its key's first row.

    ``ordered`` is sorted by the key columns first, so each key's rows are contiguous. Use
    this instead of joining on the key columns: a join never matches null to null, but a
    null key value is a key of its own (as in ``group_by`` and the sequential model).
    """
    firsts = ordered.group_by(keys, use_threads=False).aggregate([(IDX, "min")])
    idx = ordered.column(IDX)
    is_first = pc.is_in(idx, value_set=firsts.column(f"{IDX}_min").combine_chunks())
    return pc.cumulative_max(pc.if_else(is_first, idx, pa.scalar(0, pa.int64())))


def _take_by_group(ordered: pa.Table, keys: list[str], agg: str) -> pa.Table:
    picked = ordered.group_by(keys, use_threads=False).aggregate([(IDX, agg)])
    return ordered.take(picked.column(f"{IDX}_{agg}"))


def _upsert(spec: TableSpec, ordered: pa.Table) -> pa.Table:
    last = _take_by_group(ordered, list(spec.primary_key), "max")
    return last.filter(pc.invert(last.column(DEL)))


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
    slow_rows = ordered.filter(pc.is_in(_key_starts(ordered, keys), value_set=slow_starts))
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


def _after_last_delete(ordered: pa.Table) -> tuple[pa.Table, pa.Table]:
    """Split ``ordered`` (with KEY_START) into the rows after their key's last delete, and the
    last delete row of each key that has one."""
    deletes = ordered.filter(ordered.column(DEL))
    if not deletes.num_rows:
        return ordered, deletes
    last_del = deletes.group_by([KEY_START], use_threads=False).aggregate([(IDX, "max")])
    last_idx = last_del.column(f"{IDX}_max").combine_chunks()
    last_del = last_del.rename_columns({f"{IDX}_max": "__ms_last_del"})
    live = ordered.join(last_del, [KEY_START], join_type="left outer")
    after = pc.or_kleene(
        pc.is_null(live.column("__ms_last_del")),
        pc.greater(live.column(IDX), live.column("__ms_last_del")),
    )
    live = (
        live.filter(after)
        .select(ordered.column_names)
        .sort_by([(IDX, "ascending")])
        .cast(ordered.schema)
    )
    return live, ordered.filter(pc.is_in(ordered.column(IDX), value_set=last_idx))


def _reindexed(table: pa.Table) -> pa.Table:
    """Positions (IDX) renumbered from 0 in the current order: the engines take by IDX."""
    i = table.schema.get_field_index(IDX)
    return table.set_column(i, IDX, pa.array(np.arange(table.num_rows, dtype=np.int64)))


def compact(spec: TableSpec, rows: pa.Table) -> pa.Table:
    """The rows a run of one partition's consecutive segments can be sealed into, such that
    merging them with any older and newer rows gives the same table as merging the originals.

    * ``upsert``: the winning row of each key, deletes included (the last row wins wherever it
      is merged, and a winning delete still removes older rows).
    * ``dedup`` and ``partial`` without a comparison column or TTL: the key's last delete plus
      the first (dedup) or folded (partial) row after it. Order is the offset then, so the rows
      of a newer run always come after this run's; every partial strategy folds associatively.
    * Otherwise (``append``, or an order that interleaves runs): every row, sorted.

    Output: the table's columns plus system columns, sorted by key then (partition, offset).
    """
    ordered = _in_order(spec, rows)
    keys = list(spec.primary_key)
    if spec.mode == "upsert" and ordered.num_rows:
        out = _take_by_group(ordered, keys, "max")
    elif (
        spec.mode in ("dedup", "partial")
        and spec.comparison_column is None
        and spec.dedup_ttl is None
        and ordered.num_rows
    ):
        live, last_deletes = _after_last_delete(
            ordered.append_column(KEY_START, _key_starts(ordered, keys))
        )
        live = _reindexed(live.drop_columns([KEY_START]))
        kept = _dedup(spec, live) if spec.mode == "dedup" else _partial(spec, live)
        out = pa.concat_tables([last_deletes.drop_columns([KEY_START]), kept.cast(live.schema)])
    else:
        out = ordered
    sort = [(k, "ascending", "at_end") for k in keys] + [
        (PARTITION_COL, "ascending", "at_end"),
        (OFFSET_COL, "ascending", "at_end"),
    ]
    return out.take(pc.sort_indices(out, sort_keys=sort)).drop_columns([IDX, DEL])


def _partial(spec: TableSpec, ordered: pa.Table) -> pa.Table:
    keys = list(spec.primary_key)
    # Joins below go through KEY_START, never through the (nullable) key columns.
    ordered = ordered.append_column(KEY_START, _key_starts(ordered, keys))
    live, _ = _after_last_delete(ordered)
    ordered = ordered.drop_columns([KEY_START])
    if live.num_rows == 0:
        return ordered.slice(0, 0)
    value_cols = [c for c in spec.columns if c not in keys]
    aggs: list[tuple[str, str, Any]] = [(IDX, "max", None)]
    appends: list[str] = []
    for c in value_cols:
        strat = spec.strategy(c)
        if strat == "overwrite":
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
        else:
            cols.append(grouped.column(name).cast(schema.field(name).type))
    return pa.table(cols, schema=schema)


def _plain_names(names: list[str], aggs: list[tuple[str, str, Any]]) -> list[str]:
    """pyarrow names aggregates ``<column>_<function>``: map them back to the column names."""
    mapping = {f"{c}_{f}": c for c, f, _ in aggs}
    mapping[f"{IDX}_max"] = IDX
    return [mapping.get(n, n) for n in names]
