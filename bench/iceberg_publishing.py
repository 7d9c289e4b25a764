"""Iceberg publishing at an ingest rate: the view's publish lag at the defaults, and ingest
with publishing on against off, in one run.

Run from the repository root::

    .venv/bin/python bench/iceberg_publishing.py               # 240 s lag run, 8 x 20 s phases
    .venv/bin/python bench/iceberg_publishing.py --quick       # 60 s, 8 x 10 s

What runs is the production publish loop, driven (no Spark): an upsert table of 2 partitions
(partitioned by key, 200k keys) preloaded with 200k rows and sealed; a committer thread commits
one micro-batch of 5,000 random keys (both partitions, one staged file, as a writer's trigger
does) every second; the production sealer (:class:`Sealer`, default thresholds) runs
``seal_due`` every 2 s on its own thread, as a worker's sealing thread does; and the production
publisher, at its default interval, in its own process
(:class:`~millstream.sealing.publishing.PublisherProcess`) driven by a
:class:`~millstream.supervise.SupervisedLoop` of its own, as a worker runs it (the same step,
``run_due``, every second). Every second a sampler reads the publish lag
(:func:`millstream.metastore.iceberg.publish_lag`: the age of the oldest committed version the
newest snapshot does not cover, ``millstream_iceberg_publish_lag_seconds``): a record
committed longer ago than that is in the view. It prints p50/p99/max of the lag and of the
publish times (the first publish reads the whole table; the rest are incremental).

Then the ingest phases: the committer commits 5,000-row micro-batches back to back, with
publishing off, on in a process of its own (``process``: what a worker runs) and on in a
thread of the committing process (``thread``: what workers ran before, the
:class:`~millstream.sealing.maintenance.Publisher` itself), in a rotating order (the machine's
load drifts); each phase prints rows/s and the p50/p99 commit latency (from the batch's
creation to its commit: the moment Millstream's own read returns its rows, so this is the
read's freshness), and the p99 of its two parts (staging the Parquet file, committing it to
the metadata store). The summary compares the median phase's rows/s and the pooled latencies
of each mode with ``off``. ``--paced`` commits one
batch a second instead (5,000 rows/s: the latencies at the target rate); with ``--every 0.5``
half as many rows twice a second (a writer's default trigger: twice the commits to take the
p99 of); ``--modes off,process,thread`` leaves ``process0`` (a child at the parent's priority)
out.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from millstream.catalog import Catalog
from millstream.sealing.keyindex import IndexCache
from millstream.sealing.maintenance import DEFAULT_PUBLISH_INTERVAL, Publisher
from millstream.sealing.publishing import PublisherProcess
from millstream.sealing.sealer import Sealer
from millstream.supervise import SupervisedLoop
from millstream.table.writer import commit_staged, stage_rows

KEYS = 200_000
BATCH = 5_000
PARTITIONS = 2


class Committer:
    def __init__(self, cat: Catalog, seed: int = 0) -> None:
        self.cat = cat
        self.spec = cat.table("kv").spec
        self.rng = np.random.default_rng(seed)
        self.upper = dict.fromkeys(range(PARTITIONS), 0)
        self.serial = 0
        #: (stage, metadata commit, waiting) seconds of each commit; waiting is its wall time
        #: minus the committing thread's CPU time (waiting for the GIL, a core, a lock, I/O)
        self.parts: list[tuple[float, float, float]] = []

    def commit(self, n: int = BATCH) -> float:
        """Commit ``n`` rows of random keys; the seconds from the batch's creation to its commit."""
        t0 = time.perf_counter()
        cpu0 = time.thread_time()
        keys = self.rng.integers(0, KEYS, n)
        parts = (keys % PARTITIONS).astype(np.int32)
        offsets = np.empty(n, np.int64)
        ranges = {}
        for p in range(PARTITIONS):
            mine = np.flatnonzero(parts == p)
            lo = self.upper[p]
            offsets[mine] = np.arange(lo, lo + len(mine))
            ranges[p] = (lo, lo + len(mine))
            self.upper[p] = lo + len(mine)
        self.serial += 1
        table = pa.table(
            {
                "k": pa.array(keys, pa.int64()),
                "v": pa.array(self.rng.random(n)),
                "s": pa.array([f"batch-{self.serial}"] * n),
                "_ms_partition": pa.array(parts),
                "_ms_offset": pa.array(offsets),
                "_ms_tombstone": pa.array(np.zeros(n, bool)),
            }
        )
        t1 = time.perf_counter()
        staged = stage_rows(self.cat.deep, self.spec, table)
        t2 = time.perf_counter()
        commit_staged(self.cat.store, self.cat.deep, "kv", staged, ranges, {})
        t3 = time.perf_counter()
        self.parts.append((t2 - t1, t3 - t2, (t3 - t0) - (time.thread_time() - cpu0)))
        return t3 - t0


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values), q)) if values else float("nan")


