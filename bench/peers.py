"""Millstream against the Python libraries a user would pick instead: deltalake, pyiceberg,
pypaimon, and a single-process pyarrow/polars ceiling, on one workload shaped like Paimon's
cluster-benchmark q1 (bench/peers_workload.py: JSON records of ~150 bytes, uniform random keys
in [0, K), a monotonic ``seq`` comparison column, 2% deletes).

The peers run in a venv of their own (pypaimon pins pyarrow < 20; the product's venv stays as
it is), made once with ``uv`` under ``~/.cache/millstream-bench/peers-venv``. Every system runs
in its own process (bench/peers_worker.py); every table is checked against the model (per key
the newest row, deleted keys gone) and the run prints PASS or FAIL per system.

Batch mode: N records in 10 files, ingested by each system from empty.

- Millstream: ``millstream run --available-now`` on a ``files`` source at defaults, the whole
  process timed; "warm" is ``DatastreamRunner.run(available_now=True)`` in a process whose
  SparkSession already ran a 1,000-record datastream (its rows/s is the in-process figure).
- deltalake, pyiceberg, pypaimon: per file, as bench/peers_worker.py describes.
- the ceiling: all files at once, sorted, deduplicated, one Parquet file.

Whole process is the wall time of the process (interpreter, imports, JVM for Millstream); in
process is rows over the ingest alone; the read is a fresh process opening and reading the
table (imports not timed); peak RSS is of the whole process tree (Millstream's JVM and Python
workers included), sampled every 50 ms; files and bytes are the Parquet files on disk.

Streaming mode: a table pre-loaded with K keys (seq = key), then a producer on the bundled
Tansu broker (4 partitions) at each rate of a ramp (e.g. 1k, 5k, 20k rows/s) for a phase each.
Millstream runs as ``millstream run`` runs (pre-loaded through the topic, so its table starts
as a running datastream's does, then sealed in the background as it would be); each peer runs
a loop that consumes what arrived in the last second and merges it. A reader process reads the
whole current table in a loop; a record's freshness is from its produce acknowledgement to the
end of the first read that sees its ``seq`` (the newest ``seq`` in the table). The run also
reports freshness to the commit (the writer's own log: what the table holds, without a read)
and the read's latency while ingesting. A rate is held when the p99 is <= 2 s and every record
of the phase was seen.

Run from the repository root::

    .venv/bin/python bench/peers.py --smoke                        # both modes, a few minutes
    .venv/bin/python bench/peers.py batch --rows 1000000 --rounds 3
    .venv/bin/python bench/peers.py stream --keys 200000,2000000 --rates 1000,5000,20000 --phase 60
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import peers_workload as wl
from common import RESULTS, command_line, load_text, log, machine, percentile, write_json

CACHE = Path.home() / ".cache" / "millstream-bench"
PEERS_VENV = CACHE / "peers-venv"
PEER_PACKAGES = [
    "deltalake==1.6.6",
    "pyiceberg[sql-sqlite]==0.12.0",
    "pypaimon==2.1.0",
    "polars",
    "pyarrow<20",
    "confluent-kafka",
    "numpy",
]
WORKER = Path(__file__).resolve().parent / "peers_worker.py"
PEERS = ("deltalake", "pyiceberg", "pypaimon")
BATCH_SYSTEMS = ("ceiling", "deltalake", "millstream", "millstream-warm", "pypaimon", "pyiceberg")
STREAM_SYSTEMS = ("millstream", "deltalake", "pypaimon", "pyiceberg")
TOPIC = "peers"
PARTITIONS = wl.PARTITIONS
HELD_P99_S = 2.0


# ---------------------------------------------------------------------------------------------
# The peers' venv and processes
# ---------------------------------------------------------------------------------------------


def uv() -> str:
    """``uv`` beside this interpreter (the product's venv has it), else on ``$PATH``."""
    here = Path(sys.executable).parent / "uv"
    if here.exists():
        return str(here)
    found = shutil.which("uv")
    if found is None:
        raise SystemExit("bench/peers.py needs uv (pip install uv) to make the peers' venv")
    return found


def peers_python() -> str:
    """The peers' interpreter, made on first use (``uv venv`` + ``uv pip install``)."""
    py = PEERS_VENV / "bin" / "python"
    marker = PEERS_VENV / "bench-packages.json"
    if py.exists() and marker.exists() and json.loads(marker.read_text()) == PEER_PACKAGES:
        return str(py)
    log(f"making the peers' venv at {PEERS_VENV} ({', '.join(PEER_PACKAGES)})")
    CACHE.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [uv(), "venv", "-q", "--allow-existing", "--python", "3.11", str(PEERS_VENV)], check=True
    )
    subprocess.run([uv(), "pip", "install", "-q", "--python", str(py), *PEER_PACKAGES], check=True)
    marker.write_text(json.dumps(PEER_PACKAGES))
    return str(py)


