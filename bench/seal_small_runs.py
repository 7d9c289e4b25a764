"""What a seal of a run of many tiny micro-batch files costs: a busy table of a many-table
datastream (100 topics at 10 rows/s) seals ~100-150 files of a few rows each, one a batch.

Run from the repository root (not part of CI; about a minute)::

    .venv/bin/python bench/seal_small_runs.py --src before=/tmp/sealdecode-before/src --src after=src
    # options: --tables T --files F --rows R --keys K --runs N --profile

The tables are built once by the tree on ``PYTHONPATH`` through the production commit path
(``stage_rows`` + ``commit_staged``, one file a batch, SQLite metadata store, local deep
store): ``--tables`` upsert tables of the orders schema (comparison ``updated_at``, delete
column ``is_deleted``), each with a first run sealed (so each timed seal has a key index and a
sealed segment below it, as a table in its steady state has) and then ``--files`` committed
batches of ``--rows`` rows each (keys drawn from ``--keys``) in its one partition.

Each ``--src NAME=DIR`` tree then runs in a fresh process of its own on a copy of the metadata
store, ``--runs`` times, the trees alternating (the first tree first in even runs). In each
process, per table (key index warmed first, as a running sealer has it): the CPU
(``time.process_time``) and wall of ``read_entries`` of the pending run (the seal's decode),
then of ``seal_partition`` (the production seal: decode, merge, write, swap). Printed: each
tree's medians over every table of every run, the ratio to the first tree's, and a digest of
every sealed file's rows (the trees' seals must write the same rows, in the same order).

``--profile``: one process of this tree, cProfile of the seals, top functions by own time.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import os
import pstats
import random
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import common
import pyarrow as pa

from millstream.catalog import Catalog
from millstream.ingest.sources.generator import ORDERS_SCHEMA
from millstream.sealing.sealer import Sealer
from millstream.sealing.thresholds import Thresholds
from millstream.spec import TableSpec
from millstream.table.read import read_entries
from millstream.table.writer import commit_staged, stage_rows

SCHEMA = ORDERS_SCHEMA  # the generator's orders


def _spec(i: int) -> TableSpec:
    return TableSpec.parse(
        {
            "name": f"t{i:03d}",
            "schema": SCHEMA,
            "mode": "upsert",
            "primary_key": ["order_id"],
            "comparison_column": "updated_at",
            "delete_column": "is_deleted",
        }
    )


def _commit(
    cat: Catalog, spec: TableSpec, rng: random.Random, b: int, rows: int, keys: int
) -> None:
    """Commit batch ``b`` of the table's one partition: ``rows`` rows at offsets
    ``b*rows ..``, as one micro-batch file."""
    start = datetime(2026, 1, 1, tzinfo=UTC)
    data = pa.Table.from_pylist(
        [
            {
                "order_id": rng.randrange(keys),
                "customer": f"c{rng.randrange(1000)}",
                "amount": round(rng.random() * 100, 2),
                "status": rng.choice(["new", "paid", "shipped"]),
                "updated_at": start + timedelta(milliseconds=b * rows + k),
                "is_deleted": rng.random() < 0.02,
                "_ms_partition": 0,
                "_ms_offset": b * rows + k,
                "_ms_tombstone": False,
            }
            for k in range(rows)
        ],
        schema=spec.arrow_schema(system_columns=True),
    )
    staged = stage_rows(cat.deep, spec, data)
    commit_staged(cat.store, cat.deep, spec.name, staged, {0: (b * rows, b * rows + rows)}, {0: 0})


def _build(args: argparse.Namespace, home: Path) -> Catalog:
    cat = Catalog.open(home=home)
    rng = random.Random(7)
    for i in range(args.tables):
        spec = _spec(i)
        cat.create_table(spec)
        for b in range(args.files):  # a first run, sealed: the timed seal has an index
            _commit(cat, spec, rng, b, args.rows, args.keys)
        assert Sealer(cat, spec.name).seal_partition(0, force=True) is not None
        for b in range(args.files, 2 * args.files):
            _commit(cat, spec, rng, b, args.rows, args.keys)
    return cat


def _seals(cat: Catalog, tables: int, profile: cProfile.Profile | None = None) -> dict[str, list]:
    """Per table: the decode of its run, then its seal, timed; the sealed rows' digest."""
    got: dict[str, list] = {"read_cpu": [], "read_wall": [], "cpu": [], "wall": [], "digest": []}
    sealers = [Sealer(cat, _spec(i).name, thresholds=Thresholds()) for i in range(tables)]
    for s in sealers:
        manifest = cat.manifest(s.table)
        s.key_index(0, manifest)  # a running sealer has its index in memory
        run = s.pending_run(0, manifest)
        c0, w0 = time.process_time(), time.perf_counter()
        read_entries(cat.deep, manifest.table.spec, run)
        got["read_cpu"].append(time.process_time() - c0)
        got["read_wall"].append(time.perf_counter() - w0)
    for s in sealers:
        if profile is not None:
            profile.enable()
        c0, w0 = time.process_time(), time.perf_counter()
        result = s.seal_partition(0, force=True)
        got["cpu"].append(time.process_time() - c0)
        got["wall"].append(time.perf_counter() - w0)
        if profile is not None:
            profile.disable()
        assert result is not None
        path = result.sealed.file_path
        assert path is not None
        rows = cat.deep.read_parquet(path)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, rows.schema) as w:
            w.write_table(rows.combine_chunks())
        got["digest"].append(hashlib.sha256(sink.getvalue().to_pybytes()).hexdigest()[:16])
    return got


