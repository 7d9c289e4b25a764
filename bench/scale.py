"""Scale benchmark: what grows with the number of partitions and of datastreams on one worker.

Run from the repository root (not part of CI; about 12 minutes, ``--quick`` about 5)::

    .venv/bin/python bench/scale.py                      # both parts, 3 rounds of part A
    .venv/bin/python bench/scale.py --quick              # 200,000 rows, 1 round, 20 s steps
    .venv/bin/python bench/scale.py --skip b --json /tmp/scale.json
    .venv/bin/python bench/scale.py --skip a,b --topics 100 --topic-rate 10 --seconds 180
    .venv/bin/python bench/scale.py --skip a,b --c-variants one --seconds 180 \
        --c-src before=/tmp/main-checkout --c-src after=.   # A/B of the worker's own CPU
    # options: --rows N, --rounds N, --partitions 4,64,256, --streams 1,4,8,16,
    #          --rate R (per datastream), --seconds S (per step),
    #          --skip a,b,c, --keep  (the catch-up of a many-topic backlog: bench/backlog.py)

**(a) Partitions: catch-up and commit latency.** The same total input (``--rows``, default
1,000,000 records of the generator's orders stream, ``ORDERS_SCHEMA``, seed 7, keys
partition-affine) is written as the ``files`` source's JSON-lines files (``ingest_input.py``:
one subdirectory per partition, 50,000 lines per file) once per partition count (4, 64 and
256 partitions). Each is caught up by ``DatastreamRunner(files source -> upsert table)
.run(available_now=True)`` at DEFAULT settings (adaptive batches: the 1M rows fit one
micro-batch; a partition fewer than the write tasks has its range split over them), in one
SparkSession warmed by a tiny datastream first (the input is one file per partition). Per run:
rows/s over the whole input (wall time of ``run()``), and per micro-batch the sink's metadata
commit time (``commit_s`` of its ``commits.jsonl``: the one transaction of compare-and-append
for the table and its dead-letter table, plus deleting unreferenced staged files) and Spark's
``addBatch`` / ``triggerExecution`` (none since session 19: the run's batches are Spark jobs,
``millstream.spark.catch_up``, not a streaming query). The partition counts run interleaved, ``--rounds`` times;
the figure is the median per partition count, and the ratios 64/4 and 256/4 are of those
medians (the per-round ratios are printed too). The first round's tables are read back and
their row counts checked against ``millstream.reference.oracle``.

**(b) Datastreams on one worker.** Real processes, as ``bench/failover.py`` starts them
(``harness.cluster``): a Tansu broker, ``millstream controller``, ONE
``millstream worker`` (``local[2]``), a SQLite metadata store. Datastreams are added in steps
(1, 4, 8, 16 in all), each on its own 4-partition topic with the end-to-end tests' spec
(``orders_spec``: upsert, 500 ms trigger, ``max_records_per_batch`` 5,000). A producer thread
in this process writes generator orders into every topic at ``--rate`` (1,000) records/s each.
Once every datastream of a step runs and is caught up, the step is measured for ``--seconds``
(60): the worker's RSS (summed over its process tree: the driver, Spark's JVM, every Python
worker, source and sink runner), the number of Python processes in that tree and their kinds,
the tree's CPU use, and per datastream the produce-ack -> visible freshness, sampled as
``ingest_freshness.py`` does (every 50 ms: the last acknowledged offset per partition and the
shard uppers; a sample's latency is the first time its shard's upper passes it minus its ack
time), plus the batches committed and the median commit time.

**(c) Many topics, one worker: a datastream of many topics vs a datastream per topic.** The
same real processes as (b). ``--topics`` (100) topics of one partition each get
``--topic-rate`` (10) records/s each. First ONE datastream's pattern matches them all
(``source.topic_pattern``, a table each, ``orders_spec``'s table section, starting at the
latest offsets): the time from its create to each table's first rows, then, once caught up,
``--seconds`` measured: per table the produce-ack -> visible freshness (p99 per table, worst
and median), the worker's RSS every 5 s, its CPU and the CPU-s per batch of its shared query;
for a long window, what grows: the RSS of each kind of process at 1 minute and at the end,
the worker JVM's heap every 5 s (``jstat -gc``: used, committed, old generation) and the
batches and CPU-s a batch minute by minute.
It is then deleted, and the same topics get a datastream each on the same worker, measured
the same way (``--c-variants one`` stops after the first; ``--topics 200 --topic-rate 5`` is
the issue's second case). ``--c-src LABEL=DIR`` (repeatable) runs the first variant once per
source tree, in order, each with fresh processes importing ``DIR/src`` (a ``git worktree add``
of another commit), and prints the worker's own process's CPU-s a batch (over the window and
by minute), the batches and p99 of each, with their ratios to the first's.

Prints both tables and the verdicts against issue 15's targets (64 partitions catch up at
>= 0.8x the rows/s of 4 partitions; 8 datastreams on one worker each keep p99 freshness <=
2 s at 1,000 rows/s). The script waits up to 3 minutes for a quiet machine (``--no-wait``
skips it), stops everything it started (the query and SparkSession; the worker, controller
and broker by PID) and removes its temporary directory unless ``--keep``. Results go to
``bench/results/scale-<time>.json`` and ``--json PATH``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import common
from ingest_input import UPSERT_TABLE, write_files
from ingest_observe import progress

TARGET_PARTITION_RATIO = 0.8  # 64 partitions catch up at >= 0.8x the rows/s of 4
TARGET_STREAMS = 8  # datastreams on one worker ...
TARGET_P99_S = 2.0  # ... each keeping p99 freshness <= 2 s ...
TARGET_RATE = 1000.0  # ... at 1,000 rows/s
SEED = 7
FILE_ROWS = 50_000
TOPIC_PARTITIONS = 4

# ---------------------------------------------------------------------------------------------
# (a) partitions
# ---------------------------------------------------------------------------------------------


@dataclass
class SplitInput:
    partitions: int
    root: Path
    rows: int
    expected_rows: int | None = None


def make_split_input(base: Path, rows: int, partitions: int, *, oracle: bool) -> SplitInput:
    """``rows`` generator orders over ``partitions`` partitions, as JSON-lines files (a
    tombstone becomes a delete record, as in ``ingest_input.py``)."""
    from ingest_input import _line

    from millstream.ingest.sources.generator import (
        ORDERS_SCHEMA,
        GeneratorConfig,
        generate,
        partition_total,
    )
    from millstream.reference.oracle import expected_table
    from millstream.spec import TableSpec

    cfg = GeneratorConfig(seed=SEED, partitions=partitions, key_cardinality=max(1000, rows // 5))
    root = base / f"input-{partitions}"
    spec = TableSpec.parse({"name": "orders", "schema": ORDERS_SCHEMA, **UPSERT_TABLE})
    expected = 0
    for p in range(partitions):
        n = partition_total(rows, partitions, p)
        assert n is not None
        lines = [_line(o, k, v) for o, k, v in generate(cfg, p, 0, n)]
        write_files(root, {p: lines}, FILE_ROWS)
        if oracle:  # keys are partition-affine: the model per partition adds up
            got, bad = expected_table(spec, ((p, o, None, v) for o, v in enumerate(lines)))
            assert not bad, f"the oracle found bad records in partition {p}"
            expected += len(got)
    return SplitInput(partitions, root, rows, expected if oracle else None)


def files_spec(name: str, root: Path) -> Any:
    """The files source into an upsert table, at DEFAULT settings (no batch size given)."""
    from millstream.datastream import DatastreamSpec
    from millstream.ingest.sources.generator import ORDERS_SCHEMA

    return DatastreamSpec.parse(
        {
            "name": name,
            "source": {"kind": "files", "path": str(root)},
            "table": UPSERT_TABLE,
            "schema": ORDERS_SCHEMA,
        }
    )


def catch_up(spark: Any, catalog: Any, inp: SplitInput, name: str) -> dict[str, Any]:
    from millstream.spark.runner import DatastreamRunner

    runner = DatastreamRunner(files_spec(name, inp.root), catalog, spark, writer_id="bench")
    t0 = time.perf_counter()
    runner.run(available_now=True)
    s = time.perf_counter() - t0
    commits = [c for c in runner.commits() if c.get("version") is not None]
    commit_s = [float(c["commit_s"]) for c in commits if c.get("commit_s") is not None]
    # Since session 19 an available-now run is Spark jobs, not a query: no Spark progress.
    queried = progress(runner.query) if runner.query is not None else []
    prog = [p for p in queried if p["duration_ms"].get("addBatch")]
    add = [p["duration_ms"]["addBatch"] / 1000 for p in prog]
    trig = [p["duration_ms"].get("triggerExecution", 0) / 1000 for p in prog]
    return {
        "name": name,
        "partitions": inp.partitions,
        "rows": inp.rows,
        "seconds": s,
        "rows_s": inp.rows / s,
        "batches": len(commits),
        "committed_rows": sum(int(c.get("rows") or 0) for c in commits),
        "commit_s": commit_s,
        "commit_s_median": statistics.median(commit_s) if commit_s else float("nan"),
        "commit_s_max": max(commit_s) if commit_s else float("nan"),
        "add_batch_s_median": statistics.median(add) if add else float("nan"),
        "trigger_s_median": statistics.median(trig) if trig else float("nan"),
    }


def part_a(args: argparse.Namespace, base: Path, log: Any) -> dict[str, Any]:
    from millstream.catalog import Catalog
    from millstream.spark.session import spark_session

    counts = [int(x) for x in args.partitions.split(",")]
    inputs: dict[int, SplitInput] = {}
    t0 = time.perf_counter()
    for n in counts:
        inputs[n] = make_split_input(base, args.rows, n, oracle=not args.no_verify)
        log(
            f"(a) input: {args.rows:,} rows over {n} partitions ({inputs[n].expected_rows} rows expected)"
        )
    gen_s = time.perf_counter() - t0
    spark = spark_session(app_name="millstream-bench-scale")
    runs: list[dict[str, Any]] = []
    try:
        catalog = Catalog.open(home=base / "home-a")
        warm = make_split_input(base / "warm", 2000, counts[-1], oracle=False)
        w0 = time.perf_counter()
        catch_up(spark, catalog, warm, "warmup")
        log(f"(a) warm-up run over {counts[-1]} partitions: {time.perf_counter() - w0:.1f}s")
        for r in range(1, args.rounds + 1):
            for n in counts:
                res = catch_up(spark, catalog, inputs[n], f"p{n}_r{r}")
                res["round"] = r
                if r == 1 and inputs[n].expected_rows is not None:
                    rows = catalog.read_table(res["name"]).num_rows
                    dead = catalog.read_table(f"{res['name']}__dead_letter").num_rows
                    res["table_rows"], res["dead_letter_rows"] = rows, dead
                    res["matches_oracle"] = rows == inputs[n].expected_rows and dead == 0
                runs.append(res)
                log(
                    f"(a) round {r}, {n:>3} partitions: {res['rows_s']:>9,.0f} rows/s "
                    f"({res['seconds']:.2f}s, {res['batches']} batches, commit median "
                    f"{res['commit_s_median'] * 1000:.0f} ms, max {res['commit_s_max'] * 1000:.0f} ms"
                    + (
                        f", oracle {'ok' if res['matches_oracle'] else 'MISMATCH'}"
                        if "matches_oracle" in res
                        else ""
                    )
                    + ")"
                )
        catalog.close()
    finally:
        spark.stop()
    med = {n: statistics.median(x["rows_s"] for x in runs if x["partitions"] == n) for n in counts}
    ratios = {f"{n}/{counts[0]}": common.ratio(med[n], med[counts[0]]) for n in counts[1:]}
    per_round = {
        f"{n}/{counts[0]}": [
            common.ratio(
                next(x["rows_s"] for x in runs if x["partitions"] == n and x["round"] == r),
                next(x["rows_s"] for x in runs if x["partitions"] == counts[0] and x["round"] == r),
            )
            for r in range(1, args.rounds + 1)
        ]
        for n in counts[1:]
    }
    return {
        "rows": args.rows,
        "input_seconds": gen_s,
        "runs": runs,
        "median_rows_s": med,
        "ratios": ratios,
        "ratios_per_round": per_round,
    }


# ---------------------------------------------------------------------------------------------
# (b) datastreams on one worker
# ---------------------------------------------------------------------------------------------


@dataclass
class Acks:
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: (topic, partition) -> (last acknowledged offset, ack time)
    last: dict[tuple[str, int], tuple[int, float]] = field(default_factory=dict)
    #: (topic, partition) -> one past the last acknowledged offset
    ends: dict[tuple[str, int], int] = field(default_factory=dict)
    count: int = 0
    errors: list[str] = field(default_factory=list)


class Producer:
    """Writes generator orders into every topic of :attr:`topics` at ``rate`` records/s each
    (round-robin over the topics' partitions) from a thread, noting each partition's last
    acknowledged offset and when it was acknowledged."""

    def __init__(
        self,
        bootstrap: str,
        rate: float,
        partitions: int = TOPIC_PARTITIONS,
        *,
        linger_ms: float = 20.0,
        keys: int = 20_000,
    ) -> None:
        from confluent_kafka import Producer as KafkaProducer

        from millstream.ingest.sources.generator import GeneratorConfig, generate

        self.rate = rate
        self.partitions = partitions
        self.topics: list[str] = []
        self.acks = Acks()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        # the generator's first 20,000 records of each partition, cycled in order; ``keys`` is
        # the key cardinality (20,000: a new key almost every record for the first ~20,000)
        cfg = GeneratorConfig(seed=SEED, partitions=partitions, key_cardinality=keys)
        self.records = {
            p: [(k, v) for _, k, v in generate(cfg, p, 0, 20_000)] for p in range(partitions)
        }
        self.producer = KafkaProducer(
            {
                "bootstrap.servers": bootstrap,
                "linger.ms": linger_ms,
                "log.connection.close": False,
            }
        )
        self.thread = threading.Thread(target=self._run, name="scale-producer", daemon=True)

    def add(self, topics: list[str]) -> None:
        with self._lock:
            self.topics = [*self.topics, *topics]

    def _on_delivery(self, err: Any, msg: Any) -> None:
        now = time.time()
        if err is not None:
            self.acks.errors.append(str(err))
            return
        key = (msg.topic(), msg.partition())
        with self.acks.lock:
            self.acks.count += 1
            o = msg.offset()
            if o > self.acks.last.get(key, (-1, 0.0))[0]:
                self.acks.last[key] = (o, now)
                self.acks.ends[key] = o + 1

    def _run(self) -> None:
        sent: dict[str, int] = {}
        started: dict[str, float] = {}
        while not self._stop.is_set():
            with self._lock:
                topics = self.topics
            now = time.time()
            for topic in topics:
                t0 = started.setdefault(topic, now)
                due = int(self.rate * (now - t0))
                n = sent.get(topic, 0)
                while n < due:
                    p = n % self.partitions
                    recs = self.records[p]
                    key, value = recs[(n // self.partitions) % len(recs)]
                    try:
                        self.producer.produce(
                            topic, value=value, key=key, partition=p, on_delivery=self._on_delivery
                        )
                    except BufferError:
                        self.producer.poll(0.01)
                        continue
                    n += 1
                sent[topic] = n
            self.producer.poll(0)
            time.sleep(0.005)
        self.producer.flush(30)

    def start(self) -> Producer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(60)

    def snapshot(
        self,
    ) -> tuple[dict[tuple[str, int], tuple[int, float]], dict[tuple[str, int], int]]:
        with self.acks.lock:
            return dict(self.acks.last), dict(self.acks.ends)


def all_uppers(store: Any) -> dict[tuple[str, int], int]:
    """Every shard upper, (table, partition) -> upper, in one read."""
    from sqlalchemy import select

    from millstream.metastore import schema as s

    sh = s.shards
    with store.read() as conn:
        rows = conn.execute(select(sh.c.table_name, sh.c.partition, sh.c.upper)).all()
    return {(str(t), int(p)): int(u) for t, p, u in rows}


def tables_with_rows(store: Any) -> set[str]:
    """The tables with at least one committed row, in one read."""
    from sqlalchemy import select

    from millstream.metastore import schema as s

    e = s.entries
    with store.read() as conn:
        rows = conn.execute(select(e.c.table_name).where(e.c.row_count > 0).distinct()).all()
    return {str(t) for (t,) in rows}


def last_batch(home: Path) -> int:
    """The last batch the worker's shared query committed (its checkpoint's commit log; -1
    before any): batches in a window are the difference of two readings."""
    found = [
        int(f.name)
        for d in home.glob("workers/*/_shared-query/checkpoint/commits")
        for f in d.iterdir()
        if f.name.isdigit()
    ]
    return max(found, default=-1)


# -- the worker's process tree ------------------------------------------------------------------


def _kind(cmd: str) -> str:
    """What a process of the worker's tree is, from its command line (a forked Python worker
    has its daemon's command line)."""
    argv = cmd.split()
    if not argv:
        return "?"
    if "java" in Path(argv[0]).name:
        return "JVM"
    if "-m" in argv[:-1]:
        module = argv[argv.index("-m") + 1]
        rest = [a for a in argv[argv.index("-m") + 2 :] if a.startswith("pyspark")]
        return " ".join(["python -m", module, *rest])
    if len(argv) > 1 and Path(argv[1]).name == "millstream":
        return "millstream " + " ".join(argv[2:3]) + " (driver)"
    return " ".join(Path(a).name for a in argv[:2])


