"""What an idle worker of many Kafka topics costs: its process tree's and the broker's CPU.

Run from the repository root (not part of CI; about 2 minutes a tree and round)::

    .venv/bin/python bench/idle_worker.py                          # this tree, 100 topics
    .venv/bin/python bench/idle_worker.py --topics 5 --seconds 10 --settle 5   # a smoke run
    .venv/bin/python bench/idle_worker.py --src before=/tmp/main-before --src after=. --rounds 2

Real processes, as ``bench/scale.py`` part (c) starts them (``scale.services``): a Tansu
broker, ``millstream controller``, ONE ``millstream worker``, a SQLite metadata store.
``--topics`` (100) topics of one partition each get ``--records`` (3) generator orders each,
then nothing more. ONE datastream (``orders_spec``'s table section, 500 ms trigger, starting
at the earliest offsets) matches them all (``source.topic_pattern``, a table each: the
Debezium database of mostly idle tables of issue 38). Once every table is caught up (its
shard upper at its topic's end) and ``--settle`` (30) seconds more have passed, the CPU
seconds (/proc) of the worker's process tree (its own process, Spark's JVM, the source
process and Spark's Python workers, by kind) and of the broker are read at the start and at
the end of ``--seconds`` (60) with nothing arriving, and printed in cores.

**wake**: then ``--wakes`` (5) times, after a random pause of 1 to 3 s, one record is
produced into one topic (round-robin) and the clock runs from its acknowledgement until its
table's shard upper covers it (polled every 20 ms): how soon records reaching an idle
table of an idle worker are committed.

``--src LABEL=DIR`` (repeatable; a checkout with ``DIR/src``) runs the services on that
tree's code, fresh processes each time; with several, the trees alternate ``--rounds`` times
(before, after, before, after, ...) and the medians per tree are printed with their ratios
to the first tree's. The load average is printed beside every figure: on a loaded machine
the figures are indicative. Results go to ``bench/results/idle_worker-<time>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import common
from scale import _label_dir, all_uppers, controller_and_worker, cpu_seconds, services, tree

OWN = "millstream worker (driver)"


def group(kind: str) -> str:
    """The worker tree's process kinds in the groups the report prints: the query's source
    process (Spark's ``python_streaming_source_runner``, which answers every tick's
    ``latestOffset``), Spark's other Python workers (the task daemon, the sink runner, the
    planning workers) and millstream's own (the publisher)."""
    if kind == OWN:
        return "worker process"
    if kind == "JVM":
        return "JVM"
    if "python_streaming_source_runner" in kind:
        return "source process"
    if "pyspark" in kind:
        return "Spark Python workers"
    return "publisher/other Python"


def tree_cpu(procs0: list[dict[str, Any]], procs1: list[dict[str, Any]]) -> dict[str, float]:
    """CPU seconds each group of the worker's tree used between two :func:`scale.tree`
    readings (a process that started in between counts from 0; one that ended is missing)."""
    before = {p["pid"]: p["cpu_s"] for p in procs0}
    out: dict[str, float] = {}
    for p in procs1:
        g = group(p["kind"])
        out[g] = out.get(g, 0.0) + p["cpu_s"] - before.get(p["pid"], 0.0)
    return out


def kind_cpu(procs0: list[dict[str, Any]], procs1: list[dict[str, Any]]) -> dict[str, float]:
    """As :func:`tree_cpu`, by each process kind (:func:`scale.tree`'s ``kind``)."""
    before = {p["pid"]: p["cpu_s"] for p in procs0}
    out: dict[str, float] = {}
    for p in procs1:
        out[p["kind"]] = out.get(p["kind"], 0.0) + p["cpu_s"] - before.get(p["pid"], 0.0)
    return out


