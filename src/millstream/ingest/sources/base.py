"""What every Millstream stream source shares, on Spark's Python Data Source API.

Offsets are ``{partition: offset}`` (JSON keys are strings). Admission control comes from
``ReadMaxRows(max_records_per_batch)``; ``SupportsTriggerAvailableNow`` pins the target so
``trigger(availableNow=True)`` still runs in bounded batches. Every planned range
``[lo, hi)`` of a partition yields one *marker* row besides its records, so the sink learns
every range, even one with no records (offsets need not be contiguous), and the frontier
always advances over the whole range.

With the ``rangesOnly`` option the reader yields the markers alone, each flagged with
:data:`SELF_READ` as its value, and the sink reads every range itself through the same
:meth:`PartitionedStreamReader.read_range` (see :func:`reader_for`). Record data then never
passes through the JVM: a marker is one small row per range, while records would be turned
from Arrow into JVM rows and back into Arrow, in a second Python worker per task. Ranges are
fixed by the batch's offsets, so a replayed batch re-reads exactly the same records.

Subclasses implement four small hooks: :meth:`list_partitions`, :meth:`earliest_offsets`,
:meth:`latest_offsets` and :meth:`read_range`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from millstream.errors import InvalidSpecError
from millstream.ingest.decode import RAW_SCHEMA as RAW_ARROW
from millstream.options import Options

RAW_DDL = (
    "partition int, offset bigint, key binary, value binary, "
    "range_lo bigint, range_hi bigint, is_marker boolean"
)


#: The value of a marker whose range the sink must read itself (``rangesOnly`` sources).
SELF_READ = b"millstream:read-range"

#: Spark format name -> module and reader class of each Millstream source.
READERS = {
    "millstream_files": ("millstream.ingest.sources.files", "FilesStreamReader"),
    "millstream_kafka": ("millstream.ingest.sources.kafka", "KafkaStreamReader"),
    "millstream_generator": ("millstream.ingest.sources.generator", "GeneratorStreamReader"),
}


def reader_for(fmt: str, options: Mapping[str, str]) -> PartitionedStreamReader:
    """A reader of the source ``fmt`` (a Spark format name) with ``options``."""
    import importlib

    if fmt not in READERS:
        raise InvalidSpecError("source", f"unknown Millstream source format {fmt!r}")
    module, cls = READERS[fmt]
    reader: PartitionedStreamReader = getattr(importlib.import_module(module), cls)(
        Options(options)
    )
    return reader


def encode_offsets(offsets: dict[int, int]) -> dict[str, int]:
    return {str(p): int(o) for p, o in sorted(offsets.items())}


def decode_offsets(offsets: dict[str, Any] | None) -> dict[int, int]:
    return {int(p): int(o) for p, o in (offsets or {}).items()}


def split_budget(start: dict[int, int], latest: dict[int, int], budget: int) -> dict[int, int]:
    """End offsets admitting at most ``budget`` offsets over all partitions, shared in
    proportion to each partition's backlog (every partition with a backlog moves)."""
    backlog = {p: max(0, latest[p] - start.get(p, latest[p])) for p in latest}
    total = sum(backlog.values())
    if total <= budget:
        return dict(latest)
    end = {}
    for p, lag in backlog.items():
        share = max(1, budget * lag // total) if lag else 0
        end[p] = start.get(p, latest[p]) + min(lag, share)
    return end


class RangeTask(InputPartition):
    """One Spark task: ranges ``(partition, lo, hi)`` of one or more stream partitions."""

    def __init__(self, ranges: list[tuple[int, int, int]]) -> None:
        super().__init__(ranges)
        self.ranges = ranges


class PartitionedStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Base reader. Options: ``startOffsets`` (JSON, from the shard uppers), ``startingOffsets``
    (earliest|latest, for partitions with no start), ``maxRecordsPerBatch``, ``tasks``."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = Options(options)
        options = self.options
        self.max_rows = int(options.get("maxRecordsPerBatch", "100000"))
        if self.max_rows < 1:
            raise InvalidSpecError("max_records_per_batch", "must be at least 1")
        self.start_offsets = decode_offsets(json.loads(options.get("startOffsets") or "{}"))
        self.starting = options.get("startingOffsets", "earliest")
        self.tasks = int(options.get("tasks", "2"))
        self.ranges_only = options.get("rangesOnly", "false").lower() == "true"
        self._target: dict[int, int] | None = None
        self._gate_store: Any = None

    # -- hooks -----------------------------------------------------------------------------

    def list_partitions(self) -> list[int]:
        raise NotImplementedError

    def earliest_offsets(self) -> dict[int, int]:
        raise NotImplementedError

    def latest_offsets(self) -> dict[int, int]:
        raise NotImplementedError

    def read_range(self, partition: int, lo: int, hi: int) -> Iterator[pa.RecordBatch]:
        """Records of ``partition`` with offsets in ``[lo, hi)`` as batches of
        (partition, offset, key, value)."""
        raise NotImplementedError

    # -- Spark API -------------------------------------------------------------------------

    def _fill_new_partitions(self, start: dict[int, int], latest: dict[int, int]) -> dict[int, int]:
        missing = [p for p in latest if p not in start]
        if not missing:
            return start
        base = self.earliest_offsets() if self.starting == "earliest" else latest
        return {**start, **{p: base.get(p, 0) for p in missing}}

    def initialOffset(self) -> dict[str, int]:
        latest = self.latest_offsets()
        return encode_offsets(self._fill_new_partitions(dict(self.start_offsets), latest))

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self.latest_offsets()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, int]:
        begin = decode_offsets(start)
        latest = self._target if self._target is not None else self.latest_offsets()
        begin = self._fill_new_partitions(begin, latest)
        latest = {p: max(latest.get(p, o), o) for p, o in begin.items()}
        if isinstance(limit, ReadAllAvailable):
            return encode_offsets(self._follow_shards(begin, latest))
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else self.max_rows
        return encode_offsets(self._follow_shards(begin, split_budget(begin, latest, budget)))

    def _follow_shards(self, begin: dict[int, int], end: dict[int, int]) -> dict[int, int]:
        """A warm standby (``gate*`` options) that may not commit plans no further than what the
        active has committed. So it stays warm but never runs ahead of the shard upper, and the
        first batch it plans once the active is gone starts at the upper and commits directly:
        no gap, no restart."""
        ds = self.options.get("gateDatastream")
        if not ds:
            return end
        import time

        from millstream.config import Settings
        from millstream.control.workers import may_commit
        from millstream.metastore.store import MetadataStore

        if self._gate_store is None:
            self._gate_store = MetadataStore(Settings.from_options(self.options).metadata_url)
        store = self._gate_store
        ttl = float(self.options.get("gateWorkerTtl") or 6.0)
        if may_commit(
            store, ds, self.options.get("gateWorker", ""), worker_ttl=ttl, now=time.time()
        ):
            return end
        uppers = {sh.partition: sh.upper for sh in store.list_shards(self.options["gateTable"])}
        return {p: max(begin.get(p, e), min(e, uppers.get(p, e))) for p, e in end.items()}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        begin, stop = decode_offsets(start), decode_offsets(end)
        ranges = [
            (p, begin.get(p, hi), hi) for p, hi in sorted(stop.items()) if hi > begin.get(p, hi)
        ]
        n = max(1, min(self.tasks, len(ranges)))
        buckets: list[list[tuple[int, int, int]]] = [[] for _ in range(n)]
        load = [0] * n
        for r in sorted(ranges, key=lambda r: r[2] - r[1], reverse=True):
            i = load.index(min(load))
            buckets[i].append(r)
            load[i] += r[2] - r[1]
        return [RangeTask(sorted(b)) for b in buckets if b]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangeTask)
        if self.ranges_only:
            yield markers_batch(partition.ranges)
            return
        for p, lo, hi in partition.ranges:
            for batch in self.read_range(p, lo, hi):
                n = batch.num_rows
                if n:
                    yield pa.RecordBatch.from_arrays(
                        [
                            *raw_columns(batch),
                            pa.array(np.full(n, lo, dtype=np.int64)),
                            pa.array(np.full(n, hi, dtype=np.int64)),
                            pa.array(np.zeros(n, dtype=bool)),
                        ],
                        schema=RAW_ARROW,
                    )
            yield marker_batch(p, lo, hi)

    def commit(self, end: dict[str, Any]) -> None:
        pass


