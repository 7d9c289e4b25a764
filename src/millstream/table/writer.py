"""Staging data files and committing them: the write half every writer (the Spark sink, tests,
the sealer) shares."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from millstream.core.merge import lacks_comparison_value, missing_comparison_error
from millstream.errors import InvalidSpecError
from millstream.metastore.models import AppendResult
from millstream.spec import OFFSET_COL, PARTITION_COL, TableSpec
from millstream.storage.deepstore import DeepStore, table_data_prefix
from millstream.table.commit import StagedFile, StagedWrite, commit_writes
from millstream.types import decimal_overflow, has_decimal, overflowing_decimal_text

# Annotations only: a write task (which stages files; the driver commits) loads no metadata
# store, SQLAlchemy included (~35 MiB a Python worker).
if TYPE_CHECKING:
    from millstream.metastore.store import MetadataStore

__all__ = ["RowStager", "StagedFile", "commit_staged", "stage_rows"]


def _refuse_decimal_overflow(spec: TableSpec, rows: pa.Table) -> None:
    """A decimal with more integer digits than its column's precision is never stored
    (Parquet would keep it, and reads would return a value the type cannot hold)."""
    for c in spec.columns:
        if not has_decimal(rows.schema.field(c).type):
            continue
        over = decimal_overflow(rows.column(c).combine_chunks())
        if over.any():
            first = int(np.flatnonzero(over)[0])
            raise InvalidSpecError(
                f"rows.{c}",
                f"{int(over.sum())} row(s) of table {spec.name!r}: decimal overflow, the first "
                f"{_shown(rows.column(c)[first])} does not fit {spec.columns[c]}",
            )


def _shown(value: pa.Scalar) -> str:
    if pa.types.is_decimal(value.type):
        return overflowing_decimal_text(value)
    return repr(value.as_py())


def _checked(spec: TableSpec, rows: pa.Table) -> pa.Table:
    """``rows`` in the table's schema (table columns + system columns), sorted by
    (partition, offset); refuses a decimal that overflows its column and a row that is not a
    delete and lacks the comparison value (decode dead-letters such records)."""
    schema = spec.arrow_schema(system_columns=True)
    try:
        rows = rows.select(schema.names).cast(schema)
    except (KeyError, pa.ArrowInvalid) as exc:
        raise InvalidSpecError("rows", f"do not match table {spec.name!r}: {exc}") from exc
    _refuse_decimal_overflow(spec, rows)
    bad = lacks_comparison_value(spec, rows)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        partition, offset = rows.column(PARTITION_COL)[first], rows.column(OFFSET_COL)[first]
        raise InvalidSpecError(
            f"rows.{spec.comparison_column}",
            f"{int(bad.sum())} row(s) of table {spec.name!r}, the first at partition "
            f"{partition} offset {offset}: {missing_comparison_error(spec)}",
        )
    return rows.sort_by([(PARTITION_COL, "ascending"), (OFFSET_COL, "ascending")])


def _counts(rows: pa.Table) -> dict[int, int]:
    """Rows per partition (``value_counts``: no Arrow execution plan, which ``group_by``
    starts on Arrow's thread pool for every staged piece of every table)."""
    counts = pc.value_counts(rows.column(PARTITION_COL))
    return dict(
        zip(
            counts.field("values").to_pylist(),
            counts.field("counts").to_pylist(),
            strict=True,
        )
    )


def _staged_path(spec: TableSpec, name_hint: str) -> str:
    return f"{table_data_prefix(spec.name)}/{name_hint}-{uuid.uuid4().hex}.parquet"


def stage_rows(
    deep: DeepStore, spec: TableSpec, rows: pa.Table, *, name_hint: str = "batch"
) -> StagedFile:
    """Write ``rows`` (table columns + system columns) as one Parquet file sorted by
    (partition, offset). No file is written for zero rows. Refuses rows that are not deletes
    and lack the comparison value (decode dead-letters such records)."""
    if rows.num_rows == 0:
        return StagedFile(None, 0, {})
    rows = _checked(spec, rows)
    path = _staged_path(spec, name_hint)
    size = deep.write_parquet(path, rows)
    return StagedFile(path, size, _counts(rows))


#: Rows a :class:`RowStager` writes as one row group (a sealed file's row groups are as large).
STAGE_GROUP_ROWS = 131_072


class RowStager:
    """Stages rows that come in pieces as one Parquet file, holding at most a row group's
    worth (:data:`STAGE_GROUP_ROWS`) at a time: a write task's memory no longer grows with
    the records it wrote. Each piece is checked as :func:`stage_rows` checks its rows; pieces
    must come in (partition, offset) order, as a task reads its ranges (one out of order is
    an error naming both positions: the file must hold its rows in that order, as
    :func:`stage_rows` writes them). No file for zero rows. :meth:`abort` deletes what was
    written."""

    def __init__(self, deep: DeepStore, spec: TableSpec, *, name_hint: str = "batch") -> None:
        self.deep, self.spec, self.name_hint = deep, spec, name_hint
        self.path: str | None = None
        self._writer: Any = None
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._counts: dict[int, int] = {}
        self._last: tuple[int, int] | None = None

    def add(self, rows: pa.Table) -> None:
        if rows.num_rows == 0:
            return
        rows = _checked(self.spec, rows)
        first = (rows.column(PARTITION_COL)[0].as_py(), rows.column(OFFSET_COL)[0].as_py())
        if self._last is not None and first <= self._last:
            raise ValueError(
                f"rows of table {self.spec.name!r} staged out of order: partition {first[0]} "
                f"offset {first[1]} after partition {self._last[0]} offset {self._last[1]}"
            )
        n = rows.num_rows
        self._last = (
            rows.column(PARTITION_COL)[n - 1].as_py(),
            rows.column(OFFSET_COL)[n - 1].as_py(),
        )
        for p, c in _counts(rows).items():
            self._counts[p] = self._counts.get(p, 0) + c
        self._pending.append(rows)
        self._pending_rows += n
        if self._pending_rows >= STAGE_GROUP_ROWS:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        rows = pa.concat_tables(self._pending)
        self._pending, self._pending_rows = [], 0
        if self._writer is None:
            self.path = _staged_path(self.spec, self.name_hint)
            self._writer = self.deep.parquet_writer(self.path, rows.schema)
        self._writer.write_table(rows)

    def finish(self) -> StagedFile:
        self._flush()
        if self._writer is None:
            return StagedFile(None, 0, {})
        self._writer.close()
        self._writer = None
        assert self.path is not None
        self.deep.sync(self.path)  # before any commit references it
        return StagedFile(self.path, self.deep.size(self.path), dict(self._counts))

    def abort(self) -> None:
        self._pending = []
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
            self._writer = None
        if self.path is not None:
            self.deep.delete(self.path)


def commit_staged(
    store: MetadataStore,
    deep: DeepStore,
    table: str,
    staged: StagedFile,
    ranges: Mapping[int, tuple[int, int]],
    epochs: Mapping[int, int],
    *,
    writer_id: str | None = None,
    batch_id: int | None = None,
) -> AppendResult:
    """Commit one staged file of ``table`` for every partition in ``ranges`` (``{p: (lo,
    hi)}``) through the production commit path (:func:`millstream.table.commit.commit_writes`,
    what the Spark sink runs), with no dead-letter table: one transaction, and a file the
    manifest ends up not referencing is deleted right away. A range starting above its shard's
    upper is a GAP outcome in the result (the sink raises ShardGapError for it)."""
    return commit_writes(
        store,
        deep,
        table,
        [StagedWrite(ranges, staged)],
        epochs=epochs,
        writer_id=writer_id,
        batch_id=batch_id,
        raise_for_gaps=False,
    ).table
