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
:class:`~millstream.sealing.maintenance.Publisher`, at its default interval, runs on a
:class:`~millstream.supervise.SupervisedLoop` of its own, as a worker runs it (the same step,
``Publisher.run_due``, every second). Every second a sampler reads the publish lag
(:func:`millstream.metastore.iceberg.publish_lag`: the age of the oldest committed version the
newest snapshot does not cover, ``millstream_iceberg_publish_lag_seconds``): a record
committed longer ago than that is in the view. It prints p50/p99/max of the lag and of the
publish times (the first publish reads the whole table; the rest are incremental).

Then the ingest phases: the committer commits 5,000-row micro-batches back to back, with the
publisher on, then off, alternated (on-off, off-on, ...: the machine's load drifts); each
phase prints rows/s and the p50/p99 commit latency (from the batch's creation to its commit:
the moment Millstream's own read returns its rows, so this is the read's freshness). The
summary compares the median phase's rows/s and the pooled latencies. ``--paced`` commits one
batch a second instead (5,000 rows/s: the latencies at the target rate).
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

    def commit(self, n: int = BATCH) -> float:
        """Commit ``n`` rows of random keys; the seconds from the batch's creation to its commit."""
        t0 = time.perf_counter()
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
        staged = stage_rows(self.cat.deep, self.spec, table)
        commit_staged(self.cat.store, self.cat.deep, "kv", staged, ranges, {})
        return time.perf_counter() - t0


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values), q)) if values else float("nan")


def lag_run(cat: Catalog, committer: Committer, seconds: float) -> None:
    publisher = Publisher(cat)  # the default interval
    loop = SupervisedLoop("publishing", lambda: publisher.run_due({"kv": ["kv"]}), interval=1.0)
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
        f"publisher errors {sum(s.errors for s in publisher.loop_statuses(alive=True))}"
    )


def ingest_phases(
    cat: Catalog, committer: Committer, phase: float, rounds: int, *, paced: bool
) -> None:
    results: dict[str, list[tuple[float, list[float]]]] = {"on": [], "off": []}
    sealer = Sealer(cat, "kv", index_cache=IndexCache())
    seal_loop = SupervisedLoop("sealer", sealer.seal_due, interval=2.0).start()
    publisher = Publisher(cat)
    for r in range(rounds):
        for mode in ("on", "off") if r % 2 == 0 else ("off", "on"):
            loop = None
            if mode == "on":
                loop = SupervisedLoop(
                    "publishing", lambda: publisher.run_due({"kv": ["kv"]}), interval=1.0
                ).start()
            latencies: list[float] = []
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < phase:
                latencies.append(committer.commit())
                if paced:  # one batch a second: 5,000 rows/s
                    time.sleep(max(0.0, t0 + len(latencies) - time.perf_counter()))
            elapsed = time.perf_counter() - t0
            if loop is not None:
                loop.stop()
            results[mode].append((len(latencies) * BATCH / elapsed, latencies))
            print(
                f"  round {r} publishing {mode:3s}: {len(latencies) * BATCH / elapsed:8.0f} rows/s, "
                f"commit p50 {pct(latencies, 50) * 1000:6.0f} ms, p99 "
                f"{pct(latencies, 99) * 1000:6.0f} ms"
            )
    seal_loop.stop()
    summary = {}
    for mode, runs in results.items():
        rate = statistics.median(r for r, _ in runs)
        lat = [x for _, xs in runs for x in xs]
        summary[mode] = (rate, pct(lat, 50), pct(lat, 99))
    on, off = summary["on"], summary["off"]
    print(
        f"ingest, publishing on vs off: {on[0]:.0f} vs {off[0]:.0f} rows/s "
        f"({(on[0] / off[0] - 1) * 100:+.1f}%); read freshness (commit latency) p99 "
        f"{on[2] * 1000:.0f} vs {off[2] * 1000:.0f} ms ({(on[2] / off[2] - 1) * 100:+.1f}%), "
        f"p50 {on[1] * 1000:.0f} vs {off[1] * 1000:.0f} ms"
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
    ingest_phases(cat, committer, phase, args.rounds, paced=args.paced)
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
