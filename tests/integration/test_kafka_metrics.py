"""The metrics an operator coming from Pinot reads, on a real Kafka-protocol topic ingested by
Spark: the ingestion delay measured from the records' Kafka timestamps, the live rows of an
upsert table, and the row counters a worker reports in its heartbeat."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from millstream.api import create_app
from millstream.catalog import Catalog
from millstream.control.controller import Controller, ControlSettings
from millstream.control.worker import Worker, _Writer
from millstream.datastream import DatastreamSpec
from millstream.local.tansu import TansuBroker
from millstream.sealing.sealer import Sealer
from millstream.spark.runner import DatastreamRunner

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

KEYS = 7
GOOD = 40
BAD = 2


def _produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes, int]]) -> None:
    """Produce (key, value, timestamp ms) to partition 0; the last record alone (Tansu's high
    watermark is exact only then, see harness.ingest_support.produce_exact)."""
    from confluent_kafka import Producer

    failures: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            failures.append(str(err))

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for i, (key, value, stamp) in enumerate(records):
        producer.produce(
            topic, value=value, key=key, partition=0, timestamp=stamp, on_delivery=on_delivery
        )
        if i == len(records) - 2:
            producer.flush(60)
    producer.flush(60)
    assert not failures, failures


def _metrics(api: TestClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(api.get("/metrics").text)
        for s in family.samples
    }


def test_kafka_ingestion_delay_live_rows_and_row_counters(
    kafka_broker: TansuBroker, spark: Any, tmp_path: Path
) -> None:
    topic = "metrics-orders"
    kafka_broker.create_topic(topic, 1)
    past = round(time.time() * 1000) - 60_000  # every record was created a minute ago
    records = [
        (str(i % KEYS).encode(), json.dumps({"id": i % KEYS, "v": f"v{i}"}).encode(), past + i)
        for i in range(GOOD)
    ]
    records[10:10] = [(b"x", b"not json", past + 10), (b"y", b"{", past + 11)]
    _produce(kafka_broker.bootstrap, topic, records)
    body = {
        "name": "orders",
        "source": {"kind": "kafka", "bootstrap_servers": kafka_broker.bootstrap, "topic": topic},
        "schema": {"id": "long", "v": "string"},
        "table": {"mode": "upsert", "primary_key": ["id"]},
        "max_records_per_batch": 15,
    }
    spec = DatastreamSpec.parse(body)
    table = spec.table_name
    with Catalog.open(home=tmp_path / "home") as cat:
        controller = Controller(
            cat, controller_id="c1", settings=ControlSettings(lease_ttl=10.0, worker_ttl=30.0)
        )
        app = create_app(cat, controller=controller, upstream_timeout=10)
        with TestClient(app) as api:
            assert api.post("/datastreams", json=body).status_code == 201
            controller.tick()
            assert api.get("/datastreams/orders").json()["state"] == "READY"
            runner = DatastreamRunner(spec, cat, spark, writer_id="w1")
            runner.run(available_now=True)

            m = _metrics(api)
            p0 = (("partition", "0"), ("table", table))
            assert m["millstream_offset_lag", p0] == 0
            assert m["millstream_ingestion_delay_ms", p0] == 0, "caught up: 0, as Pinot reports"
            # 40 stored rows (7 keys) and 2 bad records: the live rows a reader sees.
            assert cat.manifest(table).row_count == GOOD
            assert m["millstream_table_rows", (("table", table),)] == KEYS
            assert m["millstream_table_rows", (("table", spec.dead_letter_table),)] == BAD
            info = api.get(f"/tables/{table}/consumingSegmentsInfo").json()["partitions"][0]
            assert info["last_record_timestamp_ms"] == past + GOOD - 1
            assert info["ingestion_delay_ms"] == 0

            # One more record (an update of key 0) not ingested yet: the delay is measured
            # from the last committed record's Kafka timestamp, a minute ago.
            _produce(
                kafka_broker.bootstrap,
                topic,
                [(b"0", json.dumps({"id": 0, "v": "late"}).encode(), past + 100)],
            )
            before = round(time.time() * 1000)
            m = _metrics(api)
            assert m["millstream_offset_lag", p0] == 1
            delay = m["millstream_ingestion_delay_ms", p0]
            assert before - (past + GOOD - 1) <= delay < before - past + 600_000
            assert delay >= 60_000
            assert m["millstream_availability_lag_ms", p0] >= 0

            DatastreamRunner(spec, cat, spark, writer_id="w1").run(available_now=True)
            m = _metrics(api)
            assert m["millstream_ingestion_delay_ms", p0] == 0
            assert m["millstream_table_rows", (("table", table),)] == KEYS

            # A worker publishes what its writer committed and its sealer resolved away.
            worker = Worker(cat, spark, worker_id="worker-a")
            worker.writers["orders"] = _Writer("orders", "active", runner.state_dir, runner)
            sealer = Sealer(cat, table)
            assert sealer.seal_partition(0, force=True) is not None
            worker.sealers["orders"] = sealer
            worker._heartbeat()
            m = _metrics(api)
            labels = (
                ("datastream", "orders"),
                ("partition", "0"),
                ("table", table),
                ("worker", "worker-a"),
            )
            assert m["millstream_rows_consumed_total", labels] == GOOD + BAD + 1
            assert m["millstream_rows_dead_lettered_total", labels] == BAD
            # 41 rows of 7 keys sealed into 7: 34 older versions dropped.
            assert m["millstream_rows_superseded_total", labels] == GOOD + 1 - KEYS
            assert m["millstream_table_rows", (("table", table),)] == KEYS
