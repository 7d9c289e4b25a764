"""The merge engines' shared kernels, vectorized over Arrow: the order key, deletes, effective
comparison values, and the grouping steps the engines of :mod:`millstream.core.engines` are
built from. Nothing here depends on a table's ``mode``: what each engine keeps is decided in its
own module.

The hot ingest path keeps no per-key state (docs/design.md, "Merge engines"); key semantics are applied
when data is read and when it is sealed. The rules are the sequential model in
:mod:`millstream.reference.model`, applied per key in the **order key**:

    (effective comparison value, nulls first) -> partition -> offset

A row's effective comparison value is its comparison value, except for a delete (a Kafka
tombstone, or ``delete_column`` true) that carries none: it takes the highest comparison value
its key has at lower offsets of the same partition, so it removes exactly the key's earlier
rows (a later re-insert with an equal or higher value brings the key back; a late record with a
lower value stays deleted). A delete with no earlier value in its partition has none, and rows
without an (effective) value order first. Ties fall back to (partition, offset): the later
offset wins. A record that is not a delete must carry the comparison value (decode
dead-letters it otherwise), so only deletes ever need an effective value.

A resolved table keeps the system columns of the row that represents the key, so row identity
stays ``(partition, offset)``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from millstream.spec import OFFSET_COL, PARTITION_COL, TOMBSTONE_COL, TableSpec

IDX = "__ms_idx"
DEL = "__ms_del"
EFF = "__ms_eff"
KEY_START = "__ms_key_start"


#: Bits of the int64 :func:`by_position` packs a row's position and index into.
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


def by_position(spec: TableSpec, rows: pa.Table, agg: str) -> pa.Table | None:
    """A resolve that keeps each key's row at the highest position (``agg`` ``"max"``: an
    upsert table without a comparison column) or the lowest (``"min"``: a dedup table without
    one, without a TTL and without deletes among ``rows``), without sorting the rows: the
    order key is the position (partition, offset), so a key's last row is the one at the
    highest position and its first row the one at the lowest. Each row's position relative to
    the lowest one, and below it the row's index, pack into one int64 (positions are unique:
    entries of a partition cover disjoint offset ranges); one hash aggregation takes each
    key's highest (lowest), whose low bits are the winning row's index. Only the winners (one
    per key) are sorted, by key, as a resolve orders them (with no delete, dedup keeps exactly
    each key's first row). A single dense integer key (:func:`dense_places`, within
    :data:`MERGE_DENSE_SPAN`) needs neither: an array over the keys' span keeps each key's
    highest (lowest) packed value, in key order. None if the positions and indexes need more
    than :data:`PACK_BITS` bits (offsets spread over more than about 2**40 with 1M rows, say),
    or a position is null: the general path handles those."""
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


def in_order(
    spec: TableSpec, rows: pa.Table, *, by_key: bool = True, floor: pa.Table | None = None
) -> pa.Table:
    """Sort by (key, order key) and add the position (IDX) and the delete flag (DEL); with a
    comparison column also the effective comparison value (EFF, see :func:`effective_values`).
    Without ``by_key`` (an append table) by position alone."""
    if not by_key:
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


def key_starts(ordered: pa.Table, keys: list[str]) -> pa.Array:
    """For each row, the position (IDX) of its key's first row.

    ``ordered`` is sorted by the key columns first, so each key's rows are contiguous. Use
    this instead of joining on the key columns: a join never matches null to null, but a
    null key value is a key of its own (as in ``group_by`` and the sequential model).
    """
    firsts = ordered.group_by(keys, use_threads=False).aggregate([(IDX, "min")])
    idx = ordered.column(IDX)
    is_first = pc.is_in(idx, value_set=firsts.column(f"{IDX}_min").combine_chunks())
    return pc.cumulative_max(pc.if_else(is_first, idx, pa.scalar(0, pa.int64())))


def take_by_group(ordered: pa.Table, keys: list[str], agg: str) -> pa.Table:
    picked = ordered.group_by(keys, use_threads=False).aggregate([(IDX, agg)])
    return ordered.take(picked.column(f"{IDX}_{agg}"))


def after_last_delete(ordered: pa.Table) -> tuple[pa.Table, pa.Table]:
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


def reindexed(table: pa.Table) -> pa.Table:
    """Positions (IDX) renumbered from 0 in the current order: the engines take by IDX."""
    i = table.schema.get_field_index(IDX)
    return table.set_column(i, IDX, pa.array(np.arange(table.num_rows, dtype=np.int64)))


def seal_order(spec: TableSpec, out: pa.Table) -> pa.Table:
    """A compacted run's rows as they are sealed: sorted by key then (partition, offset),
    without the merge's own columns (IDX, DEL)."""
    sort = [(k, "ascending", "at_end") for k in spec.primary_key] + [
        (PARTITION_COL, "ascending", "at_end"),
        (OFFSET_COL, "ascending", "at_end"),
    ]
    return out.take(pc.sort_indices(out, sort_keys=sort)).drop_columns([IDX, DEL])


def fold_after_last_delete(
    spec: TableSpec, ordered: pa.Table, fold: Callable[[pa.Table], pa.Table]
) -> pa.Table:
    """Each key's last delete in ``ordered`` (in the order key, with IDX and DEL), plus
    ``fold`` of the key's rows after it: what a run of an engine whose deletes reset a key
    compacts to when its order is the offset."""
    keys = list(spec.primary_key)
    live, last_deletes = after_last_delete(
        ordered.append_column(KEY_START, key_starts(ordered, keys))
    )
    live = reindexed(live.drop_columns([KEY_START]))
    kept = fold(live)
    return pa.concat_tables([last_deletes.drop_columns([KEY_START]), kept.cast(live.schema)])
