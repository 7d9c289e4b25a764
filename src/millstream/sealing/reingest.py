"""Re-ingestion: rebuild a segment whose data file is lost or corrupt by re-reading its offset
range ``[start, end)`` from the source, then swapping the rebuilt file in by compare-and-set.

The manifest knows exactly which offsets a segment covers, and row identity is (partition,
offset), so the rebuilt segment holds the same rows the original did (a sealed segment is
compacted the same way again). Bad records in the range are already in the dead-letter table.

Only if the source still holds the whole range: a Kafka read of an offset that retention
deleted fails (``SourceGapError``) or, with ``on_data_loss: accept``, skips to the earliest
one, and a files source whose files were deleted ends early, so a re-read could rebuild the
segment with rows missing. :func:`check_source_range` refuses (:class:`SourceRangeGoneError`, with
the reason) before the read and again after it (retention may move on while it reads).
"""

from __future__ import annotations

import uuid

import pyarrow as pa

from millstream.catalog import Catalog
from millstream.clock import SYSTEM_CLOCK, Clock
from millstream.core.engines import engine_for
from millstream.datastream import DatastreamSpec
from millstream.errors import (
    CommitConflictError,
    InvalidSpecError,
    NotFoundError,
    SegmentChangedError,
    SourceRangeGoneError,
    StagedFileExpiredError,
)
from millstream.ingest.decode import decode_records
from millstream.ingest.formats import decoder_for
from millstream.ingest.sources import config_for, reader_for
from millstream.ingest.sources.base import RAW_SCHEMA, PartitionReader
from millstream.metastore.models import Entry, SegmentState
from millstream.sealing.keyindex import comparison_floor_below
from millstream.storage.deepstore import table_data_prefix
from millstream.table.gc import MAX_STAGED_AGE_SECONDS


def parse_segment_name(name: str) -> tuple[str, int, int]:
    try:
        table, partition, seq = name.rsplit("__", 2)
        return table, int(partition), int(seq)
    except ValueError:
        raise InvalidSpecError(
            "segment", f"{name!r} is not a segment name like orders__0__12"
        ) from None


def find_segment(catalog: Catalog, name: str) -> Entry:
    table, partition, seq = parse_segment_name(name)
    for e in catalog.manifest(table).entries:
        if e.partition == partition and e.seq == seq:
            return e
    raise NotFoundError("segment", name)


#: Why a segment cannot be re-read (``SourceRangeGoneError.reason``, the ``reason`` label of
#: ``millstream_segments_unrecoverable``).
RETENTION_EXPIRED = "retention_expired"
SOURCE_GONE = "source_gone"


def check_source_range(reader: PartitionReader, entry: Entry) -> None:
    """Raise :class:`SourceRangeGoneError` unless the source holds all of the entry's range:
    its earliest offset at or below the start (else retention expired part of it) and its
    latest at or above the end (else the source was truncated, or its files deleted)."""
    earliest = reader.earliest_offsets().get(entry.partition)
    latest = reader.latest_offsets().get(entry.partition)
    if earliest is None or latest is None:
        raise SourceRangeGoneError(
            entry.table,
            entry.name,
            SOURCE_GONE,
            f"the source has no partition {entry.partition} any more",
        )
    if earliest > entry.start:
        raise SourceRangeGoneError(
            entry.table,
            entry.name,
            RETENTION_EXPIRED,
            f"the source's earliest offset of partition {entry.partition} is {earliest}, past "
            f"the segment's start {entry.start} (retention deleted the records in between)",
        )
    if latest < entry.end:
        raise SourceRangeGoneError(
            entry.table,
            entry.name,
            SOURCE_GONE,
            f"the source's partition {entry.partition} ends at offset {latest}, before the "
            f"segment's end {entry.end} (truncated, or its files were deleted)",
        )


def reingest_segment(
    catalog: Catalog,
    spec: DatastreamSpec,
    name: str,
    *,
    max_staged_age: float = MAX_STAGED_AGE_SECONDS,
    clock: Clock = SYSTEM_CLOCK,
) -> Entry:
    """Re-read the segment's range from ``spec``'s source and swap the rebuilt file in.

    Like a writer's commit, the swap refuses a rebuilt file written more than
    ``max_staged_age`` ago (:class:`StagedFileExpiredError`; the file is deleted and nothing
    changes): until the swap lands nothing references it, and garbage collection deletes
    unreferenced files older than its grace period (twice that age)."""
    entry = find_segment(catalog, name)
    written_at = clock.now()  # before writing: the file is never older than this
    table_spec = catalog.table(entry.table).spec
    kind, config = config_for(spec.source)
    reader = reader_for(kind, config)
    check_source_range(reader, entry)
    batches = list(reader.read_range(entry.partition, entry.start, entry.end))
    check_source_range(reader, entry)  # retention may have moved past the start meanwhile
    raw = _raw_table(batches)
    # the source's format (Avro, Protobuf, CSV ...), as the writer decoded it
    rows = decode_records(table_spec, raw, decoder_for(config)).rows
    if entry.state is SegmentState.ONLINE:
        manifest = catalog.manifest(entry.table)
        floor = comparison_floor_below(
            table_spec, catalog.deep, manifest, entry.partition, entry.start
        )
        rows = engine_for(table_spec).compact(rows, floor=floor)
    path = f"{table_data_prefix(entry.table)}/reingest-p{entry.partition}-s{entry.seq}-{uuid.uuid4().hex}.parquet"
    size = catalog.deep.write_parquet(path, rows)

    def young_enough() -> None:
        age = clock.now() - written_at
        if age > max_staged_age:
            raise StagedFileExpiredError(path, age, max_staged_age)

    try:
        young_enough()  # before the transaction: no swap attempted for a file already too old
        # and again inside it, right before COMMIT: a stall between this line and the swap
        # (a lock wait, a paused process) longer than GC's grace would otherwise swap in a
        # file GC has already deleted
        return catalog.store.replace_entry(
            entry,
            file_path=path,
            row_count=rows.num_rows,
            size_bytes=size,
            precondition=young_enough,
        )
    except (SegmentChangedError, CommitConflictError, StagedFileExpiredError):
        # The swap refused (precondition) or gave up (lost every compare-and-set): nothing
        # references the file. On anything else (an unknown outcome a re-read did not resolve,
        # an interrupt during COMMIT) the swap may have landed: the file stays for GC.
        catalog.deep.delete(path)
        raise


def _raw_table(batches: list[pa.RecordBatch]) -> pa.Table:
    n = sum(b.num_rows for b in batches)
    if not batches or n == 0:
        return RAW_SCHEMA.empty_table()
    t = pa.Table.from_batches(batches)
    raw = pa.table(
        {
            "partition": t.column("partition").cast(pa.int32()),
            "offset": t.column("offset").cast(pa.int64()),
            "key": t.column("key").cast(pa.binary()),
            "value": t.column("value").cast(pa.binary()),
            "range_lo": pa.array([0] * n, pa.int64()),
            "range_hi": pa.array([0] * n, pa.int64()),
            "is_marker": pa.array([False] * n),
        },
        schema=RAW_SCHEMA,
    )
    # the reader's optional columns, as the sink passes them on (a table's metadata columns:
    # the record's Kafka timestamp and headers)
    for name in ("timestamp", "headers"):
        if name in t.column_names:
            raw = raw.append_column(name, t.column(name))
    return raw
