"""A schema registry that goes down while Avro records with a schema id no process has cached
arrive, through Kafka and Spark: the batch waits and retries, the frontier does not skip.

A continuous writer ingests a first lot of Avro records (schema v1); the registry is then
stopped and a second lot, written with a NEW schema (v2: one more field, so a new id), is
produced. While the registry is down nothing of the second lot may commit: the shard uppers
stay at the first lot's ends and the dead-letter table stays empty, checked over several
seconds. The registry comes back on the same port; the second lot must then be ingested whole,
the table equal to the sequential model, with no dead letters and no writer restart. (The
decode-level retry itself is in ``tests/unit/ingest/test_formats.py``.)
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from harness.cluster import wait_until
from harness.ingest_support import (
    assert_same_rows,
    produce_exact,
    shard_uppers,
    uppers_or_empty,
    writer_in_background,
)
from harness.schema_registry import TestSchemaRegistry
from millstream.catalog import Catalog
from millstream.datastream import DatastreamSpec
from millstream.local.tansu import TansuBroker
from millstream.reference.model import model_rows
from millstream.spark.runner import DatastreamRunner

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

PARTITIONS = 2
PER_PARTITION = 300
KEYS = 150
#: how long the registry stays down with the second lot waiting (behaviour is checked
#: throughout; the figure only bounds the test's length)
DOWN_SECONDS = 6.0


def _schema(version: int) -> str:
    fields: list[dict[str, Any]] = [
        {"name": "id", "type": "long"},
        {"name": "qty", "type": "long"},
    ]
    if version == 2:
        fields.append({"name": "note", "type": ["null", "string"], "default": None})
    return json.dumps({"type": "record", "name": "Item", "namespace": "t", "fields": fields})


def _serializer(registry_url: str, version: int) -> Any:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer

    return AvroSerializer(SchemaRegistryClient({"url": registry_url}), _schema(version))


def _lot(
    registry_url: str, topic: str, version: int, start: int
) -> tuple[dict[int, list[tuple[bytes | None, bytes | None]]], dict[bytes, dict[str, Any]]]:
    """``{partition: [(key, value)]}`` of Avro values under schema ``version``, and each
    value's row."""
    from confluent_kafka.serialization import MessageField, SerializationContext

    ser = _serializer(registry_url, version)
    ctx = SerializationContext(topic, MessageField.VALUE)
    rows: dict[int, list[tuple[bytes | None, bytes | None]]] = {}
    twin: dict[bytes, dict[str, Any]] = {}
    for p in range(PARTITIONS):
        for i in range(PER_PARTITION):
            n = start + p * PER_PARTITION + i
            row: dict[str, Any] = {"id": n % KEYS, "qty": n}
            if version == 2:
                row["note"] = f"v2-{n}"
            value = bytes(ser(row, ctx))
            twin[value] = {"id": row["id"], "qty": row["qty"]}
            rows.setdefault(p, []).append((str(row["id"]).encode(), value))
    return rows, twin


def test_registry_down_the_batch_waits_and_the_frontier_does_not_skip(
    kafka_broker: TansuBroker, spark: Any, tmp_path: Path
) -> None:
    topic = f"registry-down-{time.monotonic_ns() % 10**8}"
    kafka_broker.create_topic(topic, PARTITIONS)
    registry = TestSchemaRegistry().start()
    spec = DatastreamSpec.parse(
        {
            "name": "items",
            "source": {
                "kind": "kafka",
                "bootstrap_servers": kafka_broker.bootstrap,
                "topic": topic,
                "format": "avro",
                "schema_registry": {"url": registry.url, "max_wait_seconds": 600},
            },
            "table": {"mode": "upsert", "primary_key": ["id"]},
            "schema": {"id": "long", "qty": "long"},
            "max_records_per_batch": 200,
            "trigger_interval": "200ms",
        }
    )
    first, twin1 = _lot(registry.url, topic, 1, 0)
    # v2 is registered now (the producer needs it) but no decoder has seen its id yet.
    second, twin2 = _lot(registry.url, topic, 2, 10_000)
    twin = {**twin1, **twin2}
    acked1 = produce_exact(kafka_broker.bootstrap, topic, first)
    ends1 = {p: 1 + max(o for q, o, _, _ in acked1 if q == p) for p in range(PARTITIONS)}

    cat = Catalog.open(home=tmp_path / "home")
    runner = DatastreamRunner(spec, cat, spark, writer_id="w")
    try:  # the writer stops first (it may be reading from the registry), then the registry
        with writer_in_background(runner, "writer-registry-down") as errors:
            wait_until(
                "the first lot is ingested",
                lambda: not errors and uppers_or_empty(cat, spec.table_name) == ends1,
                timeout=240,
            )
            registry.stop()  # refused connections from now on
            acked2 = produce_exact(kafka_broker.bootstrap, topic, second)
            ends2 = {p: 1 + max(o for q, o, _, _ in acked2 if q == p) for p in range(PARTITIONS)}
            assert all(ends2[p] > ends1[p] for p in range(PARTITIONS))
            deadline = time.monotonic() + DOWN_SECONDS
            while time.monotonic() < deadline:
                assert not errors, errors
                assert shard_uppers(cat, spec.table_name) == ends1, "committed past a record"
                assert cat.read_table(spec.dead_letter_table).num_rows == 0, "dead-lettered"
                time.sleep(0.5)
            registry.start()  # the same port (TestSchemaRegistry keeps it)
            wait_until(
                "the second lot is ingested once the registry is back",
                lambda: not errors and shard_uppers(cat, spec.table_name) == ends2,
                timeout=240,
            )
    finally:
        registry.stop()
    assert not errors, errors
    assert runner.stats.restarts == 0, "the batch waited: the writer did not restart"
    assert cat.read_table(spec.dead_letter_table).num_rows == 0
    model_input = [
        {**twin[v], "_ms_partition": p, "_ms_offset": o, "_ms_tombstone": False}
        for p, o, _, v in [*acked1, *acked2]
        if v is not None
    ]
    expected = model_rows(spec.table_spec(), model_input)
    assert len(expected) == KEYS
    assert_same_rows(cat.read_table(spec.table_name).to_pylist(), expected, what="items")