def _child(args: argparse.Namespace) -> None:
    home = Path(tempfile.mkdtemp(prefix="seal-small-child-"))
    cat = Catalog.open(home=home, metadata_url=f"sqlite:///{args.child}", deep_store=args.deep)
    print(json.dumps(_seals(cat, args.tables)), flush=True)
    cat.close()
    shutil.rmtree(home, ignore_errors=True)


def _compare(args: argparse.Namespace) -> None:
    trees = dict(s.split("=", 1) for s in args.src)
    home = Path(tempfile.mkdtemp(prefix="seal-small-"))
    t0 = time.monotonic()
    cat = _build(args, home)
    cat.close()
    print(
        f"trees {trees}; {args.tables} tables, a run of {args.files} files of {args.rows} rows "
        f"each (built in {time.monotonic() - t0:.0f} s); load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    got: dict[str, dict[str, list]] = {name: {} for name in trees}
    loads: list[float] = []
    for r in range(args.runs):
        for name in list(trees) if r % 2 == 0 else list(reversed(trees)):
            row = common.run_tree_on_copy(
                __file__,
                trees[name],
                home / "metadata.db",
                home / f"copy-{name}-{r}.db",
                ["--deep", str(home / "deepstore"), "--tables", str(args.tables)],
            )
            for k, v in row.items():
                got[name].setdefault(k, []).extend(v)
            loads.append(os.getloadavg()[0])
    first = next(iter(trees))
    for name, row in got.items():
        parts = []
        for k, label in (
            ("read_cpu", "decode CPU"),
            ("read_wall", "decode wall"),
            ("cpu", "seal CPU"),
            ("wall", "seal wall"),
        ):
            ms = statistics.median(row[k]) * 1000
            base = statistics.median(got[first][k]) * 1000
            parts.append(f"{label} {ms:.1f} ms ({ms / base:.2f}x)")
        print(f"  {name}: " + ", ".join(parts), flush=True)
    digests = {name: row["digest"] for name, row in got.items()}
    same = len({tuple(d) for d in digests.values()}) == 1
    print(f"  sealed rows the same in every tree: {same}", flush=True)
    print(
        f"  medians of {len(got[first]['cpu'])} seals a tree; load {min(loads):.1f}-"
        f"{max(loads):.1f}",
        flush=True,
    )
    shutil.rmtree(home, ignore_errors=True)
    if not same:
        sys.exit(f"the trees' seals differ: {digests}")


def _profile(args: argparse.Namespace) -> None:
    home = Path(tempfile.mkdtemp(prefix="seal-small-"))
    cat = _build(args, home)
    prof = cProfile.Profile()
    got = _seals(cat, args.tables, prof)
    print(
        f"seal CPU median {statistics.median(got['cpu']) * 1000:.1f} ms; decode "
        f"{statistics.median(got['read_cpu']) * 1000:.1f} ms",
        flush=True,
    )
    stats = pstats.Stats(prof)
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(40)
    cat.close()
    shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tables", type=int, default=5)
    ap.add_argument("--files", type=int, default=150, help="files (batches) in a run")
    ap.add_argument("--rows", type=int, default=10, help="rows a file")
    ap.add_argument("--keys", type=int, default=10_000, help="key cardinality")
    ap.add_argument("--runs", type=int, default=4, help="processes a tree")
    ap.add_argument("--src", action="append", default=[], metavar="NAME=DIR")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    ap.add_argument("--deep", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args)
    elif args.profile:
        _profile(args)
    elif args.src:
        _compare(args)
    else:
        ap.error("--src NAME=DIR (twice or more) or --profile")


if __name__ == "__main__":
    main()
