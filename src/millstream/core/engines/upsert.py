"""``upsert``: the last row of a key wins; if it is a delete (a tombstone, or ``delete_column``
true) the key is gone.

Without a comparison column the order key is the position (partition, offset), so a resolve
needs no sort (:func:`millstream.core.merge.by_position`), a seal supersedes every sealed row
of a key its run has a row for, and a partition's sealed rows minus its delete vectors are
already merged (:attr:`Upsert.sealed_final`, :mod:`millstream.core.final`). With one, a key's
rows order by their effective comparison value; compaction writes a delete's effective value
into the comparison column, reading the partition's earlier values as a floor.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from millstream.core.engines.base import IndexColumn, KeyedEngine
from millstream.core.merge import DEL, by_position, take_by_group
from millstream.spec import OFFSET_COL


class Upsert(KeyedEngine):
    mode = "upsert"

    @property
    def winner_is_greatest(self) -> bool:
        return True

    @property
    def indexed(self) -> bool:
        return True

    @property
    def needs_floor(self) -> bool:
        return self.spec.comparison_column is not None

    @property
    def sealed_final(self) -> bool:
        return self.spec.comparison_column is None

    def _by_position(self, rows: pa.Table) -> pa.Table | None:
        if self.spec.comparison_column is not None:
            return None
        return by_position(self.spec, rows, "max")

    def _fold(self, ordered: pa.Table) -> pa.Table:
        last = take_by_group(ordered, list(self.spec.primary_key), "max")
        return last.filter(pc.invert(last.column(DEL)))

    def _compact_ordered(self, ordered: pa.Table) -> pa.Table:
        # The winning row of each key, deletes included: the last row wins wherever it is
        # merged, and a winning delete still removes older rows.
        return take_by_group(ordered, list(self.spec.primary_key), "max")

    def superseded(
        self, rows: pa.Table, new_pos: np.ndarray, idx_pos: np.ndarray, old: IndexColumn
    ) -> np.ndarray:
        cmp = self.spec.comparison_column
        if cmp is None:  # the run's rows are later: every sealed row of its keys
            return np.ones(len(idx_pos), dtype=bool)
        return orders_after(
            rows.column(cmp).take(pa.array(new_pos)),
            rows.column(OFFSET_COL).take(pa.array(new_pos)),
            old(cmp, idx_pos),
            old(OFFSET_COL, idx_pos),
        )


def orders_after(
    cmp_new: pa.Array, off_new: pa.Array, cmp_old: pa.Array, off_old: pa.Array
) -> np.ndarray:
    """Row-wise: does (cmp_new, off_new) come after (cmp_old, off_old) in the order key
    (comparison value with nulls first, then offset)? Both rows are of one partition and
    carry materialized values, so a null means the key had no value before that row."""
    n_null = pc.is_null(cmp_new).to_numpy(zero_copy_only=False)
    o_null = pc.is_null(cmp_old).to_numpy(zero_copy_only=False)
    greater = pc.fill_null(pc.greater(cmp_new, cmp_old), False).to_numpy(zero_copy_only=False)
    equal = pc.fill_null(pc.equal(cmp_new, cmp_old), False).to_numpy(zero_copy_only=False)
    later_off = pc.greater(off_new, off_old).to_numpy(zero_copy_only=False)
    both = ~n_null & ~o_null
    return np.asarray(
        (both & (greater | (equal & later_off)))
        | (~n_null & o_null)
        | (n_null & o_null & later_off),
        dtype=bool,
    )
