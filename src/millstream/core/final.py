"""The upsert merge of rows that hold at most one row per (key, partition).

An upsert table without a comparison column orders a key's rows by position (partition, then
offset) and keeps the last. Each partition's sealed rows, once its delete vectors are applied,
hold one row per key (:mod:`millstream.sealing.keyindex`), so across a sealed table a key's
rows differ by partition and its winner is its row in the highest partition: one sort by
(key, partition) finds every winner, in the key order the upsert engine's resolve
(:mod:`millstream.core.engines.upsert`) returns, without the offsets. Nothing here takes that
property on trust: the sort shows every pair of rows with the same key and partition, and then
only the offsets can order them, so the caller merges in full.

Most such tables hold each key in one partition only (a producer keys its records to a
partition), without saying so (``partitioned_by_key``). Then every row is its key's winner,
and proving that every key occurs once is all the merge there is: for a single key column of
integers, one pass over the key values alone (a bitmap of their span, or numpy's sort), not a
sort of row indices; for other keys, a count of their distinct values by hashing. No rows are
reordered: they come as read, partition by partition (as a table partitioned by key returns
them).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from millstream.core.engines import engine_for
from millstream.core.merge import deletes, dense_places
from millstream.spec import PARTITION_COL, TOMBSTONE_COL, TableSpec


def _same_as_next(column: pa.Array) -> pa.Array:
    """Whether each value but the last equals the next one (two nulls are equal, as they are
    one group to a hash aggregation)."""
    a, b = column.slice(0, len(column) - 1), column.slice(1)
    both_null = pc.and_(pc.is_null(a), pc.is_null(b))
    return pc.or_(pc.fill_null(pc.equal(a, b), False), both_null)


def keys_distinct(spec: TableSpec, rows: pa.Table) -> bool:
    """Whether no two of ``rows`` have the same key. False when it cannot tell: a key column
    holds a null (the caller then sorts, which groups nulls).

    A single key column of integers: dense keys (ids handed out in order: the values span at
    most :data:`~millstream.core.merge.DENSE_SPAN` times their count) are marked in a bitmap
    of their span, a quarter of a sort's time, and are distinct when as many marks are set as
    there are keys; others are sorted. Any other key (a string, several columns) is hashed:
    its distinct values are counted (``unique``, or a grouping for several columns), several
    times cheaper than the sort of strings and row indices the caller would do."""
    names = list(spec.primary_key)
    if not names or any(rows.column(k).null_count for k in names):
        return False
    if len(names) > 1:
        return bool(rows.select(names).group_by(names).aggregate([]).num_rows == rows.num_rows)
    column = rows.column(names[0])
    if not pa.types.is_integer(column.type):
        return bool(len(pc.unique(column)) == rows.num_rows)
    n = len(column)
    if n < 2:
        return True
    dense = dense_places(column)
    if dense is not None:
        places, span = dense
        if span < n:
            return False  # fewer possible values than keys
        seen = np.zeros(span, np.bool_)
        seen[places] = True
        return int(np.count_nonzero(seen)) == n
    ordered = np.sort(column.to_numpy())
    return not bool(np.any(ordered[1:] == ordered[:-1]))


def resolve_one_per_partition(spec: TableSpec, rows: pa.Table) -> pa.Table | None:
    """The upsert engine's resolve for a table without a comparison column (one whose sealed
    rows are final, :attr:`~millstream.core.engines.base.MergeEngine.sealed_final`), for
    ``rows`` holding at most one row per (key, partition): each key's row in its highest
    partition unless that row is a delete. Ordered by key (nulls last), unless every key occurs
    once (:func:`keys_distinct`): then the rows that are not deletes, in the order of ``rows``.
    ``rows`` needs the table's columns, ``_ms_partition`` and ``_ms_tombstone``; ``_ms_offset``
    and any other column are carried along. None if two rows share a key and a partition (the
    caller must merge by offset then)."""
    if not engine_for(spec).sealed_final:
        raise ValueError(f"table {spec.name!r} is not an upsert table ordered by position")
    n = rows.num_rows
    if n == 0:
        return rows
    flags = [c for c in (TOMBSTONE_COL, spec.delete_column) if c is not None]
    if keys_distinct(spec, rows):
        dropped = deletes(spec, rows.select(flags))
        if not pc.any(dropped).as_py():
            return rows  # nothing to drop: no copy
        return rows.filter(pc.invert(dropped))
    keys = list(spec.primary_key)
    by_key = [(k, "ascending", "at_end") for k in keys]
    order = pc.sort_indices(
        rows.select([*keys, PARTITION_COL]), sort_keys=[*by_key, (PARTITION_COL, "ascending")]
    )
    if n == 1:
        last = pa.array([True])
    else:
        ordered = rows.select([*keys, PARTITION_COL]).take(order).combine_chunks()
        same_key = _same_as_next(ordered.column(keys[0]).chunk(0))
        for k in keys[1:]:
            same_key = pc.and_(same_key, _same_as_next(ordered.column(k).chunk(0)))
        same_partition = _same_as_next(ordered.column(PARTITION_COL).chunk(0))
        if pc.any(pc.and_(same_key, same_partition)).as_py():
            return None
        # A row is its key's winner when the next row (sorted) has another key.
        last = pa.concat_arrays([pc.invert(same_key), pa.array([True])])
    winners = pc.filter(order, last)
    dropped = deletes(spec, rows.select(flags).take(winners))
    return rows.take(pc.filter(winners, pc.invert(dropped)))
