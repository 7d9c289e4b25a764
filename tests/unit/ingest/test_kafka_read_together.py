"""A shared query's write task reads its Kafka members' ranges together: the members of one
client config through ONE consumer, one assignment and one fetch session, instead of a consumer
and a fetch session per topic (100 one-partition topics in a task cost a lease, an assignment,
a fetch and a pause each). What each member gets is exactly what its own read would give: its
ranges' records and no other record of its topic, its last record's timestamp; a group that
cannot be read together is left out, and each of its members reads on its own."""

from __future__ import annotations

import itertools

import pyarrow as pa
import pytest
from confluent_kafka import Producer

from millstream.ingest.sources import kafka
from millstream.ingest.sources.kafka import ConsumerPool, KafkaConfig, KafkaReader, read_together
from millstream.local.tansu import TansuBroker

TOPICS = 6
RECORDS = 20
_names = itertools.count()


def _topics(broker: TansuBroker) -> list[str]:
    """Fresh topics of one partition, each holding RECORDS records (keyed, timestamped)."""
    run = next(_names)
    topics = [f"together-{run}-{i}" for i in range(TOPICS)]
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for t in topics:
        broker.create_topic(t, 1)
    for t in topics:
        for o in range(RECORDS):
            producer.produce(
                t, key=f"{t}-{o}".encode(), value=b'{"o": %d}' % o, timestamp=1_000_000 + o
            )
    assert producer.flush(30) == 0
    return topics


def _readers(broker: TansuBroker, topics: list[str], pool: ConsumerPool) -> list[KafkaReader]:
    return [KafkaReader(KafkaConfig(broker.bootstrap, t), consumers=pool) for t in topics]


def test_many_topics_read_together_give_each_exactly_its_own_read(
    kafka_broker: TansuBroker,
) -> None:
    topics = _topics(kafka_broker)
    # ranges ending below the topic's end: the fetch brings later records, which are not
    # the member's (they belong to a later batch)
    ranges = {t: [(0, 2 + i, 9 + i)] for i, t in enumerate(topics)}
    pool = ConsumerPool()
    together = read_together(
        {
            t: (r, ranges[t])
            for t, r in zip(topics, _readers(kafka_broker, topics, pool), strict=True)
        }
    )

    assert set(together) == set(topics)
    assert len(pool) == 1  # one consumer read every topic
    alone_pool = ConsumerPool()
    try:
        for t, reader in zip(topics, _readers(kafka_broker, topics, alone_pool), strict=True):
            stamps: dict[int, int] = {}
            alone = pa.Table.from_batches(
                list(reader.read_records(ranges[t], last_record_ms=stamps))
            )
            got = pa.Table.from_batches(together[t].batches)
            assert got.equals(alone), t
            _, lo, hi = ranges[t][0]
            assert got.column("offset").to_pylist() == list(range(lo, hi))
            assert got.column("key").to_pylist() == [f"{t}-{o}".encode() for o in range(lo, hi)]
            assert together[t].last_record_ms == stamps == {0: 1_000_000 + hi - 1}
    finally:
        pool.close()
        alone_pool.close()


def test_a_group_that_cannot_be_read_together_is_left_to_read_alone(
    kafka_broker: TansuBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A range the topic does not hold (past its end) never completes: the group gives up
    after its stall time, none of its members is answered, and each reads on its own (where
    its own read's checks name its topic)."""
    monkeypatch.setattr(kafka, "TOGETHER_STALL_S", 1.0)
    topics = _topics(kafka_broker)
    pool = ConsumerPool()
    readers = _readers(kafka_broker, topics, pool)
    reads = {t: (r, [(0, 0, 5)]) for t, r in zip(topics, readers, strict=True)}
    reads[topics[0]] = (readers[0], [(0, 0, RECORDS + 5)])  # past the topic's end
    try:
        assert read_together(reads) == {}
        # the next task's read together is not held by the failed one's consumer
        del reads[topics[0]]
        assert set(read_together(reads)) == set(topics[1:])
    finally:
        pool.close()