def peer_versions() -> dict[str, str]:
    out = subprocess.run(
        [
            peers_python(),
            "-c",
            "import json; from importlib.metadata import version as v; print(json.dumps({m: v(m) "
            "for m in ('deltalake', 'pyiceberg', 'pypaimon', 'pyarrow', 'polars')}))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(out.stdout))


def interpreter(system: str) -> str:
    return sys.executable if system.startswith("millstream") else peers_python()


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return env


def tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and all its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    page = os.sysconf("SC_PAGE_SIZE")
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            children.setdefault(int(fields[1]), []).append(int(d.name))
            rss[int(d.name)] = int(fields[21]) * page
        except (OSError, ValueError, IndexError):
            continue
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += rss.get(p, 0)
        todo.extend(children.get(p, []))
    return total


class Proc:
    """A child process, its wall time and the peak RSS of its tree."""

    def __init__(self, argv: list[str], out_file: Path, *, cwd: Path | None = None) -> None:
        self.argv = argv
        self.out_file = out_file
        self.t0 = time.perf_counter()
        self.stdout = open(out_file.with_suffix(".log"), "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            argv, stdout=self.stdout, stderr=subprocess.STDOUT, env=_env(), cwd=cwd
        )
        self.peak = 0
        self.seconds = 0.0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._done.is_set():
            self.peak = max(self.peak, tree_rss(self.proc.pid))
            self._done.wait(0.05)

    def wait(self, timeout: float | None = None) -> int:
        rc = self.proc.wait(timeout)
        self.seconds = time.perf_counter() - self.t0
        self._done.set()
        self._thread.join()
        self.stdout.close()
        return rc

    def interrupt(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()

    def result(self) -> dict[str, Any]:
        if self.out_file.exists():
            return dict(json.loads(self.out_file.read_text()))
        tail = self.out_file.with_suffix(".log").read_text()[-2000:]
        raise RuntimeError(f"{' '.join(self.argv[:4])} wrote no result:\n{tail}")


def worker(role: str, system: str, work: Path, name: str, **opts: Any) -> Proc:
    argv = [interpreter(system), str(WORKER), role, system, "--work", str(work)]
    argv += ["--out", str(work / f"{name}.json")]
    for k, v in opts.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    return Proc(argv, work / f"{name}.json")


def millstream_cli(*args: str) -> list[str]:
    return [str(Path(sys.executable).parent / "millstream"), *args]


def millstream_spec(
    work: Path, source: dict[str, Any], *, trigger_interval: str | None = None
) -> Path:
    """A datastream spec at defaults (JSON is YAML), or with its ``trigger_interval`` set."""
    spec: dict[str, Any] = {
        "name": "peers",
        "source": source,
        "table": {
            "name": "peers",
            "primary_key": ["id"],
            "mode": "upsert",
            "comparison_column": "seq",
            "delete_column": "is_deleted",
        },
        "schema": wl.SCHEMA_SPEC,
    }
    if trigger_interval is not None:
        spec["trigger_interval"] = trigger_interval
    path = work / "spec.yaml"
    path.write_text(json.dumps(spec, indent=2))
    return path


def check_text(check: dict[str, Any]) -> str:
    return "PASS" if check.get("ok") else f"FAIL {check}"


# ---------------------------------------------------------------------------------------------
# Batch
# ---------------------------------------------------------------------------------------------


def batch_input(seed: int, rows: int, keys: int) -> list[Path]:
    root = CACHE / f"input-{seed}-{rows}-{keys}"
    t0 = time.perf_counter()
    files = wl.batch_files(root, seed, rows, keys)
    log(
        f"input: {rows:,} records, keys in [0, {keys:,}), 10 files under {root} "
        f"({time.perf_counter() - t0:.1f} s)"
    )
    return files


def batch_one(
    system: str, files: list[Path], base: Path, args: argparse.Namespace
) -> dict[str, Any]:
    work = base / system
    work.mkdir(parents=True)
    (work / "files.json").write_text(json.dumps([str(f) for f in files]))
    load0 = load_text()
    if system == "millstream":
        spec = millstream_spec(work, {"kind": "files", "path": str(files[0].parent.parent)})
        p = Proc(
            millstream_cli(
                "run",
                "-f",
                str(spec),
                "--available-now",
                "--home",
                str(work / "home"),
                "-o",
                "json",
            ),
            work / "run.json",
        )
        rc = p.wait()
        if rc != 0:
            raise RuntimeError(
                f"millstream run exited {rc}: {Path(p.out_file.with_suffix('.log')).read_text()[-3000:]}"
            )
        commits = [
            json.loads(x)
            for x in next((work / "home" / "writers").rglob("commits.jsonl"))
            .read_text()
            .splitlines()
        ]
        res: dict[str, Any] = {
            "rows": args.rows,
            "batches": sum(1 for c in commits if c.get("rows")),
        }
        reader_system = "millstream"
    else:
        p = worker("batch", system, work, "ingest", files=work / "files.json")
        rc = p.wait()
        if rc != 0:
            raise RuntimeError(
                f"{system} exited {rc}: {p.out_file.with_suffix('.log').read_text()[-3000:]}"
            )
        res = p.result()
        reader_system = "millstream" if system == "millstream-warm" else system
    res.update(
        wall_s=p.seconds, peak_rss_mb=p.peak / 1e6, load_before=load0, load_after=load_text()
    )
    r = worker("read", reader_system, work, "read", seed=args.seed, rows=args.rows, keys=args.keys)
    r.wait()
    res.update(r.result())
    res["pass"] = bool(res["check"]["ok"])
    return res


def batch_mode(args: argparse.Namespace) -> dict[str, Any]:
    files = batch_input(args.seed, args.rows, args.keys)
    systems = [s for s in BATCH_SYSTEMS if s not in args.skip]
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        out: dict[str, Any] = {}
        base = Path(args.work) / f"batch-{r}"
        shutil.rmtree(base, ignore_errors=True)
        for system in systems:
            log(f"round {r + 1}/{args.rounds}: {system} (load {load_text()})")
            try:
                out[system] = batch_one(system, files, base, args)
            except Exception as exc:  # one system failing is a result, not the end of the run
                out[system] = {"error": str(exc)[-2000:], "pass": False}
            res = out[system]
            if "error" in res:
                log(f"  {system}: ERROR {res['error'][-500:]}")
            else:
                log(
                    f"  {system}: {res['wall_s']:.1f} s whole, {res.get('rows_s', float('nan')):,.0f} rows/s "
                    f"in process, read {res['read_s']:.2f} s ({res['read_first_s']:.2f} s first), {res['peak_rss_mb']:,.0f} MB, "
                    f"{res['files']} files {res['bytes'] / 1e6:.1f} MB: {check_text(res['check'])}"
                )
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
        rounds.append(out)
    summary = summarize_batch(rounds, systems)
    print_batch(summary, len(rounds))
    return {"rounds": rounds, "median": summary}


def summarize_batch(rounds: list[dict[str, Any]], systems: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for s in systems:
        ok = [r[s] for r in rounds if s in r and "error" not in r[s]]
        if not ok:
            out[s] = {"pass": False}
            continue
        med = {
            k: statistics.median(x[k] for x in ok if k in x and x[k] is not None)
            for k in ("wall_s", "rows_s", "read_first_s", "read_s", "peak_rss_mb", "files", "bytes")
            if any(k in x and x[k] is not None for x in ok)
        }
        med["pass"] = all(r[s].get("pass") for r in rounds if s in r)
        out[s] = med
    # Millstream's in-process rate is the warm run's.
    if "millstream" in out and "millstream-warm" in out and "rows_s" in out["millstream-warm"]:
        out["millstream"]["rows_s"] = out["millstream-warm"]["rows_s"]
    return out


def print_batch(summary: dict[str, Any], rounds: int) -> None:
    dl = summary.get("deltalake", {})
    ce = summary.get("ceiling", {})

    def r(s: dict[str, Any], base: dict[str, Any], k: str) -> str:
        return f"{s[k] / base[k]:.2f}x" if k in s and base.get(k) else "-"

    log(f"\nbatch, median of {rounds} round(s)")
    log(
        f"{'system':<16}{'whole s':>9}{'rows/s':>11}{'read s':>8}{'RSS MB':>8}{'files':>7}{'MB':>7}"
        f"{'whole/dl':>9}{'rate/dl':>8}{'read/dl':>8}{'rate/ceil':>10}  check"
    )
    for name, s in summary.items():
        if "wall_s" not in s:
            log(f"{name:<16} no result (the error is in the round's output)")
            continue
        log(
            f"{name:<16}{s['wall_s']:>9.2f}{s.get('rows_s', float('nan')):>11,.0f}{s['read_s']:>8.2f}"
            f"{s['peak_rss_mb']:>8,.0f}{s['files']:>7.0f}{s['bytes'] / 1e6:>7.1f}"
            f"{r(s, dl, 'wall_s'):>9}{r(s, dl, 'rows_s'):>8}{r(s, dl, 'read_s'):>8}"
            f"{r(s, ce, 'rows_s'):>10}  {'PASS' if s['pass'] else 'FAIL'}"
        )


# ---------------------------------------------------------------------------------------------
# Streaming
# ---------------------------------------------------------------------------------------------


def produce_preload(bootstrap: str, keys: int) -> int:
    """Produce the pre-load (key i once, seq i) for Millstream; returns records per partition."""
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "log.connection.close": False}
    )
    step = 100_000
    for lo in range(0, keys, step):
        recs = wl.preload(keys, lo, step)
        for k, line in zip(recs.id.tolist(), recs.json_lines(), strict=True):
            while True:
                try:
                    producer.produce(
                        TOPIC, value=line, key=str(k).encode(), partition=k % PARTITIONS
                    )
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.poll(0)
    producer.flush(120)
    return -(-keys // PARTITIONS)


def producer_loop(
    bootstrap: str, seed: int, keys: int, rates: list[int], phase_s: float, out: dict[str, Any]
) -> None:
    """Produce the stream (record i: seq = STREAM_SEQ_BASE + i, partition key % 4, so a key's
    records stay in order, as Kafka's partitioner by key keeps them) at each rate for
    ``phase_s``; note every record's acknowledgement time, partition and offset."""
    from confluent_kafka import Producer

    total = int(sum(r * phase_s for r in rates)) + 64 * PARTITIONS
    recs = wl.records(seed, keys, 0, total, wl.STREAM_SEQ_BASE)
    lines = recs.json_lines()
    key_bytes = [str(k).encode() for k in recs.id.tolist()]
    ack_t = np.full(total, np.nan)
    part = recs.id % PARTITIONS
    offs = np.full(total, -1, dtype=np.int64)
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 5, "log.connection.close": False}
    )

    sent = 0
    phases = []
    t_start = time.time()
    for rate in rates:
        t0 = time.time()
        first = sent
        while True:
            el = time.time() - t0
            if el >= phase_s:
                break
            due = first + int(rate * el)
            while sent < min(due, total - 64 * PARTITIONS):
                i = sent

                def cb(err: Any, msg: Any, i: int = i) -> None:
                    if err is None:
                        ack_t[i] = time.time()
                        offs[i] = msg.offset()

                try:
                    producer.produce(
                        TOPIC,
                        value=lines[i],
                        key=key_bytes[i],
                        partition=int(part[i]),
                        on_delivery=cb,
                    )
                except BufferError:
                    producer.poll(0.01)
                    continue
                sent += 1
            producer.poll(0)
            time.sleep(0.002)
        phases.append({"rate": rate, "first": first, "end": sent, "t0": t0, "t1": time.time()})
    producer.flush(60)
    # Tansu's high watermark is the base offset of the last record batch + 1: end each
    # partition with a batch of one record so every acknowledged record becomes readable
    # (the next records, one at a time, until every partition had one).
    ended: set[int] = set()
    while len(ended) < PARTITIONS and sent < total:
        i = sent
        ended.add(int(part[i]))

        def cb_last(err: Any, msg: Any, i: int = i) -> None:
            if err is None:
                ack_t[i] = time.time()
                offs[i] = msg.offset()

        producer.produce(
            TOPIC, value=lines[i], key=key_bytes[i], partition=int(part[i]), on_delivery=cb_last
        )
        producer.flush(30)
        sent += 1
    out.update(
        sent=sent,
        phases=phases,
        ack_t=ack_t[:sent],
        part=part[:sent],
        offs=offs[:sent],
        t_start=t_start,
    )


def read_log(path: Path) -> list[Any]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def visible_times(
    ack_t: np.ndarray, seq_idx: np.ndarray, seen_t: np.ndarray, seen_idx: np.ndarray
) -> np.ndarray:
    """Per record: the first observation time >= its ack at which the newest index seen is >=
    its index (NaN if never)."""
    if len(seen_t) == 0:
        return np.full(len(ack_t), np.nan)
    order = np.argsort(seen_t)
    seen_t, seen_idx = seen_t[order], np.maximum.accumulate(seen_idx[order])
    # first observation with newest >= index
    j = np.searchsorted(seen_idx, seq_idx, side="left")
    # and not before the ack
    j = np.maximum(j, np.searchsorted(seen_t, ack_t, side="left"))
    out = np.full(len(ack_t), np.nan)
    ok = j < len(seen_t)
    out[ok] = seen_t[j[ok]]
    return out


def stream_figures(
    prod: dict[str, Any], reads: list[Any], commits_t: np.ndarray, commits_idx: np.ndarray
) -> list[dict[str, Any]]:
    ack_t = prod["ack_t"]
    idx = np.arange(len(ack_t))
    good = ~np.isnan(ack_t)
    rl = [r for r in reads if isinstance(r, list)]
    read_t = np.array([r[0] for r in rl], dtype=float)
    read_idx = np.array([r[1] - wl.STREAM_SEQ_BASE for r in rl], dtype=np.int64)
    read_s = np.array([r[2] for r in rl], dtype=float)
    vis_read = visible_times(ack_t[good], idx[good], read_t, read_idx)
    vis_commit = visible_times(ack_t[good], idx[good], commits_t, commits_idx)
    lat_read = vis_read - ack_t[good]
    lat_commit = vis_commit - ack_t[good]
    gidx = idx[good]
    out = []
    for ph in prod["phases"]:
        m = (gidx >= ph["first"]) & (gidx < ph["end"])
        lr, lc = lat_read[m], lat_commit[m]
        during = (read_t >= ph["t0"]) & (read_t <= ph["t1"])
        achieved = (ph["end"] - ph["first"]) / max(1e-9, ph["t1"] - ph["t0"])
        fig = {
            "rate": ph["rate"],
            "achieved_rate": round(achieved),
            "records": int(m.sum()),
            "unseen": int(np.isnan(lr).sum()),
            "p50_s": percentile(lr[~np.isnan(lr)], 50),
            "p99_s": percentile(lr[~np.isnan(lr)], 99),
            "commit_p50_s": percentile(lc[~np.isnan(lc)], 50),
            "commit_p99_s": percentile(lc[~np.isnan(lc)], 99),
            "read_p50_s": percentile(read_s[during], 50),
            "read_p99_s": percentile(read_s[during], 99),
            "reads": int(during.sum()),
        }
        fig["held"] = bool(
            fig["unseen"] == 0 and fig["p99_s"] <= HELD_P99_S and achieved >= 0.95 * ph["rate"]
        )
        out.append(fig)
    return out


def wait_until(cond: Any, timeout: float, what: str, every: float = 0.5) -> float:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"{what} did not happen within {timeout:.0f} s")
        time.sleep(every)
    return time.monotonic() - t0


