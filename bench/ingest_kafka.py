"""(g) Catch-up through Kafka, JSON against Avro, on the same records (``bench/ingest.py``).

The run's generator records (the input of (a)-(f)) are produced twice into one Tansu broker:
once as they are (JSON values, Kafka tombstones) into one 4-partition topic, and once as
Confluent-framed Avro (confluent-kafka's ``AvroSerializer`` against the test schema registry,
tombstones kept) into another. Each partition ends with a record flushed on its own, so the
broker's high watermarks are exact. Then ``DatastreamRunner(kafka source -> upsert table)
.run(available_now=True)`` catches each topic up into its own table, in the warmed
SparkSession of (a), at the same ``max_records_per_batch``, alternating the formats over
``rounds`` rounds (JSON first in odd rounds, Avro first in even ones). Each table is read back
and its row count held to the oracle's, with no dead letters.

Both formats share everything but the decode: the broker, the fetches, the Spark query, the
merge and the commits. So rows/s of Avro over JSON is what the format changes end to end.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ingest_input import UPSERT_TABLE, Input
from ingest_observe import cpu_delta, process_cpu

FORMATS = ("json", "avro")


def _produce(
    bootstrap: str, topic: str, records: dict[int, list[tuple[bytes, bytes | None]]]
) -> float:
    """Every partition's records, the last one alone (Tansu's watermark is exact only when a
    partition's last batch holds one record); seconds taken."""
    from confluent_kafka import Producer

    failures: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            failures.append(str(err))

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": 500_000,
            "log.connection.close": False,
        }
    )
    t0 = time.perf_counter()
    for p, recs in sorted(records.items()):
        for key, value in recs[:-1]:
            while True:
                try:
                    producer.produce(
                        topic, value=value, key=key, partition=p, on_delivery=on_delivery
                    )
                    break
                except BufferError:
                    producer.poll(0.01)
        producer.flush(300)
        key, value = recs[-1]
        producer.produce(topic, value=value, key=key, partition=p, on_delivery=on_delivery)
        producer.flush(60)
    assert not failures, f"the broker refused records: {failures[:3]}"
    return time.perf_counter() - t0


def _spec(name: str, bootstrap: str, topic: str, fmt: str, registry: str, batch: int | None) -> Any:
    from millstream.datastream import DatastreamSpec
    from millstream.ingest.sources.generator import ORDERS_SCHEMA

    source: dict[str, Any] = {"kind": "kafka", "bootstrap_servers": bootstrap, "topic": topic}
    if fmt == "avro":
        source |= {"format": "avro", "schema_registry": {"url": registry}}
    fields: dict[str, Any] = {
        "name": name,
        "source": source,
        "table": {"name": name, **UPSERT_TABLE},
        "schema": ORDERS_SCHEMA,
    }
    if batch is not None:
        fields["max_records_per_batch"] = batch
    return DatastreamSpec.parse(fields)


def expected_rows(inp: Input) -> int:
    """The sequential model's row count over the Kafka records (tombstones as deletes)."""
    from millstream.ingest.sources.generator import ORDERS_SCHEMA
    from millstream.reference.oracle import expected_table
    from millstream.spec import TableSpec

    spec = TableSpec.parse({"name": "orders", "schema": ORDERS_SCHEMA, **UPSERT_TABLE})
    total = 0
    for p, recs in inp.records.items():
        rows, bad = expected_table(spec, ((p, o, k, v) for o, (k, v) in enumerate(recs)))
        assert not bad, f"the oracle found {len(bad)} bad records in partition {p}"
        total += len(rows)
    return total


def kafka_catch_up(
    spark: Any,
    catalog: Any,
    inp: Input,
    base: Path,
    batch: int | None,
    log: Callable[[str], None],
    rounds: int = 3,
) -> dict[str, Any]:
    from harness.formats import OrdersEncoder
    from harness.schema_registry import TestSchemaRegistry
    from millstream.local.tansu import TansuBroker
    from millstream.spark.runner import DatastreamRunner

    expected = expected_rows(inp)
    out: dict[str, Any] = {"rows": inp.rows, "batch": batch, "rounds": rounds, "expected": expected}
    broker = TansuBroker(base / "tansu-g")
    broker.start()
    try:
        with TestSchemaRegistry() as reg:
            t0 = time.perf_counter()
            enc = OrdersEncoder("avro", reg.url, "orders-avro")
            avro = {p: [(k, enc.encode(v)) for k, v in recs] for p, recs in inp.records.items()}
            out["avro_encode_s"] = time.perf_counter() - t0
            payload = {
                "json": {p: [(k, v) for k, v in recs] for p, recs in inp.records.items()},
                "avro": avro,
            }
            for fmt in FORMATS:
                broker.create_topic(f"orders-{fmt}", 4)
                out[f"{fmt}_produce_s"] = _produce(broker.bootstrap, f"orders-{fmt}", payload[fmt])
                out[f"{fmt}_mb"] = (
                    sum(len(v or b"") + len(k) for r in payload[fmt].values() for k, v in r) / 1e6
                )
            log(
                f"(g) produced {inp.rows:,} records twice: json {out['json_mb']:.0f} MB, "
                f"avro {out['avro_mb']:.0f} MB"
            )
            runs: dict[str, list[dict[str, Any]]] = {f: [] for f in FORMATS}
            for r in range(rounds):
                for fmt in FORMATS if r % 2 == 0 else FORMATS[::-1]:
                    name = f"kafka_{fmt}_{r}"
                    spec = _spec(name, broker.bootstrap, f"orders-{fmt}", fmt, reg.url, batch)
                    runner = DatastreamRunner(spec, catalog, spark, writer_id="bench")
                    cpu0 = process_cpu()
                    t = time.perf_counter()
                    runner.run(available_now=True)
                    s = time.perf_counter() - t
                    cpu = cpu_delta(cpu0, process_cpu())
                    table = catalog.read_table(name).num_rows
                    dead = catalog.read_table(f"{name}__dead_letter").num_rows
                    assert table == expected and dead == 0, (
                        f"(g) {fmt} round {r}: {table} rows (expected {expected}), {dead} dead"
                    )
                    runs[fmt].append(
                        {
                            "seconds": s,
                            "rows_s": inp.rows / s,
                            "cpu_s": cpu,
                            "table_rows": table,
                            "batches": len(runner.commits()),
                        }
                    )
                    log(f"(g) round {r} {fmt}: {inp.rows / s:,.0f} rows/s ({s:.2f}s)")
    finally:
        broker.stop()
    for fmt in FORMATS:
        out[fmt] = {
            "runs": runs[fmt],
            "median_rows_s": statistics.median(x["rows_s"] for x in runs[fmt]),
        }
    out["avro_over_json"] = out["avro"]["median_rows_s"] / out["json"]["median_rows_s"]
    out["per_round"] = [
        a["rows_s"] / j["rows_s"] for a, j in zip(runs["avro"], runs["json"], strict=True)
    ]
    return out
