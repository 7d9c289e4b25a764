"""A Debezium change stream (JSON, and Avro as Debezium's Avro converter writes it) over a real
Kafka-protocol broker into an upsert table.

Each key gets a prefix of ``create(ts=1), update(ts=2), delete(ts=3), tombstone,
create(ts=4)`` (``k % 6`` steps: inserts, updates, deletes with their tombstones, re-created
keys), interleaved across two partitions (a key's partition is its id modulo 2), every third
key's events in the ``{"schema", "payload"}`` wrapper, and every seventh key one more event
with an unknown op. The comparison column is the envelope's ``source.ts_ms``; the Kafka
offset, record timestamp and headers land in metadata columns (so the sink's own read of the
ranges carries them). The table must equal the sequential model fed by rows built here from
the produced events (no shared code with the decoder) and the rule spelled out per key; the
dead-letter table holds exactly the unknown-op events. The Avro variant produces the same
events (unwrapped: Avro has no schema/payload wrapper) and keys with confluent-kafka's
``AvroSerializer`` against the test schema registry; the model reads their JSON twins.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from harness.formats import DebeziumAvroEncoder
from harness.ingest_support import assert_same_rows, shard_uppers
from harness.schema_registry import TestSchemaRegistry
from millstream.catalog import Catalog
from millstream.datastream import DatastreamSpec
from millstream.local.tansu import TansuBroker
from millstream.reference.model import Row, model_rows
from millstream.spark.runner import DatastreamRunner

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

PARTITIONS = 2
KEYS = 120
#: (op, ts) steps; key k gets the first ``k % 6``; ``None`` is the tombstone after a delete.
STEPS: list[tuple[str, int] | None] = [("c", 1), ("u", 2), ("d", 3), None, ("c", 4)]


def _row(k: int, ts: int) -> dict[str, Any]:
    return {"id": k, "name": f"k{k}@{ts}", "qty": ts * 10}


def _event(k: int, op: str, ts: int) -> dict[str, Any]:
    before = _row(k, ts - 1) if op in ("u", "d") else None
    after = None if op == "d" else _row(k, ts)
    return {
        "before": before,
        "after": after,
        "op": op,
        "ts_ms": 1_000 + ts,
        "source": {"connector": "postgresql", "db": "shop", "table": "items", "ts_ms": ts},
    }


def _records() -> list[tuple[int, bytes, bytes | None, list[tuple[str, bytes]]]]:
    """(partition, key, value, headers) in production order (keys interleave step by step)."""
    out: list[tuple[int, bytes, bytes | None, list[tuple[str, bytes]]]] = []
    for step, what in enumerate([*STEPS, ("x", 9)]):
        for k in range(KEYS):
            if what is not None and what[0] == "x":
                if k % 7:
                    continue
            elif step >= k % 6:
                continue
            wrapped = k % 3 == 0
            key: dict[str, Any] = {"id": k}
            value: dict[str, Any] | None = None if what is None else _event(k, *what)
            if wrapped:
                key = {"schema": {"type": "struct", "name": "items.Key"}, "payload": key}
                if value is not None:
                    value = {"schema": {"type": "struct"}, "payload": value}
            headers = [("step", str(step).encode())]
            out.append(
                (
                    k % PARTITIONS,
                    json.dumps(key).encode(),
                    None if value is None else json.dumps(value).encode(),
                    headers,
                )
            )
    return out


def _as_avro(
    records: list[tuple[int, bytes, bytes | None, list[tuple[str, bytes]]]],
    enc: DebeziumAvroEncoder,
) -> tuple[list[tuple[int, bytes, bytes | None, list[tuple[str, bytes]]]], dict[Any, Any]]:
    """The same records with Avro keys and values (unwrapped), and wire bytes -> JSON twin."""
    out: list[tuple[int, bytes, bytes | None, list[tuple[str, bytes]]]] = []
    twin: dict[Any, Any] = {None: None}
    for p, key, value, headers in records:
        k = json.loads(key)
        ev = None if value is None else json.loads(value)
        wire_key = enc.key(k.get("payload", k))
        wire_value = None if ev is None else enc.value(ev.get("payload", ev))
        twin[wire_key], twin[wire_value] = key, value
        out.append((p, wire_key, wire_value, headers))
    return out, twin


def _produce(
    bootstrap: str,
    topic: str,
    records: list[tuple[int, bytes, bytes | None, list[tuple[str, bytes]]]] | None = None,
) -> list[dict[str, Any]]:
    """Produce every record; what the broker acknowledged, with offsets and timestamps. One
    record per batch: Tansu's high watermark is exact only then."""
    from confluent_kafka import Producer

    acked: list[dict[str, Any]] = []
    failures: list[str] = []

    def on_delivery(err: Any, msg: Any, headers: list[tuple[str, bytes]]) -> None:
        # a delivery report carries no headers (msg.headers() is None): keep those sent
        if err is not None:
            failures.append(str(err))
        else:
            acked.append(
                {
                    "partition": msg.partition(),
                    "offset": msg.offset(),
                    "key": msg.key(),
                    "value": msg.value(),
                    "timestamp": msg.timestamp()[1],
                    "headers": headers,
                }
            )

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
    records = _records() if records is None else records
    for p, key, value, headers in records:
        producer.produce(
            topic,
            key=key,
            value=value,
            partition=p,
            headers=headers,
            on_delivery=lambda err, msg, h=headers: on_delivery(err, msg, h),
        )
        producer.poll(0)
    producer.flush(60)
    assert not failures, f"the broker refused records: {failures[:3]}"
    assert len(acked) == len(records), "some records were never acknowledged"
    return acked