def stream_one(system: str, keys: int, base: Path, args: argparse.Namespace) -> dict[str, Any]:
    from millstream.local.tansu import TansuBroker

    work = base / f"{system}-{keys}"
    work.mkdir(parents=True)
    broker = TansuBroker(work / "broker")
    procs: list[Proc] = []
    stop = work / "STOP"
    res: dict[str, Any] = {"system": system, "keys": keys, "load_start": load_text()}
    try:
        broker.start()
        broker.create_topic(TOPIC, PARTITIONS)
        t0 = time.perf_counter()
        if system == "millstream":
            from millstream.catalog import Catalog

            per = produce_preload(broker.bootstrap, keys)
            res["preload_produce_s"] = time.perf_counter() - t0
            spec = millstream_spec(
                work,
                {"kind": "kafka", "bootstrap_servers": broker.bootstrap, "topic": TOPIC},
                trigger_interval=args.trigger_interval,
            )
            writer = Proc(
                millstream_cli("run", "-f", str(spec), "--home", str(work / "home")),
                work / "writer.json",
            )
            procs.append(writer)
            home = work / "home"
            wait_until(
                lambda: (home / "metadata.db").exists() or any(home.glob("*.db")), 300, "the home"
            )
            cat = Catalog.open(home=home)

            def caught_up() -> bool:
                if writer.proc.poll() is not None:
                    raise RuntimeError(
                        f"millstream run exited: {writer.out_file.with_suffix('.log').read_text()[-2000:]}"
                    )
                try:
                    shards = {s.partition: s.upper for s in cat.store.list_shards("peers")}
                except Exception:
                    return False
                return all(
                    shards.get(p, 0)
                    >= per - (1 if p >= keys % PARTITIONS and keys % PARTITIONS else 0)
                    for p in range(PARTITIONS)
                )

            wait_until(caught_up, args.preload_timeout, "the pre-load's catch-up")
            res["preload_s"] = time.perf_counter() - t0
            if args.settle:
                log(
                    f"  pre-loaded in {res['preload_s']:.0f} s; settling {args.settle:.0f} s (background seal)"
                )
                time.sleep(args.settle)
            cat.close()
        else:
            pre = worker("preload", system, work, "preload", keys=keys)
            if pre.wait() != 0:
                raise RuntimeError(
                    f"preload failed: {pre.out_file.with_suffix('.log').read_text()[-2000:]}"
                )
            res["preload_s"] = time.perf_counter() - t0
            writer = worker(
                "stream",
                system,
                work,
                "writer",
                bootstrap=broker.bootstrap,
                topic=TOPIC,
                partitions=PARTITIONS,
                stop=stop,
                log=work / "commits.jsonl",
            )
            procs.append(writer)
        reader = worker(
            "reader", system, work, "reader", stop=stop, log=work / "reads.jsonl", pause=args.pause
        )
        procs.append(reader)
        wait_until(lambda: bool(read_log(work / "reads.jsonl")), 300, "the reader's first read")
        # the peers' loop: wait until it polls (its consumer joined) before producing
        time.sleep(3)
        log(
            f"  {system} K={keys:,}: pre-load {res['preload_s']:.0f} s; producing {args.rates} rows/s, "
            f"{args.phase:.0f} s each (load {load_text()})"
        )
        prod: dict[str, Any] = {}
        producer_loop(broker.bootstrap, args.seed, keys, args.rates, args.phase, prod)
        last = prod["sent"] - 1
        try:
            wait_until(
                lambda: any(
                    isinstance(r, list) and r[1] - wl.STREAM_SEQ_BASE >= last
                    for r in read_log(work / "reads.jsonl")[-5:]
                ),
                args.drain,
                "the last record's read",
            )
        except TimeoutError as exc:
            res["drain"] = str(exc)
        res["load_end"] = load_text()
        stop.write_text("stop")
        if system == "millstream":
            writer.interrupt()
        for p in procs:
            try:
                p.wait(120)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        res["writer_peak_rss_mb"] = writer.peak / 1e6
        # commits: (time, newest index) from the writer's own log
        if system == "millstream":
            cl = [
                json.loads(x)
                for x in next((work / "home" / "writers").rglob("commits.jsonl"))
                .read_text()
                .splitlines()
            ]
            cl = [c for c in cl if c.get("uppers")]
            # a commit covers record i when its partition's upper is past the record's offset
            part, offs = prod["part"], prod["offs"]
            offs = np.where(offs < 0, np.iinfo(np.int64).max, offs)  # never acknowledged
            commits_t = np.array([c["at"] for c in cl], dtype=float)
            covered = []
            by_part = {p: np.flatnonzero(part == p) for p in range(PARTITIONS)}
            for c in cl:
                up = {int(k): v for k, v in c["uppers"].items()}
                newest = -1
                for p, ix in by_part.items():
                    # a partition's records have increasing offsets: those below its upper
                    n = int(np.searchsorted(offs[ix], up.get(p, 0), side="left"))
                    if n:
                        newest = max(newest, int(ix[n - 1]))
                covered.append(newest)
            commits_idx = np.array(covered, dtype=np.int64)
            res["batches"] = len(cl)
        else:
            cl = read_log(work / "commits.jsonl")
            commits_t = np.array([c[0] for c in cl], dtype=float)
            commits_idx = np.array([c[1] - wl.STREAM_SEQ_BASE for c in cl], dtype=np.int64)
            res["batches"] = len(cl)
            res["merge_s_median"] = statistics.median(c[3] for c in cl) if cl else None
            res["merge_s_p99"] = percentile([c[3] for c in cl], 99) if cl else None
        res["phases"] = stream_figures(prod, read_log(work / "reads.jsonl"), commits_t, commits_idx)
        if args.keep:
            # per record (acknowledgement, partition, offset) and per commit, to see which
            # seconds of a phase hold the late records (with reads.jsonl and the writer's logs)
            np.savez(
                work / "records.npz",
                ack_t=prod["ack_t"],
                part=prod["part"],
                offs=prod["offs"],
                commits_t=commits_t,
                commits_idx=commits_idx,
                phases=np.array(
                    [[ph["first"], ph["end"], ph["t0"], ph["t1"]] for ph in prod["phases"]]
                ),
            )
        # A writer stopped before it caught up is checked against what it committed (every
        # record up to the newest it merged), and the run says so.
        checked = prod["sent"]
        if "drain" in res and len(commits_idx):
            checked = int(commits_idx.max()) + 1
            res["checked_records"] = f"{checked} of {prod['sent']} (stopped before it caught up)"
        fin = worker("final", system, work, "final", seed=args.seed, keys=keys, rows=checked)
        fin.wait()
        res.update({f"final_{k}": v for k, v in fin.result().items()})
        res["pass"] = bool(res["final_check"]["ok"])
    finally:
        stop.write_text("stop")
        for p in procs:
            p.interrupt()
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
        broker.stop()
    return res


