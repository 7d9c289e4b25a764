"""Where a running Millstream datastream's time goes per micro-batch, at K pre-loaded keys:
bench/peers.py's streaming workload, with the datastream run in this process as ``millstream
run`` runs it (``DatastreamRunner`` on the kafka source, defaults, background sealing on), so
Spark's progress of every batch is at hand.

Per batch, from Spark's ``durationMs`` and the writer's commit log:

- plan: ``latestOffset`` (the source asks the broker for the partitions' ends) and
  ``queryPlanning``;
- tasks: ``addBatch`` less the commit: the write tasks read their ranges from the broker,
  decode and stage the Parquet files;
- commit: the metadata transaction (``commit_s`` in the commit log);
- Spark's own bookkeeping: ``walCommit`` and ``commitOffsets`` (the checkpoint's files);
- the gap: from the end of one batch to the start of the next (the trigger, and whatever held
  the driver).

And beside the batches, what the background sealer and compactor did in the same window (from
their log lines: how many passes, their seconds), the CPU seconds of every process in the
window (this process, where the runner and the sealer run; Spark's JVM; its Python workers; the
Iceberg publisher; the broker; the producer, run in a process of its own so its CPU is not the
driver's), Spark's write stage of each batch (its wall and what its tasks ran, from Spark's
status store), the latency from each record's acknowledgement to the commit that took it
(p50, p99, and p99 per 10 s of the window), the CPU of the 10 s idle before the first window,
and one read of the table at the end. ``--rates`` runs one window per rate, one after the
other, on the same query.

``--reader`` also runs bench/peers.py's reader beside the query (``peers_worker.py reader``, a
process of its own holding the read cache, reading the whole table in a loop from the settle
on), and adds per window its reads' wall and CPU seconds (p50, p90, max), the reader's share of
the window's CPU, and each record's latency from its acknowledgement to the end of the first
read whose shard uppers (listed right after the read) pass its offset.

    .venv/bin/python bench/peers_profile.py --keys 200000 --rates 1000,5000 --seconds 60
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import peers
from common import load_text, log, percentile, workdir, write_json
from ingest_observe import progress, progress_seconds

HERE = Path(__file__).resolve().parent

STEPS = (
    "latestOffset",
    "queryPlanning",
    "addBatch",
    "walCommit",
    "commitOffsets",
    "triggerExecution",
)


TICK = os.sysconf("SC_CLK_TCK")


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
            kids.setdefault(ppid, []).append(int(d.name))
    return kids


def cpu_by_process() -> dict[int, tuple[str, float]]:
    """Every process under this one: its kind (by command line) and CPU seconds so far
    (its own and its reaped children's, so a Python worker that exited counts in its
    daemon)."""
    kids = _children()
    me = os.getpid()
    todo, out = [me], {}
    while todo:
        pid = todo.pop()
        todo.extend(kids.get(pid, []))
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        f = stat[stat.rindex(")") + 2 :].split()
        cpu = sum(int(x) for x in f[11:15]) / TICK
        if pid == me:
            kind = "driver (runner, sealer)"
        elif "java" in cmd.split(" ")[0]:
            kind = "JVM"
        elif "pyspark" in cmd or "daemon" in cmd:
            # the module: pyspark.worker (the write tasks), the streaming source's runner,
            # the sink's commit runner, ...
            kind = "Python " + cmd.split()[-1].rsplit(".", 1)[-1]
        elif "peers_worker" in cmd:
            kind = "reader"
        elif "tansu" in cmd:
            kind = "broker"
        elif "publish" in cmd:
            kind = "publisher"
        elif "multiprocessing" in cmd:
            kind = "producer"
        else:
            kind = cmd[:60]
        out[pid] = (kind, cpu)
    return out


def cpu_delta(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]
) -> dict[str, float]:
    out: dict[str, float] = {}
    for pid, (kind, cpu) in after.items():
        out[kind] = out.get(kind, 0.0) + cpu - before.get(pid, (kind, 0.0))[1]
    return {k: round(v, 2) for k, v in sorted(out.items())}


def _produce(bootstrap: str, seed: int, keys: int, rate: int, seconds: float, to: str) -> None:
    prod: dict[str, Any] = {}
    peers.producer_loop(bootstrap, seed, keys, [rate], seconds, prod)
    t = os.times()
    np.savez(
        to,
        ack_t=prod["ack_t"],
        part=prod["part"],
        offs=prod["offs"],
        sent=prod["sent"],
        cpu=t.user + t.system,
    )


def to_commit(prod: Any, commits: list[dict[str, Any]]) -> np.ndarray:
    """Per acknowledged record, seconds from its acknowledgement to the first commit whose
    upper of its partition passed its offset (NaN if none did)."""
    commits = sorted((c for c in commits if c.get("uppers")), key=lambda c: c["at"])
    at = np.array([c["at"] for c in commits])
    out = np.full(len(prod["ack_t"]), np.nan)
    for p in range(peers.PARTITIONS):
        uppers = np.maximum.accumulate(
            np.array([int(c["uppers"].get(str(p), 0)) for c in commits] or [0])
        )
        mine = (prod["part"] == p) & (prod["offs"] >= 0)
        idx = np.searchsorted(uppers, prod["offs"][mine], side="right")
        ok = idx < len(commits)
        lat = np.full(int(mine.sum()), np.nan)
        lat[ok] = at[idx[ok]] - prod["ack_t"][mine][ok]
        out[mine] = lat
    return out


def stages(spark: Any, w0: float, w1: float) -> list[dict[str, float]]:
    """Spark's stages submitted in ``[w0, w1]`` (its status store, kept with the UI off): the
    write tasks' stage of each batch, with what its tasks did."""
    try:
        jvm = spark._jvm
        empty = spark.sparkContext._gateway.new_array(jvm.double, 0)
        listed = (
            spark._jsc.sc()
            .statusStore()
            .stageList(None, False, False, empty, jvm.java.util.ArrayList())
        )
    except Exception as exc:  # an other Spark version: the split goes without it
        log(f"no stage list: {exc!r}")
        return []
    out = []
    it = listed.iterator()
    while it.hasNext():
        s = it.next()
        sub, comp = s.submissionTime(), s.completionTime()
        if not (sub.isDefined() and comp.isDefined()):
            continue
        t0, t1 = sub.get().getTime() / 1000, comp.get().getTime() / 1000
        if not w0 <= t0 <= w1:
            continue
        n = max(1, s.numTasks())
        out.append(
            {
                "wall_s": t1 - t0,
                "tasks": s.numTasks(),
                "task_run_s": s.executorRunTime() / 1000 / n,
                "task_deserialize_s": s.executorDeserializeTime() / 1000 / n,
                "task_cpu_s": s.executorCpuTime() / 1e9 / n,
            }
        )
    return out