def _pss_kb(pid: int) -> int:
    """Proportional set size: shared pages (a forked Python worker shares its daemon's) are
    split between the processes sharing them, so summing it does not count them twice."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0


def cpu_seconds(pids: list[int]) -> float:
    """The CPU seconds of ``pids`` so far (a process gone counts none)."""
    total = 0.0
    for p in pids:
        with contextlib.suppress(OSError, IndexError):
            total += common.process_cpu_s(p)
    return total


def cpu_and_busy(
    others: dict[str, list[int]],
) -> tuple[dict[str, float], tuple[float, float]]:
    """The CPU seconds of each group of ``others`` (name -> PIDs), and :func:`machine_busy`."""
    return {k: cpu_seconds(v) for k, v in others.items()}, machine_busy()


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    f = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = f[3] + f[4]
    return float(sum(f) - idle), float(sum(f))


def tree(pid: int) -> list[dict[str, Any]]:
    """The process ``pid`` and its descendants: pid, kind, RSS (bytes), CPU seconds, python."""
    from harness.cluster import descendants

    page = os.sysconf("SC_PAGE_SIZE")
    tick = os.sysconf("SC_CLK_TCK")
    out = []
    for p in [pid, *descendants(pid)]:
        try:
            stat = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            rss_pages = int(Path(f"/proc/{p}/statm").read_text().split()[1])
            pss_kb = _pss_kb(p)
            cmd = (
                Path(f"/proc/{p}/cmdline")
                .read_bytes()
                .replace(b"\0", b" ")
                .decode(errors="replace")
            )
            exe = os.readlink(f"/proc/{p}/exe")
        except OSError:
            continue
        if not cmd.strip():
            continue  # a zombie
        out.append(
            {
                "pid": p,
                "kind": _kind(cmd),
                "rss": rss_pages * page,
                "pss": pss_kb * 1024,
                "cpu_s": (int(stat[11]) + int(stat[12])) / tick,
                "python": "python" in Path(exe).name,
            }
        )
    return out


def tree_summary(procs: list[dict[str, Any]]) -> dict[str, Any]:
    kinds: dict[str, dict[str, float]] = {}
    for p in procs:
        k = kinds.setdefault(p["kind"], {"count": 0, "rss_mb": 0.0, "pss_mb": 0.0})
        k["count"] += 1
        k["rss_mb"] += p["rss"] / 2**20
        k["pss_mb"] += p["pss"] / 2**20
    return {
        "rss_mb": sum(p["rss"] for p in procs) / 2**20,
        "pss_mb": sum(p["pss"] for p in procs) / 2**20,
        "cpu_s": sum(p["cpu_s"] for p in procs),
        "processes": len(procs),
        "python_processes": sum(1 for p in procs if p["python"]),
        "kinds": kinds,
        "pid_cpu": {p["pid"]: (p["kind"], p["cpu_s"]) for p in procs},
    }


def jvm_heap_mb(procs: list[dict[str, Any]]) -> dict[str, float] | None:
    """The heap of the worker tree's JVM from ``jstat -gc`` (used and committed MB, after the
    last collection's old generation), or None without a JVM or ``jstat``."""
    import shutil
    import subprocess

    jvm = next((p["pid"] for p in procs if p["kind"] == "JVM"), None)
    jstat = shutil.which("jstat")
    if jvm is None or jstat is None:
        return None
    try:
        out = subprocess.run(
            [jstat, "-gc", str(jvm)], capture_output=True, text=True, timeout=10, check=True
        ).stdout.split("\n")
        gc = dict(zip(out[0].split(), (float(x) for x in out[1].split()), strict=False))
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        return None
    used = sum(gc.get(k, 0.0) for k in ("S0U", "S1U", "EU", "OU"))
    committed = sum(gc.get(k, 0.0) for k in ("S0C", "S1C", "EC", "OC"))
    return {
        "used_mb": used / 1024,
        "committed_mb": committed / 1024,
        "old_used_mb": gc.get("OU", 0.0) / 1024,
        "metaspace_mb": gc.get("MU", 0.0) / 1024,
        "full_gcs": gc.get("FGC", 0.0),
    }


