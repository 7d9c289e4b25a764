"""What a fresh Spark Python task worker spends before a Millstream task can run: the CPU and
wall seconds of importing the modules a streaming batch's read and write parts unpickle
(``millstream.spark.daemon.PRELOADED_MODULES`` of the tree under test, or the same list where
the tree has no such module), timed inside the task.

A worker that never ran a part of that kind pays this at its first one (after a catch-up, a
batch's write part on a worker that had only read range markers waited 1-3 s on it, at load
~20); Spark also forks a new worker after closing one idle for a minute. Each round runs a
process per tree (``--src name=DIR``, alternated) with ``spark.python.worker.reuse`` off, so
that every task runs in a worker freshly forked from the daemon, and reports the median per
task and its ratio to the first tree's in the same run.

    .venv/bin/python bench/worker_start.py --src before=/tmp/main/src --src after=src --rounds 3
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

MODULES = (
    "pyspark.sql.worker.plan_data_source_read",
    "pyspark.sql.worker.write_into_data_source",
    "millstream.spark.table_source",
    "millstream.spark.sources",
    "millstream.spark.sink",
    "millstream.config",
    "millstream.metastore.store",
)

CHILD = r"""
import json, sys, time
from millstream.spark.session import spark_session

modules = json.loads(sys.argv[1])
tasks = int(sys.argv[2])


def task(_):
    import importlib, time
    c0, w0 = time.process_time(), time.perf_counter()
    for m in modules:
        importlib.import_module(m)
    return time.process_time() - c0, time.perf_counter() - w0


spark = spark_session(config={"spark.python.worker.reuse": "false"})
spark.sparkContext.parallelize(range(2), 2).map(task).collect()  # the daemon's own start
out = spark.sparkContext.parallelize(range(tasks), tasks).map(task).collect()
spark.stop()
print("RESULT " + json.dumps(out))
"""


def one(src: str, tasks: int) -> list[tuple[float, float]]:
    env = dict(os.environ, PYTHONPATH=src)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(MODULES), str(tasks)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    return [tuple(t) for t in json.loads(line[len("RESULT ") :])]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--src", action="append", required=True, help="name=DIR, two or more")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=8)
    args = ap.parse_args()
    trees = [tuple(s.split("=", 1)) for s in args.src]
    got: dict[str, list[tuple[float, float]]] = {n: [] for n, _ in trees}
    for r in range(args.rounds):
        for name, src in trees:
            load = Path("/proc/loadavg").read_text().split()[0]
            t0 = time.perf_counter()
            res = one(src, args.tasks)
            got[name].extend(res)
            cpu = statistics.median(c for c, _ in res)
            wall = statistics.median(w for _, w in res)
            print(
                f"round {r + 1} {name}: a task's imports {cpu:.3f} CPU-s, {wall:.3f} s wall "
                f"(median of {len(res)}; load {load}; process {time.perf_counter() - t0:.0f} s)",
                flush=True,
            )
    base = trees[0][0]
    b_cpu = statistics.median(c for c, _ in got[base])
    b_wall = statistics.median(w for _, w in got[base])
    for name, _ in trees:
        cpu = statistics.median(c for c, _ in got[name])
        wall = statistics.median(w for _, w in got[name])
        print(
            f"{name}: {cpu:.3f} CPU-s ({cpu / b_cpu:.2f}x {base}), {wall:.3f} s wall "
            f"({wall / b_wall:.2f}x), median of {len(got[name])} tasks"
        )


if __name__ == "__main__":
    main()
