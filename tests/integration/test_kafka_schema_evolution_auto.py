"""``source.schema_evolution: auto`` end to end: a topic on the Tansu broker whose producer
moves from Avro writer schema v1 to v2 (an added optional field, ``qty`` widened int -> long)
midway through each partition, ingested by a running writer (several micro-batches, no
restart): the table grows once, v2 records keep the new values, v1 rows read null, nothing is
dead-lettered and the frontier reaches the end of the topic."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import pytest

from harness.ingest_support import produce_exact, shard_uppers
from harness.schema_registry import TestSchemaRegistry
from millstream.catalog import Catalog
from millstream.datastream import DatastreamSpec
from millstream.local.tansu import TansuBroker
from millstream.spark.runner import DatastreamRunner

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

PARTITIONS = 2
PER_PARTITION = 600
BATCH = 250

V1: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "millstream.evo",
    "fields": [{"name": "id", "type": "long"}, {"name": "qty", "type": "int"}],
}
V2: dict[str, Any] = {
    **V1,
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "qty", "type": "long"},
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}


def test_a_running_writer_grows_its_table_to_a_new_writer_schema(
    kafka_broker: TansuBroker, spark: Any, tmp_path: Path
) -> None:
    topic = "evolve-auto"
    kafka_broker.create_topic(topic, PARTITIONS)
    sr = importlib.import_module("confluent_kafka.schema_registry")
    ser = importlib.import_module("confluent_kafka.serialization")
    avro = importlib.import_module("confluent_kafka.schema_registry.avro")
    with TestSchemaRegistry() as registry:
        client = sr.SchemaRegistryClient({"url": registry.url})
        ctx = ser.SerializationContext(topic, ser.MessageField.VALUE)
        v1 = avro.AvroSerializer(client, json.dumps(V1))
        v2 = avro.AvroSerializer(client, json.dumps(V2))
        rows: dict[int, list[tuple[bytes | None, bytes | None]]] = {}
        for p in range(PARTITIONS):
            for i in range(PER_PARTITION):
                key = p * PER_PARTITION + i
                if i < PER_PARTITION // 2:
                    value = v1({"id": key, "qty": i}, ctx)
                else:
                    value = v2({"id": key, "qty": 2**32 + i, "note": f"n{key}"}, ctx)
                rows.setdefault(p, []).append((None, bytes(value)))
        produce_exact(kafka_broker.bootstrap, topic, rows)
        spec = DatastreamSpec.parse(
            {
                "name": "evolve-auto",
                "source": {
                    "kind": "kafka",
                    "bootstrap_servers": kafka_broker.bootstrap,
                    "topic": topic,
                    "format": "avro",
                    "schema_registry": {"url": registry.url},
                    "schema_evolution": "auto",
                },
                "schema": {"id": "long", "qty": "int"},
                "max_records_per_batch": BATCH,
            }
        )
        with Catalog.open(home=tmp_path / "home") as cat:
            runner = DatastreamRunner(spec, cat, spark, writer_id="w-evolve")
            stats = runner.run(available_now=True)
            assert stats.restarts == 0
            assert len(runner.commits()) >= 3, "expected several batches"
            table = cat.store.get_table(spec.table_name)
            assert table.spec.columns == {"id": "long", "qty": "long", "note": "string"}
            assert table.schema_version == 2, "evolved once"
            assert shard_uppers(cat, spec.table_name) == dict.fromkeys(
                range(PARTITIONS), PER_PARTITION
            )
            assert cat.read_table(spec.dead_letter_table).num_rows == 0
            got = sorted(cat.read_table(spec.table_name).to_pylist(), key=lambda r: r["id"])
            half = PER_PARTITION // 2
            assert got == [
                {
                    "id": p * PER_PARTITION + i,
                    "qty": i if i < half else 2**32 + i,
                    "note": None if i < half else f"n{p * PER_PARTITION + i}",
                }
                for p in range(PARTITIONS)
                for i in range(PER_PARTITION)
            ]