def by_minute(samples: list[tuple[float, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per minute of a window, from its samples (each with ``cpu_s`` of the tree and
    ``batches``, the last committed batch, ``pid_cpu``, pid -> (kind, CPU-s), and optionally
    ``broker_cpu_s``): the batches committed, the tree's CPU-s each, the broker's cores (it is
    outside the tree, on the same machine), and each process kind's (a process's CPU-s counted from
    the minute's first sample, or from 0 when it started within the minute; a process that
    exited within the minute loses its last CPU-s)."""
    out = []
    prev_t, prev = 0.0, samples[0][1] if samples else None
    for minute in range(1, int(samples[-1][0] // 60) + 2 if samples else 0):
        within = [(t, s) for t, s in samples if prev_t < t <= minute * 60]
        if not within or prev is None:
            continue
        t, last = within[-1]
        batches = last["batches"] - prev["batches"]
        cpu = last["cpu_s"] - prev["cpu_s"]
        before = prev.get("pid_cpu", {})
        kinds: dict[str, float] = {}
        for pid, (kind, spent) in last.get("pid_cpu", {}).items():
            kinds[kind] = kinds.get(kind, 0.0) + spent - before.get(pid, (kind, 0.0))[1]
        broker = None
        if "broker_cpu_s" in last and "broker_cpu_s" in prev:
            broker = round((last["broker_cpu_s"] - prev["broker_cpu_s"]) / max(t - prev_t, 1e-9), 2)
        out.append(
            {
                "minute": minute,
                "seconds": round(t - prev_t, 1),
                "batches": batches,
                "broker_cpu_cores": broker,
                "cpu_s_per_batch": round(cpu / batches, 3) if batches > 0 else None,
                "rss_mb": round(last["rss_mb"]),
                "rss_mb_by_kind": {
                    k: round(v["rss_mb"]) for k, v in sorted(last.get("kinds", {}).items())
                },
                "cpu_s_per_batch_by_kind": {
                    k: round(v / batches, 3) for k, v in sorted(kinds.items())
                }
                if batches > 0
                else {},
            }
        )
        prev_t, prev = t, last
    return out


# -- freshness ---------------------------------------------------------------------------------


def latencies(
    samples: list[
        tuple[float, dict[tuple[str, int], tuple[int, float]], dict[tuple[str, int], int]]
    ],
    table: str,
    topic: str,
    since: float,
    until: float,
) -> tuple[list[float], int]:
    """Latencies of the distinct (partition, last acked offset) acknowledged in [since,
    until): first sample time at which the shard upper passes the offset, minus the ack time.
    Returns (latencies, how many never became visible)."""
    import bisect

    times = [t for t, _, _ in samples]
    seen: dict[tuple[int, int], float] = {}
    for _, last, _ in samples:
        for (tp, p), (o, t_ack) in last.items():
            if tp == topic and since <= t_ack < until:
                seen.setdefault((p, o), t_ack)
    running: dict[int, list[int]] = {}
    for p in {p for p, _ in seen}:
        best, col = -1, []
        for _, _, u in samples:
            best = max(best, u.get((table, p), -1))
            col.append(best)
        running[p] = col
    out: list[float] = []
    unresolved = 0
    for (p, o), t_ack in seen.items():
        i = max(bisect.bisect_right(running[p], o), bisect.bisect_left(times, t_ack))
        if i >= len(samples):
            unresolved += 1
        else:
            out.append(times[i] - t_ack)
    return out, unresolved


def commit_stats(home: Path, worker: str, ds: str, since: float, until: float) -> dict[str, Any]:
    import json

    path = home / "workers" / worker / ds / "commits.jsonl"
    lines = []
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                lines.append(json.loads(line))
    window = [c for c in lines if since <= c.get("at", 0) < until and c.get("version") is not None]
    cs = [c["commit_s"] for c in window if c.get("commit_s") is not None]
    return {
        "batches": len(window),
        "rows": sum(int(c.get("rows") or 0) for c in window),
        "commit_s_median": statistics.median(cs) if cs else float("nan"),
    }


@dataclass
class Window:
    """One measurement window of :meth:`Freshness.window`."""

    since: float
    until: float
    #: the worker's process tree (:func:`tree`) at the window's start and at its end
    procs0: list[dict[str, Any]]
    procs1: list[dict[str, Any]]
    #: (seconds into the window, :func:`tree_summary` of the worker's tree)
    rss: list[tuple[float, dict[str, Any]]]
    #: table -> (its latencies, how many acknowledged offsets never became visible)
    latencies: dict[str, tuple[list[float], int]]
    #: what ``at_end`` returned
    ended: Any = None

    @property
    def seconds(self) -> float:
        return self.until - self.since

    def cpu_cores(self) -> float:
        """The worker tree's CPU use over the window, in cores."""
        cpu0 = sum(p["cpu_s"] for p in self.procs0)
        return (sum(p["cpu_s"] for p in self.procs1) - cpu0) / self.seconds

    def cpu_by_kind(self) -> dict[str, float]:
        """The CPU seconds each kind of process of the worker's tree used over the window
        (a process that started in it counts from 0; one that ended in it is missing)."""
        before = {p["pid"]: p["cpu_s"] for p in self.procs0}
        out: dict[str, float] = {}
        for p in self.procs1:
            spent = p["cpu_s"] - before.get(p["pid"], 0.0)
            out[p["kind"]] = round(out.get(p["kind"], 0.0) + spent, 2)
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))