def lag_run(cat: Catalog, committer: Committer, seconds: float) -> None:
    publisher = PublisherProcess(cat, owner="bench")  # the default interval
    loop = SupervisedLoop(
        "publishing",
        lambda: publisher.run_due({"kv": ["kv"]}),
        interval=1.0,
        on_stop=publisher.close,
    )
    sealer = Sealer(cat, "kv", index_cache=IndexCache())
    seal_loop = SupervisedLoop("sealer", sealer.seal_due, interval=2.0)
    stop = threading.Event()
    lags: list[float] = []
    publish_times: list[float] = []
    late: list[float] = []

    def commit_every_second() -> None:
        next_at = time.monotonic()
        while not stop.is_set():
            committer.commit()
            next_at += 1.0
            wait = next_at - time.monotonic()
            if wait < 0:
                late.append(-wait)
            stop.wait(max(0.0, wait))

    t = threading.Thread(target=commit_every_second, daemon=True)
    t.start()
    loop.start()
    seal_loop.start()
    started = time.monotonic()
    seen = 0
    while time.monotonic() - started < seconds:
        time.sleep(1.0)
        lag = cat.store.publish_lag("kv", cat.store.clock.now())
        if lag is not None:
            lags.append(lag)
        view = publisher.status().get("kv")
        if view is not None and view["publishes"] > seen:
            seen = view["publishes"]
            publish_times.append(float(view["last_publish_seconds"]))
    stop.set()
    t.join()
    loop.stop()
    seal_loop.stop()
    first, rest = publish_times[:1], publish_times[1:]
    rows = cat.manifest("kv").row_count
    print(
        f"publish lag at {BATCH} rows/s, interval {publisher.interval:.0f} s (default "
        f"{DEFAULT_PUBLISH_INTERVAL:.0f} s), {seconds:.0f} s, {len(lags)} samples: "
        f"p50 {pct(lags, 50):.1f} s, p99 {pct(lags, 99):.1f} s, max {max(lags):.1f} s"
    )
    print(
        f"  publishes: {len(publish_times)}; first (full) {first[0] if first else float('nan'):.2f} s; "
        f"incremental p50 {pct(rest, 50):.2f} s, p99 {pct(rest, 99):.2f} s, max "
        f"{max(rest, default=float('nan')):.2f} s; physical rows at the end {rows}; "
        f"commits late {len(late)} (max {max(late, default=0.0):.2f} s); "
        f"publisher errors {sum(s.errors for s in publisher.loop_statuses(alive=True))}, "
        f"publisher process failures {loop.status().errors}"
    )


MODES = ("off", "process", "process0", "thread")


