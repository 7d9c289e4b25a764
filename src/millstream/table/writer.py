"""Staging data files and committing them: the write half every writer (the Spark sink, tests,
the sealer) shares."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa

from millstream.errors import CommitStateUnknownError, InvalidSpecError
from millstream.metastore.models import AppendResult, ShardAppend
from millstream.metastore.store import MetadataStore
from millstream.spec import OFFSET_COL, PARTITION_COL, TableSpec
from millstream.storage.deepstore import DeepStore, table_data_prefix


@dataclass(frozen=True, slots=True)
class StagedFile:
    """A data file written to the deep store but not (yet) referenced by the manifest."""

    path: str | None
    size_bytes: int
    #: partition -> rows of that partition in the file
    row_counts: Mapping[int, int]


def stage_rows(
    deep: DeepStore, spec: TableSpec, rows: pa.Table, *, name_hint: str = "batch"
) -> StagedFile:
    """Write ``rows`` (table columns + system columns) as one Parquet file sorted by
    (partition, offset). No file is written for zero rows."""
    if rows.num_rows == 0:
        return StagedFile(None, 0, {})
    schema = spec.arrow_schema(system_columns=True)
    try:
        rows = rows.select(schema.names).cast(schema)
    except (KeyError, pa.ArrowInvalid) as exc:
        raise InvalidSpecError("rows", f"do not match table {spec.name!r}: {exc}") from exc
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
    """compare_and_append ``staged`` for every partition in ``ranges`` (``{p: (lo, hi)}``), in one
    transaction. If the manifest ends up not referencing the file (every shard dropped or
    gapped), the file is deleted right away instead of waiting for garbage collection."""
    extra = set(staged.row_counts) - set(ranges)
    if extra:
        raise InvalidSpecError(
            "ranges", f"the file holds rows of partitions {sorted(extra)} with no range"
        )
    appends = [
        ShardAppend(
            partition=p,
            lo=lo,
            hi=hi,
            epoch=epochs.get(p, 0),
            file_path=staged.path if staged.row_counts.get(p, 0) else None,
            row_count=staged.row_counts.get(p, 0),
            size_bytes=staged.size_bytes,
        )
        for p, (lo, hi) in ranges.items()
    ]
    try:
        result = store.compare_and_append(table, appends, writer_id=writer_id, batch_id=batch_id)
    except CommitStateUnknownError:
        raise  # the file may be referenced now: only garbage collection may decide
    except BaseException:
        if staged.path is not None:  # fenced or failed before COMMIT: nothing references it
            deep.delete(staged.path)
        raise
    if staged.path is not None and staged.path not in result.files_referenced:
        deep.delete(staged.path)
    return result
