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

from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import pyarrow as pa

from millstream.ingest.decode import RAW_SCHEMA

#: The names of a :meth:`PartitionReader.read_range` batch's columns.
RECORD_NAMES = RAW_SCHEMA.names[:4]


class PartitionReader:
    """One source's partitions. Subclasses set :attr:`kind` and :attr:`Config` and implement
    the four hooks; ``start_offsets`` is where a run resumes (a rate-limited generator counts
    its production from there)."""

    #: The ``source.kind`` of a datastream spec this reader serves.
    kind: ClassVar[str]
    #: The reader's config class: a dataclass of JSON-able fields.
    Config: ClassVar[type[Any]]

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

    def read_range(self, partition: int, lo: int, hi: int) -> Iterator[pa.RecordBatch]:
        """Records of ``partition`` with offsets in ``[lo, hi)`` as batches of
        (partition, offset, key, value)."""
        raise NotImplementedError

    def read_records(self, ranges: list[tuple[int, int, int]]) -> Iterator[pa.RecordBatch]:
        """The records of ``ranges`` ``(partition, lo, hi)`` as (partition, offset, key,
        value) batches with the raw schema's types."""
        for p, lo, hi in ranges:
            for batch in self.read_range(p, lo, hi):
                if batch.num_rows:
                    yield pa.RecordBatch.from_arrays(raw_columns(batch), names=RECORD_NAMES)


def encode_offsets(offsets: Mapping[int, int]) -> dict[str, int]:
    return {str(p): int(o) for p, o in sorted(offsets.items())}


def decode_offsets(offsets: Mapping[str, Any] | None) -> dict[int, int]:
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
    partition: int, offsets: list[int], keys: list[bytes | None], values: list[bytes | None]
) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [
            pa.array([partition] * len(offsets), pa.int32()),
            pa.array(offsets, pa.int64()),
            pa.array(keys, pa.binary()),
            pa.array(values, pa.binary()),
        ],
        names=list(RECORD_NAMES),
    )