def stream_mode(args: argparse.Namespace) -> dict[str, Any]:
    systems = [s for s in STREAM_SYSTEMS if s not in args.skip]
    out: list[dict[str, Any]] = []
    for keys in args.keys_list:
        for system in systems:
            base = Path(args.work) / "stream"
            shutil.rmtree(base / f"{system}-{keys}", ignore_errors=True)
            try:
                res = stream_one(system, keys, base, args)
            except Exception as exc:
                res = {"system": system, "keys": keys, "error": str(exc)[-2000:], "pass": False}
                log(f"  {system} K={keys:,}: ERROR {res['error'][-800:]}")
            out.append(res)
            print_stream_one(res)
            if not args.keep:
                shutil.rmtree(base / f"{system}-{keys}", ignore_errors=True)
    print_stream(out)
    return {"runs": out}


def held(res: dict[str, Any]) -> int:
    best = 0
    for ph in res.get("phases", []):
        if not ph["held"]:
            break
        best = ph["rate"]
    return best


def print_stream_one(res: dict[str, Any]) -> None:
    if "phases" not in res:
        return
    for ph in res["phases"]:
        log(
            f"    {res['system']:<11} K={res['keys']:>10,} {ph['rate']:>6}/s: read-visible p50 {ph['p50_s']:.2f} "
            f"p99 {ph['p99_s']:.2f} s, commit p50 {ph['commit_p50_s']:.2f} p99 {ph['commit_p99_s']:.2f} s, "
            f"read {ph['read_p50_s']:.2f}/{ph['read_p99_s']:.2f} s, unseen {ph['unseen']}, "
            f"achieved {ph['achieved_rate']}/s {'held' if ph['held'] else 'NOT held'}"
        )
    behind = f" ({res['checked_records']})" if "checked_records" in res else ""
    log(f"    {res['system']} K={res['keys']:,}: {check_text(res.get('final_check', {}))}{behind}")