def ingest_phases(
    cat: Catalog,
    committer: Committer,
    phase: float,
    rounds: int,
    *,
    paced: bool,
    every: float = 1.0,
    modes: tuple[str, ...] = MODES,
) -> None:
    results: dict[str, list[tuple[float, list[float], list[tuple[float, float, float]]]]] = {
        m: [] for m in modes
    }
    batch = round(BATCH * every)  # 5,000 rows/s
    sealer = Sealer(cat, "kv", index_cache=IndexCache())
    seal_loop = SupervisedLoop("sealer", sealer.seal_due, interval=2.0).start()
    # One publisher of each kind for the whole run (each keeps its cache between its phases).
    in_thread = Publisher(cat)
    child = PublisherProcess(cat, owner="bench")
    child0 = PublisherProcess(cat, owner="bench", niceness=0)
    steps = {
        "thread": lambda: in_thread.run_due({"kv": ["kv"]}),
        "process": lambda: child.run_due({"kv": ["kv"]}),
        "process0": lambda: child0.run_due({"kv": ["kv"]}),
    }
    for r in range(rounds):
        for mode in modes[r % len(modes) :] + modes[: r % len(modes)]:  # the load drifts
            loop = None
            if mode != "off":
                loop = SupervisedLoop("publishing", steps[mode], interval=1.0).start()
            latencies: list[float] = []
            first = len(committer.parts)
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < phase:
                latencies.append(committer.commit(batch))
                if paced:  # one batch every ``every`` seconds: 5,000 rows/s
                    time.sleep(max(0.0, t0 + len(latencies) * every - time.perf_counter()))
            elapsed = time.perf_counter() - t0
            if loop is not None:
                loop.stop()
            parts = committer.parts[first:]
            results[mode].append((len(latencies) * batch / elapsed, latencies, parts))
            print(
                f"  round {r} publishing {mode:8s}: {len(latencies) * batch / elapsed:8.0f} "
                f"rows/s, commit p50 {pct(latencies, 50) * 1000:6.0f} ms, p99 "
                f"{pct(latencies, 99) * 1000:6.0f} ms (stage p99 "
                f"{pct([a for a, _, _ in parts], 99) * 1000:5.0f} ms, metadata commit p99 "
                f"{pct([b for _, b, _ in parts], 99) * 1000:5.0f} ms, waiting p99 "
                f"{pct([c for _, _, c in parts], 99) * 1000:5.0f} ms)"
            )
    seal_loop.stop()
    child.close()
    child0.close()
    summary = {}
    for mode, runs in results.items():
        rate = statistics.median(r for r, _, _ in runs)
        lat = [x for _, xs, _ in runs for x in xs]
        parts = [x for _, _, ps in runs for x in ps]
        summary[mode] = (
            rate,
            pct(lat, 50),
            pct(lat, 99),
            pct([a for a, _, _ in parts], 99),
            pct([b for _, b, _ in parts], 99),
            pct([c for _, _, c in parts], 99),
            statistics.median(pct(xs, 99) for _, xs, _ in runs),
        )
    off = summary["off"]
    for mode in modes[1:]:
        on = summary[mode]
        print(
            f"ingest, publishing on ({mode}) vs off: {on[0]:.0f} vs {off[0]:.0f} rows/s "
            f"({(on[0] / off[0] - 1) * 100:+.1f}%); read freshness (commit latency) p99 "
            f"{on[2] * 1000:.0f} vs {off[2] * 1000:.0f} ms ({(on[2] / off[2] - 1) * 100:+.1f}%), "
            f"p50 {on[1] * 1000:.0f} vs {off[1] * 1000:.0f} ms; stage p99 {on[3] * 1000:.0f} vs "
            f"{off[3] * 1000:.0f} ms, metadata commit p99 {on[4] * 1000:.0f} vs "
            f"{off[4] * 1000:.0f} ms, waiting p99 {on[5] * 1000:.0f} vs {off[5] * 1000:.0f} ms; "
            f"median of the phases' p99 {on[6] * 1000:.0f} vs {off[6] * 1000:.0f} ms"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seconds", type=float, default=None, help="length of the lag run")
    parser.add_argument("--phase", type=float, default=None, help="length of an ingest phase")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument(
        "--paced",
        action="store_true",
        help="ingest phases at 5,000 rows/s (one batch a second) instead of back to back",
    )
    parser.add_argument("--no-lag", action="store_true", help="only the ingest phases")
    parser.add_argument(
        "--every",
        type=float,
        default=1.0,
        help="with --paced: seconds between two batches (of 5,000 rows/s times this; 0.5 is "
        "a writer's default trigger)",
    )
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        help=f"the ingest phases' modes, off first (default {','.join(MODES)})",
    )
    args = parser.parse_args()
    seconds = args.seconds or (60.0 if args.quick else 240.0)
    phase = args.phase or (10.0 if args.quick else 20.0)
    home = Path(tempfile.mkdtemp(prefix="ms-iceberg-publishing-"))
    cat = Catalog.open(home=home)
    cat.create_table(
        {
            "name": "kv",
            "schema": {"k": "long", "v": "double", "s": "string"},
            "mode": "upsert",
            "primary_key": ["k"],
            "partitioned_by_key": True,
        }
    )
    committer = Committer(cat)
    for _ in range(KEYS // 20_000):
        committer.commit(20_000)
    sealer = Sealer(cat, "kv", index_cache=IndexCache())
    for p in range(PARTITIONS):
        sealer.seal_partition(p, force=True)
    print(
        f"upsert table, {KEYS} keys, {PARTITIONS} partitions, preloaded {KEYS} rows (sealed); "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    if not args.no_lag:
        lag_run(cat, committer, seconds)
    modes = tuple(args.modes.split(","))
    if modes[0] != "off" or not set(modes) <= set(MODES):
        parser.error(f"--modes: off first, then some of {', '.join(MODES[1:])}")
    ingest_phases(
        cat, committer, phase, args.rounds, paced=args.paced, every=args.every, modes=modes
    )
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
