"""Deleted keys come back over a real Kafka-protocol broker, on an upsert table with a
comparison column, before and after sealing.

Each key gets a prefix of ``insert(ts=1), tombstone, insert(ts=5), insert(ts=0)`` (the last a
late older record), interleaved with the other keys' records across two partitions (a key's
partition is its id modulo 2, as a key partitioner would place it). A tombstone has no comparison
value: it takes the highest its key had before it in its partition, so the re-insert at ts=5
brings the key back and the late ts=0 record does not. (On main the tombstone ordered after
every record and deleted the key forever.) The table must equal the documented model
(:func:`millstream.reference.model.model_rows`, fed by the source-side oracle) and the rule spelled
out per key, before any seal and after sealing every partition. A second round then sends each
key ``tombstone, insert(ts=3)``: with every earlier row of the key sealed, the seal takes the
tombstone's value from the key index.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from harness.ingest_support import assert_same_rows, shard_uppers
from millstream.catalog import Catalog
from millstream.datastream import DatastreamSpec
from millstream.local.tansu import TansuBroker
from millstream.metastore.models import SegmentState
from millstream.reference.oracle import RawRecord, expected_table
from millstream.sealing.sealer import Sealer
from millstream.spark.runner import DatastreamRunner
from millstream.table.read import read_manifest

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

PARTITIONS = 2
KEYS = 240
#: The first round's steps; key k gets the first ``k % 5`` of them.
FIRST_ROUND: list[int | None] = [1, None, 5, 0]  # a ts, or None for a tombstone
SECOND_ROUND: list[int | None] = [None, 3]


def _first_round_expected(k: int) -> int | None:
    """The ts of key k's current row after the first round, or None if it is absent."""
    steps = FIRST_ROUND[: k % 5]
    return {0: None, 1: 1, 2: None, 3: 5, 4: 5}[len(steps)]


def _second_round_expected(k: int) -> int | None:
    """After ``tombstone, insert(ts=3)``: the tombstone takes the key's highest ts so far (5
    once the first round reached the re-insert), so ts=3 is older and the key stays absent."""
    return None if k % 5 >= 3 else 3


def _produce(
    bootstrap: str, topic: str, round_steps: list[int | None], *, first_round: bool
) -> list[RawRecord]:
    """Produce the round for every key, step by step (so keys interleave), and return what the
    broker acknowledged. One record per batch: Tansu's watermark is exact only then."""
    from confluent_kafka import Producer

    acked: list[RawRecord] = []
    failures: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            failures.append(str(err))
        else:
            acked.append((msg.partition(), msg.offset(), msg.key(), msg.value()))

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 0,
            "batch.num.messages": 1,
            "acks": "all",
            "enable.idempotence": False,
            "max.in.flight.requests.per.connection": 1,  # keep each partition's order
            "log.connection.close": False,
        }
    )
    sent = 0
    for step, ts in enumerate(round_steps):
        for k in range(KEYS):
            if first_round and step >= k % 5:
                continue
            value = None if ts is None else json.dumps({"id": k, "v": f"k{k}@{ts}", "ts": ts})
            producer.produce(
                topic,
                key=str(k).encode(),
                value=None if value is None else value.encode(),
                partition=k % PARTITIONS,
                on_delivery=on_delivery,
            )
            producer.poll(0)
            sent += 1
    producer.flush(60)
    assert not failures, f"the broker refused records: {failures[:3]}"
    assert len(acked) == sent, "some records were never acknowledged"
    return acked


def _spec(bootstrap: str, topic: str) -> DatastreamSpec:
    return DatastreamSpec.parse(
        {
            "name": "recreate",
            "source": {"kind": "kafka", "bootstrap_servers": bootstrap, "topic": topic},
            "table": {
                "name": "recreate",
                "mode": "upsert",
                "primary_key": ["id"],
                "comparison_column": "ts",
            },
            "schema": {"id": "long", "v": "string", "ts": "long"},
            "max_records_per_batch": 150,  # several micro-batches per round
            "segments": {"flush_rows": 10_000_000, "flush_seconds": 86_400},
        }
    )


def _check(cat: Catalog, spec: DatastreamSpec, records: list[RawRecord], expected: Any) -> None:
    """The table equals the model of ``records`` and ``expected(k)`` per key, read with and
    without delete vectors."""
    model, bad = expected_table(spec.table_spec(), records)
    assert bad == []
    by_rule = [
        {"id": k, "v": f"k{k}@{ts}", "ts": ts}
        for k in range(KEYS)
        if (ts := expected(k)) is not None
    ]
    assert_same_rows(model, by_rule, what="the model vs the rule spelled out per key")
    m = cat.manifest(spec.table_name)
    for use_dv in (True, False):
        got = read_manifest(cat.deep, m, use_delete_vectors=use_dv).to_pylist()
        assert_same_rows(got, by_rule, what=f"{spec.table_name} (delete vectors: {use_dv})")


def _seal_every_partition(cat: Catalog, table: str) -> None:
    sealer = Sealer(cat, table)
    for p in range(PARTITIONS):
        assert sealer.seal_partition(p, force=True) is not None, f"partition {p} had no run"
    states = {e.state for e in cat.manifest(table).entries}
    assert states == {SegmentState.ONLINE}


def test_upsert_with_comparison_column_over_broker_recreates_deleted_keys_before_and_after_seals(
    kafka_broker: TansuBroker, spark: Any, tmp_path: Path
) -> None:
    topic = f"recreate-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(topic, PARTITIONS)
    spec = _spec(kafka_broker.bootstrap, topic)
    records = _produce(kafka_broker.bootstrap, topic, FIRST_ROUND, first_round=True)
    ends = {p: 1 + max(o for q, o, _, _ in records if q == p) for p in range(PARTITIONS)}

    with Catalog.open(home=tmp_path / "home") as cat:
        DatastreamRunner(spec, cat, spark, writer_id="w1").run(available_now=True)
        assert shard_uppers(cat, spec.table_name) == ends
        manifest = cat.manifest(spec.table_name)
        assert len(manifest.entries) > PARTITIONS, "expected several micro-batches"
        assert all(e.state is not SegmentState.ONLINE for e in manifest.entries), "no seal yet"
        _check(cat, spec, records, _first_round_expected)

        _seal_every_partition(cat, spec.table_name)
        _check(cat, spec, records, _first_round_expected)

        second = _produce(kafka_broker.bootstrap, topic, SECOND_ROUND, first_round=False)
        records += second
        DatastreamRunner(spec, cat, spark, writer_id="w1").run(available_now=True)
        _check(cat, spec, records, _second_round_expected)
        _seal_every_partition(cat, spec.table_name)
        _check(cat, spec, records, _second_round_expected)
