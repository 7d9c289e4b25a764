"""What a shared query's start costs before its first batch: the entries of N one-topic Kafka
members (their latest and first offsets, tables, shards and options), as a multi-table
datastream's tables joining the worker's query make them (issue 38, docs/performance.md "(c)
Catch-up of a 100-topic backlog").

Run from the repository root (not part of CI)::

    .venv/bin/python bench/shared_join.py                            # 100 topics, 3 rounds
    .venv/bin/python bench/shared_join.py --src /path/to/old/tree    # A/B against another tree

N one-partition topics of a few records each are created on the bundled broker. Each round
runs, in a fresh process per tree (``PYTHONPATH=<tree>/src``), N datastreams' runners on a
fresh SQLite metadata store with their tables created beforehand (as the controller creates a
multi-table datastream's tables), and times :meth:`SharedQueryRunner.begin` (what a query
start does before Spark starts the query; a join does the same through ``add_many``). With
``--src`` the trees alternate, the first round's order swapped each round; the figure is the
median per tree and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import common

CHILD = r"""
import json, sys, time
from pathlib import Path
from types import SimpleNamespace
from millstream.catalog import Catalog
from millstream.datastream import DatastreamSpec
from millstream.spark.runner import DatastreamRunner
from millstream.spark.shared import SharedQueryRunner
from millstream.storage.statedir import StateDirectory

bootstrap, topics, home = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
spark = SimpleNamespace(sparkContext=SimpleNamespace(defaultParallelism=2))
catalog = Catalog.open(home=home)
members = []
for i in range(topics):
    spec = DatastreamSpec.parse({
        "name": f"j{i:03d}",
        "source": {"kind": "kafka", "bootstrap_servers": bootstrap, "topic": f"t{i:03d}"},
        "schema": {"id": "long", "v": "string"},
        "table": {"mode": "append"},
    })
    m = DatastreamRunner(spec, catalog, spark, writer_id="w1",
                         state_dir=StateDirectory(home / "state", spec.name))
    m.ensure_tables()  # the controller creates a multi-table datastream's tables first
    members.append(m)
runner = SharedQueryRunner(members, spark, StateDirectory(home / "state", "_q"))
t0 = time.perf_counter()
runner.begin()
print(json.dumps({"begin_s": time.perf_counter() - t0}))
catalog.close()
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topics", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--src", type=Path, default=None, help="another tree to A/B against")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    log = common.log_stamped
    from confluent_kafka import Producer

    from millstream.local.tansu import TansuBroker

    trees = {"this": common.REPO, **({"src": args.src.resolve()} if args.src else {})}
    res: dict[str, Any] = {
        "command": common.command_line("shared_join.py"),
        "machine": common.machine("pyspark"),
        "load_start": common.load(),
        "topics": args.topics,
    }
    runs: list[dict[str, Any]] = []
    with common.workdir("millstream-bench-join-", say=log) as base:
        broker = TansuBroker(base / "tansu").start()
        try:
            prod = Producer({"bootstrap.servers": broker.bootstrap})
            for i in range(args.topics):
                broker.create_topic(f"t{i:03d}", 1)
                for j in range(5):
                    prod.produce(f"t{i:03d}", key=b"%d" % j, value=b'{"id": %d}' % j)
            prod.flush(60)
            for r in range(1, args.rounds + 1):
                order = list(trees) if r % 2 else list(reversed(trees))
                for tree in order:
                    home = base / f"r{r}-{tree}"
                    env = {**os.environ, "PYTHONPATH": str(trees[tree] / "src")}
                    out = subprocess.run(
                        [
                            sys.executable,
                            "-c",
                            CHILD,
                            broker.bootstrap,
                            str(args.topics),
                            str(home),
                        ],
                        capture_output=True,
                        text=True,
                        env=env,
                        check=False,
                    )
                    if out.returncode:
                        raise RuntimeError(f"{tree}: {out.stderr[-3000:]}")
                    got = json.loads(out.stdout.strip().splitlines()[-1])
                    runs.append({"round": r, "tree": tree, **got, "load": common.load()})
                    log(
                        f"round {r}, {tree}: begin {got['begin_s']:.2f} s (load {common.load()[0]})"
                    )
        finally:
            broker.stop()
    med = {t: statistics.median(x["begin_s"] for x in runs if x["tree"] == t) for t in trees}
    res |= {"runs": runs, "median_begin_s": med, "load_end": common.load()}
    log(
        f"median begin of {args.topics} members: "
        + ", ".join(f"{t} {s:.2f} s" for t, s in med.items())
    )
    if "src" in med:
        log(f"ratio this / src: {common.ratio(med['this'], med['src']):.2f}")
    common.save_results("shared_join", res, args.json, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
