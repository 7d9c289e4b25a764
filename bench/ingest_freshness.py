"""(e) Freshness: a Tansu broker, a producer at a steady rate into a 4-partition topic, a
DatastreamRunner on the kafka source (500 ms trigger), and a sampler that every 50 ms notes the
last acknowledged offset per partition and the shard uppers. The latency of a sample is the
first time a shard upper exceeds that offset minus the time the produce was acked."""

from __future__ import annotations

import bisect
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import percentile
from ingest_input import PARTITIONS, UPSERT_TABLE, Input
from ingest_observe import progress, progress_seconds

#: (sample time, partition -> (last acked offset, ack time), partition -> shard upper)
Sample = tuple[float, dict[int, tuple[int, float]], dict[int, int]]


@dataclass
class Acks:
    lock: threading.Lock = field(default_factory=threading.Lock)
    last: dict[int, tuple[int, float]] = field(default_factory=dict)
    count: int = 0
    errors: list[str] = field(default_factory=list)


def _producer_loop(
    bootstrap: str,
    topic: str,
    inp: Input,
    rate: float,
    seconds: float,
    acks: Acks,
    stop: threading.Event,
    out: dict[str, Any],
) -> None:
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 5, "log.connection.close": False}
    )

    def on_delivery(err: Any, msg: Any) -> None:
        now = time.time()
        if err is not None:
            acks.errors.append(str(err))
            return
        with acks.lock:
            acks.count += 1
            p, o = msg.partition(), msg.offset()
            if o > acks.last.get(p, (-1, 0.0))[0]:
                acks.last[p] = (o, now)

    cursors = dict.fromkeys(range(PARTITIONS), 0)
    sent = 0
    t0 = time.time()
    out["t0"] = t0
    while not stop.is_set():
        elapsed = time.time() - t0
        if elapsed >= seconds:
            break
        due = int(rate * elapsed)
        while sent < due:
            p = sent % PARTITIONS
            recs = inp.records[p]
            key, value = recs[cursors[p] % len(recs)]
            cursors[p] += 1
            try:
                producer.produce(topic, value=value, key=key, partition=p, on_delivery=on_delivery)
            except BufferError:
                producer.poll(0.01)
                continue
            sent += 1
        producer.poll(0)
        time.sleep(0.002)
    out["produce_seconds"] = time.time() - t0
    producer.flush(30)
    # Tansu's high watermark is the base offset of the last record batch + 1: end each
    # partition with a batch of one record so the last acknowledged offsets become readable.
    for p in range(PARTITIONS):
        key, value = inp.records[p][cursors[p] % len(inp.records[p])]
        producer.produce(topic, value=value, key=key, partition=p, on_delivery=on_delivery)
        producer.flush(30)
    out["sent"] = sent + PARTITIONS


