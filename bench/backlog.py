"""Catch-up of a many-topic backlog: one datastream of 100 one-partition topics vs one
4-partition topic holding the same records (issue 38's last benchmark: the 100 topics catch up
at >= 0.8x the rows/s of the one topic).

Run from the repository root (not part of CI)::

    .venv/bin/python bench/backlog.py                            # 1,000,000 records, 100 topics
    .venv/bin/python bench/backlog.py --rows 100000 --topics 20  # a small run
    .venv/bin/python bench/backlog.py --rounds 3 --json /tmp/backlog.json
    .venv/bin/python bench/backlog.py --rounds 2 --src new=. --src before=/path/to/old/tree

**Input.** ``--rows`` (1,000,000) records of the generator's orders stream (``ORDERS_SCHEMA``,
seed 7, keys partition-affine, updates, deletes as tombstones, duplicates) generated over
``--topics`` (100) generator partitions. They are produced, before any datastream exists,
twice onto the bundled Tansu broker with confluent-kafka: generator partition ``i`` into topic
``t<i>`` (one partition each; 10,000 records a topic at the defaults), and the very same
records into ONE topic ``single`` of 4 partitions (generator partition ``i`` into partition
``i % 4``, in order), so both variants hold the same keys, values and per-key order.

**Catch-up.** Real processes, as ``bench/scale.py`` part (c) starts them (``scale.services``):
``millstream controller`` and ONE ``millstream worker`` (``local[2]``) on a SQLite metadata
store. ``millstream run --available-now`` runs one table's datastream only (a multi-table
spec has no single table), so both variants run on the worker: the 100 topics as ONE
datastream naming them (``source.topics``, a table per topic, ``{topic}`` in the table name),
the 4-partition topic as a one-topic datastream; both the end-to-end tests' upsert table
(``orders_spec``) at default batch sizes, ``starting_offsets: earliest``. Per variant: the
time from the datastream's create (``POST /datastreams``) to every table's shard uppers
reaching its topic's end offsets (sampled every 0.25 s from the metadata store); rows/s =
records / that time; the worker process tree's CPU seconds over it and its peak RSS (sampled
every 2 s); from the worker's commit logs the batches, rows per batch and tables per batch.
Each variant's datastream is deleted once measured. With ``--rounds`` the two variants run in
alternating order (a new datastream and tables each round) and the figure is the median. The
first round's tables are read back: each must hold as many rows as its records' model (its
topic's distinct live keys, ``millstream.reference.oracle``) and no dead letter.

**A/B.** With ``--src NAME=DIR`` (repeated), each round runs every tree's worker in turn
(alternating order; the other trees' workers stopped): worker ``w1`` started with ``DIR/src``
first on its ``PYTHONPATH`` (which Spark's Python workers inherit), its own warm-ups, then
both variants; the controller, broker and records are the same. Each tree's ratio and its
first batch's commit (the last table of it, from the create) are printed, per tree.

Prints the ratio (100 topics / one 4-partition topic) against the 0.8x target. Waits up to
3 minutes for a quiet machine (``--no-wait`` skips it), stops what it started, removes its
temporary directory unless ``--keep``. Results go to ``bench/results/backlog-<time>.json`` and
``--json PATH``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import common
import scale

TARGET_RATIO = 0.8
SEED = 7
SINGLE = "single"
SINGLE_PARTITIONS = 4


def generate_input(
    rows: int, topics: int
) -> tuple[list[list[tuple[bytes, bytes | None]]], list[int]]:
    """(per generator partition its (key, value) records, per partition its model's row count)."""
    from harness.cluster import orders_spec
    from millstream.ingest.sources.generator import (
        ORDERS_SCHEMA,
        GeneratorConfig,
        generate,
        partition_total,
    )
    from millstream.reference.oracle import expected_table
    from millstream.spec import TableSpec

    cfg = GeneratorConfig(seed=SEED, partitions=topics, key_cardinality=max(1000, rows // 5))
    base = orders_spec("x", "localhost:1", "x")["table"]
    spec = TableSpec.parse({"name": "orders", "schema": ORDERS_SCHEMA, **base})
    parts: list[list[tuple[bytes, bytes | None]]] = []
    expected: list[int] = []
    for p in range(topics):
        n = partition_total(rows, topics, p)
        assert n is not None
        recs = [(k, v) for _, k, v in generate(cfg, p, 0, n)]
        parts.append(recs)
        got, bad = expected_table(spec, ((0, o, k, v) for o, (k, v) in enumerate(recs)))
        assert not bad, f"the oracle found bad records in generator partition {p}"
        expected.append(len(got))
    return parts, expected


def produce(
    bootstrap: str, plan: list[tuple[str, int, list[tuple[bytes, bytes | None]]]]
) -> dict[tuple[str, int], int]:
    """Produce each (topic, partition, records) in order; returns every partition's end offset
    (one past the last acknowledged offset)."""
    from confluent_kafka import Producer

    ends: dict[tuple[str, int], int] = {}
    errors: list[str] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
            return
        key = (msg.topic(), msg.partition())
        ends[key] = max(ends.get(key, 0), msg.offset() + 1)

    prod = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 50,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": 200_000,
            "enable.idempotence": True,  # in order, once
            "log.connection.close": False,
        }
    )
    for topic, partition, recs in plan:
        for key, value in recs:
            while True:
                try:
                    prod.produce(
                        topic, value=value, key=key, partition=partition, on_delivery=delivered
                    )
                    break
                except BufferError:
                    prod.poll(0.05)
        prod.poll(0)
    left = prod.flush(300)
    if errors or left:
        raise RuntimeError(f"produce failed: {left} unflushed, errors {errors[:3]}")
    return ends


def commit_counts(home: Path, datastream: str, since: float) -> dict[str, Any]:
    """Batches, rows per batch and tables per batch of ``datastream``'s commits after
    ``since``, from the worker's per-table commit logs (one line per table and batch)."""
    per_batch: dict[int, list[int]] = {}
    commit_s: dict[int, float] = {}
    at: dict[int, list[float]] = {}
    for path in home.glob(f"workers/*/**/{datastream}*/**/commits.jsonl*"):
        with contextlib.suppress(OSError):
            for line in path.read_text().splitlines():
                with contextlib.suppress(ValueError):
                    c = json.loads(line)
                    if c.get("version") is None or c.get("at", 0) < since:
                        continue
                    if int(c.get("rows") or 0) > 0:
                        b = int(c["batch_id"])
                        per_batch.setdefault(b, []).append(int(c["rows"]))
                        at.setdefault(b, []).append(float(c["at"]) - since)
                        # a batch's tables may share one transaction: its longest, not the sum
                        commit_s[b] = max(commit_s.get(b, 0.0), float(c.get("commit_s") or 0.0))
    rows = [sum(v) for v in per_batch.values()]
    tables = [len(v) for v in per_batch.values()]
    return {
        "batches": len(per_batch),
        "rows_per_batch_median": statistics.median(rows) if rows else 0,
        "rows_per_batch_max": max(rows, default=0),
        "tables_per_batch_median": statistics.median(tables) if tables else 0,
        "tables_per_batch_max": max(tables, default=0),
        "table_commits": sum(tables),
        "commit_s_per_batch": [round(commit_s[b], 3) for b in sorted(per_batch)],
        #: seconds from the create to a batch's first and last table commit line
        "batch_commit_at_s": [
            [round(min(at[b]), 1), round(max(at[b]), 1)] for b in sorted(per_batch)
        ],
    }


def catch_up(
    api: Any,
    store: Any,
    worker: Any,
    home: Path,
    spec: dict[str, Any],
    tables: dict[str, tuple[str, int]],
    ends: dict[tuple[str, int], int],
    rows: int,
    timeout: float,
    diag: Any,
) -> dict[str, Any]:
    """Create ``spec``, wait until every (table, partition) of ``tables`` (table -> (topic,
    partitions)) reaches its topic's end, measure, then delete the datastream."""
    from harness.cluster import wait_until

    target = {(t, p): ends.get((tp, p), 0) for t, (tp, n) in tables.items() for p in range(n)}
    procs0 = scale.tree(worker.pid)
    cpu0 = {p["pid"]: p["cpu_s"] for p in procs0}
    peak = scale.tree_summary(procs0)["rss_mb"]
    t0 = time.time()
    r = api.post("/datastreams", spec)
    assert r.status_code == 201, r.text
    sampled = t0
    done = 0
    while True:
        now = time.time()
        with contextlib.suppress(Exception):
            up = scale.all_uppers(store)
            done = sum(1 for k, e in target.items() if up.get(k, -1) >= e)
            if done == len(target):
                break
        if now - sampled >= 2.0:
            sampled = now
            peak = max(peak, scale.tree_summary(scale.tree(worker.pid))["rss_mb"])
        if now - t0 > timeout:
            print(diag(), file=sys.stderr)
            raise TimeoutError(
                f"{spec['name']}: {done} of {len(target)} shards caught up in {timeout:.0f}s"
            )
        time.sleep(0.25)
    seconds = time.time() - t0
    procs1 = scale.tree(worker.pid)
    peak = max(peak, scale.tree_summary(procs1)["rss_mb"])
    # processes that ended meanwhile are not counted; new ones count from 0
    cpu_s = sum(p["cpu_s"] - cpu0.get(p["pid"], 0.0) for p in procs1)
    out = {
        "datastream": spec["name"],
        "tables": len(tables),
        "seconds": seconds,
        "rows_s": rows / seconds,
        "worker_cpu_s": cpu_s,
        "worker_rss_mb_peak": peak,
        "load": common.load(),
        **commit_counts(home, spec["name"], t0),
    }
    assert api.delete(f"/datastreams/{spec['name']}").status_code == 202
    wait_until(
        f"{spec['name']} is removed",
        lambda: all(d["name"] != spec["name"] for d in api.get("/datastreams")),
        timeout=timeout,
        interval=1.0,
        diagnostics=diag,
    )
    return out


def verify(home: Path, url: str, tables: dict[str, int], log: Any) -> dict[str, Any]:
    """Each table's rows and dead letters against the model's row count."""
    from millstream.catalog import Catalog

    cat = Catalog.open(home=home, metadata_url=url, deep_store=str(home / "deepstore"))
    wrong = {}
    try:
        for t, want in tables.items():
            got = cat.read_table(t).num_rows
            dead = cat.read_table(f"{t}__dead_letter").num_rows
            if got != want or dead:
                wrong[t] = {"rows": got, "expected": want, "dead_letters": dead}
    finally:
        cat.close()
    log(
        f"verify: {len(tables) - len(wrong)} of {len(tables)} tables hold their model"
        + (f"; WRONG {wrong}" if wrong else "")
    )
    return {"tables": len(tables), "wrong": wrong}


def controller_only(cluster: Any) -> tuple[Any, str]:
    """Start ``cluster``'s controller; wait until it leads. Returns its API client."""
    from harness.cluster import Api, wait_until

    ctl = cluster.controller()
    api = Api(ctl.url)
    wait_until("the controller leads", lambda: api.get("/health")["leader"], timeout=120)
    return api, ctl.url


def start_worker(cluster: Any, api: Any, url: str, src: Path) -> Any:
    """Worker ``w1`` running the code of the tree ``src`` (its ``src`` first on PYTHONPATH,
    which Spark's Python workers inherit); returns once it heartbeats."""
    from harness.cluster import wait_until

    worker = cluster.worker("w1", url, env={"PYTHONPATH": str(src / "src")})
    wait_until(
        "the worker heartbeats",
        lambda: api.workers().get("w1", {}).get("alive"),
        timeout=300,
        diagnostics=cluster.diagnostics,
    )
    return worker


def warm_up(
    api: Any,
    store: Any,
    worker: Any,
    home: Path,
    base_spec: dict[str, Any],
    ends: dict[tuple[str, int], int],
    tag: str,
    timeout: float,
    diag: Any,
) -> None:
    """A one-topic and a two-topic datastream of a few records each, caught up and deleted,
    so neither measured variant pays the worker's first query."""
    for spec, tables in (
        (
            {
                **base_spec,
                "name": f"warm1{tag}",
                "table": {**base_spec["table"], "name": f"warm1{tag}"},
                "source": {**base_spec["source"], "topic": "w0"},
            },
            {f"warm1{tag}": ("w0", 1)},
        ),
        (
            {
                **base_spec,
                "name": f"warm2{tag}",
                "table": {**base_spec["table"], "name": f"warm2{tag}{{topic}}"},
                "source": {
                    k: v
                    for k, v in {**base_spec["source"], "topics": ["w1", "w2"]}.items()
                    if k != "topic"
                },
            },
            {f"warm2{tag}w1": ("w1", 1), f"warm2{tag}w2": ("w2", 1)},
        ),
    ):
        w = catch_up(api, store, worker, home, spec, tables, ends, 1, timeout, diag)
        common.log_stamped(f"warm-up {spec['name']}: {w['seconds']:.1f}s")


def measure(
    api: Any,
    store: Any,
    worker: Any,
    home: Path,
    url: str,
    base_spec: dict[str, Any],
    ends: dict[tuple[str, int], int],
    expected: list[int],
    topics: list[str],
    variant: str,
    r: int,
    tag: str,
    args: argparse.Namespace,
    diag: Any,
) -> dict[str, Any]:
    """One variant's catch-up (``topics``: one datastream of every topic, a table each;
    ``single``: the 4-partition topic); the first round's tables are read back."""
    if variant == "topics":
        name = f"many{r}{tag}"
        spec = {
            **base_spec,
            "name": name,
            "table": {**base_spec["table"], "name": f"r{r}{tag}m{{topic}}"},
        }
        spec["source"] = {**base_spec["source"], "topics": topics}
        del spec["source"]["topic"]
        tables = {f"r{r}{tag}m{t}": (t, 1) for t in topics}
        model = {f"r{r}{tag}m{t}": expected[i] for i, t in enumerate(topics)}
        rows = args.rows
    else:
        name = f"one{r}{tag}"
        spec = {**base_spec, "name": name, "table": {**base_spec["table"], "name": name}}
        spec["source"] = {**base_spec["source"], "topic": SINGLE}
        tables = {name: (SINGLE, SINGLE_PARTITIONS)}
        model = {name: sum(expected)}
        rows = args.rows
    out = catch_up(api, store, worker, home, spec, tables, ends, rows, args.timeout, diag)
    common.log_stamped(
        f"round {r}, {variant:>6}{f' ({tag})' if tag else ''}: {out['rows_s']:>8,.0f} rows/s ({out['seconds']:.1f}s), worker "
        f"{out['worker_cpu_s']:.0f} CPU-s, peak RSS {out['worker_rss_mb_peak']:,.0f} MB, "
        f"{out['batches']} batches (rows/batch median {out['rows_per_batch_median']:,.0f}, "
        f"tables/batch median {out['tables_per_batch_median']}), load {out['load'][0]}"
        f"; batches committed at {out['batch_commit_at_s']} s, "
        f"commit {out['commit_s_per_batch']} s"
    )
    if r == 1:
        out["verify"] = verify(home, url, model, common.log_stamped)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000, help="records in all")
    ap.add_argument("--topics", type=int, default=100, help="one-partition topics")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=1800.0, help="per catch-up, seconds")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--no-wait", action="store_true", help="do not wait for a quiet machine")
    ap.add_argument(
        "--src",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="A/B: run the worker from the tree DIR (its src/ first on PYTHONPATH); repeat "
        "it, each round runs every tree's worker in turn (alternating order), both variants "
        "on each",
    )
    args = ap.parse_args(argv)
    trees: list[tuple[str, Path | None]] = [("", None)]
    if args.src:
        trees = []
        for item in args.src:
            name, sep, where = item.partition("=")
            tree = re.sub(r"[^a-z0-9]", "", name.lower())
            if not sep or not tree or not (Path(where) / "src" / "millstream").is_dir():
                ap.error(f"--src {item!r}: NAME=DIR, DIR a tree with src/millstream")
            trees.append((tree, Path(where).resolve()))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    log = common.log_stamped
    load_start, waited = (common.load(), 0.0) if args.no_wait else common.wait_for_quiet(log)
    res: dict[str, Any] = {
        "command": common.command_line("backlog.py"),
        "machine": common.machine("pyspark", "pyarrow"),
        "load_start": load_start,
        "load_wait_s": waited,
        "rows": args.rows,
        "topics": args.topics,
        "trees": {name: str(src) if src else None for name, src in trees},
    }
    from harness.cluster import orders_spec

    t0 = time.perf_counter()
    parts, expected = generate_input(args.rows, args.topics)
    log(
        f"input: {args.rows:,} records over {args.topics} generator partitions, {sum(expected):,} rows in the model ({time.perf_counter() - t0:.0f}s)"
    )
    topics = [f"t{i:03d}" for i in range(args.topics)]
    with (
        common.workdir("millstream-bench-backlog-", keep=args.keep, say=log) as base,
        scale.services(base) as svc,
    ):
        home, url, broker, cluster, store = svc.home, svc.url, svc.broker, svc.cluster, svc.store
        for t in topics:
            broker.create_topic(t, 1)
        broker.create_topic(SINGLE, SINGLE_PARTITIONS)
        t1 = time.perf_counter()
        ends = produce(broker.bootstrap, [(t, 0, parts[i]) for i, t in enumerate(topics)])
        s_many = time.perf_counter() - t1
        t1 = time.perf_counter()
        ends |= produce(
            broker.bootstrap,
            [(SINGLE, i % SINGLE_PARTITIONS, parts[i]) for i in range(args.topics)],
        )
        s_one = time.perf_counter() - t1
        assert sum(e for (tp, _), e in ends.items() if tp == SINGLE) == args.rows
        assert sum(e for (tp, _), e in ends.items() if tp != SINGLE) == args.rows
        res["produce_s"] = {"topics": s_many, "single": s_one}
        log(
            f"produced {args.rows:,} records into {args.topics} topics in {s_many:.0f}s, into one {SINGLE_PARTITIONS}-partition topic in {s_one:.0f}s"
        )

        diag = cluster.diagnostics
        base_spec = orders_spec("x", broker.bootstrap, "x")
        base_spec["source"]["starting_offsets"] = "earliest"
        base_spec.pop("max_records_per_batch")  # default (adaptive) batch sizes
        # warm-up: a one-topic and a two-topic datastream of a few records each, caught
        # up and deleted, so neither measured variant pays the worker's first query
        warm = {f"w{i}": [r for p in range(args.topics) for r in parts[p][:5]] for i in range(3)}
        del parts
        for t in warm:
            broker.create_topic(t, 1)
        ends |= produce(broker.bootstrap, [(t, 0, recs) for t, recs in warm.items()])
        runs: list[dict[str, Any]] = []
        if trees == [("", None)]:  # this process's code, one worker for every round
            api, worker = scale.controller_and_worker(cluster, leader_timeout=120)
        else:
            (api, ctl_url), worker = controller_only(cluster), None
        for r in range(1, args.rounds + 1):
            for name, src in trees if r % 2 else trees[::-1]:
                tag = f"{name}{r}" if src is not None else ""
                if src is not None:  # this tree's worker: the only one running
                    if worker is not None:
                        worker.terminate()
                    worker = start_worker(cluster, api, ctl_url, src)
                    log(f"round {r}: worker of tree {name} ({src}) started")
                assert worker is not None
                if src is not None or r == 1:
                    warm_up(api, store, worker, home, base_spec, ends, tag, args.timeout, diag)
                order = ["topics", "single"] if r % 2 else ["single", "topics"]
                for variant in order:
                    out = measure(
                        api,
                        store,
                        worker,
                        home,
                        url,
                        base_spec,
                        ends,
                        expected,
                        topics,
                        variant,
                        r,
                        tag,
                        args,
                        diag,
                    )
                    out |= {"variant": variant, "round": r, "tree": name}
                    runs.append(out)
        if worker is not None:
            worker.terminate()
        api.close()
    res |= {"runs": runs, "load_end": common.load()}
    log("")
    log(f"machine: {res['machine']}")
    log(f"load average at start {res['load_start']}, at end {res['load_end']}")
    log(f"catch-up of {args.rows:,} records, median of {args.rounds} round(s):")
    summary: dict[str, Any] = {}
    for name, _ in trees:
        mine = [x for x in runs if x["tree"] == name]
        med = {
            v: statistics.median(x["rows_s"] for x in mine if x["variant"] == v)
            for v in ("topics", "single")
        }
        per_round = [
            common.ratio(
                next(x["rows_s"] for x in mine if x["variant"] == "topics" and x["round"] == r),
                next(x["rows_s"] for x in mine if x["variant"] == "single" and x["round"] == r),
            )
            for r in range(1, args.rounds + 1)
        ]
        first = {
            v: statistics.median(
                x["batch_commit_at_s"][0][1] for x in mine if x["variant"] == v and x["batches"]
            )
            for v in ("topics", "single")
        }
        ratio = common.ratio(med["topics"], med["single"])
        summary[name] = {
            "median_rows_s": med,
            "ratio": ratio,
            "ratio_per_round": per_round,
            "first_batch_committed_s": first,
        }
        label = f"tree {name}: " if name else ""
        log(
            f"{label}{args.topics} one-partition topics, one datastream: {med['topics']:,.0f} rows/s; "
            f"one {SINGLE_PARTITIONS}-partition topic: {med['single']:,.0f} rows/s"
        )
        log(
            f"{label}ratio {args.topics} topics / one topic: {ratio:.2f} (per round: "
            f"{', '.join(f'{x:.2f}' for x in per_round)}); target >= {TARGET_RATIO}: "
            f"{common.verdict(ratio >= TARGET_RATIO)}; first batch committed (its last table) "
            f"{first['topics']:.1f} s after the create against {first['single']:.1f} s"
        )
    res["by_tree"] = summary
    if "" in summary:  # one tree: the figures at the top level, as before
        res |= {k: v for k, v in summary[""].items() if k != "first_batch_committed_s"}
    ok = all(not x["verify"]["wrong"] for x in runs if "verify" in x)
    log(f"row counts: {'every table holds its model' if ok else 'MISMATCH'}")
    common.save_results("backlog", res, args.json, log)
    return 0 if ok else 1


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
