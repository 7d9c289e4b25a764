"""What a long-lived Iceberg publisher holds of its tables' last metadata files at their
snapshot bound, and what a publish costs with it, A/B by tree.

Run from the repository root (not part of CI; a minute or two)::

    git worktree add --detach /tmp/pubmeta-before <commit>
    .venv/bin/python bench/publisher_metadata.py --src before=/tmp/pubmeta-before/src --src after=src
    # options: --tables N --snapshots S --publishes P --repeat R

Builds once (with the first tree) one small upsert table on the embedded metadata store and a
local deep store, published ``--snapshots`` times (10 rows a commit): its view lists
``retention.iceberg_snapshots`` of them (240 by default) and its metadata log 100 files, the
steady state of every table of a worker after an hour of 15 s publishes. Then, per tree, in a
fresh process of its own on a copy of that home (alternating, ``--repeat`` times):

* **held**: a :class:`~millstream.table.iceberg.PublishCache` is handed that table's metadata
  file under ``--tables`` names (each read and kept apart, as a publisher keeps each of its
  tables' last file); the bytes ``tracemalloc`` sees the cache hold after (gc'd), and the
  process's RSS growth;
* **publish**: ``--publishes`` commits and publishes of the table through one cache (the
  first not timed: it reads in full), CPU (``time.process_time``) of each publish, median;
  and as many publishes with nothing new (the check a round makes of every idle table).

Prints each tree's figures and their ratio to the first tree's.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common

TABLE = "kv"


def _commit(cat: Any, lo: int, rows: int = 10) -> int:
    import pyarrow as pa

    from millstream.spec import OFFSET_COL, PARTITION_COL, TOMBSTONE_COL
    from millstream.table.writer import commit_staged, stage_rows

    spec = cat.table(TABLE).spec
    batch = pa.Table.from_pylist(
        [
            {
                "k": (lo + i) % 500,
                "v": f"value {lo + i}",
                PARTITION_COL: 0,
                OFFSET_COL: lo + i,
                TOMBSTONE_COL: False,
            }
            for i in range(rows)
        ],
        schema=spec.arrow_schema(system_columns=True),
    )
    commit_staged(
        cat.store, cat.deep, TABLE, stage_rows(cat.deep, spec, batch), {0: (lo, lo + rows)}, {}
    )
    return lo + rows


def _build(home: Path, snapshots: int) -> None:
    from millstream.catalog import Catalog
    from millstream.table.iceberg import PublishCache, publish

    with Catalog.open(home=home) as cat:
        cat.create_table(
            {
                "name": TABLE,
                "schema": {"k": "long", "v": "string"},
                "mode": "upsert",
                "primary_key": ["k"],
            }
        )
        cache = PublishCache()
        lo = 0
        for _ in range(snapshots):
            lo = _commit(cat, lo)
            publish(cat.store, cat.deep, TABLE, cache=cache)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _child(home: Path, tables: int, publishes: int) -> dict[str, Any]:
    import tracemalloc

    from millstream.catalog import Catalog
    from millstream.table.iceberg import PublishCache, load_metadata, publish

    out: dict[str, Any] = {}
    with Catalog.open(home=home) as cat:
        pointer = cat.store.read_pointer(TABLE)
        assert pointer is not None
        path = pointer.metadata_location
        listed = load_metadata(cat.deep, path)
        out["snapshots"] = len(listed.snapshots)
        out["metadata_log"] = len(listed.metadata_log)
        out["file_bytes"] = os.path.getsize(cat.deep._abs(path))
        del listed

        held = PublishCache()
        gc.collect()
        rss0 = _rss()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for i in range(tables):
            held.metadata(cat.deep, f"t{i:03d}", path)
        gc.collect()
        out["held_bytes"] = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        out["held_rss"] = _rss() - rss0
        del held
        gc.collect()

        cache = PublishCache()
        lo = max((s.upper for s in cat.store.list_shards(TABLE)), default=0)
        changed: list[float] = []
        idle: list[float] = []
        for i in range(publishes + 1):
            lo = _commit(cat, lo)
            c0 = time.process_time()
            assert publish(cat.store, cat.deep, TABLE, cache=cache).published
            if i:  # the first reads the table in full
                changed.append(time.process_time() - c0)
            c0 = time.process_time()
            assert not publish(cat.store, cat.deep, TABLE, cache=cache).published
            idle.append(time.process_time() - c0)
        out["publish_ms"] = statistics.median(changed) * 1000
        out["idle_ms"] = statistics.median(idle) * 1000
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tables", type=int, default=100)
    ap.add_argument("--snapshots", type=int, default=260)
    ap.add_argument("--publishes", type=int, default=30)
    ap.add_argument("--src", action="append", default=[], metavar="NAME=DIR")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.tables, args.publishes)))
        return 0
    trees = [tuple(s.split("=", 1)) for s in args.src] or [("this", "src")]
    common.log(f"{common.command_line('publisher_metadata.py')}; load {common.load_text()}")
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in trees}

    def env_of(src: str) -> dict[str, str]:
        return dict(os.environ, PYTHONPATH=str(Path(src).resolve()))

    with tempfile.TemporaryDirectory(prefix="pubmeta-") as tmp:
        home = Path(tmp) / "home"  # each run's copy goes back here (paths are absolute)
        pristine = Path(tmp) / "pristine"
        t0 = time.time()
        code = (
            "import sys; sys.path.insert(0, 'bench'); import publisher_metadata; "
            f"publisher_metadata._build(__import__('pathlib').Path({str(home)!r}), "
            f"{args.snapshots})"
        )
        subprocess.run([sys.executable, "-c", code], env=env_of(trees[0][1]), check=True)
        common.log(f"built 1 table x {args.snapshots} publishes in {time.time() - t0:.0f}s")
        home.rename(pristine)
        for r in range(args.repeat):
            for name, src in trees if r % 2 == 0 else list(reversed(trees)):
                shutil.copytree(pristine, home)
                out = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--child",
                        str(home),
                        "--tables",
                        str(args.tables),
                        "--publishes",
                        str(args.publishes),
                    ],
                    env=env_of(src),
                    check=True,
                    capture_output=True,
                    text=True,
                )
                shutil.rmtree(home)
                row = json.loads(out.stdout.strip().splitlines()[-1])
                runs[name].append(row)
                common.log(f"{name} run {r + 1}: {row}")
    first = trees[0][0]
    common.log(f"load at the end {common.load_text()}")
    keys = ("held_bytes", "held_rss", "publish_ms", "idle_ms")
    med = {n: {k: statistics.median(r[k] for r in rs) for k in keys} for n, rs in runs.items()}
    shape = runs[first][0]
    print(
        f"one table: {shape['snapshots']} snapshots listed, {shape['metadata_log']} files in "
        f"its metadata log, its file {shape['file_bytes']:,} bytes; held under {args.tables} "
        f"names; medians of {args.repeat}"
    )
    print(
        f"{'tree':<10} {'held (tracemalloc)':>20} {'a table':>10} {'RSS growth':>12} "
        f"{'publish CPU':>12} {'idle check':>11}"
    )
    for name, m in med.items():
        ratios = (
            ""
            if name == first
            else "  " + ", ".join(f"{k} {common.ratio(m[k], med[first][k]):.3f}x" for k in keys)
        )
        print(
            f"{name:<10} {m['held_bytes'] / 2**20:>17.2f} MiB {m['held_bytes'] / args.tables / 1024:>7.1f} KiB"
            f" {m['held_rss'] / 2**20:>8.1f} MiB {m['publish_ms']:>9.2f} ms {m['idle_ms']:>8.3f} ms{ratios}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