def freshness(
    spark: Any,
    catalog: Any,
    inp: Input,
    base: Path,
    rate: float,
    seconds: float,
    after_spark: list[Callable[[], Any]],
) -> dict[str, Any]:
    """``after_spark`` receives the broker's stop: it runs after the SparkSession stops, so
    the source's Kafka consumers (in Spark's Python workers) never outlive their broker."""
    from confluent_kafka import Producer

    from millstream.datastream import DatastreamSpec
    from millstream.ingest.sources.generator import ORDERS_SCHEMA
    from millstream.ingest.sources.kafka import CONSUMERS
    from millstream.local.tansu import TansuBroker
    from millstream.spark.runner import DatastreamRunner

    topic = "fresh"
    broker = TansuBroker(base / "broker")
    runner: DatastreamRunner | None = None
    thread: threading.Thread | None = None
    errors: list[BaseException] = []
    committed: list[int] = []  # records per committed micro-batch
    try:
        broker.start()
        broker.create_topic(topic, PARTITIONS)
        spec = DatastreamSpec.parse(
            {
                "name": "fresh",
                "source": {"kind": "kafka", "bootstrap_servers": broker.bootstrap, "topic": topic},
                "table": UPSERT_TABLE,
                "schema": ORDERS_SCHEMA,
                "trigger_interval": "500ms",
            }
        )
        # Prime the topic so the query's first (slow) batch is not in the measurement.
        # (The last record goes alone: Tansu's high watermark only covers a whole batch.)
        prime = Producer({"bootstrap.servers": broker.bootstrap, "log.connection.close": False})
        for p in range(PARTITIONS):
            for key, value in inp.records[p][:100]:
                prime.produce(topic, value=value, key=key, partition=p)
            prime.flush(30)
            key, value = inp.records[p][100]
            prime.produce(topic, value=value, key=key, partition=p)
            prime.flush(30)
        runner = DatastreamRunner(spec, catalog, spark, writer_id="fresh")
        runner.ensure_tables()

        def _run() -> None:
            assert runner is not None
            try:
                runner.run(available_now=False)
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=_run, name="fresh-writer", daemon=True)
        t_start = time.perf_counter()
        thread.start()

        def uppers() -> dict[int, int]:
            return {s.partition: s.upper for s in catalog.store.list_shards("fresh")}

        deadline = time.monotonic() + 180
        while not all(uppers().get(p, 0) >= 101 for p in range(PARTITIONS)):
            if errors:
                raise errors[0]
            if time.monotonic() > deadline:
                raise TimeoutError("the kafka datastream did not ingest the priming records")
            time.sleep(0.1)
        start_s = time.perf_counter() - t_start

        acks = Acks()
        stop = threading.Event()
        pout: dict[str, Any] = {}
        producer = threading.Thread(
            target=_producer_loop,
            args=(broker.bootstrap, topic, inp, rate, seconds, acks, stop, pout),
            name="fresh-producer",
            daemon=True,
        )
        samples: list[Sample] = []
        producer.start()
        while producer.is_alive():
            with acks.lock:
                last = dict(acks.last)
            samples.append((time.time(), last, uppers()))
            if errors:
                raise errors[0]
            time.sleep(0.05)
        producer.join()
        with acks.lock:
            final = dict(acks.last)
        drain_deadline = time.monotonic() + 30
        while time.monotonic() < drain_deadline:
            u = uppers()
            samples.append((time.time(), final, u))
            if all(u.get(p, 0) > o for p, (o, _) in final.items()):
                break
            time.sleep(0.05)
        batches_progress = progress(runner.query)
        committed = [c["rows"] for c in runner.commits() if c.get("rows")]
        runner.stop()
        thread.join(timeout=60)
    finally:
        if runner is not None:
            runner.stop()
        if thread is not None:
            thread.join(timeout=60)
        CONSUMERS.close()
        after_spark.append(broker.stop)

    latencies, unresolved = latencies_of(samples)
    tail = tail_episodes(samples, pout.get("t0", samples[0][0] if samples else 0.0))
    gaps = batch_gaps(batches_progress, pout.get("t0", 0.0))
    lat = sorted(latencies)
    batches = [p for p in batches_progress if p["input_rows"]]
    trig = [p["duration_ms"].get("triggerExecution", 0) / 1000 for p in batches]
    return {
        "target_rate": rate,
        "seconds": pout.get("produce_seconds", 0.0),
        "acked": acks.count,
        "produce_errors": len(acks.errors),
        "achieved_rate": acks.count / pout["produce_seconds"] if pout.get("produce_seconds") else 0,
        "samples": len(lat),
        "unresolved": unresolved,
        "p50_s": percentile(lat, 50, "nearest"),
        "p99_s": percentile(lat, 99, "nearest"),
        "max_s": lat[-1] if lat else float("nan"),
        "query_start_s": start_s,
        "batches": len(batches),
        # Spark's input rows are the source's range markers; the records are the sink's.
        "batch_rows_median": statistics.median(committed) if committed else 0,
        "batch_seconds_median": statistics.median(trig) if trig else 0.0,
        "batch_seconds_p99": percentile(trig, 99, "nearest") if trig else 0.0,
        # Where the tail is: spans (seconds after the first produce) in which records took
        # more than 1.5 s to become visible, and the micro-batches that started more than 1 s
        # after the one before (the trigger is 500 ms) or took more than 1 s.
        "slow_episodes": tail,
        "batch_gaps": gaps,
        "batch_duration_ms_median": {
            k: statistics.median(p["duration_ms"].get(k, 0) for p in batches)
            for k in ("triggerExecution", "latestOffset", "walCommit", "addBatch", "commitOffsets")
        }
        if batches
        else {},
    }