class Captured(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[tuple[float, str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.created, record.name, record.getMessage()))


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--keys", type=int, default=2_000_000)
    ap.add_argument("--rates", type=lambda v: [int(x) for x in v.split(",")], default=[20_000])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--settle", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--reader", action="store_true", help="a whole-table reader beside the query")
    args = ap.parse_args()

    from millstream.catalog import Catalog
    from millstream.datastream import DatastreamSpec
    from millstream.ingest.sources.kafka import CONSUMERS
    from millstream.local.tansu import TansuBroker
    from millstream.spark.runner import DatastreamRunner
    from millstream.spark.session import spark_session

    captured = Captured()
    logging.getLogger("millstream").addHandler(captured)
    logging.getLogger("millstream").setLevel(logging.INFO)
    with workdir("peers-profile-") as base:
        broker = TansuBroker(base / "broker")
        broker.start()
        spark = None
        reader: subprocess.Popen[bytes] | None = None
        try:
            broker.create_topic(peers.TOPIC, peers.PARTITIONS)
            t0 = time.perf_counter()
            per = peers.produce_preload(broker.bootstrap, args.keys)
            log(f"pre-load produced in {time.perf_counter() - t0:.0f} s (load {load_text()})")
            spec_path = peers.millstream_spec(
                base, {"kind": "kafka", "bootstrap_servers": broker.bootstrap, "topic": peers.TOPIC}
            )
            spec = DatastreamSpec.from_file(spec_path)
            catalog = Catalog.open(home=base / "home")
            spark = spark_session()
            runner = DatastreamRunner(
                spec, catalog, spark, writer_id="profile", background_sealing=True
            )
            errors: list[BaseException] = []

            def run() -> None:
                try:
                    runner.run(available_now=False)
                except BaseException as exc:
                    errors.append(exc)

            thread = threading.Thread(target=run, daemon=True)
            thread.start()

            def caught_up() -> bool:
                if errors:
                    raise errors[0]
                try:
                    shards = {s.partition: s.upper for s in catalog.store.list_shards("peers")}
                except Exception:
                    return False
                return all(shards.get(p, 0) >= per - 1 for p in range(peers.PARTITIONS))

            peers.wait_until(caught_up, 1800, "the pre-load's catch-up")
            log(f"caught up {time.perf_counter() - t0:.0f} s; settling {args.settle:.0f} s")
            if args.reader:
                reader = start_reader(base)
            time.sleep(max(0.0, args.settle - 10))
            idle0 = cpu_by_process()
            time.sleep(min(10.0, args.settle))
            idle_cpu = cpu_delta(idle0, cpu_by_process())
            outs = []
            for i, rate in enumerate(args.rates):
                outs.append(
                    window(runner, catalog, captured, broker.bootstrap, base, args, i, rate)
                )
                outs[-1]["idle_cpu_s_10s_before"] = idle_cpu
            runner.stop()
            thread.join(60)
        finally:
            if reader is not None:
                (base / "STOP-READER").write_text("stop")
                try:
                    reader.wait(120)
                except subprocess.TimeoutExpired:
                    reader.kill()
                    reader.wait()
            CONSUMERS.close()
            if spark is not None:
                spark.stop()
            broker.stop()
    for out in outs:
        print_summary(out)
    if args.json:
        write_json(args.json, outs)
    write_json(peers.RESULTS / f"peers-profile-{time.strftime('%H%M%S')}.json", outs)


