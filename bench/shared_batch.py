"""What a batch of N small busy tables costs a worker's shared query, phase by phase.

Run from the repository root (not part of CI; about a minute per tree)::

    .venv/bin/python bench/shared_batch.py                          # 20 and 50 tables
    .venv/bin/python bench/shared_batch.py --tables 20,50 --batches 6 --profile
    .venv/bin/python bench/shared_batch.py --tree new=src --tree old=/tmp/old/src
    # options: --tables N,N --records R --batches B --profile --json PATH --no-wait

A Tansu broker with N topics of one partition and a SQLite metadata store with a local deep
store. N datastreams (one topic and one upsert table each, the end-to-end tests' orders
spec) are the members of ONE shared query (:class:`~millstream.spark.shared.SharedQueryRunner`),
as the tables of a datastream of many topics are. Spark's part is stood in for as in
``tests/unit/ingest/test_shared_query_membership.py``: the production source plans a batch
(``latestOffset``, ``partitions``), the production sink's write tasks run on the planned
tasks (offsets through JSON, tasks, the reader and the writer through pickle, as they travel in
Spark; one after the other here, on the worker's two task slots in Spark), and a sink from the
query's data source (``streamWriter``, as Spark's commit process gets it at each batch)
commits the batch. Before each batch every topic gets ``--records``
(10) records, so every table has records in every batch.

Per batch: the SQL statements its commit sent to the metadata store, wall and CPU seconds (``time.process_time``: every thread of this process, the
Kafka clients' too; not the broker's) of planning, of the write tasks and of the commit,
and the tasks planned. What Spark adds (its scheduling, the offset and commit logs, a Python
worker call per task) does not grow with the tables and is not here. ``--profile`` runs one
more batch with the members one after another (cProfile sees one thread) and prints where
its time went. With ``--batches`` 20 or more it also prints the median CPU-s of the first
and of the last 10 batches: each batch adds an unsealed entry to every table (nothing seals
here), so the two say whether a batch grows dearer with the tables' unsealed runs.
``--tree NAME=SRC`` runs the bench with ``SRC`` first on ``sys.path`` (a
tree before a change, say), a fresh process per tree and table count, the trees
alternating, so before and after are measured in the same run. Results go to
``bench/results/shared-batch-<time>.json`` and ``--json PATH``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pickle
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import common

SPARK = SimpleNamespace(sparkContext=SimpleNamespace(defaultParallelism=2))
PHASES = ("plan", "tasks", "commit")
SEED = 7
#: Batches run before the measured ones: the consumers and caches warm up, and tables that
#: joined enter the query (a batch) before they are planned.
WARM = 2


class Batches:
    """One shared query's batches as Spark runs them (see the module's docstring)."""

    def __init__(self, runner: Any, later: list[Any]) -> None:
        from millstream.spark.options import GroupSourceOptions
        from millstream.spark.sources import GroupStreamReader

        source, sink = runner.begin()
        runner.query = SimpleNamespace(isActive=True, id="q", runId="r")
        self.source_options, self.sink_options = source.to_options(), sink.to_options()
        self.planner = GroupStreamReader(GroupSourceOptions.from_options(self.source_options))
        self.task_reader = GroupStreamReader(GroupSourceOptions.from_options(self.source_options))
        self.task_sink = writer(self.sink_options)
        self.start: dict[str, Any] = json.loads(json.dumps(self.planner.initialOffset()))
        self.batch = 0
        self.now = 0.0  # Spark's clock (monotonic seconds)
        if later:  # they join the running query (as a pattern's tables do)
            joined = runner.add_many(later)
            assert all(v is True for v in joined.values()), joined

    def run(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        w0, c0 = time.perf_counter(), time.process_time()
        # each batch a trigger interval after the last: every member is due (StreamReader.due)
        self.now += 10.0
        limit = self.planner.getDefaultReadLimit()
        end = json.loads(json.dumps(self.planner.latestOffset(self.start, limit, self.now)))
        tasks = pickle.loads(pickle.dumps(self.planner.partitions(self.start, end)))
        w1, c1 = time.perf_counter(), time.process_time()
        # each task unpickles the query's reader and writer (Spark ships them to its tasks)
        reader, sink = pickle.dumps(self.task_reader), pickle.dumps(self.task_sink)
        messages = pickle.loads(
            pickle.dumps([pickle.loads(sink).write(pickle.loads(reader).read(t)) for t in tasks])
        )
        w2, c2 = time.perf_counter(), time.process_time()
        sent.clear()
        writer(self.sink_options).commit(messages, self.batch)
        w3, c3 = time.perf_counter(), time.process_time()
        out["commit_statements"] = len(sent)
        self.start, self.batch = end, self.batch + 1
        out["tasks_planned"] = len(tasks)
        out["members_written"] = sum(len(m.messages) for m in messages)
        out["failed"] = {n: e for m in messages for n, e in m.failed.items()}
        for name, (wa, wb, ca, cb) in zip(
            PHASES, [(w0, w1, c0, c1), (w1, w2, c1, c2), (w2, w3, c2, c3)], strict=True
        ):
            out[f"{name}_wall_s"] = round(wb - wa, 4)
            out[f"{name}_cpu_s"] = round(cb - ca, 4)
        out["wall_s"] = round(w3 - w0, 4)
        out["cpu_s"] = round(c3 - c0, 4)
        return out


def writer(options: dict[str, str]) -> Any:
    """The shared query's sink as Spark makes it, from its data source: once for the query's
    write tasks (then pickled to each), and for every batch's commit."""
    from millstream.spark.table_source import MillstreamGroupSink

    return MillstreamGroupSink(options).streamWriter(None, False)


