"""What one seal of a large run holds: A/B.

Run from the repository root::

    .venv/bin/python bench/seal_memory.py --rows 1000000 --repeat 2 --src before=DIR --src after=src

A table of 10,000,000 keys over 4 partitions seals runs of 2,500,000 rows. This builds one
upsert table (the peers' row shape: three strings, a comparison column) whose partition 0
holds ``--rows`` rows in 8 micro-batch files of random keys, then seals it
(``Sealer.seal_partition``, the production seal) in a fresh process per tree (``--src
NAME=DIR``: that tree's ``src`` on ``PYTHONPATH``; alternated ``--repeat`` times). It prints
each seal's peak Arrow allocation (the default pool's ``max_memory()``), the peak RSS above the
process's before the seal (sampled every 5 ms) and its seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import common


def _build(home: str, rows: int) -> None:
    import numpy as np
    import pyarrow as pa

    from millstream.catalog import Catalog
    from millstream.spec import OFFSET_COL, PARTITION_COL, TOMBSTONE_COL, TableSpec
    from millstream.table.writer import commit_staged, stage_rows

    cat = Catalog.open(home=Path(home))
    schema = {"id": "long", "amount": "double", "customer": "string", "status": "string"}
    spec = cat.create_table(
        TableSpec.parse(
            {
                "name": "t",
                "schema": {**schema, "note": "string", "seq": "long"},
                "primary_key": ["id"],
                "mode": "upsert",
                "comparison_column": "seq",
            }
        )
    ).spec
    per, end = rows // 8, 0
    rng = np.random.default_rng(1)
    for _ in range(8):
        ids = rng.integers(0, rows, per)
        batch = pa.Table.from_pydict(
            {
                "id": pa.array(ids, pa.int64()),
                "amount": pa.array(ids * 0.25),
                "customer": pa.array([f"customer-{i % 50_000:06d}" for i in ids]),
                "status": pa.array(["shipped" if i % 3 else "pending" for i in ids]),
                "note": pa.array([f"a note of some forty characters, number {i}" for i in ids]),
                "seq": pa.array(np.arange(end, end + per), pa.int64()),
                PARTITION_COL: pa.array(np.zeros(per, np.int32)),
                OFFSET_COL: pa.array(np.arange(end, end + per, dtype=np.int64)),
                TOMBSTONE_COL: pa.array(np.zeros(per, bool)),
            },
            schema=spec.arrow_schema(system_columns=True),
        )
        staged = stage_rows(cat.deep, spec, batch)
        commit_staged(cat.store, cat.deep, "t", staged, {0: (end, end + per)}, {})
        end += per
    cat.close()


def _seal(home: str) -> dict[str, float]:
    import pyarrow as pa

    from millstream.catalog import Catalog
    from millstream.sealing.sealer import Sealer

    cat = Catalog.open(home=Path(home))

    def rss() -> int:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    base = rss()
    peak = {"rss": base}
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak["rss"] = max(peak["rss"], rss())
            time.sleep(0.005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    started = time.perf_counter()
    result = Sealer(cat, "t").seal_partition(0, force=True)
    seconds = time.perf_counter() - started
    done.set()
    watcher.join()
    assert result is not None
    cat.close()
    return {
        "rows_in": result.rows_in,
        "arrow_peak_mib": pa.default_memory_pool().max_memory() / 2**20,
        "rss_above_mib": (peak["rss"] - base) / 2**20,
        "seconds": seconds,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--src", action="append", default=[], metavar="NAME=DIR")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--child", choices=["build", "seal"], help=argparse.SUPPRESS)
    ap.add_argument("--home", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child == "build":
        _build(args.home, args.rows)
        return 0
    if args.child == "seal":
        print(json.dumps(_seal(args.home)))
        return 0
    trees = [tuple(s.split("=", 1)) for s in args.src] or [("this", "src")]
    common.log(f"{common.command_line('seal_memory.py')}; load {common.load_text()}")
    first: dict[str, float] = {}
    for _ in range(args.repeat):
        for name, src in trees:
            env = dict(os.environ, PYTHONPATH=str(Path(src).resolve()))
            with tempfile.TemporaryDirectory(prefix="seal-memory-") as home:
                for child in ("build", "seal"):
                    out = subprocess.run(
                        [
                            sys.executable,
                            __file__,
                            "--child",
                            child,
                            "--home",
                            home,
                            "--rows",
                            str(args.rows),
                        ],
                        env=env,
                        check=True,
                        capture_output=True,
                        text=True,
                    ).stdout
            r = json.loads(out.strip().splitlines()[-1])
            first = first or r
            common.log(
                f"{name}: {r['rows_in']:,} rows sealed; Arrow peak {r['arrow_peak_mib']:.0f} MiB "
                f"({r['arrow_peak_mib'] / first['arrow_peak_mib']:.2f}x the first tree's), "
                f"RSS +{r['rss_above_mib']:.0f} MiB, {r['seconds']:.1f} s"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