def print_stream(runs: list[dict[str, Any]]) -> None:
    log("\nstreaming: highest rate held (p99 freshness to a read <= 2 s, every record seen)")
    log(
        f"{'system':<12}{'K':>12}{'held rows/s':>13}{'p99@top s':>11}{'commit p99@top':>16}{'read p50@top':>14}  check"
    )
    for r in runs:
        if "phases" not in r:
            log(f"{r['system']:<12}{r['keys']:>12,}  ERROR")
            continue
        top = r["phases"][-1]
        log(
            f"{r['system']:<12}{r['keys']:>12,}{held(r):>13,}{top['p99_s']:>11.2f}{top['commit_p99_s']:>16.2f}"
            f"{top['read_p50_s']:>14.2f}  {'PASS' if r.get('pass') else 'FAIL'}"
        )


# ---------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("mode", nargs="?", choices=["batch", "stream", "both"], default="both")
    ap.add_argument("--smoke", action="store_true", help="small sizes: both modes in a few minutes")
    ap.add_argument("--rows", type=int, default=1_000_000, help="batch: records")
    ap.add_argument(
        "--keys",
        default=None,
        help="batch: K (default 200000); stream: K list, e.g. 200000,2000000",
    )
    ap.add_argument("--rounds", type=int, default=1, help="batch: rounds (the table is the median)")
    ap.add_argument("--rates", default="1000,5000,20000", help="stream: the ramp, rows/s")
    ap.add_argument("--phase", type=float, default=60.0, help="stream: seconds per rate")
    ap.add_argument("--pause", type=float, default=0.1, help="stream: reader's pause between reads")
    ap.add_argument(
        "--trigger-interval",
        default=None,
        help="stream: Millstream's trigger_interval (e.g. 250ms; default: the spec's default)",
    )
    ap.add_argument(
        "--settle", type=float, default=30.0, help="stream: Millstream's pause after its pre-load"
    )
    ap.add_argument("--drain", type=float, default=60.0, help="stream: wait for the last record, s")
    ap.add_argument("--preload-timeout", type=float, default=900.0)
    ap.add_argument("--skip", default="", help="systems to leave out, comma-separated")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--work", default=str(CACHE / "work"))
    ap.add_argument("--keep", action="store_true", help="keep the tables")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    if args.smoke:
        args.rows = min(args.rows, 100_000)
        args.keys = args.keys or "20000"
        args.rates = "500,2000"
        args.phase = min(args.phase, 15.0)
        args.settle = min(args.settle, 5.0)
        args.drain = min(args.drain, 30.0)
    args.skip = set(filter(None, args.skip.split(",")))
    args.rates = [int(x) for x in args.rates.split(",")]
    keys_list = [int(x) for x in (args.keys or "200000").split(",")]
    args.keys_list = keys_list
    args.keys = keys_list[0]
    peers_python()
    info = {
        "command": command_line("peers.py"),
        "machine": machine("pyarrow"),
        "peers": peer_versions(),
        "load_start": load_text(),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),
    }
    log(json.dumps(info))
    results: dict[str, Any] = {"info": info}
    if args.mode in ("batch", "both"):
        results["batch"] = batch_mode(args)
    if args.mode in ("stream", "both"):
        results["stream"] = stream_mode(args)
    results["load_end"] = load_text()
    out = write_json(RESULTS / f"peers-{time.strftime('%H%M%S')}.json", results)
    if args.json:
        write_json(args.json, results)
    log(f"results: {out}")


if __name__ == "__main__":
    main()
