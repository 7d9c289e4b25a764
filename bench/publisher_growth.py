"""What a long-lived Iceberg publisher costs as its tables' unsealed runs grow, and whether
its memory follows the tables' live files: CPU a round, RSS, the Python heap and its cache.

Run from the repository root (not part of CI; 5-20 minutes, by the load)::

    .venv/bin/python bench/publisher_growth.py                   # 20 tables, 60 batches
    PYTHONPATH=/tmp/old/src .venv/bin/python bench/publisher_growth.py   # a tree before
    .venv/bin/python bench/publisher_growth.py --src before=/tmp/old/src --src after=src \
        --tables 30 --batches 70 --seal-at 0 --repeat 2     # A/B: each tree in its own process
    .venv/bin/python bench/publisher_growth.py --tables 30 --batches 70 --profile 15,70
    # options: --tables N --batches B --every E --seal-at S (0: never) --profile B1,B2

The production publisher (:class:`~millstream.sealing.maintenance.Publisher`, ``run_due``,
the step a worker's publisher process runs) over ``--tables`` small upsert tables (each with
its dead-letter table, as a worker hands them over), on the embedded metadata store and a
local deep store. Each batch commits 20 rows to every table (keys drawn from 1,000, so new
rows hit keys of earlier files, as a busy upsert table's do); every ``--every`` batches a
publish round runs (a worker publishes every 15 s, and a batch of 100 busy tables takes ~2-3
s). At batch ``--seal-at`` every table's unsealed run is sealed (as its ``flush_seconds``
would). Per round: the unsealed entries a table holds, the round's CPU seconds
(``time.process_time``), the process's RSS, the Python heap (``tracemalloc``) and the
publisher cache's entries and the bytes of Arrow buffers it counts.

``--profile B1,B2``: the rounds after those batches run under cProfile, and the functions
with the most own time and the most cumulative time are printed. ``--src NAME=DIR``
(repeated): each tree's ``src`` runs the same in a fresh process of its own (alternating,
``--repeat`` times, the first tree first in even repeats), and a table prints each round's
CPU seconds per tree and their ratio to the first tree's, same rounds.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import common
import numpy as np
import pyarrow as pa


def rss_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tables", type=int, default=20)
    ap.add_argument("--batches", type=int, default=60)
    ap.add_argument("--every", type=int, default=5, help="batches between publish rounds")
    ap.add_argument(
        "--seal-at", type=int, default=40, help="the batch after which all seal (0: never)"
    )
    ap.add_argument("--profile", default="", help="batches whose round is profiled: 15,70")
    ap.add_argument("--profile-dir", default="", help="also save each profile there (.prof)")
    ap.add_argument("--src", action="append", default=[], metavar="NAME=DIR")
    ap.add_argument("--repeat", type=int, default=1, help="alternations with --src")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.src:
        compare(args)
        return
    profiled = {int(b) for b in args.profile.split(",") if b}

    import millstream
    from millstream.catalog import Catalog
    from millstream.clock import ManualClock
    from millstream.datastream import dead_letter_spec
    from millstream.sealing.keyindex import IndexCache
    from millstream.sealing.maintenance import Publisher
    from millstream.sealing.sealer import Sealer
    from millstream.table.writer import commit_staged, stage_rows

    common.log(f"tree {Path(millstream.__file__).parent.parent}, load {common.load_text()}")
    cat = Catalog.open(home=Path(tempfile.mkdtemp(prefix="ms-publisher-growth-")))
    names = [f"t{i:03d}" for i in range(args.tables)]
    upper = dict.fromkeys(names, 0)
    specs = {}
    for n in names:
        specs[n] = cat.create_table(
            {
                "name": n,
                "schema": {"k": "long", "v": "double", "s": "string"},
                "mode": "upsert",
                "primary_key": ["k"],
            }
        ).spec
        cat.create_table(dead_letter_spec(specs[n]))
    rng = np.random.default_rng(0)

    def commit(n: str, rows: int = 20) -> None:
        lo = upper[n]
        batch = pa.table(
            {
                "k": pa.array(rng.integers(0, 1000, rows), pa.int64()),
                "v": pa.array(rng.random(rows)),
                "s": pa.array(["x" * 20] * rows),
                "_ms_partition": pa.array(np.zeros(rows, np.int32)),
                "_ms_offset": pa.array(np.arange(lo, lo + rows, dtype=np.int64)),
                "_ms_tombstone": pa.array(np.zeros(rows, bool)),
            }
        )
        staged = stage_rows(cat.deep, specs[n], batch)
        commit_staged(cat.store, cat.deep, n, staged, {0: (lo, lo + rows)}, {})
        upper[n] = lo + rows

    clock = ManualClock(time.time())
    publisher = Publisher(cat, interval=15.0, clock=clock)
    handed = {n: [n, dead_letter_spec(n).name] for n in names}
    tracemalloc.start()
    for b in range(args.batches):
        for n in names:
            commit(n)
        if args.seal_at and b + 1 == args.seal_at:
            c0 = time.process_time()
            for n in names:
                Sealer(cat, n, index_cache=IndexCache()).seal_partition(0, force=True)
            common.log(f"sealed every table: {time.process_time() - c0:.2f} CPU-s")
        if (b + 1) % args.every == 0:
            clock.advance(20)
            profiler = cProfile.Profile() if b + 1 in profiled else None
            c0 = time.process_time()
            if profiler is not None:
                profiler.enable()
            publisher.run_due(handed)
            if profiler is not None:
                profiler.disable()
            cpu = time.process_time() - c0
            entries = len(cat.manifest(names[0]).entries)
            traced, _ = tracemalloc.get_traced_memory()
            cache = publisher.cache.columns
            common.log(
                f"batch {b + 1}: {entries} entries a table, a publish round {cpu:.2f} CPU-s "
                f"({cpu / args.tables * 1000:.0f} ms a table), RSS {rss_mb():.0f} MB, Python heap "
                f"{traced / 2**20:.1f} MB, cache {len(cache)} entries ({cache.bytes / 2**20:.1f} "
                "MB of Arrow buffers)"
            )
            if args.child:
                print(json.dumps({"batch": b + 1, "entries": entries, "cpu": cpu}), flush=True)
            if profiler is not None:
                if args.profile_dir:
                    profiler.dump_stats(Path(args.profile_dir) / f"round-{b + 1}.prof")
                for order in ("tottime", "cumulative"):
                    out = io.StringIO()
                    pstats.Stats(profiler, stream=out).sort_stats(order).print_stats(30)
                    common.log(f"-- round after batch {b + 1}, by {order}:\n{out.getvalue()}")
    cat.close()


def compare(args: argparse.Namespace) -> None:
    """Each ``--src`` tree in a fresh process, alternating; each round's CPU-s side by side."""
    trees = dict(s.split("=", 1) for s in args.src)
    common.log(f"trees {trees}, load {common.load_text()}")
    child = [
        sys.executable,
        __file__,
        "--child",
        *("--tables", str(args.tables), "--batches", str(args.batches)),
        *("--every", str(args.every), "--seal-at", str(args.seal_at)),
    ]
    rounds: dict[str, dict[int, list[float]]] = {n: {} for n in trees}
    entries: dict[int, int] = {}
    for r in range(args.repeat):
        for name in list(trees) if r % 2 == 0 else list(reversed(trees)):
            env = {**os.environ, "PYTHONPATH": str(Path(trees[name]).resolve())}
            out = subprocess.run(child, env=env, check=True, capture_output=True, text=True)
            for line in out.stdout.splitlines():
                if line.startswith("{"):
                    row = json.loads(line)
                    rounds[name].setdefault(row["batch"], []).append(row["cpu"])
                    entries[row["batch"]] = row["entries"]
            common.log(f"repeat {r + 1}: {name} done, load {common.load_text()}")
    first = next(iter(trees))
    common.log(
        f"CPU-s a publish round over {args.tables} tables (median of {args.repeat} per tree):"
    )
    common.log("| after batch | entries a table | " + " | ".join(trees) + " |")
    for b in sorted(entries):
        cells = []
        for name in trees:
            med = statistics.median(rounds[name][b])
            base = statistics.median(rounds[first][b])
            cells.append(f"{med:.2f}" + ("" if name == first else f" ({med / base:.2f}x)"))
        common.log(f"| {b} | {entries[b]} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
