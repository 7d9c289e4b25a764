"""A streaming write task's Kafka read, the code before a change against the code after it, in
one run.

Run from the repository root (not part of CI; about 2 minutes)::

    git worktree add /tmp/before <commit>
    .venv/bin/python bench/kafka_task_read.py --src before=/tmp/before/src --src after=src
    .venv/bin/python bench/kafka_task_read.py --src before=/tmp/before/src --src after=src \\
        --records 5000 --reads 30 --rounds 3 --json /tmp/task-read.json

A Tansu broker with one topic of 4 partitions holding ``--records`` generator orders (JSON) per
partition. Each side, in alternating rounds, in a fresh process with that side's ``src`` on its
path (a worker's Python process: the consumer pool warm after its first read): ``--reads``
times, ``KafkaReader.read_records`` of two partitions' ranges of ``--records`` records each, as
one of a micro-batch's two write tasks reads them at 20,000 records/s (10,000 a batch). Per
read: its wall and CPU time, and that it got every record, each once, in offset order.

Prints per side the median read (wall and CPU, over all its rounds' reads after each
process's first) and the ratio after / before of the medians. Results go to
``bench/results/kafka-task-read-<time>.json`` and ``--json PATH``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import common

TOPIC = "reads"
PARTITIONS = 4
#: The partitions a task reads (a batch's four partitions over two write tasks).
TASK_PARTITIONS = (0, 1)

CHILD = r"""
import json, sys, time
from millstream.ingest.sources.kafka import CONSUMERS, KafkaConfig, KafkaReader
bootstrap, topic, records, reads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
parts = json.loads(sys.argv[5])
reader = KafkaReader(KafkaConfig(bootstrap_servers=bootstrap, topic=topic))
out = []
for i in range(reads + 1):
    ranges = [(p, 0, records) for p in parts]
    w, c = time.perf_counter(), time.process_time()
    got = {}
    n = 0
    for b in reader.read_records(ranges):
        n += b.num_rows
        got.setdefault(b.column("partition")[0].as_py(), []).extend(b.column("offset").to_pylist())
    wall, cpu = time.perf_counter() - w, time.process_time() - c
    ok = n == records * len(parts) and all(got.get(p) == list(range(records)) for p in parts)
    out.append({"wall_s": wall, "cpu_s": cpu, "ok": ok, "first": i == 0})
CONSUMERS.close()
print(json.dumps(out))
"""


def produce(bootstrap: str, records: int) -> None:
    from confluent_kafka import Producer

    from millstream.ingest.sources.generator import GeneratorConfig, generate

    cfg = GeneratorConfig(seed=7, partitions=PARTITIONS, key_cardinality=200_000)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for p in range(PARTITIONS):
        for _, key, value in generate(cfg, p, 0, records):
            while True:
                try:
                    producer.produce(TOPIC, value=value, key=key, partition=p)
                    break
                except BufferError:
                    producer.poll(0.1)
        producer.flush(60)


def run_side(src: Path, bootstrap: str, records: int, reads: int) -> list[dict[str, Any]]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    args = [bootstrap, TOPIC, str(records), str(reads), json.dumps(list(TASK_PARTITIONS))]
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *args], env=env, capture_output=True, text=True, check=True
    )
    result: list[dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--src", action="append", required=True, help="NAME=DIR: a side's src directory"
    )
    ap.add_argument("--records", type=int, default=5_000, help="records per partition and read")
    ap.add_argument("--reads", type=int, default=30, help="reads per side and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    sides = dict(s.split("=", 1) for s in args.src)
    from millstream.local.tansu import TansuBroker

    res: dict[str, Any] = {
        "command": common.command_line("kafka_task_read.py"),
        "machine": {**common.machine(), "load_start": common.load()},
        "sides": {n: str(Path(d).resolve()) for n, d in sides.items()},
        "reads": {n: [] for n in sides},
    }
    with common.workdir("millstream-bench-task-read-") as base:
        broker = TansuBroker(base / "tansu").start()
        try:
            broker.create_topic(TOPIC, PARTITIONS)
            t0 = time.monotonic()
            produce(broker.bootstrap, args.records)
            common.log(
                f"produced {args.records:,} records x {PARTITIONS} in {time.monotonic() - t0:.1f}s"
            )
            for r in range(args.rounds):
                for name, src in sides.items():
                    got = run_side(Path(src), broker.bootstrap, args.records, args.reads)
                    res["reads"][name].extend(got)
                    steady = [g["wall_s"] for g in got if not g["first"]]
                    common.log(
                        f"round {r + 1} {name}: median {statistics.median(steady) * 1000:.1f} ms, "
                        f"all complete: {all(g['ok'] for g in got)}, load {common.load()}"
                    )
        finally:
            broker.stop()
    res["machine"]["load_end"] = common.load()
    summary: dict[str, Any] = {}
    for name, got in res["reads"].items():
        steady = [g for g in got if not g["first"]]
        summary[name] = {
            "reads": len(steady),
            "complete": all(g["ok"] for g in got),
            "wall_ms_median": statistics.median(g["wall_s"] for g in steady) * 1000,
            "cpu_ms_median": statistics.median(g["cpu_s"] for g in steady) * 1000,
        }
        common.log(
            f"{name}: {summary[name]['reads']} reads of {len(TASK_PARTITIONS) * args.records:,} "
            f"records, median {summary[name]['wall_ms_median']:.1f} ms wall, "
            f"{summary[name]['cpu_ms_median']:.1f} ms CPU, complete: {summary[name]['complete']}"
        )
    names = list(sides)
    if len(names) == 2:
        a, b = (summary[n] for n in names)
        for k in ("wall_ms_median", "cpu_ms_median"):
            summary[f"ratio_{k}"] = b[k] / a[k]
        common.log(
            f"{names[1]} / {names[0]}: wall {summary['ratio_wall_ms_median']:.2f}x, "
            f"CPU {summary['ratio_cpu_ms_median']:.2f}x (load {res['machine']['load_start']} -> "
            f"{res['machine']['load_end']})"
        )
    res["summary"] = summary
    common.save_results("kafka-task-read", res, args.json, common.log)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