class Freshness:
    """Samples, every ``every`` seconds while a window is open, the producer's last
    acknowledged offsets (with their ack times) and every shard upper; :meth:`window` turns
    the samples of one window into per-table produce-ack -> visible latencies (:func:`latencies`)
    and watches the worker's process tree meanwhile."""

    def __init__(self, producer: Producer, store: Any, *, every: float, name: str) -> None:
        self.producer = producer
        self.store = store
        self.every = every
        self.samples: list[Any] = []
        self.sampling = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.sampling.is_set():
                last, _ = self.producer.snapshot()
                with contextlib.suppress(Exception):
                    self.samples.append((time.time(), last, all_uppers(self.store)))
            time.sleep(self.every)

    def start(self) -> Freshness:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def window(
        self,
        worker_pid: int,
        tables: dict[str, str],
        *,
        seconds: float,
        rss_every: float,
        tail: float,
        at_end: Callable[[], Any] | None = None,
        on_sample: Callable[[list[dict[str, Any]]], dict[str, Any]] | None = None,
    ) -> Window:
        """Sample for ``seconds`` (the worker's tree every ``rss_every`` s, and what
        ``on_sample`` returns for that tree added to its summary), call ``at_end``
        (its result is :attr:`Window.ended`), then keep sampling ``tail`` seconds so the
        window's last records become visible. ``tables``: table -> the topic it reads."""
        procs0 = tree(worker_pid)
        self.sampling.set()
        since = time.time()
        rss: list[tuple[float, dict[str, Any]]] = []
        while time.time() - since < seconds:
            time.sleep(rss_every)
            procs = tree(worker_pid)
            summary = tree_summary(procs)
            if on_sample is not None:
                summary.update(on_sample(procs))
            rss.append((time.time() - since, summary))
        until = time.time()
        procs1 = tree(worker_pid)
        ended = at_end() if at_end is not None else None
        time.sleep(tail)
        self.sampling.clear()
        lat = {
            table: latencies(self.samples, table, topic, since, until)
            for table, topic in tables.items()
        }
        self.samples.clear()
        return Window(since, until, procs0, procs1, rss, lat, ended)


