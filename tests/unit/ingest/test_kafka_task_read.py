"""A write task reads all its Kafka ranges through one assignment of one consumer: one fetch
wait per task instead of one per range (bench/scale.py: with a broker that holds each fetch
for ``fetch.wait.max.ms``, 100 ms per range kept the worker's task slots busy waiting, and a
task's time grew with its partitions). The records, their order per range and the last
timestamps are those of reading range by range."""

from __future__ import annotations

import pyarrow as pa
from confluent_kafka import TopicPartition
from kafka_fakes import OneConsumerPool

from millstream.ingest.sources.base import PartitionReader
from millstream.ingest.sources.kafka import KafkaConfig, KafkaReader

PARTITIONS = 64
RECORDS = 12


class _Msg:
    def __init__(self, p: int, o: int) -> None:
        self.p, self.o = p, o

    def partition(self) -> int:
        return self.p

    def offset(self) -> int:
        return self.o

    def key(self) -> bytes:
        return f"k{self.p}".encode()

    def value(self) -> bytes:
        return f'{{"p": {self.p}, "o": {self.o}}}'.encode()

    def error(self) -> None:
        return None

    def timestamp(self) -> tuple[int, int]:
        return 1, 1_000_000 + 1000 * self.p + self.o

    def headers(self) -> None:
        return None


class _Consumer:
    """Every assigned partition is fetched in each ``consume`` (as one fetch request)."""

    def __init__(self) -> None:
        self.assigned: dict[int, int] = {}
        self.assigns = 0
        self.paused: set[int] = set()
        self.consumes = 0

    def assign(self, tps: list[TopicPartition]) -> None:
        self.assigns += 1
        self.assigned = {tp.partition: tp.offset for tp in tps}
        self.paused = set()

    def unassign(self) -> None:
        self.assigned = {}
        self.paused = set()

    def pause(self, tps: list[TopicPartition]) -> None:
        self.paused |= {tp.partition for tp in tps}

    def resume(self, tps: list[TopicPartition]) -> None:
        self.resumed = {tp.partition for tp in tps}

    def consume(self, num_messages: int, timeout: float) -> list[_Msg]:
        self.consumes += 1
        out: list[_Msg] = []
        for p, pos in sorted(self.assigned.items()):
            if p in self.paused:
                continue
            take = max(0, min(RECORDS - pos, 5, num_messages - len(out)))  # 5 per fetch
            out += [_Msg(p, o) for o in range(pos, pos + take)]
            self.assigned[p] = pos + take
        return out

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self.assigned[tp.partition]) for tp in tps]


def _reader() -> tuple[KafkaReader, _Consumer]:
    consumer = _Consumer()
    return KafkaReader(
        KafkaConfig("127.0.0.1:1", "t"), consumers=OneConsumerPool(consumer)
    ), consumer


def test_a_tasks_ranges_are_read_with_one_assignment_and_equal_reading_them_one_by_one() -> None:
    ranges = [(p, p % 3, RECORDS - (p % 2)) for p in range(PARTITIONS)]
    reader, consumer = _reader()
    stamps: dict[int, int] = {}
    batches = list(reader.read_records(ranges, last_record_ms=stamps))

    assert consumer.assigns == 1
    assert consumer.resumed == set(range(PARTITIONS))  # the pooled consumer is usable again
    assert consumer.consumes < 8  # a few fetches of all 64 partitions, not one per range

    one_by_one, alone = _reader()
    alone_stamps: dict[int, int] = {}
    expected = list(PartitionReader.read_records(one_by_one, ranges, last_record_ms=alone_stamps))
    assert alone.assigns == PARTITIONS
    got = pa.Table.from_batches(batches)
    assert got.equals(pa.Table.from_batches(expected))
    assert stamps == alone_stamps == {p: 1_000_000 + 1000 * p + hi - 1 for p, _, hi in ranges}
    # per range, in the order of the ranges
    assert got.column("partition").to_pylist() == [p for p, lo, hi in ranges for _ in range(lo, hi)]
    assert got.column("offset").to_pylist() == [o for _, lo, hi in ranges for o in range(lo, hi)]
