"""source.format avro and protobuf end to end: a topic on the Tansu broker produced with
confluent-kafka's AvroSerializer / ProtobufSerializer against the test schema registry,
ingested by every merge engine, equals the sequential model of its JSON twins (the same
generator orders as JSON); its bad values (wrong magic byte, truncated, unknown schema id)
are in the dead-letter table with their raw bytes, once each, and the frontier (the shard
uppers) moved past them to the end of the topic."""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.formats import OrdersEncoder
from harness.ingest_support import (
    PARTITIONS,
    TABLE_SECTIONS,
    assert_same_rows,
    produce_exact,
    shard_uppers,
)
from harness.schema_registry import TestSchemaRegistry
from millstream.catalog import Catalog
from millstream.datastream import DatastreamSpec
from millstream.ingest.sources.generator import ORDERS_SCHEMA, GeneratorConfig, generate
from millstream.local.tansu import TansuBroker
from millstream.reference.oracle import RawRecord, expected_table
from millstream.spark.runner import DatastreamRunner

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

SEED = 20260713
PER_PARTITION = 2_000
BATCH = 3_000
_ids = itertools.count()


@dataclass
class WireTopic:
    bootstrap: str
    name: str
    registry: str
    wire: list[RawRecord]  # what the broker holds
    twins: list[RawRecord]  # the same records with their JSON values

    def ends(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for p, o, _, _ in self.wire:
            out[p] = max(out.get(p, 0), o + 1)
        return out


@pytest.fixture(scope="module")
def registry():
    with TestSchemaRegistry() as reg:
        yield reg


@pytest.fixture(scope="module", params=["avro", "protobuf"])
def wire_topic(request, kafka_broker: TansuBroker, registry: TestSchemaRegistry) -> WireTopic:
    fmt = request.param
    print(f"seed {SEED}")
    name = f"orders-{fmt}-{next(_ids)}"
    kafka_broker.create_topic(name, PARTITIONS)
    cfg = GeneratorConfig(
        seed=SEED, partitions=PARTITIONS, key_cardinality=1_500, malformed_fraction=0.01
    )
    enc = OrdersEncoder(fmt, registry.url, name)
    json_of: dict[bytes | None, bytes | None] = {None: None}
    rows: dict[int, list[tuple[bytes | None, bytes | None]]] = {}
    for p in range(PARTITIONS):
        for _, key, value in generate(cfg, p, 0, PER_PARTITION):
            wire = enc.encode(value)
            json_of[wire] = value
            rows.setdefault(p, []).append((key, wire))
    acked = produce_exact(kafka_broker.bootstrap, name, rows)
    twins = [(p, o, k, json_of[v]) for p, o, k, v in acked]
    return WireTopic(kafka_broker.bootstrap, name, registry.url, acked, twins)


@pytest.mark.parametrize("mode", list(TABLE_SECTIONS))
def test_every_merge_engine_over_avro_and_protobuf_equals_the_model(
    mode: str, wire_topic: WireTopic, spark, tmp_path: Path
) -> None:
    fmt = "avro" if "avro" in wire_topic.name else "protobuf"
    spec = DatastreamSpec.parse(
        {
            "name": f"{fmt}-{mode}",
            "source": {
                "kind": "kafka",
                "bootstrap_servers": wire_topic.bootstrap,
                "topic": wire_topic.name,
                "format": fmt,
                "schema_registry": {"url": wire_topic.registry},
            },
            "table": dict(TABLE_SECTIONS[mode]),
            "schema": dict(ORDERS_SCHEMA),
            "max_records_per_batch": BATCH,
        }
    )
    with Catalog.open(home=tmp_path / "home") as cat:
        runner = DatastreamRunner(spec, cat, spark, writer_id=f"w-{fmt}-{mode}")
        stats = runner.run(available_now=True)
        assert stats.restarts == 0
        assert len(runner.commits()) >= 2, "expected several batches"
        # The frontier moved past every bad value to the end of the topic.
        assert shard_uppers(cat, spec.table_name) == wire_topic.ends()

        expected, bad = expected_table(spec.table_spec(), wire_topic.twins)
        assert_same_rows(cat.read_table(spec.table_name).to_pylist(), expected, what=spec.name)
        assert bad, "the topic should hold bad values"
        raw_of = {(p, o): v for p, o, _, v in wire_topic.wire}
        dead = cat.read_table(spec.dead_letter_table).to_pylist()
        assert Counter((r["partition"], r["offset"], r["raw"]) for r in dead) == Counter(
            (p, o, raw_of[(p, o)]) for p, o in bad
        )
        reasons = {r["error"].split(" ")[0].rstrip(":") for r in dead}
        assert {"wrong", "unknown"} <= reasons, reasons