def start_reader(base: Path) -> subprocess.Popen[bytes]:
    """bench/peers.py's Millstream reader on ``base``'s home, once its first read (a merge of
    the whole table) is done."""
    argv = [sys.executable, str(HERE / "peers_worker.py"), "reader", "millstream"]
    argv += ["--work", str(base), "--out", str(base / "reader.json")]
    argv += ["--stop", str(base / "STOP-READER"), "--log", str(base / "reads.jsonl")]
    argv += ["--pause", "0.1"]
    proc = subprocess.Popen(argv, cwd=HERE)
    t0 = time.perf_counter()
    peers.wait_until(lambda: bool(peers.read_log(base / "reads.jsonl")), 1800, "the first read")
    log(f"the reader's first read done in {time.perf_counter() - t0:.0f} s")
    return proc


def reads_in(base: Path, prod: Any, w0: float, w1: float) -> dict[str, Any]:
    """The reader's reads that ended in ``[w0, w1]``: wall and CPU seconds, and each record's
    latency to the first read whose uppers passed its offset."""
    every = [r for r in peers.read_log(base / "reads.jsonl") if isinstance(r, list)]
    mine = [r for r in every if w0 <= r[0] <= w1]
    if not mine:
        return {"reads": 0}
    wall = [r[2] for r in mine]
    cpu = [r[4] for r in mine]
    lat = to_commit(prod, [{"at": r[0], "uppers": r[5]} for r in every if r[0] >= w0])
    done = lat[~np.isnan(lat)]

    def spread(xs: list[float]) -> dict[str, float]:
        return {
            "p50": round(percentile(xs, 50), 3),
            "p90": round(percentile(xs, 90), 3),
            "max": round(max(xs), 3),
        }

    return {
        "reads": len(mine),
        "read_wall_s": spread(wall),
        "read_cpu_s": spread(cpu),
        "to_read_s": {
            "p50": round(float(np.percentile(done, 50)), 3) if len(done) else None,
            "p99": round(float(np.percentile(done, 99)), 3) if len(done) else None,
            "not_read": int(np.isnan(lat).sum()),
        },
    }


