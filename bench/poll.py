"""Poll benchmark: what a reader that reads a current table again and again pays per read.

A dashboard or a service holds a ``Catalog`` open with a read cache and reads the current
table every second while micro-batches land (``bench/soak.py`` measures the same reader
beside a real ingest; this one isolates it, in one process, without Spark). The table is an
upsert table partitioned by key over 4 partitions: 400,000 rows over 200,000 random keys,
sealed, then ``--batches`` micro-batches of ``--batch-rows`` random keys, committed one by one
through the production writer (``stage_rows`` + ``commit_staged``), with a read after each.
The baseline, in the same run: ``pyarrow.parquet.read_table`` of one zstd file of the table's
current rows (written every tenth read). Run from the repository root::

    .venv/bin/python bench/poll.py                # 60 batches of 2,500 rows
    .venv/bin/python bench/poll.py --batches 20   # quicker
    .venv/bin/python bench/poll.py --batch-rows 5000 --seal-every 4   # as bench/soak.py's poll

``--seal-every N`` seals one partition (in turn) after every N-th batch and compacts it, as
the soak's background sealer does (there each partition seals about every 16 polls), so the
polls that follow a seal re-read that partition's sealed rows.

It prints the median and p90 of the poll's read and of the plain read, and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import common
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from rich.console import Console

from millstream.catalog import Catalog
from millstream.sealing.compaction import CompactionPolicy
from millstream.sealing.sealer import Sealer
from millstream.spec import TableSpec
from millstream.table.writer import commit_staged, stage_rows

KEYS = 200_000
PARTITIONS = 4
SPEC = {
    "name": "t",
    "schema": {"id": "long", "amount": "double", "label": "string", "ts": "timestamp"},
    "primary_key": ["id"],
    "mode": "upsert",
    "partitioned_by_key": True,
}


def batch(
    rng: np.random.Generator, spec: TableSpec, offsets: dict[int, int], n: int
) -> tuple[pa.Table, dict[int, tuple[int, int]]]:
    """``n`` rows of random keys, each on the partition its key hashes to (id mod 4), with
    each partition's next offsets; and the ranges they cover."""
    ids = rng.integers(0, KEYS, n)
    parts = (ids % PARTITIONS).astype(np.int32)
    offs = np.zeros(n, np.int64)
    ranges = {}
    for p in range(PARTITIONS):
        mine = parts == p
        k = int(mine.sum())
        offs[mine] = np.arange(offsets[p], offsets[p] + k)
        ranges[p] = (offsets[p], offsets[p] + k)
        offsets[p] += k
    micros = 1_700_000_000_000_000 + np.arange(n)
    table = pa.table(
        {
            "id": ids,
            "amount": rng.random(n),
            "label": [f"label-{i % 1000}" for i in ids],
            "ts": pa.array(micros, pa.timestamp("us", tz="UTC")),
            "_ms_partition": parts,
            "_ms_offset": offs,
            "_ms_tombstone": np.zeros(n, bool),
        }
    )
    return table.cast(spec.arrow_schema(system_columns=True)), ranges


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=60, help="micro-batches, one read each")
    parser.add_argument("--batch-rows", type=int, default=2_500)
    parser.add_argument(
        "--seal-every", type=int, default=0, help="seal a partition after every N-th batch"
    )
    parser.add_argument("--json", type=Path, default=None, help="save the figures here")
    args = parser.parse_args(argv)
    console = Console(soft_wrap=True)
    console.print(f"$ {common.command_line('poll.py')}")
    console.print(f"load {common.load_text()}; {common.cpu_model()}")
    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory(prefix="millstream-bench-poll-") as tmp:
        home = Path(tmp) / "home"
        with Catalog.open(home=home) as cat:
            spec = cat.create_table(TableSpec.parse(SPEC)).spec
            offsets = {p: 0 for p in range(PARTITIONS)}
            for _ in range(4):
                rows, ranges = batch(rng, spec, offsets, 100_000)
                commit_staged(
                    cat.store, cat.deep, "t", stage_rows(cat.deep, spec, rows), ranges, {}
                )
            sealer = Sealer(cat, "t", compaction=CompactionPolicy())
            for p in range(PARTITIONS):
                while sealer.seal_partition(p, force=True) is not None:
                    pass
            live = Path(tmp) / "live.parquet"
            reads: list[float] = []
            plain: list[float] = []
            with Catalog.open(home=home, read_cache_mb=512) as reader:
                current = reader.read_table("t")  # the first read fills the cache
                for i in range(args.batches):
                    rows, ranges = batch(rng, spec, offsets, args.batch_rows)
                    staged = stage_rows(cat.deep, spec, rows)
                    commit_staged(cat.store, cat.deep, "t", staged, ranges, {})
                    if args.seal_every and (i + 1) % args.seal_every == 0:
                        p = (i // args.seal_every) % PARTITIONS
                        sealer.seal_partition(p, force=True)
                        sealer.compact_partition(p)
                    t0 = time.perf_counter()
                    current = reader.read_table("t")
                    reads.append((time.perf_counter() - t0) * 1000)
                    if i % 10 == 0:
                        pq.write_table(current, live, compression="zstd")
                    t0 = time.perf_counter()
                    pq.read_table(live)
                    plain.append((time.perf_counter() - t0) * 1000)
            expected = cat.read_table("t")  # a new reader, no cache: the same rows
            assert current.sort_by("id").equals(expected.sort_by("id")), "the poll's rows differ"
    read_ms, plain_ms = statistics.median(reads), statistics.median(plain)
    ratio = common.ratio(read_ms, plain_ms)
    console.print(
        f"{args.batches} polls of {current.num_rows:,} live rows, {args.batch_rows:,} rows a "
        f"batch: read median {read_ms:.1f} ms (p90 {common.percentile(reads, 90):.1f}); plain "
        f"Parquet of the live rows {plain_ms:.1f} ms (p90 {common.percentile(plain, 90):.1f}); "
        f"read / plain {ratio:.2f}x"
    )
    if args.json is not None:
        common.write_json(
            args.json,
            {
                "machine": common.machine("pyarrow"),
                "args": vars(args) | {"json": str(args.json)},
                "read_ms": reads,
                "plain_ms": plain,
                "read_vs_plain": ratio,
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
