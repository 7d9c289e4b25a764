"""The interface every merge engine implements, and the skeleton the keyed engines share."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from millstream.core.merge import (
    DEL,
    EFF,
    IDX,
    deletes,
    in_order,
    seal_order,
)
from millstream.spec import OFFSET_COL, TableSpec

#: How a key index hands an engine the values of its sealed rows: ``(column, positions)``.
IndexColumn = Callable[[str, np.ndarray], pa.Array]


class MergeEngine(ABC):
    """What a table's ``mode`` means, for one table: how rows resolve, what a seal may drop,
    what the key index keeps, and whether a sealed partition is already merged.

    Reached from the table spec through :func:`millstream.core.engines.engine_for`. Every
    method works on whole Arrow tables: no engine dispatches per row.
    """

    #: the ``table.mode`` this engine implements
    mode: str = ""

    def __init__(self, spec: TableSpec) -> None:
        self.spec = spec

    @abstractmethod
    def resolve(self, rows: pa.Table) -> pa.Table:
        """The current rows of ``rows`` (the table's columns plus the system columns): the
        same schema (tombstone column all false), ordered by the order key."""

    @abstractmethod
    def compact(self, rows: pa.Table, *, floor: pa.Table | None = None) -> pa.Table:
        """The rows a run of one partition's consecutive segments can be sealed into, such
        that merging them with any older and newer rows gives the same table as merging the
        originals. ``floor`` (key columns and the comparison column) gives, per key, the
        highest comparison value of the partition's earlier rows outside the run; only an
        engine that :attr:`needs_floor` reads it. Output: the table's columns plus system
        columns, sorted by key then (partition, offset)."""

    @property
    def indexed(self) -> bool:
        """Whether seals write delete vectors for the sealed rows a run supersedes (and so
        keep a key index, :mod:`millstream.sealing.keyindex`)."""
        return False

    @property
    def needs_floor(self) -> bool:
        """Whether :meth:`compact` materializes deletes' effective comparison values, and so
        needs the partition's earlier values as a floor."""
        return False

    @property
    def sealed_final(self) -> bool:
        """Whether a partition's sealed rows, minus its delete vectors, are already merged:
        one row per key, its winner against every older row (:mod:`millstream.core.final`)."""
        return False

    @property
    def merges_columns(self) -> bool:
        """Whether a key's current row is built from several of its rows' columns (so it may
        equal none of them, and every column decides it), rather than being one of them."""
        return False

    @property
    def winner_is_greatest(self) -> bool:
        """Whether a key's current row is its greatest row in the order key, whole: the
        winner of a union of rows is the winner of one part's winner and the other part, so a
        reader may merge new rows onto its previous read's winners (:mod:`millstream.table.poll`)."""
        return False

    def index_columns(self) -> list[str]:
        """The columns a key index keeps of each live sealed row."""
        raise ValueError(f"table {self.spec.name!r} is {self.mode}: it keeps no key index")

    def superseded(
        self, rows: pa.Table, new_pos: np.ndarray, idx_pos: np.ndarray, old: IndexColumn
    ) -> np.ndarray:
        """Of the matches between ``rows`` (a compacted run, newer than every sealed row of its
        partition) at ``new_pos`` and sealed rows at ``idx_pos`` (the same key), which sealed
        rows the run supersedes: a boolean mask over the matches. ``old`` reads a column of the
        sealed rows."""
        raise ValueError(f"table {self.spec.name!r} is {self.mode}: it keeps no key index")


class KeyedEngine(MergeEngine):
    """An engine with a primary key: rows of a key are put in the order key and folded."""

    def resolve(self, rows: pa.Table) -> pa.Table:
        fast = self._by_position(rows)
        if fast is not None:
            return fast
        ordered = in_order(self.spec, rows)
        if EFF in ordered.column_names:
            ordered = ordered.drop_columns([EFF])
        if ordered.num_rows == 0:
            return ordered.drop_columns([IDX, DEL])
        out = self._fold(ordered)
        out = out.sort_by([(IDX, "ascending")])
        return out.drop_columns([IDX, DEL])

    def compact(self, rows: pa.Table, *, floor: pa.Table | None = None) -> pa.Table:
        spec = self.spec
        ordered = in_order(spec, rows, floor=floor if self.needs_floor else None)
        if EFF in ordered.column_names:
            cmp_col = spec.comparison_column
            assert cmp_col is not None
            if self.needs_floor:  # materialize: EFF differs only for deletes without a value
                i = ordered.schema.get_field_index(cmp_col)
                field = ordered.schema.field(i)
                ordered = ordered.set_column(i, field, ordered.column(EFF).cast(field.type))
            ordered = ordered.drop_columns([EFF])
        out = self._compact_ordered(ordered) if ordered.num_rows else ordered
        # The run's rows in the order key go before the sealed order's copy is made: a seal of
        # a 2,500,000-row run held them beside it (issue 39).
        del ordered
        return seal_order(spec, out)

    def index_columns(self) -> list[str]:
        cols = [*self.spec.primary_key, OFFSET_COL]
        if self.spec.comparison_column is not None:
            cols.append(self.spec.comparison_column)
        return cols

    def superseded(
        self, rows: pa.Table, new_pos: np.ndarray, idx_pos: np.ndarray, old: IndexColumn
    ) -> np.ndarray:
        # The default: a delete resets a key, so the run's deletes supersede the key's sealed
        # rows (nothing before a delete affects the result; compaction keeps the last delete).
        is_del = np.asarray(deletes(self.spec, rows).to_numpy(zero_copy_only=False), dtype=bool)
        return np.asarray(is_del[new_pos], dtype=bool)

    def _by_position(self, rows: pa.Table) -> pa.Table | None:
        """A resolve by position alone (:func:`millstream.core.merge.by_position`) where the
        engine and ``rows`` allow one, else None."""
        return None

    @abstractmethod
    def _fold(self, ordered: pa.Table) -> pa.Table:
        """The rows that represent the keys of ``ordered`` (in the order key, with IDX and
        DEL, not empty), in any order."""

    def _compact_ordered(self, ordered: pa.Table) -> pa.Table:
        """:meth:`compact`'s rows of ``ordered`` (in the order key, with IDX and DEL, not
        empty): by default every row."""
        return ordered