#: The SQL statements sent to the metadata store (every engine's), cleared before a commit.
sent: list[str] = []


def count_statements() -> None:
    """Count every statement any SQLAlchemy engine sends (``before_cursor_execute``)."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    def one(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        sent.append(statement)

    event.listen(Engine, "before_cursor_execute", one)


def produce(bootstrap: str, topics: list[str], records: int, seq: int) -> None:
    from confluent_kafka import Producer

    from millstream.ingest.sources.generator import GeneratorConfig, generate

    cfg = GeneratorConfig(seed=SEED, partitions=1, key_cardinality=1000)
    recs = [(k, v) for _, k, v in generate(cfg, 0, seq * records, (seq + 1) * records)]
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for t in topics:
        for k, v in recs:
            p.produce(t, value=v, key=k, partition=0)
    p.flush(60)


def one(tables: int, records: int, batches: int, profile: bool, join: bool) -> dict[str, Any]:
    """The bench for ``tables`` tables in this process (the tree on ``sys.path``)."""
    import millstream
    from harness.ingest_support import TABLE_SECTIONS
    from millstream.catalog import Catalog
    from millstream.datastream import DatastreamSpec
    from millstream.ingest.sources.generator import ORDERS_SCHEMA
    from millstream.local.tansu import TansuBroker
    from millstream.spark.runner import DatastreamRunner
    from millstream.spark.shared import SharedQueryRunner
    from millstream.storage.statedir import StateDirectory

    count_statements()
    base = Path(tempfile.mkdtemp(prefix="shared-batch-"))
    with TansuBroker(base / "tansu") as broker:
        topics = [f"sb-t{i:03d}" for i in range(tables)]
        for t in topics:
            broker.create_topic(t, 1)
        catalog = Catalog.open(home=base / "home")
        members = []
        for t in topics:
            spec = DatastreamSpec.parse(
                {
                    "name": t.replace("-", "_"),
                    "source": {
                        "kind": "kafka",
                        "bootstrap_servers": broker.bootstrap,
                        "topic": t,
                        "starting_offsets": "earliest",
                    },
                    "table": dict(TABLE_SECTIONS["upsert"]),
                    "schema": dict(ORDERS_SCHEMA),
                    "trigger_interval": "500ms",
                }
            )
            members.append(
                DatastreamRunner(
                    spec,
                    catalog,
                    SPARK,
                    writer_id="w1",
                    state_dir=StateDirectory(base / "writers", spec.name),
                )
            )
        first, later = (members[:1], members[1:]) if join else (members, [])
        runner = SharedQueryRunner(first, SPARK, StateDirectory(base, "_q"))
        query = Batches(runner, later)
        rows: list[dict[str, Any]] = []
        for b in range(batches + WARM):
            produce(broker.bootstrap, topics, records, b)
            got = query.run()
            if got["failed"]:
                raise SystemExit(f"members failed: {got['failed']}")
            if b >= WARM:
                rows.append(got)
        prof = None
        if profile:
            prof = profiled(query, broker.bootstrap, topics, records, batches + WARM)
        catalog.close()
    shutil.rmtree(base, ignore_errors=True)
    return {
        "tree": str(Path(millstream.__file__).parent.parent),
        "tables": tables,
        "records": records,
        "joined": join,
        "batches": rows,
        "median": {
            k: round(statistics.median(r[k] for r in rows), 4)
            for k in rows[0]
            if k.endswith("_s") or k in ("tasks_planned", "members_written", "commit_statements")
        },
        "profile": prof,
    }


def profiled(query: Batches, bootstrap: str, topics: list[str], records: int, seq: int) -> str:
    """One more batch under cProfile, the members one after another (cProfile sees the
    thread it runs on): the functions by cumulative time."""
    import millstream.spark.sink as sink_mod  # each_member: the one the write tasks call
    import millstream.spark.sources as sources_mod

    def serial(names: list[str], call: Any, thread_prefix: str) -> dict[str, Any]:
        return {n: call(n) for n in names}

    produce(bootstrap, topics, records, seq)
    saved = sink_mod.each_member, sources_mod.each_member
    sink_mod.each_member = sources_mod.each_member = serial
    try:
        pr = cProfile.Profile(time.process_time)
        pr.enable()
        query.run()
        pr.disable()
    finally:
        sink_mod.each_member, sources_mod.each_member = saved
    text = io.StringIO()
    pstats.Stats(pr, stream=text).sort_stats("cumulative").print_stats(60)
    return text.getvalue()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tables", default="20,50", help="table counts, comma-separated")
    ap.add_argument("--records", type=int, default=10, help="records per table per batch")
    ap.add_argument("--batches", type=int, default=5, help="batches measured per run")
    ap.add_argument("--profile", action="store_true", help="profile one more batch")
    ap.add_argument("--join", action="store_true", help="all tables but one join the running query")
    ap.add_argument(
        "--tree", action="append", default=[], help="NAME=SRC: run with SRC first on sys.path"
    )
    ap.add_argument("--rounds", type=int, default=1, help="rounds of every tree")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--no-wait", action="store_true", help="do not wait for a quiet machine")
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one is not None:  # a child: one run, its JSON on stdout
        print(json.dumps(one(args.one, args.records, args.batches, args.profile, args.join)))
        return 0
    if not args.no_wait:
        common.wait_for_quiet(common.log)
    trees = [t.split("=", 1) for t in args.tree] or [["this", str(common.REPO / "src")]]
    results: list[dict[str, Any]] = []
    for r in range(args.rounds):
        for n in [int(x) for x in args.tables.split(",")]:
            order = trees if r % 2 == 0 else trees[::-1]
            for name, src in order:
                load = common.load_text()
                env = {**os.environ, "PYTHONPATH": os.path.abspath(src)}
                cmd = [sys.executable, __file__, "--one", str(n), "--records", str(args.records)]
                cmd += ["--batches", str(args.batches), *(["--profile"] if args.profile else [])]
                cmd += ["--join"] if args.join else []
                done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
                if done.returncode:
                    sys.stderr.write(done.stderr[-4000:])
                    raise SystemExit(f"tree {name}, {n} tables: exit {done.returncode}")
                res = json.loads(done.stdout.strip().splitlines()[-1])
                res.update(name=name, round=r, load=load)
                results.append(res)
                m = res["median"]
                common.log(
                    f"{name:>6} {n:4d} tables (load {load}): {m['tasks_planned']:.0f} tasks, "
                    f"batch {m['wall_s']:.3f} s wall {m['cpu_s']:.3f} CPU-s "
                    f"({m['cpu_s'] / n * 1000:.1f} ms a table): plan {m['plan_cpu_s']:.3f}, "
                    f"tasks {m['tasks_cpu_s']:.3f}, commit {m['commit_cpu_s']:.3f} CPU-s, "
                    f"{m['commit_statements']:.0f} statements"
                )
                rows = res["batches"]
                if len(rows) >= 20:  # does a batch grow dearer as the tables' unsealed runs grow?
                    first, last = (
                        statistics.median(r["cpu_s"] for r in g) for g in (rows[:10], rows[-10:])
                    )
                    common.log(
                        f"       a batch's CPU-s, first 10 batches {first:.3f}, last 10 {last:.3f} "
                        f"({len(rows)} unsealed entries a table at the end)"
                    )
                if res["profile"]:
                    print(res["profile"])
    common.save_results("shared-batch", {"machine": common.machine(), "runs": results}, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