def _spec(bootstrap: str, topic: str, registry: str | None = None) -> DatastreamSpec:
    fmt: dict[str, Any] = (
        {"format": "avro", "schema_registry": {"url": registry}} if registry else {}
    )
    return DatastreamSpec.parse(
        {
            "name": "items",
            "source": {
                "kind": "kafka",
                "bootstrap_servers": bootstrap,
                "topic": topic,
                **fmt,
                "envelope": "debezium",
                "metadata_columns": {
                    "op": "op",
                    "source_ts_ms": "changed_ms",
                    "offset": "kafka_offset",
                    "timestamp": "kafka_ms",
                    "headers": "kafka_headers",
                },
            },
            "table": {"mode": "upsert", "primary_key": ["id"], "comparison_column": "changed_ms"},
            "schema": {
                "id": "long",
                "name": "string",
                "qty": "int",
                "op": "string",
                "changed_ms": "long",
                "kafka_offset": "long",
                "kafka_ms": "long",
                "kafka_headers": "string",
            },
            "max_records_per_batch": 150,  # several micro-batches
            "segments": {"flush_rows": 10_000_000, "flush_seconds": 86_400},
        }
    )


def _model_input(acked: list[dict[str, Any]]) -> tuple[list[Row], list[tuple[int, int]]]:
    """The rows the table is made of, built from the events with ``json.loads``, and the
    (partition, offset) of the bad events."""
    rows: list[Row] = []
    bad: list[tuple[int, int]] = []
    for r in acked:
        sys = {"_ms_partition": r["partition"], "_ms_offset": r["offset"]}
        meta = {
            "kafka_offset": r["offset"],
            "kafka_ms": r["timestamp"],
            "kafka_headers": json.dumps(
                {k: v.decode() for k, v in r["headers"] or []}, separators=(",", ":")
            ),
        }
        if r["value"] is None:
            key = json.loads(r["key"])
            key = key.get("payload", key)
            rows.append({"id": key["id"], **meta, **sys, "_ms_tombstone": True})
            continue
        ev = json.loads(r["value"])
        ev = ev.get("payload", ev)
        if ev["op"] not in ("c", "r", "u", "d"):
            bad.append((r["partition"], r["offset"]))
            continue
        env = {"op": ev["op"], "changed_ms": ev["source"]["ts_ms"]}
        if ev["op"] == "d":
            rows.append({"id": ev["before"]["id"], **env, **meta, **sys, "_ms_tombstone": True})
        else:
            rows.append({**ev["after"], **env, **meta, **sys, "_ms_tombstone": False})
    return rows, bad


def _present_by_rule(k: int) -> int | None:
    """The ts of key k's current row, or None if absent: c, u -> present; d, tombstone ->
    absent; the re-create -> present again."""
    return {0: None, 1: 1, 2: 2, 3: None, 4: None, 5: 4}[k % 6]


@pytest.mark.parametrize("fmt", ["json", "avro"])
def test_debezium_stream_over_broker_equals_the_model(
    fmt: str, kafka_broker: TansuBroker, spark: Any, tmp_path: Path
) -> None:
    topic = f"debezium-{fmt}-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(topic, PARTITIONS)
    with TestSchemaRegistry() as registry:
        if fmt == "avro":
            records, twin = _as_avro(_records(), DebeziumAvroEncoder(registry.url, topic))
            spec = _spec(kafka_broker.bootstrap, topic, registry.url)
            acked = _produce(kafka_broker.bootstrap, topic, records)
            twins = [{**r, "key": twin[r["key"]], "value": twin[r["value"]]} for r in acked]
        else:
            spec = _spec(kafka_broker.bootstrap, topic)
            twins = acked = _produce(kafka_broker.bootstrap, topic)
        _check(spec, acked, twins, tmp_path, spark)


def _check(
    spec: DatastreamSpec,
    acked: list[dict[str, Any]],
    twins: list[dict[str, Any]],
    tmp_path: Path,
    spark: Any,
) -> None:
    ends = {
        p: 1 + max(r["offset"] for r in acked if r["partition"] == p) for p in range(PARTITIONS)
    }
    rows, bad = _model_input(twins)
    model = model_rows(spec.table_spec(), rows)
    assert sorted(r["id"] for r in model) == [
        k for k in range(KEYS) if _present_by_rule(k) is not None
    ]
    assert all(r["changed_ms"] == _present_by_rule(r["id"]) for r in model)

    with Catalog.open(home=tmp_path / "home") as cat:
        DatastreamRunner(spec, cat, spark, writer_id="w1").run(available_now=True)
        assert shard_uppers(cat, spec.table_name) == ends
        assert len(cat.manifest(spec.table_name).entries) > PARTITIONS, "several micro-batches"
        got = cat.read_table(spec.table_name).to_pylist()
        assert_same_rows(got, model, what=spec.table_name)
        dead = cat.read_table(spec.dead_letter_table).to_pylist()
        assert sorted((r["partition"], r["offset"]) for r in dead) == sorted(bad)
        assert all("field 'op'" in r["error"] for r in dead)
        assert len(bad) == len(range(0, KEYS, 7))