def latencies_of(samples: list[Sample]) -> tuple[list[float], int]:
    """For every distinct (partition, last acked offset) seen by the sampler: the first sample
    time at which that partition's shard upper exceeds the offset, minus the ack time.
    Returns (latencies, how many never became visible)."""
    visible = _visible(samples)
    return [lat for _, lat in visible if lat is not None], sum(lat is None for _, lat in visible)


def _visible(samples: list[Sample]) -> list[tuple[float, float | None]]:
    """(ack time, seconds until visible or None if never) of every distinct (partition, last
    acked offset) the sampler saw."""
    times = [t for t, _, _ in samples]
    seen: dict[tuple[int, int], float] = {}
    for _, last, _ in samples:
        for p, (o, t_ack) in last.items():
            seen.setdefault((p, o), t_ack)
    # Shard uppers only grow: per partition, the running maximum is sorted.
    running: dict[int, list[int]] = {}
    for p in {p for p, _ in seen}:
        best, col = -1, []
        for _, _, u in samples:
            best = max(best, u.get(p, -1))
            col.append(best)
        running[p] = col
    out: list[tuple[float, float | None]] = []
    for (p, o), t_ack in seen.items():
        i = max(bisect.bisect_right(running[p], o), bisect.bisect_left(times, t_ack))
        out.append((t_ack, None if i >= len(samples) else times[i] - t_ack))
    return out


def tail_episodes(samples: list[Sample], t0: float, slow_s: float = 1.5) -> list[dict[str, float]]:
    """Spans of acks (seconds after ``t0``) whose records took more than ``slow_s`` to become
    visible, merged when less than a second apart: where the p99 comes from."""
    slow = [(t - t0, lat) for t, lat in _visible(samples) if lat is not None and lat > slow_s]
    slow.sort()
    episodes: list[dict[str, float]] = []
    for at, lat in slow:
        if episodes and at - episodes[-1]["end"] < 1.0:
            episodes[-1]["end"] = round(at, 2)
            episodes[-1]["worst"] = round(max(episodes[-1]["worst"], lat), 2)
            episodes[-1]["acks"] += 1
        else:
            episodes.append(
                {"start": round(at, 2), "end": round(at, 2), "worst": round(lat, 2), "acks": 1}
            )
    return episodes


def batch_gaps(batches: list[dict[str, Any]], t0: float) -> list[dict[str, Any]]:
    """Micro-batches that started more than 1 s after the previous one, or took more than
    1 s, with their start (seconds after ``t0``) and ``durationMs``."""
    out: list[dict[str, Any]] = []
    prev: float | None = None
    for b in batches:
        stamp = b.get("timestamp")
        if not stamp:
            continue
        at = progress_seconds(stamp)
        took = b["duration_ms"].get("triggerExecution", 0) / 1000
        if (prev is not None and at - prev > 1.0) or took > 1.0:
            out.append(
                {
                    "start": round(at - t0, 2),
                    "after_previous_s": None if prev is None else round(at - prev, 2),
                    "rows": b.get("input_rows"),
                    "duration_ms": b["duration_ms"],
                }
            )
        prev = at
    return out
