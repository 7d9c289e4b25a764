"""Re-ingestion: rebuild a segment whose data file is lost or corrupt by re-reading its offset
range ``[start, end)`` from the source, then swapping the rebuilt file in by compare-and-set.

The manifest knows exactly which offsets a segment covers, and row identity is (partition,
offset), so the rebuilt segment holds the same rows the original did (a sealed segment is
compacted the same way again). Bad records in the range are already in the dead-letter table.
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from sqlalchemy import Connection, select, update

from millstream.catalog import Catalog
from millstream.core.merge import compact
from millstream.datastream import DatastreamSpec
from millstream.errors import AlreadyExistsError, InvalidSpecError, MillstreamError, NotFoundError
from millstream.ingest.decode import decode_records
from millstream.metastore import schema as s
from millstream.metastore.models import Entry, SegmentState
from millstream.metastore.store import get_entry, insert_entry, publish_version
from millstream.storage.deepstore import table_data_prefix


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


def reingest_segment(catalog: Catalog, spec: DatastreamSpec, name: str) -> Entry:
    """Re-read the segment's range from ``spec``'s source and swap the rebuilt file in."""
    from millstream.ingest.runner import make_reader  # pyspark-backed readers, loaded lazily

    entry = find_segment(catalog, name)
    table_spec = catalog.table(entry.table).spec
    reader = make_reader(spec)
    batches = list(reader.read_range(entry.partition, entry.start, entry.end))
    raw = _raw_table(batches)
    rows = decode_records(table_spec, raw).rows
    if entry.state is SegmentState.ONLINE:
        rows = compact(table_spec, rows)
    path = f"{table_data_prefix(entry.table)}/reingest-p{entry.partition}-s{entry.seq}-{uuid.uuid4().hex}.parquet"
    size = catalog.deep.write_parquet(path, rows)
    try:
        return _swap(catalog, entry, path, rows.num_rows, size)
    except BaseException:
        catalog.deep.delete(path)
        raise


def _raw_table(batches: list[pa.RecordBatch]) -> pa.Table:
    from millstream.ingest.decode import RAW_SCHEMA

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


def _swap(catalog: Catalog, old: Entry, path: str, rows: int, size: int) -> Entry:
    store = catalog.store

    def _txn(conn: Connection) -> Entry:
        info = store._table(conn, old.table)
        assert info is not None
        row = conn.execute(select(s.entries).where(s.entries.c.id == old.id)).mappings().first()
        if row is None or row["removed_version"] is not None:
            raise MillstreamError(
                f"segment {old.name} changed while it was re-ingested (sealed or rolled back); "
                "nothing was swapped",
                segment=old.name,
            )
        version = info.manifest_version + 1
        now = store.clock.now()
        conn.execute(
            update(s.entries)
            .where(s.entries.c.id == old.id, s.entries.c.version == row["version"])
            .values(removed_version=version, version=row["version"] + 1)
        )
        new_id = insert_entry(
            conn,
            table=old.table,
            partition=old.partition,
            seq=old.seq,
            file_path=path,
            start=old.start,
            end=old.end,
            state=old.state,
            row_count=rows,
            size_bytes=size,
            added_version=version,
            now=now,
            writer_id="reingest",
        )
        publish_version(conn, info, "reingest", now)
        return get_entry(conn, new_id)

    entry, _ = store.retrying(_txn)
    return entry  # type: ignore[no-any-return]


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
            import time

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
