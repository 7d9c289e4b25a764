"""What the Iceberg view of a large upsert table holds while it is computed in full: A/B.

Run from the repository root::

    .venv/bin/python bench/iceberg_view_memory.py --keys 2000000 --src before=DIR --src after=src

A publisher computes a table's view in full (:func:`millstream.table.iceberg.full_view`) at
its first publish and after a seal or compaction of most of the table: every row of the
version is read, aligned with the table's read and compared. This builds one upsert table of
``--keys`` keys (the peers' row shape: three strings, ~100 bytes a row; 200,000-row files over
4 partitions) and times ``full_view`` over it, in a fresh process per tree (``--src
NAME=DIR``: that tree's ``src`` on ``PYTHONPATH``; alternated ``--repeat`` times), sampling
the process's RSS and Arrow's allocated bytes every 10 ms. It prints each run's peak Arrow
bytes as copies of the table's read (its Arrow size with system columns), the peak RSS above
the process's before the view, and the ratio to the first tree's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import common

PER_FILE = 200_000
PARTITIONS = 4


def _child(keys: int) -> dict[str, float]:
    import numpy as np
    import pyarrow as pa

    from millstream.catalog import Catalog
    from millstream.spec import OFFSET_COL, PARTITION_COL, TOMBSTONE_COL, TableSpec
    from millstream.table import iceberg
    from millstream.table.read import read_manifest
    from millstream.table.writer import commit_staged, stage_rows

    with tempfile.TemporaryDirectory(prefix="iceberg-view-memory-") as home:
        cat = Catalog.open(home=Path(home))
        spec = cat.create_table(
            TableSpec.parse(
                {
                    "name": "t",
                    "schema": {
                        "id": "long",
                        "amount": "double",
                        "customer": "string",
                        "status": "string",
                        "note": "string",
                    },
                    "primary_key": ["id"],
                    "mode": "upsert",
                }
            )
        ).spec
        ends = [0] * PARTITIONS
        for lo in range(0, keys, PER_FILE):
            n, p = min(PER_FILE, keys - lo), (lo // PER_FILE) % PARTITIONS
            ids = np.arange(lo, lo + n)
            rows = pa.Table.from_pydict(
                {
                    "id": pa.array(ids, pa.int64()),
                    "amount": pa.array(ids * 0.25),
                    "customer": pa.array([f"customer-{i % 50_000:06d}" for i in ids]),
                    "status": pa.array(["shipped" if i % 3 else "pending" for i in ids]),
                    "note": pa.array([f"a note of some forty characters, number {i}" for i in ids]),
                    PARTITION_COL: pa.array(np.full(n, p, np.int32)),
                    OFFSET_COL: pa.array(np.arange(ends[p], ends[p] + n, dtype=np.int64)),
                    TOMBSTONE_COL: pa.array(np.zeros(n, bool)),
                },
                schema=spec.arrow_schema(system_columns=True),
            )
            staged = stage_rows(cat.deep, spec, rows)
            commit_staged(cat.store, cat.deep, "t", staged, {p: (ends[p], ends[p] + n)}, {})
            ends[p] += n
        manifest = cat.store.manifest("t")
        copy = read_manifest(cat.deep, manifest, include_system_columns=True).nbytes

        def rss() -> int:
            return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")

        base = rss()
        peak = {"rss": base, "arrow": 0}
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                peak["rss"] = max(peak["rss"], rss())
                peak["arrow"] = max(peak["arrow"], pa.total_allocated_bytes())
                time.sleep(0.01)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        started = time.perf_counter()
        view = iceberg.full_view(cat.deep, manifest)
        seconds = time.perf_counter() - started
        done.set()
        watcher.join()
        assert view.live_rows == keys
        cat.close()
    return {
        "copy_mib": copy / 2**20,
        "arrow_peak_mib": peak["arrow"] / 2**20,
        "copies": peak["arrow"] / copy,
        "rss_above_mib": (peak["rss"] - base) / 2**20,
        "seconds": seconds,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=2_000_000)
    ap.add_argument("--src", action="append", default=[], metavar="NAME=DIR")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child(args.keys)))
        return 0
    trees = [tuple(s.split("=", 1)) for s in args.src] or [("this", "src")]
    common.log(f"{common.command_line('iceberg_view_memory.py')}; load {common.load_text()}")
    runs: dict[str, list[dict[str, float]]] = {name: [] for name, _ in trees}
    for r in range(args.repeat):
        for name, src in trees if r % 2 == 0 else list(reversed(trees)):
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(src).resolve()), "tests"]))
            out = subprocess.run(
                [sys.executable, __file__, "--child", "--keys", str(args.keys)],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            got = json.loads(out.stdout.strip().splitlines()[-1])
            runs[name].append(got)
            common.log(
                f"{name}: Arrow peak {got['arrow_peak_mib']:.0f} MiB = {got['copies']:.2f} "
                f"copies of the table ({got['copy_mib']:.0f} MiB), RSS +{got['rss_above_mib']:.0f}"
                f" MiB, {got['seconds']:.1f} s"
            )
    common.log(f"load after: {common.load_text()}")
    first = trees[0][0]
    base = statistics.median(g["arrow_peak_mib"] for g in runs[first])
    base_rss = statistics.median(g["rss_above_mib"] for g in runs[first])
    print(f"{'tree':<10} {'Arrow peak MiB':>15} {'copies':>7} {'RSS above MiB':>14} {'ratio':>6}")
    for name, _ in trees:
        arrow = statistics.median(g["arrow_peak_mib"] for g in runs[name])
        copies = statistics.median(g["copies"] for g in runs[name])
        above = statistics.median(g["rss_above_mib"] for g in runs[name])
        print(
            f"{name:<10} {arrow:>15.0f} {copies:>7.2f} {above:>14.0f} "
            f"{common.ratio(arrow, base):>5.2f}x (RSS {common.ratio(above, base_rss):.2f}x)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