@dataclass
class Services:
    """What :func:`services` started (the controller and workers are the caller's to start)."""

    #: the cluster's home (its logs, the workers' state) and its metadata store's URL
    home: Path
    url: str
    #: a ``millstream.local.tansu.TansuBroker``, running
    broker: Any
    #: a ``harness.cluster.Cluster`` on ``home`` and ``url``, no service started yet
    cluster: Any
    #: a ``MetadataStore`` on ``url``: this process's own reads (shard uppers, entries)
    store: Any


@contextlib.contextmanager
def services(
    base: Path,
    *,
    home: str = "home",
    broker_dir: str = "tansu",
    src: Path | None = None,
    metadata_url: str | None = None,
) -> Iterator[Services]:
    """The real processes' setup of (b), (c), ``bench/idle_worker.py``, ``bench/backlog.py``
    and ``bench/failover.py`` (``harness.cluster``, as the end-to-end tests): a Tansu broker
    under ``base/broker_dir``, a cluster on the fresh home ``base/home`` with a SQLite metadata
    store in it (or ``metadata_url``), and a store client on it. ``src``: the cluster's
    services (controller, workers and the processes they start) import the millstream of
    that source tree (``DIR/src``, a ``--src``/``--c-src`` checkout); this process's reads
    use its own. On an error the cluster's diagnostics (its services' log tails) go to
    stderr; at the end every service is stopped (by PID), the store closed and the broker
    stopped."""
    from harness.cluster import Cluster
    from millstream.local.tansu import TansuBroker
    from millstream.metastore.store import MetadataStore

    root = base / home
    root.mkdir(parents=True)
    url = metadata_url or f"sqlite:///{root / 'metadata.db'}"
    broker = TansuBroker(base / broker_dir).start()
    cluster = Cluster(
        home=root,
        metadata_url=url,
        env={"PYTHONPATH": str(src / "src")} if src is not None else {},
    )
    store = MetadataStore(url)
    try:
        yield Services(root, url, broker, cluster, store)
    except BaseException:
        print(cluster.diagnostics(), file=sys.stderr)
        raise
    finally:
        cluster.close()
        store.dispose()
        broker.stop()


def controller_and_worker(cluster: Any, *, leader_timeout: float = 60.0) -> tuple[Any, Any]:
    """Start ``cluster``'s controller and one worker ``w1``; wait until the controller leads
    and the worker heartbeats. Returns the controller's API client and the worker."""
    from harness.cluster import Api, wait_until

    ctl = cluster.controller()
    api = Api(ctl.url)
    wait_until("the controller leads", lambda: api.get("/health")["leader"], timeout=leader_timeout)
    worker = cluster.worker("w1", ctl.url)
    wait_until(
        "the worker heartbeats",
        lambda: api.workers().get("w1", {}).get("alive"),
        timeout=300,
        diagnostics=cluster.diagnostics,
    )
    return api, worker


def part_b(args: argparse.Namespace, base: Path, log: Any) -> dict[str, Any]:
    from harness.cluster import orders_spec, wait_until

    producer: Producer | None = None
    freshness: Freshness | None = None
    steps: list[dict[str, Any]] = []
    with services(base, home="home-b") as svc:
        home, broker, cluster, store = svc.home, svc.broker, svc.cluster, svc.store
        try:
            diag = cluster.diagnostics
            api, worker = controller_and_worker(cluster)
            idle = tree_summary(tree(worker.pid))
            log(
                f"(b) idle worker: {idle['pss_mb']:.0f} MB PSS ({idle['rss_mb']:.0f} MB RSS), "
                f"{idle['python_processes']} Python processes"
            )
            producer = Producer(broker.bootstrap, args.rate).start()
            freshness = Freshness(producer, store, every=0.05, name="scale-sampler").start()
            names: list[str] = []
            for target in [int(x) for x in args.streams.split(",")]:
                new = [f"s{i:02d}" for i in range(len(names), target)]
                for n in new:
                    broker.create_topic(n, TOPIC_PARTITIONS)
                producer.add(new)
                for n in new:
                    r = api.post("/datastreams", orders_spec(n, broker.bootstrap, n))
                    assert r.status_code == 201, r.text
                names += new
                t_add = time.time()
                caught = True
                try:
                    wait_until(
                        f"{target} datastreams run and are caught up",
                        functools.partial(all_caught_up, api, list(names), producer, store),
                        timeout=args.catch_up_timeout,
                        interval=1.0,
                        diagnostics=diag,
                    )
                except AssertionError:
                    caught = False
                    log(
                        f"(b) {target} datastreams: NOT caught up after {args.catch_up_timeout:.0f}s; measuring anyway"
                    )
                ready_s = time.time() - t_add
                time.sleep(2)
                others = {"broker": [broker.pid or 0], "bench (producer, sampler)": [os.getpid()]}
                other0, busy0 = cpu_and_busy(others)
                load0 = common.load()
                w = freshness.window(
                    worker.pid,
                    {n: n for n in names},
                    seconds=args.seconds,
                    rss_every=min(5.0, args.seconds / 6),
                    tail=args.tail,
                    at_end=functools.partial(cpu_and_busy, others),
                )
                since, until = w.since, w.until
                procs0 = {p["pid"]: p for p in w.procs0}
                cpu_kinds: dict[str, float] = {}
                for p in w.procs1:  # CPU in the window by process kind (exited ones are not in it)
                    before = procs0[p["pid"]]["cpu_s"] if p["pid"] in procs0 else 0.0
                    cpu_kinds[p["kind"]] = cpu_kinds.get(p["kind"], 0.0) + p["cpu_s"] - before
                other1, busy1 = w.ended
                rss = [summary for _, summary in w.rss]
                per_ds = {}
                for n in names:
                    lat, unresolved = w.latencies[n]
                    per_ds[n] = {
                        "samples": len(lat),
                        "unresolved": unresolved,
                        "p50_s": common.percentile(lat, 50, "nearest"),
                        "p99_s": common.percentile(lat, 99, "nearest"),
                        "max_s": max(lat) if lat else float("nan"),
                        **commit_stats(home, "w1", n, since, until),
                    }
                peak = max(rss, key=lambda x: x["rss_mb"])
                step = {
                    "datastreams": target,
                    "caught_up": caught,
                    "ready_s": ready_s,
                    "window_s": until - since,
                    "load_start": load0,
                    "load_end": common.load(),
                    "worker_cpu_cores": w.cpu_cores(),
                    "worker_cpu_cores_by_kind": {
                        k: v / (until - since) for k, v in sorted(cpu_kinds.items())
                    },
                    "other_cpu_cores": {
                        k: (other1[k] - other0[k]) / (until - since) for k in others
                    },
                    "machine_busy": (busy1[0] - busy0[0]) / max(1.0, busy1[1] - busy0[1]),
                    "pss_mb_last": rss[-1]["pss_mb"],
                    "rss_mb_last": rss[-1]["rss_mb"],
                    "rss_mb_peak": peak["rss_mb"],
                    "python_processes": rss[-1]["python_processes"],
                    "processes": rss[-1]["processes"],
                    "kinds": rss[-1]["kinds"],
                    "per_datastream": per_ds,
                    "p99_s_worst": max(d["p99_s"] for d in per_ds.values()),
                    "p99_s_median": statistics.median(d["p99_s"] for d in per_ds.values()),
                    "p50_s_median": statistics.median(d["p50_s"] for d in per_ds.values()),
                    "produce_errors": len(producer.acks.errors),
                }
                steps.append(step)
                log(
                    f"(b) {target:>2} datastreams: PSS {step['pss_mb_last']:,.0f} MB, "
                    f"{step['python_processes']} Python processes, worker CPU "
                    f"{step['worker_cpu_cores']:.2f} cores, p50 {step['p50_s_median']:.2f}s, p99 "
                    f"median {step['p99_s_median']:.2f}s worst {step['p99_s_worst']:.2f}s "
                    f"(ready after {ready_s:.0f}s, load {load0[0]} -> {step['load_end'][0]})"
                )
            api.close()
        finally:
            if freshness is not None:
                freshness.stop()
            if producer is not None:
                producer.stop()
    return {
        "idle": idle,
        "rate_per_datastream": args.rate,
        "steps": steps,
    }


