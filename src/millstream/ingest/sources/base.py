"""What every Millstream source shares: a partitioned log read by offset range, without Spark.

A source is a :class:`PartitionReader`: four small hooks (:meth:`~PartitionReader.list_partitions`,
:meth:`~PartitionReader.earliest_offsets`, :meth:`~PartitionReader.latest_offsets` and
:meth:`~PartitionReader.read_range`) over partitions numbered from 0 and offsets that only
grow. Readers are built from a plain, JSON-able *config* (a dataclass per source kind), so a
reader can be rebuilt anywhere: in a Spark task (:mod:`millstream.spark.sources`), in the
driver for lag, or by a re-ingestion that reads a segment's range again.

Offsets are ``{partition: offset}``; across JSON their keys are strings
(:func:`encode_offsets` / :func:`decode_offsets`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

import pyarrow as pa

#: Raw record columns every Millstream stream source yields. ``[range_lo, range_hi)`` is the
#: source range of the record's task; marker rows (``is_marker``) carry a range with no record,
#: so empty ranges still advance the frontier.
RAW_SCHEMA = pa.schema(
    [
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("range_lo", pa.int64()),
        ("range_hi", pa.int64()),
        ("is_marker", pa.bool_()),
    ]
)
#: The names of a :meth:`PartitionReader.read_range` batch's columns.
RECORD_NAMES = RAW_SCHEMA.names[:4]
#: The optional fifth column of a batch of a source with record timestamps (epoch ms).
TIMESTAMP_NAME = "timestamp"
#: The optional column of a batch with record headers (a JSON object as a string; only when
#: ``source.metadata_columns`` asks for them).
HEADERS_NAME = "headers"
#: Optional batch columns :meth:`PartitionReader.read_records` passes on (for metadata columns).
EXTRA_NAMES = (TIMESTAMP_NAME, HEADERS_NAME)


#: Readers asked for their latest offsets at once by :meth:`PartitionReader.latest_offsets_of`.
LATEST_THREADS = 8


class PartitionReader:
    """One source's partitions. Subclasses set :attr:`kind` and :attr:`Config` and implement
    the four hooks; ``start_offsets`` is where a run resumes (a rate-limited generator counts
    its production from there)."""

    #: The ``source.kind`` of a datastream spec this reader serves.
    kind: ClassVar[str]
    #: The reader's config class: a dataclass of JSON-able fields.
    Config: ClassVar[type[Any]]
    #: Whether :meth:`read_range` batches carry a ``timestamp`` column (epoch ms, the
    #: source's record time: Kafka's record timestamp). Sources without one (files,
    #: generator) leave it out, and the writer records its ingestion time instead.
    record_timestamps: ClassVar[bool] = False
    #: What a record is assumed to weigh (bytes of value) where :meth:`record_bytes` cannot
    #: tell: the adaptive batch budget divides a task's memory by it.
    typical_record_bytes: ClassVar[int] = 1024

    def __init__(self, config: Any, *, start_offsets: Mapping[int, int] | None = None) -> None:
        self.config = config
        self.start_offsets = dict(start_offsets or {})

    @classmethod
    def config_from_spec(cls, fields: dict[str, Any]) -> Any:
        """The config from the fields of a datastream's ``source`` section."""
        raise NotImplementedError

    def list_partitions(self) -> list[int]:
        raise NotImplementedError

    def earliest_offsets(self) -> dict[int, int]:
        raise NotImplementedError

    def latest_offsets(self) -> dict[int, int]:
        raise NotImplementedError

    @classmethod
    def earliest_offsets_of(
        cls, readers: Sequence[PartitionReader]
    ) -> list[dict[int, int] | Exception]:
        """The :meth:`earliest_offsets` of several readers of this kind, in their order, as
        :meth:`latest_offsets_of` asks their ends: each on a thread of its own unless the
        kind overrides this."""

        def ask(r: PartitionReader) -> dict[int, int] | Exception:
            try:
                return r.earliest_offsets()
            except Exception as exc:
                return exc

        if len(readers) <= 1:
            return [ask(r) for r in readers]
        with ThreadPoolExecutor(min(len(readers), LATEST_THREADS), "earliest-offsets") as pool:
            return list(pool.map(ask, readers))

    @classmethod
    def latest_offsets_of(
        cls, readers: Sequence[PartitionReader]
    ) -> list[dict[int, int] | Exception]:
        """The :meth:`latest_offsets` of several readers of this kind, in their order; a
        reader whose answer failed gets its error in its place. By default each is asked on a
        thread of its own (each answer waits on its source); a kind whose source answers for
        many partitions at once (Kafka: one request for every topic) overrides this."""

        def ask(r: PartitionReader) -> dict[int, int] | Exception:
            try:
                return r.latest_offsets()
            except Exception as exc:
                return exc

        if len(readers) <= 1:
            return [ask(r) for r in readers]
        with ThreadPoolExecutor(min(len(readers), LATEST_THREADS), "latest-offsets") as pool:
            return list(pool.map(ask, readers))

    def record_bytes(self) -> float | None:
        """Mean size in bytes of a record's value, where the source knows it cheaply (the
        files source from its line index); None: :attr:`typical_record_bytes` is assumed."""
        return None

    def read_range(self, partition: int, lo: int, hi: int) -> Iterator[pa.RecordBatch]:
        """Records of ``partition`` with offsets in ``[lo, hi)`` as batches of
        (partition, offset, key, value)."""
        raise NotImplementedError

    def read_records(
        self,
        ranges: list[tuple[int, int, int]],
        *,
        last_record_ms: dict[int, int] | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """The records of ``ranges`` ``(partition, lo, hi)`` as (partition, offset, key,
        value) batches with the raw schema's types, plus the batch's optional columns
        (:data:`EXTRA_NAMES`) where it has them. ``last_record_ms``, if given, receives
        per partition the timestamp of the last record read that has one (ranges in offset
        order, as the sink reads them)."""
        for p, lo, hi in ranges:
            for batch in self.read_range(p, lo, hi):
                if batch.num_rows:
                    if last_record_ms is not None:
                        stamp = last_timestamp(batch)
                        if stamp is not None:
                            last_record_ms[p] = stamp
                    extra = [n for n in EXTRA_NAMES if n in batch.schema.names]
                    yield pa.RecordBatch.from_arrays(
                        [*raw_columns(batch), *(batch.column(n) for n in extra)],
                        names=[*RECORD_NAMES, *extra],
                    )


def latest_offsets_of(
    readers: Mapping[str, PartitionReader],
) -> dict[str, dict[int, int] | Exception]:
    """``{name: latest offsets, or the error asking raised}`` of several readers, each kind
    asked through its :meth:`PartitionReader.latest_offsets_of` (all of a kind at once)."""
    return _by_kind(readers, lambda kind, rs: kind.latest_offsets_of(rs))


def earliest_offsets_of(
    readers: Mapping[str, PartitionReader],
) -> dict[str, dict[int, int] | Exception]:
    """``{name: earliest offsets, or the error asking raised}`` of several readers, each kind
    asked through its :meth:`PartitionReader.earliest_offsets_of` (all of a kind at once)."""
    return _by_kind(readers, lambda kind, rs: kind.earliest_offsets_of(rs))


def _by_kind(
    readers: Mapping[str, PartitionReader],
    ask: Callable[[type[PartitionReader], list[PartitionReader]], list[dict[int, int] | Exception]],
) -> dict[str, dict[int, int] | Exception]:
    """``ask(kind, its readers)`` once per kind of reader, its answers by reader name."""
    kinds: dict[type[PartitionReader], list[str]] = {}
    for name, r in readers.items():
        kinds.setdefault(type(r), []).append(name)
    out: dict[str, dict[int, int] | Exception] = {}
    for kind, names in kinds.items():
        out.update(zip(names, ask(kind, [readers[n] for n in names]), strict=True))
    return out


def last_timestamp(batch: pa.RecordBatch) -> int | None:
    """The ``timestamp`` (epoch ms) of a :meth:`PartitionReader.read_range` batch's last record
    (None if the batch has no such column, or the record no timestamp)."""
    if TIMESTAMP_NAME not in batch.schema.names or batch.num_rows == 0:
        return None
    value = batch.column(TIMESTAMP_NAME)[batch.num_rows - 1].as_py()
    return None if value is None else int(value)


def encode_offsets(offsets: Mapping[int, int]) -> dict[str, int]:
    return {str(p): int(o) for p, o in sorted(offsets.items())}


def decode_offsets(offsets: Mapping[str, Any] | None) -> dict[int, int]:
    return {int(p): int(o) for p, o in (offsets or {}).items()}


def split_budget(start: dict[int, int], latest: dict[int, int], budget: int) -> dict[int, int]:
    """End offsets admitting ``budget`` offsets over all partitions, shared in proportion to
    each partition's backlog (largest remainders first, so the shares add up to the budget)
    and every partition with a backlog moving (by one offset at least, even if that takes
    more than the budget: more partitions with a backlog than the budget holds).

    Rounding each share down instead left up to one offset per partition unread per batch,
    so with many partitions a catch-up of N budgets took N + 1 batches (256 partitions,
    1M rows, 100,000 a batch: an 11th batch of ~2,500 rows, ~0.4 s)."""
    backlog = {p: max(0, latest[p] - start.get(p, latest[p])) for p in latest}
    total = sum(backlog.values())
    if total <= budget:
        return dict(latest)
    share = {p: budget * lag // total for p, lag in backlog.items()}
    left = budget - sum(share.values())
    by_remainder = sorted(backlog, key=lambda p: (-(budget * backlog[p] % total), p))
    for p in by_remainder[:left]:
        share[p] += 1
    return {
        p: start.get(p, latest[p]) + min(lag, max(1, share[p]) if lag else 0)
        for p, lag in backlog.items()
    }


#: A record in a write task weighs about this many times its raw value: its decoded Arrow
#: columns, the raw piece being decoded beside the rows kept, and the Parquet staging. Measured:
#: a task of 500,000 137-byte JSON records peaked 250 MiB above an idle Python worker (3.7x).
DECODED_PER_RAW_BYTE = 4
#: The adaptive budget never plans fewer records than this per batch.
MIN_ADAPTIVE_BATCH = 1_000


def adaptive_budget(tasks: int, task_memory_bytes: int, record_bytes: float) -> int:
    """Records per batch when ``max_records_per_batch`` is not set: as many as ``tasks``
    write tasks hold in ``task_memory_bytes`` each, a record weighing
    :data:`DECODED_PER_RAW_BYTE` times ``record_bytes`` once decoded (at least
    :data:`MIN_ADAPTIVE_BATCH`). A batch takes what is there up to this budget, so a caught-up
    datastream's batches stay as small as what arrives per trigger, and one that is behind
    catches up in a few large batches instead of many small ones."""
    per_record = max(16.0, float(record_bytes)) * DECODED_PER_RAW_BYTE
    return max(MIN_ADAPTIVE_BATCH, int(max(1, tasks) * task_memory_bytes // per_record))


def raw_columns(batch: pa.RecordBatch) -> list[pa.Array]:
    """(partition, offset, key, value) of a :meth:`PartitionReader.read_range` batch, with the
    raw schema's types."""
    return [
        batch.column(0).cast(pa.int32()),
        batch.column(1).cast(pa.int64()),
        batch.column(2).cast(pa.binary()),
        batch.column(3).cast(pa.binary()),
    ]


def records_batch(
    partition: int,
    offsets: list[int],
    keys: list[bytes | None],
    values: list[bytes | None],
    timestamps: list[int | None] | None = None,
    headers: list[str | None] | None = None,
) -> pa.RecordBatch:
    """A :meth:`PartitionReader.read_range` batch; with ``timestamps`` (epoch ms, None where a
    record has none) it has a fifth column, :data:`TIMESTAMP_NAME`, and with ``headers`` (JSON
    objects) a column :data:`HEADERS_NAME`."""
    arrays = [
        pa.array([partition] * len(offsets), pa.int32()),
        pa.array(offsets, pa.int64()),
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
    ]
    names = list(RECORD_NAMES)
    if timestamps is not None:
        arrays.append(pa.array(timestamps, pa.int64()))
        names.append(TIMESTAMP_NAME)
    if headers is not None:
        arrays.append(pa.array(headers, pa.string()))
        names.append(HEADERS_NAME)
    return pa.RecordBatch.from_arrays(arrays, names=names)