def one_run(args: argparse.Namespace, base: Path, src: Path | None, seed: int) -> dict[str, Any]:
    from confluent_kafka import Producer as KafkaProducer

    from harness.cluster import orders_spec, wait_until
    from millstream.ingest.sources.generator import GeneratorConfig, generate

    rng = random.Random(seed)
    topics = [f"c{i:03d}" for i in range(args.topics)]
    tables = {t: f"m{t}" for t in topics}
    records = [(k, v) for _, k, v in generate(GeneratorConfig(seed=7, partitions=1), 0, 0, 1000)]
    ends: dict[str, int] = {}
    acked: dict[str, float] = {}

    def on_delivery(err: Any, msg: Any) -> None:
        if err is None:
            ends[msg.topic()] = max(ends.get(msg.topic(), 0), msg.offset() + 1)
            acked[msg.topic()] = time.perf_counter()

    with services(base, src=src) as svc:
        broker, cluster, store = svc.broker, svc.cluster, svc.store
        producer = KafkaProducer(
            {"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "log.connection.close": False}
        )
        sent = 0

        def produce(topic: str, n: int) -> None:
            nonlocal sent
            for _ in range(n):
                key, value = records[sent % len(records)]
                producer.produce(topic, value=value, key=key, partition=0, on_delivery=on_delivery)
                sent += 1

        def caught_up() -> bool:
            uppers = all_uppers(store)
            return all(uppers.get((tables[t], 0), -1) >= ends.get(t, 0) for t in topics)

        try:
            api, worker = controller_and_worker(cluster)
            for t in topics:
                broker.create_topic(t, 1)
            for t in topics:
                produce(t, args.records)
            producer.flush(60)
            assert len(ends) == len(topics), f"acknowledged {len(ends)} of {len(topics)} topics"
            spec = orders_spec("x", broker.bootstrap, "x")
            spec.pop("max_records_per_batch")
            spec["name"] = "idle"
            spec["table"] = {**spec["table"], "name": "m{topic}"}
            spec["source"] = {
                **{k: v for k, v in spec["source"].items() if k != "topic"},
                "topic_pattern": r"c\d{3}",
                "starting_offsets": "earliest",
            }
            t0 = time.time()
            assert api.post("/datastreams", spec).status_code == 201
            wait_until(
                f"every table of {len(topics)} topics is caught up",
                caught_up,
                timeout=args.catch_up_timeout,
                interval=1.0,
                diagnostics=cluster.diagnostics,
            )
            caught = time.time() - t0
            common.log_stamped(f"  caught up after {caught:.0f} s; settling {args.settle:.0f} s")
            time.sleep(args.settle)
            load0 = common.load()
            procs0, broker0 = tree(worker.pid), cpu_seconds([broker.pid or 0])
            w0 = time.perf_counter()
            time.sleep(args.seconds)
            procs1, broker1 = tree(worker.pid), cpu_seconds([broker.pid or 0])
            wall = time.perf_counter() - w0
            load1 = common.load()
            cores = {g: s / wall for g, s in tree_cpu(procs0, procs1).items()}
            cores["tree"] = sum(cores.values())
            cores["broker"] = (broker1 - broker0) / wall
            cores["tree+broker"] = cores["tree"] + cores["broker"]
            wakes: list[float] = []
            for i in range(args.wakes):
                time.sleep(rng.uniform(1.0, 3.0))
                topic = topics[i % len(topics)]
                before = ends[topic]
                produce(topic, 1)
                producer.flush(30)
                assert ends[topic] == before + 1, f"{topic}: the wake record was not acknowledged"
                began = acked[topic]
                while all_uppers(store).get((tables[topic], 0), -1) < ends[topic]:
                    if time.perf_counter() - began > 60:
                        raise TimeoutError(f"{topic}: a record not committed within 60 s")
                    time.sleep(0.02)
                wakes.append(time.perf_counter() - began)
            api.close()
        finally:
            with contextlib.suppress(Exception):
                producer.flush(5)
    return {
        "topics": len(topics),
        "caught_up_s": caught,
        "window_s": wall,
        "cores": cores,
        "cores_by_kind": {k: v / wall for k, v in kind_cpu(procs0, procs1).items()},
        "load": [load0, load1],
        "wake_s": wakes,
        "wake_median_s": statistics.median(wakes) if wakes else float("nan"),
        "wake_max_s": max(wakes) if wakes else float("nan"),
    }


def say(label: str, r: dict[str, Any]) -> None:
    c = r["cores"]
    parts = ", ".join(f"{k} {v:.3f}" for k, v in c.items())
    common.log_stamped(
        f"{label}: {r['topics']} idle topics, cores over {r['window_s']:.0f} s: {parts}; wake "
        f"median {r['wake_median_s']:.3f} s max {r['wake_max_s']:.3f} s "
        f"(load {r['load'][0][0]} -> {r['load'][1][0]})"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topics", type=int, default=100, help="topics of one partition (100)")
    ap.add_argument("--records", type=int, default=3, help="records into each topic at first")
    ap.add_argument("--settle", type=float, default=30.0, help="seconds idle before sampling")
    ap.add_argument("--seconds", type=float, default=60.0, help="the sampled idle window")
    ap.add_argument("--wakes", type=int, default=5, help="single records timed after it")
    ap.add_argument("--rounds", type=int, default=1, help="rounds of the --src trees")
    ap.add_argument("--catch-up-timeout", type=float, default=300.0)
    ap.add_argument(
        "--src",
        action="append",
        type=_label_dir,
        default=[],
        metavar="LABEL=DIR",
        help="run the services on DIR/src (repeatable; alternated --rounds times)",
    )
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    trees: list[tuple[str, Path | None]] = list(args.src) or [("this tree", None)]
    res: dict[str, Any] = {
        "command": common.command_line("idle_worker.py"),
        "machine": common.machine("pyspark"),
        "load_start": common.load(),
        "runs": [],
    }
    with common.workdir("millstream-bench-idle-worker-", keep=args.keep) as base:
        for rnd in range(args.rounds):
            for label, src in trees:
                common.log_stamped(f"round {rnd + 1}: {label} ({src or 'this tree'})")
                r = one_run(args, base / f"{label}-{rnd}", src, seed=rnd)
                r["label"], r["round"] = label, rnd + 1
                res["runs"].append(r)
                say(f"round {rnd + 1} {label}", r)
    medians: dict[str, dict[str, float]] = {}
    for label, _ in trees:
        runs = [r for r in res["runs"] if r["label"] == label]
        keys = {k for r in runs for k in r["cores"]}
        medians[label] = {k: statistics.median(r["cores"].get(k, 0.0) for r in runs) for k in keys}
        medians[label]["wake_median_s"] = statistics.median(r["wake_median_s"] for r in runs)
    res["medians"] = medians
    first = trees[0][0]
    for label, m in medians.items():
        text = ", ".join(f"{k} {m[k]:.3f}" for k in sorted(m))
        common.log_stamped(f"median {label}: {text}")
        if label != first:
            ratios = ", ".join(
                f"{k} x{common.ratio(m[k], medians[first][k]):.2f} ({m[k] - medians[first][k]:+.3f})"
                for k in sorted(m)
                if k in medians[first]
            )
            common.log_stamped(f"{label}/{first}: {ratios}")
    res["load_end"] = common.load()
    common.save_results("idle_worker", res, args.json, common.log_stamped)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