def window(
    runner: Any,
    catalog: Any,
    captured: Captured,
    bootstrap: str,
    base: Path,
    args: argparse.Namespace,
    i: int,
    rate: int,
) -> dict[str, Any]:
    """Produce at ``rate`` for ``args.seconds`` and split the batches of that window."""
    load0 = load_text()
    sealer = runner.sealer
    seals0 = sealer.seals if sealer is not None else 0
    compactions0 = len(sealer.compactions) if sealer is not None else 0
    produced = base / f"produced-{i}.npz"
    producer = multiprocessing.get_context("spawn").Process(
        target=_produce,
        args=(bootstrap, args.seed + i, args.keys, rate, args.seconds, produced),
    )
    cpu0 = cpu_by_process()
    w0 = time.time()
    producer.start()
    producer.join()
    w1 = time.time()
    cpu1 = cpu_by_process()
    prod = dict(np.load(produced))
    time.sleep(5)
    load1 = load_text()
    batches = [
        b
        for b in progress(runner.query)
        if b.get("timestamp") and w0 <= progress_seconds(b["timestamp"]) <= w1
    ]
    staged = stages(runner.spark, w0, w1)
    every_commit = runner.commits()
    commits = [c for c in every_commit if w0 <= c.get("at", 0) <= w1 + 5 and c.get("rows")]
    lat = to_commit(prod, [c for c in every_commit if c.get("at", 0) >= w0])
    new_seals = sealer.seals - seals0 if sealer is not None else 0
    seals = list(sealer.durations[max(0, len(sealer.durations) - new_seals) :]) if new_seals else []
    compactions = [c.seconds for c in sealer.compactions[compactions0:]] if sealer else []
    segments = len(catalog.manifest("peers").entries)
    t_read = time.perf_counter()
    rows = catalog.read_table("peers").num_rows
    read_s = time.perf_counter() - t_read
    out = summarize(batches, commits, captured.records, w0, w1)
    done = lat[~np.isnan(lat)]
    cpu = cpu_delta(cpu0, cpu1)
    # the producer ran in a child process this one reaped: its CPU is in this one's
    cpu["producer"] = round(float(prod["cpu"]), 2)
    cpu["driver (runner, sealer)"] = round(cpu["driver (runner, sealer)"] - cpu["producer"], 2)
    out.update(
        cpu_s_in_window=cpu,
        write_stage_median_s={
            k: round(statistics.median(st[k] for st in staged), 3)
            for k in ("wall_s", "task_run_s", "task_deserialize_s", "task_cpu_s", "tasks")
        }
        if staged
        else {},
        to_commit_s={
            "p50": round(float(np.percentile(done, 50)), 3) if len(done) else None,
            "p99": round(float(np.percentile(done, 99)), 3) if len(done) else None,
            "max": round(float(done.max()), 3) if len(done) else None,
            "not_committed": int(np.isnan(lat).sum()),
            # p99 of the records acknowledged in each 10 s of the window
            "p99_by_10s": [
                round(float(np.nanpercentile(lat[sel], 99)), 2) if sel.any() else None
                for t in range(0, int(args.seconds), 10)
                for sel in [
                    (prod["ack_t"] >= w0 + t) & (prod["ack_t"] < w0 + t + 10) & ~np.isnan(lat)
                ]
            ],
        },
        seals_in_window=[round(x, 2) for x in seals],
        compactions_in_window=[round(x, 2) for x in compactions],
        manifest_entries=segments,
        all_steps_median_s={
            k: round(statistics.median(b["duration_ms"].get(k, 0) / 1000 for b in batches), 3)
            for k in sorted({k for b in batches for k in b["duration_ms"]})
        }
        if batches
        else {},
    )
    out["per_batch"] = [
        {
            "start": round(progress_seconds(b["timestamp"]) - w0, 3),
            "rows": b.get("input_rows"),
            **{k: round(v / 1000, 3) for k, v in b["duration_ms"].items()},
        }
        for b in batches
    ]
    out.update(
        keys=args.keys,
        rate=rate,
        seconds=args.seconds,
        load_start=load0,
        load_end=load1,
        read_s=read_s,
        table_rows=rows,
        sent=int(prod["sent"]),
    )
    if args.reader:
        out["reader"] = reads_in(base, prod, w0, w1)
    return out


def summarize(
    batches: list[dict[str, Any]],
    commits: list[dict[str, Any]],
    logs: list[tuple[float, str, str]],
    w0: float,
    w1: float,
) -> dict[str, Any]:
    def med(xs: list[float]) -> float:
        return statistics.median(xs) if xs else float("nan")

    steps = {k: [b["duration_ms"].get(k, 0) / 1000 for b in batches] for k in STEPS}
    commit_s = [c["commit_s"] for c in commits if c.get("commit_s") is not None]
    starts = [progress_seconds(b["timestamp"]) for b in batches]
    gaps = [
        s2 - (s1 + d)
        for s1, s2, d in zip(starts, starts[1:], steps["triggerExecution"], strict=False)
    ]
    took = re.compile(r"in ([0-9.]+)s")
    sealing = [
        (t, msg)
        for t, name, msg in logs
        if w0 <= t <= w1 and ("seal" in name or "sealing" in name) and took.search(msg)
    ]
    seal_s = [float(took.search(m).group(1)) for _, m in sealing]  # type: ignore[union-attr]
    window = w1 - w0
    return {
        "batches": len(batches),
        "rows_per_batch_median": med([c["rows"] for c in commits]),
        "median_s": {k: round(med(v), 3) for k, v in steps.items()},
        "p90_s": {k: round(percentile(v, 90), 3) for k, v in steps.items()},
        "commit_s_median": round(med(commit_s), 3),
        "commit_s_p90": round(percentile(commit_s, 90), 3),
        "tasks_s_median": round(med(steps["addBatch"]) - med(commit_s), 3),
        "gap_s_median": round(med(gaps), 3),
        "busy_fraction": round(sum(steps["triggerExecution"]) / window, 3) if window else None,
        "seal_passes": len(sealing),
        "seal_s_total": round(sum(seal_s), 2),
        "seal_s_max": round(max(seal_s), 2) if seal_s else 0.0,
        "seal_lines": [m[:200] for _, m in sealing[:20]],
    }


def print_summary(s: dict[str, Any]) -> None:
    log(json.dumps({k: v for k, v in s.items() if k not in ("seal_lines", "per_batch")}, indent=1))
    for line in s["seal_lines"]:
        log(f"  {line}")


if __name__ == "__main__":
    main()
