"""Every record of a default-batching producer arrives over the bundled broker, and the lag
says so honestly.

A default confluent-kafka ``Producer`` sends several records per produce batch, and Tansu
answers a partition's high watermark as the base offset of its last batch plus one: a consumer
reads offsets 0-2 while the watermark says 1. Planned to that watermark, a writer committed the
first record of the batch, never read the rest (a tombstone among them) and reported a lag of
0. The reader now probes past a watermark that moved and plans to the highest offset the source
has shown. This drives the production path: the writer's query (planner and sink read) and the
status's source offsets (the lag).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from harness.ingest_support import assert_same_rows, shard_uppers
from millstream.api.status import upstream_offsets
from millstream.catalog import Catalog
from millstream.datastream import DatastreamSpec
from millstream.local.tansu import TansuBroker
from millstream.reference.oracle import RawRecord, expected_table
from millstream.spark.runner import DatastreamRunner

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

PARTITIONS = 2


def _produce_batched(
    bootstrap: str, topic: str, rows: list[tuple[int, int, str | None]]
) -> list[RawRecord]:
    """``(partition, id, v or None for a tombstone)`` through a default-batching producer (one
    flush at the end); what the broker acknowledged."""
    from confluent_kafka import Producer

    acked: list[RawRecord] = []
    failures: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            failures.append(str(err))
        else:
            acked.append((msg.partition(), msg.offset(), msg.key(), msg.value()))

    producer = Producer({"bootstrap.servers": bootstrap})
    for p, k, v in rows:
        value = None if v is None else json.dumps({"id": k, "v": v}).encode()
        producer.produce(
            topic, key=str(k).encode(), value=value, partition=p, on_delivery=on_delivery
        )
    producer.flush(60)
    assert not failures, failures
    assert len(acked) == len(rows)
    return acked


def _ends(records: list[RawRecord]) -> dict[int, int]:
    return {p: 1 + max(o for q, o, _, _ in records if q == p) for p in range(PARTITIONS)}


def test_a_default_batching_producers_records_all_arrive_and_the_lag_is_honest(
    kafka_broker: TansuBroker, spark: Any, tmp_path: Path
) -> None:
    from confluent_kafka import Consumer, TopicPartition

    topic = f"batched-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(topic, PARTITIONS)
    spec = DatastreamSpec.parse(
        {
            "name": "batched",
            "source": {
                "kind": "kafka",
                "bootstrap_servers": kafka_broker.bootstrap,
                "topic": topic,
            },
            "table": {"name": "batched", "mode": "upsert", "primary_key": ["id"]},
            "schema": {"id": "long", "v": "string"},
        }
    )
    # keys 0-9 on partition k % 2, updated, then key 4 deleted and key 6 deleted and re-inserted;
    # partition 0's last record is the tombstone of key 4
    first = [(k % 2, k, f"a{k}") for k in range(10)] + [(k % 2, k, f"b{k}") for k in range(10)]
    first += [(0, 6, None), (0, 6, "c6"), (0, 4, None)]
    records = _produce_batched(kafka_broker.bootstrap, topic, first)
    ends = _ends(records)

    probe = Consumer({"bootstrap.servers": kafka_broker.bootstrap, "group.id": "watermarks"})
    try:
        marks = {
            p: probe.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(PARTITIONS)
        }
    finally:
        probe.close()
    assert any(marks[p] < ends[p] for p in range(PARTITIONS)), (
        f"the broker's watermarks {marks} are exact ({ends}): this test no longer shows a "
        "watermark short of the records served"
    )

    (before,) = upstream_offsets([spec], 30).values()
    assert before.offsets == ends, "the lag must count every record the broker serves"

    with Catalog.open(home=tmp_path / "home") as cat:
        DatastreamRunner(spec, cat, spark, writer_id="w1").run(available_now=True)
        assert shard_uppers(cat, spec.table_name) == ends
        model, bad = expected_table(spec.table_spec(), records)
        assert bad == []
        assert {r["id"] for r in model} == set(range(10)) - {4}
        assert_same_rows(cat.read_table(spec.table_name).to_pylist(), model, what="batched")

        # a second batch of records, the last one a re-insert of the deleted key
        second = [(1, 9, "d9"), (0, 2, None), (1, 7, "d7"), (0, 4, "back")]
        records += _produce_batched(kafka_broker.bootstrap, topic, second)
        ends = _ends(records)
        (behind,) = upstream_offsets([spec], 30).values()
        assert behind.offsets == ends  # a lag of 2 per partition, not 0
        assert ends != shard_uppers(cat, spec.table_name)

        DatastreamRunner(spec, cat, spark, writer_id="w1").run(available_now=True)
        assert shard_uppers(cat, spec.table_name) == ends
        model, _ = expected_table(spec.table_spec(), records)
        assert {r["id"] for r in model} == set(range(10)) - {2}
        assert_same_rows(cat.read_table(spec.table_name).to_pylist(), model, what="batched")
        (after,) = upstream_offsets([spec], 30).values()
        assert after.offsets == shard_uppers(cat, spec.table_name)  # caught up: lag 0