def all_caught_up(api: Any, names: list[str], producer: Producer, store: Any) -> bool:
    if not all(api.state(n) == "READY" and api.running_writers(n) == {"w1"} for n in names):
        return False
    _, ends = producer.snapshot()
    uppers = all_uppers(store)
    lag = 0
    for n in names:
        for p in range(TOPIC_PARTITIONS):
            if (n, p) not in uppers:
                return False  # its writer has not started (a worker lists it as it starts)
            lag = max(lag, ends.get((n, p), 0) - uppers[(n, p)])
    return lag <= producer.rate / TOPIC_PARTITIONS  # under a second of records


# ---------------------------------------------------------------------------------------------
# (c) many topics: one multi-table datastream vs a datastream per topic
# ---------------------------------------------------------------------------------------------


def part_c(
    args: argparse.Namespace, base: Path, log: Any, src: Path | None = None
) -> dict[str, Any]:
    """``--topics`` topics of one partition each, ``--topic-rate`` records/s each, into ONE
    worker: first as one datastream naming them all (``source.topics``, a table each), then,
    in the same run on the same worker and topics, as a datastream per topic. Each variant
    starts at the topics' latest offsets, is measured for ``--seconds`` once caught up:
    per table the produce-ack -> visible freshness (as in (b)), and the worker's RSS every
    5 s (its growth over the window says whether it stays flat)."""
    from harness.cluster import orders_spec, wait_until

    n = args.topics
    topics = [f"c{i:03d}" for i in range(n)]
    variants: dict[str, Any] = {}
    with services(base, home="home-c", broker_dir="tansu-c", src=src) as svc:
        home, broker, cluster, store = svc.home, svc.broker, svc.cluster, svc.store
        producer = Producer(
            broker.bootstrap,
            args.topic_rate,
            partitions=1,
            linger_ms=args.linger_ms,
            keys=args.topic_keys,
        )
        freshness = Freshness(producer, store, every=0.1, name="scale-c-sampler")

        def caught_up(api: Any, names: list[str], tables: dict[str, str]) -> bool:
            if not all(api.state(x) == "READY" and api.running_writers(x) == {"w1"} for x in names):
                return False
            _, ends = producer.snapshot()
            uppers = all_uppers(store)
            if any((t, 0) not in uppers for t in tables):
                return False
            # within 5 s of records: at a few records a second a table's lag is rarely 0
            behind = 5 * args.topic_rate
            return all(ends.get((tp, 0), 0) - uppers[(t, 0)] <= behind for t, tp in tables.items())

        def measure(variant: str, api: Any, worker: Any, tables: dict[str, str]) -> dict[str, Any]:
            batch0 = last_batch(home)
            log(f"(c) {variant}: measuring {args.seconds:.0f} s (worker pid {worker.pid})")
            w = freshness.window(
                worker.pid,
                tables,
                seconds=args.seconds,
                rss_every=5.0,
                tail=args.tail,
                on_sample=lambda procs: {
                    "batches": last_batch(home),
                    "jvm_heap": jvm_heap_mb(procs),
                    "broker_cpu_s": cpu_seconds([broker.pid or 0]),
                },
            )
            batches = last_batch(home) - batch0
            # per process kind, the RSS at the first sample past a minute (or the first) and at the
            # last one: which process grows
            at_1min = next((s for t, s in w.rss if t >= 60), w.rss[0][1])
            last = w.rss[-1][1]
            growth = {
                k: {
                    "count": v["count"],
                    "rss_mb_1min": round(at_1min["kinds"].get(k, {}).get("rss_mb", 0.0)),
                    "rss_mb_last": round(v["rss_mb"]),
                }
                for k, v in last["kinds"].items()
            }
            rss = [(t, summary["rss_mb"]) for t, summary in w.rss]
            (t_first, first), (t_last, last_sample) = w.rss[0], w.rss[-1]
            broker_cores = (last_sample["broker_cpu_s"] - first["broker_cpu_s"]) / max(
                t_last - t_first, 1e-9
            )
            p99s, p50s, unresolved = [], [], 0
            for lat, missing in w.latencies.values():
                unresolved += missing
                if lat:
                    p99s.append(common.percentile(lat, 99, "nearest"))
                    p50s.append(common.percentile(lat, 50, "nearest"))
            out = {
                "tables": len(tables),
                "window_s": w.seconds,
                "load": common.load(),
                "worker_cpu_cores": w.cpu_cores(),
                "worker_cpu_s_by_kind": w.cpu_by_kind(),
                "broker_cpu_cores": broker_cores,
                "linger_ms": args.linger_ms,
                "batches": batches,
                "cpu_s_per_batch": (
                    w.cpu_cores() * w.seconds / batches if batches > 0 else float("nan")
                ),
                "p99_s_worst": max(p99s) if p99s else float("nan"),
                "p99_s_median": statistics.median(p99s) if p99s else float("nan"),
                "p50_s_median": statistics.median(p50s) if p50s else float("nan"),
                "tables_measured": len(p99s),
                "unresolved": unresolved,
                "rss_mb": rss,
                "rss_mb_first": rss[0][1],
                "rss_mb_last": rss[-1][1],
                "rss_mb_peak": max(r for _, r in rss),
                "rss_mb_1min": at_1min["rss_mb"],
                "rss_mb_by_kind": growth,
                "jvm_heap": [(round(t), s.get("jvm_heap")) for t, s in w.rss],
                "by_minute": by_minute(w.rss),
            }
            log(
                f"(c) {variant}: {len(tables)} tables, p99 worst {out['p99_s_worst']:.2f}s median "
                f"{out['p99_s_median']:.2f}s, p50 median {out['p50_s_median']:.2f}s, worker CPU "
                f"{out['worker_cpu_cores']:.2f} cores, {batches} batches "
                f"({out['cpu_s_per_batch']:.2f} CPU-s each), the broker {broker_cores:.2f} cores "
                f"(producer linger {args.linger_ms:g} ms), RSS {out['rss_mb_first']:,.0f} -> "
                f"{out['rss_mb_last']:,.0f} MB (peak {out['rss_mb_peak']:,.0f}) over "
                f"{out['window_s']:.0f}s, load {out['load'][0]}; CPU-s by process: "
                f"{out['worker_cpu_s_by_kind']}"
            )
            log(f"(c) {variant}: RSS by process kind, at 1 min -> at the end: {growth}")
            heaps = [(t, h) for t, h in out["jvm_heap"] if h]
            if heaps:
                log(
                    f"(c) {variant}: JVM heap used/committed MB "
                    + ", ".join(
                        f"{t}s {h['used_mb']:.0f}/{h['committed_mb']:.0f} (old {h['old_used_mb']:.0f})"
                        for t, h in heaps[:: max(1, len(heaps) // 10)]
                    )
                )
            for m in out["by_minute"]:
                log(
                    f"(c) {variant}: minute {m['minute']}: {m['batches']} batches, "
                    f"{m['cpu_s_per_batch']} CPU-s a batch, the broker {m['broker_cpu_cores']} cores, "
                    f"RSS {m['rss_mb']:,} MB; CPU-s a batch "
                    f"by process: {m['cpu_s_per_batch_by_kind']}"
                )
            # each process kind's RSS by minute (a kind of several processes: their sum)
            kinds = sorted({k for m in out["by_minute"] for k in m["rss_mb_by_kind"]})
            log(
                f"(c) {variant}: RSS MB by minute, "
                + ", ".join(str(m["minute"]) for m in out["by_minute"])
            )
            for k in kinds:
                log(
                    f"(c) {variant}:   {k}: "
                    + ", ".join(str(m["rss_mb_by_kind"].get(k, "-")) for m in out["by_minute"])
                )
            return out

        try:
            diag = cluster.diagnostics
            api, worker = controller_and_worker(cluster)
            for t in topics:
                broker.create_topic(t, 1)
            producer.add(topics)
            producer.start()
            freshness.start()
            base_spec = orders_spec("x", broker.bootstrap, "x")
            base_spec["source"]["starting_offsets"] = "latest"
            base_spec.pop("max_records_per_batch")

            # one datastream whose pattern matches every topic: a table each, named after its topic
            one = {
                **base_spec,
                "name": "multi",
                "table": {**base_spec["table"], "name": "m{topic}"},
            }
            one["source"] = {**base_spec["source"], "topic_pattern": r"c\d{3}"}
            del one["source"]["topic"]
            tables = {f"m{t}": t for t in topics}
            t0 = time.time()
            assert api.post("/datastreams", one).status_code == 201
            first: dict[str, float] = {}
            while len(first) < n and time.time() - t0 < args.catch_up_timeout:
                now = time.time()
                with contextlib.suppress(Exception):
                    for t in tables_with_rows(store) - set(first):
                        first[t] = now - t0
                time.sleep(0.5)
            rows_at = sorted(first.values())
            variants["first_rows"] = {
                "tables": len(first),
                "first_s": rows_at[0] if rows_at else float("nan"),
                "median_s": statistics.median(rows_at) if rows_at else float("nan"),
                "last_s": rows_at[-1] if len(rows_at) == n else float("nan"),
                "load": common.load(),
            }
            log(
                f"(c) from create to a table's first rows, {len(first)} of {n} tables: first "
                f"{variants['first_rows']['first_s']:.1f}s, median "
                f"{variants['first_rows']['median_s']:.1f}s, every table "
                f"{variants['first_rows']['last_s']:.1f}s (load {common.load()[0]})"
            )
            wait_until(
                f"one datastream of {n} topics runs and is caught up",
                functools.partial(caught_up, api, ["multi"], tables),
                timeout=args.catch_up_timeout,
                interval=2.0,
                diagnostics=diag,
            )
            log(f"(c) one datastream of {n} topics caught up after {time.time() - t0:.0f}s")
            variants["one_datastream"] = measure("one datastream", api, worker, tables)
            if "each" not in args.c_variants.split(","):
                api.close()
                return {"topics": n, "rate_per_topic": args.topic_rate, **variants}
            assert api.delete("/datastreams/multi").status_code == 202
            wait_until(
                "the multi-table datastream is removed",
                lambda: all(d["name"] != "multi" for d in api.get("/datastreams")),
                timeout=args.catch_up_timeout,
                interval=1.0,
                diagnostics=diag,
            )

            # the same topics, a datastream each
            names = [f"d{t}" for t in topics]
            for name, t in zip(names, topics, strict=True):
                spec = {**base_spec, "name": name, "table": {**base_spec["table"], "name": name}}
                spec["source"] = {**base_spec["source"], "topic": t}
                assert api.post("/datastreams", spec).status_code == 201
            tables = {name: t for name, t in zip(names, topics, strict=True)}
            t0 = time.time()
            wait_until(
                f"{n} datastreams run and are caught up",
                functools.partial(caught_up, api, names, tables),
                timeout=args.catch_up_timeout,
                interval=2.0,
                diagnostics=diag,
            )
            log(f"(c) {n} datastreams caught up after {time.time() - t0:.0f}s")
            variants["datastream_per_topic"] = measure(
                "a datastream per topic", api, worker, tables
            )
            api.close()
        finally:
            freshness.stop()
            producer.stop()
    return {"topics": n, "rate_per_topic": args.topic_rate, **variants}


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def report(res: dict[str, Any], log: Any) -> None:
    log("")
    log(f"machine: {res['machine']}")
    log(f"load average at start {res['load_start']}, at end {res['load_end']}")
    a = res.get("a")
    if a:
        rounds = max(x["round"] for x in a["runs"])
        log(f"\n(a) catch-up of {a['rows']:,} rows at default settings (median of {rounds} rounds)")
        log(
            f"{'partitions':>10} {'rows/s (runs)':>34} {'median':>9} {'batches':>7} {'commit p50':>10} {'commit max':>10} {'run() p50':>12}"
        )
        for n, med in a["median_rows_s"].items():
            runs = [x for x in a["runs"] if x["partitions"] == int(n)]
            cs = [c for x in runs for c in x["commit_s"]]
            each = ", ".join(f"{x['rows_s']:,.0f}" for x in runs)
            log(
                f"{n:>10} {each:>34} {med:>9,.0f} "
                f"{runs[0]['batches']:>7} {statistics.median(cs) * 1000:>8.0f}ms "
                f"{max(cs) * 1000:>8.0f}ms {statistics.median(x['seconds'] for x in runs):>11.2f}s"
            )
        for k, v in a["ratios"].items():
            log(
                f"ratio {k}: {v:.2f} (per round: {', '.join(f'{x:.2f}' for x in a['ratios_per_round'][k])})"
            )
        r64 = a["ratios"].get("64/4")
        if r64 is not None:
            log(
                f"target 64/4 >= {TARGET_PARTITION_RATIO}: {common.verdict(r64 >= TARGET_PARTITION_RATIO)} ({r64:.2f})"
            )
    b = res.get("b")
    if b:
        log(
            f"\n(b) datastreams on one worker at {b['rate_per_datastream']:,.0f} rows/s each, "
            "one shared query"
        )
        idle = b["idle"]
        log(
            f"idle worker: {idle['pss_mb']:.0f} MB PSS ({idle['rss_mb']:.0f} MB RSS), "
            f"{idle['python_processes']} Python processes"
        )
        log(
            f"{'streams':>7} {'PSS MB':>7} {'RSS MB':>7} {'py procs':>8} {'worker CPU':>10} "
            f"{'broker+bench':>12} {'machine':>7} {'p50 med':>8} {'p99 med':>8} "
            f"{'p99 worst':>9} {'batches/s':>9} {'commit p50':>10} {'caught up':>9} {'load':>11}"
        )
        for s in b["steps"]:
            per = s["per_datastream"].values()
            cs = [d["commit_s_median"] for d in per]
            bps = sum(d["batches"] for d in per) / s["window_s"]
            log(
                f"{s['datastreams']:>7} {s['pss_mb_last']:>7,.0f} {s['rss_mb_last']:>7,.0f} "
                f"{s['python_processes']:>8} {s['worker_cpu_cores']:>10.2f} "
                f"{sum(s['other_cpu_cores'].values()):>12.2f} {s['machine_busy']:>7.0%} "
                f"{s['p50_s_median']:>7.2f}s {s['p99_s_median']:>7.2f}s {s['p99_s_worst']:>8.2f}s "
                f"{bps:>9.1f} {statistics.median(cs) * 1000:>8.0f}ms "
                f"{'yes' if s['caught_up'] else 'NO':>9} {s['load_start'][0]:>5}->{s['load_end'][0]:<5}"
            )
        for s in b["steps"]:
            log(f"  {s['datastreams']:>2} datastreams, PSS and CPU by process kind:")
            for k, v in sorted(s["kinds"].items(), key=lambda kv: -kv[1]["pss_mb"]):
                cores = s["worker_cpu_cores_by_kind"].get(k, 0.0)
                log(
                    f"     {v['count']:>3} x {k}: {v['pss_mb']:,.0f} MB ({v['rss_mb']:,.0f} MB "
                    f"RSS), {cores:.2f} cores"
                )
        at = [s for s in b["steps"] if s["datastreams"] == TARGET_STREAMS]
        if at:
            worst = at[0]["p99_s_worst"]
            log(
                f"target {TARGET_STREAMS} datastreams, each p99 <= {TARGET_P99_S}s at {TARGET_RATE:,.0f} rows/s: {common.verdict(worst <= TARGET_P99_S)} (worst p99 {worst:.2f}s)"
            )


def _label_dir(text: str) -> tuple[str, Path]:
    label, sep, path = text.partition("=")
    if not sep or not label or not Path(path, "src", "millstream").is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: want LABEL=DIR with DIR/src/millstream")
    return label, Path(path).resolve()


def report_c_ab(ab: dict[str, Any], log: Any) -> None:
    """Per ``--c-src`` tree: the worker's own process's CPU-s a batch over the window and
    minute by minute, the batches and p99, and their ratios to the first tree's."""
    own = "millstream worker (driver)"
    base: dict[str, float] | None = None
    for label, c in ab.items():
        one = c["one_datastream"]
        figures = {
            "own_cpu_s_per_batch": one["worker_cpu_s_by_kind"].get(own, 0.0) / one["batches"]
            if one["batches"]
            else float("nan"),
            "own_cpu_cores": one["worker_cpu_s_by_kind"].get(own, 0.0) / one["window_s"],
            "cpu_s_per_batch": one["cpu_s_per_batch"],
            "p99_s_worst": one["p99_s_worst"],
            "p99_s_median": one["p99_s_median"],
            "batches": float(one["batches"]),
        }
        minutes = ", ".join(
            str(m["cpu_s_per_batch_by_kind"].get(own, "-")) for m in one["by_minute"]
        )
        ratios = (
            ""
            if base is None
            else " (x "
            + ", ".join(f"{k} {v / base[k]:.2f}" for k, v in figures.items() if base[k])
            + " of the first)"
        )
        log(
            f"(c) {label}: the worker's own process {figures['own_cpu_s_per_batch']:.3f} CPU-s "
            f"a batch (by minute {minutes}), {figures['own_cpu_cores']:.3f} CPU-s a second, "
            f"the tree {figures['cpu_s_per_batch']:.2f} CPU-s a batch, "
            f"{one['batches']} batches, p99 worst {figures['p99_s_worst']:.2f}s median "
            f"{figures['p99_s_median']:.2f}s, load {one['load'][0]}{ratios}"
        )
        base = base or figures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="200k rows, 1 round, 20 s steps")
    ap.add_argument("--rows", type=int, default=None, help="(a) input rows (1,000,000)")
    ap.add_argument("--rounds", type=int, default=None, help="(a) rounds (3; quick 1)")
    ap.add_argument("--partitions", default="4,64,256", help="(a) partition counts, first = base")
    ap.add_argument("--no-verify", action="store_true", help="(a) skip the oracle check")
    ap.add_argument("--streams", default="1,4,8,16", help="(b) datastreams in all, per step")
    ap.add_argument("--rate", type=float, default=TARGET_RATE, help="(b) records/s per datastream")
    ap.add_argument(
        "--seconds", type=float, default=None, help="(b) window per step (60; quick 20)"
    )
    ap.add_argument("--tail", type=float, default=8.0, help="(b) seconds sampled after a window")
    ap.add_argument("--catch-up-timeout", type=float, default=240.0)
    ap.add_argument("--topics", type=int, default=100, help="(c) topics, one partition each")
    ap.add_argument("--topic-rate", type=float, default=10.0, help="(c) records/s per topic")
    ap.add_argument(
        "--linger-ms",
        type=float,
        default=20.0,
        help="(c) the producer's linger.ms (20): the bundled broker's cost a read grows with "
        "the produce batches a topic holds (bench/broker_growth.py); a longer linger puts more "
        "records in a batch. Freshness is measured from the acknowledgement, after the linger",
    )
    ap.add_argument(
        "--topic-keys",
        type=int,
        default=20_000,
        help="(c) distinct keys each topic cycles through (20,000: a new key almost every "
        "record for the first ~33 minutes at 10 records/s, so every table's keys, and the state "
        "that follows them, grow through the whole run; 1,000: a table holds ~600 keys after "
        "75 s and all of them after 6-9 minutes, the generator's random updates finding the "
        "last ones slowly, and its seals reach their steady state one flush_seconds after its "
        "first rows)",
    )
    ap.add_argument(
        "--c-variants",
        default="one,each",
        help="(c) one: one datastream of every topic; each: then a datastream per topic",
    )
    ap.add_argument(
        "--c-src",
        action="append",
        type=_label_dir,
        default=[],
        metavar="LABEL=DIR",
        help="(c) run its first variant once per source tree DIR (a checkout: DIR/src), in "
        "order, each with fresh processes, and print the worker's own CPU-s a batch and p99 "
        "against the first's (repeatable)",
    )
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: a,b,c")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--no-wait", action="store_true", help="do not wait for a quiet machine")
    args = ap.parse_args(argv)
    args.rows = args.rows or (200_000 if args.quick else 1_000_000)
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.seconds = args.seconds or (20.0 if args.quick else 60.0)
    skip = set(filter(None, args.skip.split(",")))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    log = common.log_stamped
    load_start, waited = (common.load(), 0.0) if args.no_wait else common.wait_for_quiet(log)
    res: dict[str, Any] = {
        "command": common.command_line("scale.py"),
        "machine": common.machine("pyspark", "pyarrow"),
        "load_start": load_start,
        "load_wait_s": waited,
    }
    with common.workdir("millstream-bench-scale-", keep=args.keep, say=log) as base:
        if "a" not in skip:
            res["a"] = part_a(args, base, log)
        if "b" not in skip:
            res["b"] = part_b(args, base, log)
        if "c" not in skip and args.c_src:
            res["c_ab"] = {}
            for label, src in args.c_src:
                log(f"(c) --c-src {label}: {src}")
                (base / label).mkdir()
                res["c_ab"][label] = part_c(args, base / label, log, src)
            res["c"] = res["c_ab"][args.c_src[-1][0]]
        elif "c" not in skip:
            res["c"] = part_c(args, base, log)
    res["load_end"] = common.load()
    report(res, log)
    if res.get("c_ab"):
        report_c_ab(res["c_ab"], log)
    common.save_results("scale", res, args.json, log)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
