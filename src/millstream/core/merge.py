"""Merge engines, vectorized over Arrow: resolve a set of rows to the table's current rows.

The hot ingest path keeps no per-key state (docs/design.md, "Merge engines"); key semantics are applied
here, when data is read and when it is sealed. The rules are the sequential model in
:mod:`millstream.testing.model`, applied per key in the **order key**:

    (effective comparison value, nulls first) -> partition -> offset

A row's effective comparison value is its comparison value, except for a delete (a Kafka
tombstone, or ``delete_column`` true) that carries none: it takes the highest comparison value
its key has at lower offsets of the same partition, so it removes exactly the key's earlier
rows (a later re-insert with an equal or higher value brings the key back; a late record with a
lower value stays deleted). A delete with no earlier value in its partition has none, and rows
without an (effective) value order first. Ties fall back to (partition, offset): the later
offset wins. A record that is not a delete must carry the comparison value (decode
dead-letters it otherwise), so only deletes ever need an effective value.

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
EFF = "__ms_eff"
KEY_START = "__ms_key_start"
APPEND_SEPARATOR = ","


def resolve(spec: TableSpec, rows: pa.Table) -> pa.Table:
    """Return the current rows of ``rows`` under the table's merge engine.

    ``rows`` has the table's columns plus the system columns. The result has the same schema
    (tombstone column all false), ordered by the order key.
    """
    if spec.comparison_column is None and (
        spec.mode == "upsert"
        or (
            spec.mode == "dedup"
            and spec.dedup_ttl is None
            and not pc.any(deletes(spec, rows)).as_py()
        )
    ):
        fast = _by_position(spec, rows)
        if fast is not None:
            return fast
    ordered = _in_order(spec, rows)
    if EFF in ordered.column_names:
        ordered = ordered.drop_columns([EFF])
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


#: Bits of the int64 :func:`_by_position` packs a row's position and index into.
PACK_BITS = 62
POS = "__ms_pos"
#: Integer keys whose values span at most this many times the rows are dense (ids handed out
#: in order): an array over their span, indexed by value, stands in for a hash table.
DENSE_SPAN = 8
#: The merge's array holds an int64 per value of the span: at most this many per row keeps it
#: within twice the packed positions it picks from (16 bytes a row), however large the read.
MERGE_DENSE_SPAN = 2


def dense_places(
    column: pa.ChunkedArray | pa.Array, max_span: int = DENSE_SPAN
) -> tuple[np.ndarray, int] | None:
    """For a column of integers without nulls whose values span at most ``max_span`` times
    its length: each value's place in the span (value - lowest, int64) and the span. None for
    any other column."""
    if column.null_count or not pa.types.is_integer(column.type) or len(column) == 0:
        return None
    values = column.to_numpy()
    low, high = values.min(), values.max()
    span = int(high) - int(low) + 1  # Python integers: no overflow at the type's ends
    if span > max_span * len(values):
        return None
    if values.dtype == np.uint64:  # low may exceed int64; the places (< span) do not
        return (values - low).astype(np.int64), span
    return values.astype(np.int64) - np.int64(low), span


def _by_position(spec: TableSpec, rows: pa.Table) -> pa.Table | None:
    """:func:`resolve` for an upsert table without a comparison column, or a dedup table
    without one, without a TTL and without deletes among ``rows``, without sorting the rows:
    the order key is the position (partition, offset), so a key's last row (upsert) is the one
    at the highest position and its first row (dedup) the one at the lowest. Each row's position relative to the lowest one, and below it the
    row's index, pack into one int64 (positions are unique: entries of a partition cover
    disjoint offset ranges); one hash aggregation takes each key's highest, whose low bits are
    the winning row's index. Only the winners (one per key) are sorted, by key, as
    :func:`resolve` orders them (with no delete, dedup keeps exactly each key's first row).
    A single dense integer key (:func:`dense_places`, within :data:`MERGE_DENSE_SPAN`) needs
    neither: an array over the keys' span keeps each key's highest (lowest) packed value, in
    key order.
    None if the positions and indexes need more than
    :data:`PACK_BITS` bits (offsets spread over more than about 2**40 with 1M rows, say), or a
    position is null: the general path handles those."""
    n = rows.num_rows
    if n == 0:
        return None
    part, off = rows.column(PARTITION_COL), rows.column(OFFSET_COL)
    if part.null_count or off.null_count:
        return None
    p_range, o_range = pc.min_max(part).as_py(), pc.min_max(off).as_py()
    span = o_range["max"] - o_range["min"] + 1
    positions = (p_range["max"] - p_range["min"] + 1) * span
    row_bits = max(1, (n - 1).bit_length())
    if (positions - 1).bit_length() + row_bits > PACK_BITS:
        return None
    p = part.to_numpy().astype(np.int64) - p_range["min"]
    o = off.to_numpy().astype(np.int64) - o_range["min"]
    packed = ((p * span + o) << row_bits) | np.arange(n, dtype=np.int64)
    keys = list(spec.primary_key)
    agg = "max" if spec.mode == "upsert" else "min"
    dense = dense_places(rows.column(keys[0]), MERGE_DENSE_SPAN) if len(keys) == 1 else None
    if dense is not None:
        # Each key's highest (lowest) packed value in an array indexed by the key's place:
        # no hash table, and the winners come out in key order (packed values are >= 0).
        places, span = dense
        if agg == "max":
            best = np.full(span, -1, np.int64)
            np.maximum.at(best, places, packed)
            picked = best[best >= 0]
        else:
            unset = np.iinfo(np.int64).max
            best = np.full(span, unset, np.int64)
            np.minimum.at(best, places, packed)
            picked = best[best != unset]
        winners = rows.take(pa.array(picked & ((1 << row_bits) - 1)))
        return winners.filter(pc.invert(deletes(spec, winners)))
    picked = (
        rows.select(keys)
        .append_column(POS, pa.array(packed))
        .group_by(keys)  # max and min are order-independent: threads are fine
        .aggregate([(POS, agg)])
        .column(f"{POS}_{agg}")
        .to_numpy()
    )
    winners = rows.take(pa.array(picked & ((1 << row_bits) - 1)))
    winners = winners.filter(pc.invert(deletes(spec, winners)))
    # One row per key: the key columns alone order them (null keys last, as resolve does).
    by_key = [(k, "ascending", "at_end") for k in keys]
    return winners.take(pc.sort_indices(winners, sort_keys=by_key))


def order_sort_keys(spec: TableSpec) -> list[tuple[str, str]]:
    """Sort keys putting a keyed table's rows in (key, order key) order. With a comparison
    column they sort the effective value, column :data:`EFF`, whose nulls go first."""
    keys: list[tuple[str, str]] = [(k, "ascending") for k in spec.primary_key]
    if spec.comparison_column is not None:
        keys.append((EFF, "ascending"))
    keys += [(PARTITION_COL, "ascending"), (OFFSET_COL, "ascending")]
    return keys


def deletes(spec: TableSpec, rows: pa.Table) -> pa.ChunkedArray:
    """Which rows are deletes (a tombstone, or the delete column true)."""
    is_del = pc.fill_null(rows.column(TOMBSTONE_COL), False)
    if spec.delete_column is not None:
        is_del = pc.or_(is_del, pc.fill_null(rows.column(spec.delete_column), False))
    return is_del


def lacks_comparison_value(spec: TableSpec, rows: pa.Table) -> np.ndarray:
    """Which rows are bad for a keyed table with a comparison column: not a delete, and no
    comparison value (all False otherwise). Decode dead-letters such records and
    ``stage_rows`` refuses them, so only deletes ever need an effective value."""
    column = spec.comparison_column
    if not spec.keyed or column is None or rows.num_rows == 0:
        return np.zeros(rows.num_rows, dtype=bool)
    bad = pc.and_(pc.is_null(rows.column(column)), pc.invert(deletes(spec, rows)))
    return np.asarray(bad.to_numpy(), dtype=bool)


def missing_comparison_error(spec: TableSpec) -> str:
    """The error of a row :func:`lacks_comparison_value` finds, naming the column."""
    return (
        f"comparison column {spec.comparison_column!r} is null "
        "(a record that is not a delete must carry it)"
    )


def _in_order(spec: TableSpec, rows: pa.Table, floor: pa.Table | None = None) -> pa.Table:
    """Sort by (key, order key) and add the position (IDX) and the delete flag (DEL); with a
    comparison column also the effective comparison value (EFF, see :func:`effective_values`)."""
    if spec.mode == "append":
        keys = [(PARTITION_COL, "ascending"), (OFFSET_COL, "ascending")]
    else:
        keys = order_sort_keys(spec)
        if spec.comparison_column is not None:
            rows = rows.append_column(EFF, effective_values(spec, rows, floor=floor))
    # Rows without an (effective) comparison value order first; null keys go anywhere.
    idx = pc.sort_indices(
        rows,
        sort_keys=[(name, order, "at_start" if name == EFF else "at_end") for name, order in keys],
    )
    ordered = rows.take(idx)
    ordered = ordered.append_column(IDX, pa.array(np.arange(ordered.num_rows, dtype=np.int64)))
    return ordered.append_column(DEL, deletes(spec, ordered))


def effective_values(spec: TableSpec, rows: pa.Table, *, floor: pa.Table | None = None) -> pa.Array:
    """Each row's effective comparison value (in the order of ``rows``): its comparison value,
    or, for a delete without one, the highest comparison value of the same key at a lower
    offset of the same partition (null if there is none).

    ``floor`` (key columns and the comparison column, one partition's rows only) stands for
    earlier rows of the partition that are not in ``rows``: per key, the highest comparison
    value they hold.

    Vectorized, over the rows of keys that have such a delete only (a superset found by one
    hash lookup per key column): sort them by (key, partition, offset), dense-rank the values,
    and take a running maximum of ``group * (n + 1) + rank`` (group ids increase along the
    sort, so the running maximum never carries over from the group before).
    """
    cmp_col = spec.comparison_column
    assert cmp_col is not None
    values = rows.column(cmp_col).combine_chunks()
    need = pc.and_(deletes(spec, rows), pc.is_null(values)).combine_chunks()
    if rows.num_rows == 0 or not pc.any(need).as_py():
        return values
    keys = list(spec.primary_key)
    candidate = np.ones(rows.num_rows, dtype=bool)
    needing = rows.filter(need)
    for c in keys:
        found = pc.is_in(
            rows.column(c), value_set=pc.unique(needing.column(c)), skip_nulls=False
        )  # null matches null: a null key is a key of its own
        candidate &= np.asarray(found.to_numpy(zero_copy_only=False), dtype=bool)
    positions = np.flatnonzero(candidate)  # every row needing a value, and its key's rows
    base = rows.select([*keys, PARTITION_COL, OFFSET_COL, cmp_col]).take(pa.array(positions))
    if floor is not None and floor.num_rows:
        partitions = pc.unique(rows.column(PARTITION_COL)).to_pylist()
        if len(partitions) != 1:
            raise ValueError(f"a floor applies to one partition's rows, got {partitions}")
        earliest = np.iinfo(np.int64).min  # before any offset of the partition
        floor_rows = pa.table(
            {
                **{c: floor.column(c) for c in keys},
                PARTITION_COL: pa.array([partitions[0]] * floor.num_rows, pa.int32()),
                OFFSET_COL: pa.array([earliest] * floor.num_rows, pa.int64()),
                cmp_col: floor.column(cmp_col),
            }
        )
        base = pa.concat_tables([base, floor_rows.cast(base.schema)]).combine_chunks()
    n = base.num_rows
    order = pc.sort_indices(
        base, sort_keys=[(c, "ascending", "at_end") for c in [*keys, PARTITION_COL, OFFSET_COL]]
    ).to_numpy()
    in_order = base.take(pa.array(order))
    # Group (key, partition) ids: a new group wherever a key column or the partition changes.
    starts = np.zeros(n, dtype=bool)
    starts[0] = True
    for c in [*keys, PARTITION_COL]:
        col = in_order.column(c).combine_chunks()
        prev, cur = col.slice(0, n - 1), col.slice(1)
        changed = pc.or_(
            pc.fill_null(pc.not_equal(prev, cur), False),
            pc.xor(pc.is_null(prev), pc.is_null(cur)),
        )
        starts[1:] |= np.asarray(changed.to_numpy(zero_copy_only=False), dtype=bool)
    group = np.cumsum(starts, dtype=np.int64) - 1
    sorted_values = in_order.column(cmp_col).combine_chunks()
    ranks = np.asarray(
        pc.rank(sorted_values, sort_keys="ascending", tiebreaker="dense"), dtype=np.int64
    )
    ranks[np.asarray(pc.is_null(sorted_values).to_numpy(zero_copy_only=False), dtype=bool)] = 0
    base_of_group = group * (n + 1)
    running = np.maximum.accumulate(base_of_group + ranks) - base_of_group
    # Back to the rows' order; a delete without a value ranks 0 itself, so the running
    # maximum up to and including it is the maximum of the rows before it.
    running_in_base = np.empty(n, dtype=np.int64)
    running_in_base[order] = running
    rank_of_row = np.zeros(rows.num_rows, dtype=np.int64)
    rank_of_row[positions] = running_in_base[: len(positions)]
    distinct = pc.unique(sorted_values.drop_null())
    distinct = distinct.take(pc.array_sort_indices(distinct))
    earlier = distinct.take(pa.array(rank_of_row - 1, pa.int64(), mask=rank_of_row == 0))
    return pc.if_else(need, earlier, values)


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
    # The join carries positions only: Arrow joins cannot carry list, struct or map columns.
    probe = ordered.select([KEY_START, IDX]).join(last_del, [KEY_START], join_type="left outer")
    after = pc.or_kleene(
        pc.is_null(probe.column("__ms_last_del")),
        pc.greater(probe.column(IDX), probe.column("__ms_last_del")),
    )
    kept = probe.filter(after).column(IDX).combine_chunks()
    live = ordered.filter(pc.is_in(ordered.column(IDX), value_set=kept))
    return live, ordered.filter(pc.is_in(ordered.column(IDX), value_set=last_idx))


def _reindexed(table: pa.Table) -> pa.Table:
    """Positions (IDX) renumbered from 0 in the current order: the engines take by IDX."""
    i = table.schema.get_field_index(IDX)
    return table.set_column(i, IDX, pa.array(np.arange(table.num_rows, dtype=np.int64)))


def compact(spec: TableSpec, rows: pa.Table, *, floor: pa.Table | None = None) -> pa.Table:
    """The rows a run of one partition's consecutive segments can be sealed into, such that
    merging them with any older and newer rows gives the same table as merging the originals.

    * ``upsert``: the winning row of each key, deletes included (the last row wins wherever it
      is merged, and a winning delete still removes older rows). With a comparison column, a
      delete without a comparison value gets its effective value written into that column (a
      delete is never visible, so no read sees the value itself): the earlier rows it derives
      from are gone once the run is compacted and older sealed rows are named by delete
      vectors. ``floor`` (key columns and the comparison column) gives, per key, the highest
      comparison value of the partition's earlier rows outside the run; the sealer takes it
      from the key index (:meth:`millstream.sealing.keyindex.KeyIndex.comparison_floor`).
      Without it a run whose key has older rows would materialize too low a value.
    * ``dedup`` and ``partial`` without a comparison column or TTL: the key's last delete plus
      the first (dedup) or folded (partial) row after it. Order is the offset then, so the rows
      of a newer run always come after this run's; every partial strategy folds associatively.
    * Otherwise (``append``, or an order that interleaves runs): every row, sorted, as it is.
      Nothing an effective value derives from is removed then (such tables have no delete
      vectors), so reads keep deriving it and no floor is needed.

    Output: the table's columns plus system columns, sorted by key then (partition, offset).
    """
    ordered = _in_order(spec, rows, floor if spec.mode == "upsert" else None)
    keys = list(spec.primary_key)
    if EFF in ordered.column_names:
        cmp_col = spec.comparison_column
        assert cmp_col is not None
        if spec.mode == "upsert":  # materialize: EFF differs only for deletes without a value
            i = ordered.schema.get_field_index(cmp_col)
            field = ordered.schema.field(i)
            ordered = ordered.set_column(i, field, ordered.column(EFF).cast(field.type))
        ordered = ordered.drop_columns([EFF])
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
