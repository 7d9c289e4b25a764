"""Re-ingestion: rebuild a segment whose data file is lost or corrupt by re-reading its offset
range ``[start, end)`` from the source, then swapping the rebuilt file in by compare-and-set.

The manifest knows exactly which offsets a segment covers, and row identity is (partition,
offset), so the rebuilt segment holds the same rows the original did (a sealed segment is
compacted the same way again). Bad records in the range are already in the dead-letter table.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from millstream.catalog import Catalog
from millstream.clock import SYSTEM_CLOCK, Clock
from millstream.core.merge import compact
from millstream.datastream import DatastreamSpec
from millstream.errors import (
    AlreadyExistsError,
    CommitConflictError,
    InvalidSpecError,
    NotFoundError,
    SegmentChangedError,
    StagedFileExpiredError,
)
from millstream.ingest.decode import RAW_SCHEMA, decode_records
from millstream.ingest.sources import spec_reader
from millstream.metastore.models import Entry, SegmentState
from millstream.metastore.swaps import replace_entry
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
    reader = spec_reader(spec.source)
    batches = list(reader.read_range(entry.partition, entry.start, entry.end))
    raw = _raw_table(batches)
    rows = decode_records(table_spec, raw).rows
    if entry.state is SegmentState.ONLINE:
        manifest = catalog.manifest(entry.table)
        floor = comparison_floor_below(
            table_spec, catalog.deep, manifest, entry.partition, entry.start
        )
        rows = compact(table_spec, rows, floor=floor)
    path = f"{table_data_prefix(entry.table)}/reingest-p{entry.partition}-s{entry.seq}-{uuid.uuid4().hex}.parquet"
    size = catalog.deep.write_parquet(path, rows)
    age = clock.now() - written_at
    if age > max_staged_age:
        catalog.deep.delete(path)
        raise StagedFileExpiredError(path, age, max_staged_age)
    try:
        return replace_entry(
            catalog.store, entry, file_path=path, row_count=rows.num_rows, size_bytes=size
        )
    except (SegmentChangedError, CommitConflictError):
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
    return pa.table(
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


@dataclass
class ReingestJob:
    id: str
    segment: str
    state: str = "RUNNING"  # RUNNING | SUCCEEDED | FAILED
    started_at: float = 0.0
    finished_at: float | None = None
    error: str | None = None
    result: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "segment": self.segment,
            "state": self.state,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "error": self.error,
            "result": self.result,
        }


@dataclass
class ReingestJobs:
    """Re-ingestion jobs of one controller process; one running job per segment at most."""

    jobs: dict[str, ReingestJob] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(
        self, catalog: Catalog, spec: DatastreamSpec, segment: str, now: float
    ) -> ReingestJob:
        find_segment(catalog, segment)  # 404 / 422 before starting anything
        with self.lock:
            if any(j.segment == segment and j.state == "RUNNING" for j in self.jobs.values()):
                raise AlreadyExistsError("running re-ingestion job for segment", segment)
            job = ReingestJob(uuid.uuid4().hex[:12], segment, started_at=now)
            self.jobs[job.id] = job

        def _run() -> None:
            try:
                e = reingest_segment(catalog, spec, segment)
                job.result = {"segment": e.name, "rows": e.row_count, "file": e.file_path}
                job.state = "SUCCEEDED"
            except Exception as exc:
                job.error = str(exc).splitlines()[0][:1000] if str(exc) else type(exc).__name__
                job.state = "FAILED"
            job.finished_at = time.time()

        threading.Thread(target=_run, name=f"reingest-{segment}", daemon=True).start()
        return job

    def list(self) -> list[ReingestJob]:
        with self.lock:
            return sorted(self.jobs.values(), key=lambda j: j.started_at)
