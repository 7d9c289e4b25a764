"""What the fsync of a local deep store's files costs a batch and a seal: A/B in one run.

Run from the repository root::

    .venv/bin/python bench/durable_writes.py            # ~1 minute
    .venv/bin/python bench/durable_writes.py --quick    # smoke test

A local deep store fsyncs each file it writes (and its directories up to the root) before
the write returns, so the manifest commit that references it never names a file whose data is
only in the page cache (``millstream.storage.deepstore``). This measures the production
calls with that on (``durable``) and off (``DeepStore.durable_writes = False``, what a write
did before) on the same catalog, in alternating rounds (the order flips each round, so drift
of the machine's load falls on both):

* ``stage + commit``: a write task's staging of a batch of 4 partitions x 1000 rows
  (``stage_rows``: one zstd Parquet file) and its commit (``commit_staged``), as
  ``bench/commit.py``'s part A does with one writer;
* ``large stage``: a file of 200,000 rows (~4 MB, a seal's segment or a large batch's part).

It prints each side's median milliseconds and the ratio durable/before.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import common
import numpy as np
import pyarrow as pa

from millstream.catalog import Catalog
from millstream.spec import OFFSET_COL, PARTITION_COL, TOMBSTONE_COL, TableSpec
from millstream.table.writer import commit_staged, stage_rows

PARTITIONS = 4
ROWS_PER_PARTITION = 1000
LARGE_ROWS = 200_000


def _rows(spec: TableSpec, partitions: int, per_partition: int, start: int) -> pa.Table:
    n = partitions * per_partition
    part = np.repeat(np.arange(partitions, dtype=np.int32), per_partition)
    offs = np.tile(np.arange(start, start + per_partition, dtype=np.int64), partitions)
    rng = np.random.default_rng(start)
    return pa.Table.from_pydict(
        {
            "id": pa.array(rng.integers(0, 10_000_000, n), pa.int64()),
            "amount": pa.array(rng.random(n)),
            "label": pa.array([f"label-{i % 97}" for i in range(n)]),
            PARTITION_COL: pa.array(part, pa.int32()),
            OFFSET_COL: pa.array(offs),
            TOMBSTONE_COL: pa.array(np.zeros(n, dtype=bool)),
        },
        schema=spec.arrow_schema(system_columns=True),
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=None, help="A/B rounds (default 8, quick 2)")
    ap.add_argument("--workdir", type=Path, help="scratch directory (default: a temp dir)")
    args = ap.parse_args()
    rounds = args.rounds or (2 if args.quick else 8)
    batches = 10 if args.quick else 40  # stage + commit per side and round
    larges = 2 if args.quick else 5

    with common.workdir("durable-writes-", parent=args.workdir) as work:
        common.log(f"{common.command_line('durable_writes.py')}; load {common.load_text()}")
        cat = Catalog.open(home=work / "home")
        spec = cat.create_table(
            TableSpec.parse(
                {
                    "name": "t",
                    "schema": {"id": "long", "amount": "double", "label": "string"},
                    "primary_key": ["id"],
                    "mode": "upsert",
                }
            )
        ).spec
        offset = [0]

        def batch() -> None:
            rows = _rows(spec, PARTITIONS, ROWS_PER_PARTITION, offset[0])
            staged = stage_rows(cat.deep, spec, rows)
            lo = offset[0]
            offset[0] += ROWS_PER_PARTITION
            commit_staged(
                cat.store,
                cat.deep,
                "t",
                staged,
                {p: (lo, offset[0]) for p in range(PARTITIONS)},
                {},
            )

        large_rows = _rows(spec, 1, LARGE_ROWS, 0)

        def large() -> None:
            staged = stage_rows(cat.deep, spec, large_rows, name_hint="large")
            assert staged.path is not None
            cat.deep.delete(staged.path)

        cases: dict[str, tuple[Callable[[], None], int]] = {
            "stage + commit": (batch, batches),
            "large stage": (large, larges),
        }
        times: dict[tuple[str, bool], list[float]] = {
            (c, d): [] for c in cases for d in (True, False)
        }
        for r in range(rounds):
            for durable in (True, False) if r % 2 == 0 else (False, True):
                cat.deep.durable_writes = durable
                for name, (fn, n) in cases.items():
                    for _ in range(n):
                        t0 = time.perf_counter()
                        fn()
                        times[(name, durable)].append((time.perf_counter() - t0) * 1000)
        cat.deep.durable_writes = True
        common.log(f"load after: {common.load_text()}")
        print(f"{'case':<16} {'before ms':>10} {'durable ms':>11} {'ratio':>7}  (medians)")
        for name in cases:
            before = statistics.median(times[(name, False)])
            durable = statistics.median(times[(name, True)])
            print(
                f"{name:<16} {before:>10.2f} {durable:>11.2f} "
                f"{common.ratio(durable, before):>6.2f}x"
            )
        cat.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
