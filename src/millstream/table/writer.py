"""Staging data files and committing them: the write half every writer (the Spark sink, tests,
the sealer) shares."""

from __future__ import annotations

import uuid
from collections.abc import Mapping

import numpy as np
import pyarrow as pa

from millstream.core.merge import lacks_comparison_value, missing_comparison_error
from millstream.errors import InvalidSpecError
from millstream.metastore.models import AppendResult
from millstream.metastore.store import MetadataStore
from millstream.spec import OFFSET_COL, PARTITION_COL, TableSpec
from millstream.storage.deepstore import DeepStore, table_data_prefix
from millstream.table.commit import StagedFile, StagedWrite, commit_writes
from millstream.types import decimal_overflow, has_decimal, overflowing_decimal_text

__all__ = ["StagedFile", "commit_staged", "stage_rows"]


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


def stage_rows(
    deep: DeepStore, spec: TableSpec, rows: pa.Table, *, name_hint: str = "batch"
) -> StagedFile:
    """Write ``rows`` (table columns + system columns) as one Parquet file sorted by
    (partition, offset). No file is written for zero rows. Refuses rows that are not deletes
    and lack the comparison value (decode dead-letters such records)."""
    if rows.num_rows == 0:
        return StagedFile(None, 0, {})
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
    rows = rows.sort_by([(PARTITION_COL, "ascending"), (OFFSET_COL, "ascending")])
    counts = rows.group_by([PARTITION_COL]).aggregate([(OFFSET_COL, "count")])
    row_counts = dict(
        zip(
            counts.column(PARTITION_COL).to_pylist(),
            counts.column(f"{OFFSET_COL}_count").to_pylist(),
            strict=True,
        )
    )
    path = f"{table_data_prefix(spec.name)}/{name_hint}-{uuid.uuid4().hex}.parquet"
    size = deep.write_parquet(path, rows)
    return StagedFile(path, size, row_counts)


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