def marker_batch(partition: int, lo: int, hi: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [
            pa.array([partition], pa.int32()),
            pa.array([hi], pa.int64()),
            pa.array([None], pa.binary()),
            pa.array([None], pa.binary()),
            pa.array([lo], pa.int64()),
            pa.array([hi], pa.int64()),
            pa.array([True], pa.bool_()),
        ],
        schema=RAW_ARROW,
    )


def markers_batch(ranges: list[tuple[int, int, int]]) -> pa.RecordBatch:
    """Marker rows for ``ranges`` whose records the sink reads itself (:data:`SELF_READ`)."""
    n = len(ranges)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([p for p, _, _ in ranges], pa.int32()),
            pa.array([hi for _, _, hi in ranges], pa.int64()),
            pa.nulls(n, pa.binary()),
            pa.array([SELF_READ] * n, pa.binary()),
            pa.array([lo for _, lo, _ in ranges], pa.int64()),
            pa.array([hi for _, _, hi in ranges], pa.int64()),
            pa.array([True] * n, pa.bool_()),
        ],
        schema=RAW_ARROW,
    )


def raw_columns(batch: pa.RecordBatch) -> list[pa.Array]:
    """(partition, offset, key, value) of a :meth:`~PartitionedStreamReader.read_range` batch,
    with the raw schema's types."""
    return [
        batch.column(0).cast(pa.int32()),
        batch.column(1).cast(pa.int64()),
        batch.column(2).cast(pa.binary()),
        batch.column(3).cast(pa.binary()),
    ]


def read_records(
    reader: PartitionedStreamReader, ranges: list[tuple[int, int, int]]
) -> Iterator[pa.RecordBatch]:
    """The records of ``ranges`` as (partition, offset, key, value) batches."""
    names = RAW_ARROW.names[:4]
    for p, lo, hi in ranges:
        for batch in reader.read_range(p, lo, hi):
            if batch.num_rows:
                yield pa.RecordBatch.from_arrays(raw_columns(batch), names=names)


def records_batch(
    partition: int, offsets: list[int], keys: list[bytes | None], values: list[bytes | None]
) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [
            pa.array([partition] * len(offsets), pa.int32()),
            pa.array(offsets, pa.int64()),
            pa.array(keys, pa.binary()),
            pa.array(values, pa.binary()),
        ],
        names=["partition", "offset", "key", "value"],
    )
