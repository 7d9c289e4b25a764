"""What a long-lived Iceberg publisher costs as its tables' unsealed runs grow, and whether
its memory follows the tables' live files: CPU a round, RSS, the Python heap and its cache.

Run from the repository root (not part of CI; 5-20 minutes, by the load)::

    .venv/bin/python bench/publisher_growth.py                   # 20 tables, 60 batches
    PYTHONPATH=/tmp/old/src .venv/bin/python bench/publisher_growth.py   # a tree before
    # options: --tables N --batches B --every E --seal-at S

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
"""

from __future__ import annotations

import argparse
import os
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
    ap.add_argument("--seal-at", type=int, default=40, help="the batch after which all seal")
    args = ap.parse_args()

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
        if b + 1 == args.seal_at:
            c0 = time.process_time()
            for n in names:
                Sealer(cat, n, index_cache=IndexCache()).seal_partition(0, force=True)
            common.log(f"sealed every table: {time.process_time() - c0:.2f} CPU-s")
        if (b + 1) % args.every == 0:
            clock.advance(20)
            c0 = time.process_time()
            publisher.run_due(handed)
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
    cat.close()


if __name__ == "__main__":
    main()
