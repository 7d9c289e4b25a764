"""Soak benchmark: does a table's cost follow its data, not its age?

Continuous ingestion (the generator source, ``rate`` rows/s over 4 partitions, 200k keys) into
an upsert table partitioned by key, by a standalone runner (the ``millstream run`` code, in a
child process with its own Spark JVM) that seals, compacts, expires history (retention
``--retention``) and collects files in the background. Every ``--sample`` seconds this process
measures, from the same metadata and deep store:

* deep-store files and bytes (every table), manifest rows (entries, delete vectors, versions:
  every row, removed ones included), live entries and delete vectors of the table;
* the read time of the current table (``Catalog.read_table``): ``read ms`` is the median of
  the reads since the last sample by a reader that polls the table every second for the whole
  run with a 512 MB cache (``read_cache_mb``; what a dashboard or a service would do), and
  ``plain beside polls ms`` its baseline: right after each poll, plain
  ``pyarrow.parquet.read_table`` of one zstd file of the live rows (rewritten from the poll's
  answer every tenth poll), so both see the same moments of the ingest's load; ``cold read
  ms`` the median of 3 reads each by a new reader without a cache, and its baseline ``plain
  live-rows ms``, at the sample, plain Parquet of the live rows (median of 3);
* the RSS of the ingest process group (driver, JVM, Python workers).

At the end it prints each figure's growth per hour over the last two thirds of the run (a
least-squares slope, and that slope as a share of the figure's mean): flat means under 5% per
hour. Run from the repository root::

    .venv/bin/python bench/soak.py                 # 30 minutes at 5,000 rows/s
    .venv/bin/python bench/soak.py --minutes 90    # longer
    .venv/bin/python bench/soak.py --quick         # 4 minutes at 2,000 rows/s, to try it
    .venv/bin/python bench/soak.py --summary run.json   # the summary of a run saved by --json

Garbage collection's grace period and the staged-file age limit are shortened with the
retention (``--grace``, default 300 s: a file nothing references goes 5 minutes after it was
written; in production they are 1 h and 30 min, so files flatten an hour later).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import common
import numpy as np
import pyarrow.parquet as pq
from rich.console import Console
from rich.table import Table
from sqlalchemy import func, select

from millstream.spec import parse_duration

TABLE = "orders"
FIGURES = (
    "deep-store files",
    "deep-store MB",
    "manifest rows",
    "live entries",
    "delete vectors",
    "read ms",
    "cold read ms",
    "plain live-rows ms",
    "plain beside polls ms",
    "ingest RSS MB",
)


def spec(rate: float, keys: int, retention: str, flush_rows: int) -> dict[str, Any]:
    from millstream.ingest.sources.generator import ORDERS_SCHEMA

    return {
        "name": TABLE,
        "source": {
            "kind": "generator",
            "rate": rate,
            "partitions": 4,
            "key_cardinality": keys,
            "update_fraction": 0.7,
        },
        "table": {
            "primary_key": ["order_id"],
            "mode": "upsert",
            "delete_column": "is_deleted",
            "partitioned_by_key": True,
            "retention": {"time": retention, "min_versions": 1},
        },
        "schema": ORDERS_SCHEMA,
        "segments": {"flush_rows": flush_rows, "flush_seconds": 60},
    }


def child(home: Path, spec_path: Path, interval: float, grace: float) -> int:
    """The ingest process: a standalone runner until SIGTERM."""
    from millstream.catalog import Catalog
    from millstream.datastream import DatastreamSpec
    from millstream.spark.runner import DatastreamRunner
    from millstream.spark.session import spark_session

    ds = DatastreamSpec.parse(json.loads(spec_path.read_text()))
    spark = spark_session(master="local[2]")
    with Catalog.open(home=home) as cat:
        runner = DatastreamRunner(
            ds,
            cat,
            spark,
            writer_id="soak",
            background_sealing=True,
            maintenance_interval=interval,
            max_staged_age=grace,
            gc_grace_seconds=grace,
        )
        signal.signal(signal.SIGTERM, lambda *_: runner.stop())
        runner.run(available_now=False)
    return 0


def group_rss_mb(pgid: int) -> float:
    total = 0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[2]) != pgid:
                continue
            for line in (d / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return total / 1024


class Poller(threading.Thread):
    """Reads the current table every ``every`` seconds through one long-lived, cached reader,
    keeping each read's duration (ms) until :meth:`take`; and right after each read, the
    baseline under the same load: plain Parquet of one zstd file of the live rows (rewritten
    from the reader's answer every ``rewrite`` reads)."""

    def __init__(self, home: Path, scratch: Path, every: float = 1.0, rewrite: int = 10) -> None:
        super().__init__(daemon=True)
        self.home, self.every, self.rewrite = home, every, rewrite
        self.live = scratch / "poll-live.parquet"
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.times: list[float] = []
        self.plain: list[float] = []
        self.errors = 0

    def run(self) -> None:
        from millstream.catalog import Catalog

        with Catalog.open(home=self.home, read_cache_mb=512) as reader:
            reads = 0
            while not self.stopping.wait(self.every):
                t0 = time.perf_counter()
                try:
                    current = reader.read_table(TABLE)
                except Exception:  # the table may not exist yet
                    self.errors += 1
                    continue
                took = (time.perf_counter() - t0) * 1000
                if reads % self.rewrite == 0:
                    pq.write_table(current, self.live, compression="zstd")
                reads += 1
                t0 = time.perf_counter()
                pq.read_table(self.live)
                plain = (time.perf_counter() - t0) * 1000
                with self.lock:
                    self.times.append(took)
                    self.plain.append(plain)

    def take(self) -> tuple[list[float], list[float]]:
        """The reads' and their baselines' durations since the last call."""
        with self.lock:
            out, self.times, plain, self.plain = self.times, [], self.plain, []
        return out, plain


def sample(
    home: Path, scratch: Path, pgid: int, polled: tuple[list[float], list[float]]
) -> dict[str, float]:
    from millstream.catalog import Catalog
    from millstream.errors import NotFoundError
    from millstream.metastore import schema as s

    with Catalog.open(home=home) as cat:
        files = cat.deep.list_files("tables")
        with cat.store.read() as conn:
            rows = sum(
                int(conn.execute(select(func.count()).select_from(t)).scalar_one())
                for t in (s.entries, s.delete_vectors, s.table_versions)
            )
        try:
            manifest = cat.manifest(TABLE)
        except NotFoundError:
            return {}
        reads, beside = polled
        if not reads:
            return {}
        cold, current = [], None
        for _ in range(3):
            with Catalog.open(home=home) as new_reader:
                t0 = time.perf_counter()
                current = new_reader.read_table(TABLE)
                cold.append((time.perf_counter() - t0) * 1000)
        assert current is not None
        live = scratch / "live.parquet"
        pq.write_table(current, live, compression="zstd")
        plain = []
        for _ in range(3):
            t0 = time.perf_counter()
            pq.read_table(live)
            plain.append((time.perf_counter() - t0) * 1000)
        uppers = sum(sh.upper for sh in cat.store.list_shards(TABLE))
    return {
        "deep-store files": float(len(files)),
        "deep-store MB": sum(f.size for f in files) / 1e6,
        "manifest rows": float(rows),
        "live entries": float(len(manifest.entries)),
        "delete vectors": float(len(manifest.delete_vectors)),
        "read ms": statistics.median(reads),
        "plain beside polls ms": statistics.median(beside),
        "reads polled": float(len(reads)),
        "cold read ms": statistics.median(cold),
        "plain live-rows ms": statistics.median(plain),
        "ingest RSS MB": group_rss_mb(pgid),
        "live rows": float(current.num_rows),
        "offsets consumed": float(uppers),
    }


def growth(samples: list[dict[str, float]], name: str) -> tuple[float, float]:
    """(slope per hour, slope per hour as a share of the mean) over the last two thirds."""
    end = samples[-1]["t"]
    tail = [x for x in samples if x["t"] >= end / 3 and name in x]
    if len(tail) < 3:
        return float("nan"), float("nan")
    t = np.array([x["t"] for x in tail]) / 3600
    y = np.array([x[name] for x in tail])
    slope = float(np.polyfit(t, y, 1)[0])
    mean = float(y.mean())
    return slope, (slope / mean if mean else float("nan"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=5000.0, help="rows/s")
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--retention", default="5m", help="the table's retention.time")
    parser.add_argument("--grace", type=float, default=300.0, help="GC grace = staged age, s")
    parser.add_argument("--maintenance", type=float, default=60.0, help="interval, s")
    parser.add_argument("--flush-rows", type=int, default=20_000)
    parser.add_argument("--sample", type=float, default=60.0, help="seconds between samples")
    parser.add_argument("--quick", action="store_true", help="4 minutes at 2,000 rows/s")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--keep", type=Path, default=None, help="run in this new directory and keep it"
    )
    parser.add_argument(
        "--summary", type=Path, default=None, help="print the summary of a run saved by --json"
    )
    parser.add_argument("--child", nargs=2, metavar=("HOME", "SPEC"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.summary is not None:
        saved = json.loads(args.summary.read_text())
        summarize(Console(soft_wrap=True), saved["samples"], saved["args"]["retention"], {})
        return 0
    if args.child:
        return child(Path(args.child[0]), Path(args.child[1]), args.maintenance, args.grace)
    if args.quick:
        args.minutes, args.rate, args.retention = 4.0, 2000.0, "1m"
        args.grace, args.maintenance, args.sample, args.flush_rows = 60.0, 20.0, 20.0, 5000
    console = Console(soft_wrap=True)
    console.print(f"$ {common.command_line('soak.py')}")
    console.print(
        f"load {common.load_text()}; {common.cpu_model()}; {args.rate:,.0f} rows/s, "
        f"{args.keys:,} keys, retention {args.retention}, GC grace {args.grace:.0f} s, "
        f"maintenance every {args.maintenance:.0f} s, {args.minutes:g} minutes"
    )
    samples: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="millstream-soak-") as tmp:
        root = Path(tmp) if args.keep is None else args.keep
        if args.keep is not None:
            root.mkdir(parents=True)
        home = root / "home"
        spec_path = root / "spec.json"
        spec_path.write_text(
            json.dumps(spec(args.rate, args.keys, args.retention, args.flush_rows))
        )
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
        log = (root / "ingest.log").open("w")
        proc = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--child",
                str(home),
                str(spec_path),
                "--maintenance",
                str(args.maintenance),
                "--grace",
                str(args.grace),
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        poller = Poller(home, root)
        poller.start()
        t0 = time.monotonic()
        try:
            while time.monotonic() - t0 < args.minutes * 60:
                time.sleep(min(args.sample, max(0.0, args.minutes * 60 - (time.monotonic() - t0))))
                if proc.poll() is not None:
                    raise SystemExit(
                        f"the ingest process ended ({proc.returncode}); see "
                        f"{(root / 'ingest.log').read_text()[-3000:]}"
                    )
                try:
                    x = sample(home, root, proc.pid, poller.take())
                except Exception as exc:  # the table may not exist yet
                    console.print(f"  sample failed: {exc}")
                    continue
                if not x:
                    continue
                x["t"] = time.monotonic() - t0
                samples.append(x)
                x["read / plain"] = x["read ms"] / x["plain beside polls ms"]
                console.print(
                    f"  {x['t'] / 60:5.1f} min: "
                    + ", ".join(f"{n} {x[n]:,.1f}" for n in (*FIGURES, "live rows"))
                    + f", read / plain {x['read / plain']:.2f}x"
                    + f", consumed {x['offsets consumed']:,.0f}"
                )
        finally:
            poller.stopping.set()
            poller.join(30)
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            log.close()
    if len(samples) < 3:
        console.print("too few samples")
        return 1
    result: dict[str, Any] = {"args": vars(args), "samples": samples}
    summarize(console, samples, args.retention, result)
    if args.json is not None:
        common.write_json(args.json, {"machine": common.machine("pyarrow"), **result})
    return 0


def third_range(samples: list[dict[str, float]], name: str, third: int) -> str:
    """``name``'s lowest and highest value over one third (1: middle, 2: last) of the run."""
    end = samples[-1]["t"]
    ys = [x[name] for x in samples if third * end / 3 <= x["t"] <= (third + 1) * end / 3]
    return f"{min(ys):,.0f}-{max(ys):,.0f}" if ys else "-"


def summarize(
    console: Console, samples: list[dict[str, float]], retention: str, result: dict[str, Any]
) -> None:
    """Print (and put in ``result``) each figure's growth over the last two thirds and the
    read's ratio at every sample after the retention window. A figure is flat when it grows
    by under 5% of its value an hour (the issue's rule: a falling figure is not growth); the
    ranges of the middle and last thirds show a sawtooth (seals, compaction, GC) that a
    straight line over 20 minutes can tilt either way."""
    table = Table(title="growth over the last two thirds of the run")
    columns = (
        "figure",
        "at the end",
        "per hour",
        "per hour, share",
        "middle third",
        "last third",
        "growth < 5%/h",
    )
    for col in columns:
        table.add_column(col, justify="left" if col == "figure" else "right")
    result["growth"] = {}
    for name in FIGURES:
        slope, share = growth(samples, name)
        result["growth"][name] = {"per_hour": slope, "share_per_hour": share}
        table.add_row(
            name,
            f"{samples[-1][name]:,.1f}",
            f"{slope:+,.1f}",
            f"{share:+.1%}",
            third_range(samples, name, 1),
            third_range(samples, name, 2),
            common.verdict(share < 0.05),
        )
    console.print(table)
    last = samples[-1]
    ratio = last["read / plain"]
    result["read_vs_plain_live_rows"] = ratio
    at_sample = last["read ms"] / last["plain live-rows ms"]
    result["read_vs_plain_at_the_sample"] = at_sample
    cold = last["cold read ms"] / last["plain live-rows ms"]
    result["cold_read_vs_plain_live_rows"] = cold
    console.print(
        f"read of the current table at the end: {last['read ms']:.0f} ms = {ratio:.2f}x plain "
        f"Parquet of its live rows read beside each poll ({last['plain beside polls ms']:.0f} "
        f"ms, {last['live rows']:,.0f} rows), target 1.5x: {common.verdict(ratio <= 1.5)} "
        f"({at_sample:.2f}x the 3 plain reads at the sample, {last['plain live-rows ms']:.0f} "
        f"ms); a new reader without a cache {last['cold read ms']:.0f} ms = {cold:.2f}x those"
    )
    # The read's target holds at every sample after the retention window, not just the last.
    window = parse_duration(retention, field="--retention")
    after = [x for x in samples if window is None or x["t"] >= window.total_seconds()]
    which = "after the retention window"
    if not after:
        after, which = samples, "(a run shorter than its retention window: all)"
    ratios = sorted(x["read / plain"] for x in after)
    within = sum(r <= 1.5 for r in ratios)
    result["read_vs_plain_after_retention"] = {
        "samples": len(ratios),
        "min": ratios[0],
        "median": statistics.median(ratios),
        "max": ratios[-1],
        "within_1_5x": within,
    }
    console.print(
        f"read / plain Parquet of the live rows at each of the {len(ratios)} samples {which}: min {ratios[0]:.2f}x, median {statistics.median(ratios):.2f}x, max "
        f"{ratios[-1]:.2f}x; within 1.5x at {within} of {len(ratios)}: "
        f"{common.verdict(within == len(ratios))}"
    )


if __name__ == "__main__":
    sys.exit(main())
