"""What a worker's sealing pass costs over N busy tables whose runs are not due yet: with the
skip of an unchanged table's manifest read, and with every pass reading it (as before); and,
with ``--src``, trees against each other over tables that take a commit before every pass.

Run from the repository root (not part of CI; about a minute)::

    .venv/bin/python bench/seal_pass.py                 # 50 tables of 2 partitions
    # options: --tables N --entries E --passes P --rounds R
    .venv/bin/python bench/seal_pass.py --src before=/tmp/sp_before/src --src after=src \
        --tables 100 --partitions 1 --entries 12,170 --passes 10 --repeat 3

``--src NAME=DIR`` (repeated): the tables are built once by this tree, up to each ``--entries``
level in turn (a comma list); at each level every tree's ``src`` runs in a fresh process of its
own on a copy of the metadata store (alternating, ``--repeat`` times, the first tree first in
even repeats), as a busy worker's sealing thread does: one :class:`Sealer` a table, a first
pass, then ``--passes`` times a commit of one entry to every table's every partition (not
timed: a busy table's manifest version moves every batch, so a pass cannot skip on an
unchanged version) and a timed pass over every table (with one read of every table's changes
first, ``MetadataStore.sealing_reads``, where the tree has it, as its worker does). Printed per level: each tree's CPU ms a
pass (median) and manifest reads a pass, and the ratio to the first tree's.

``--seal-cost 12,100,300``: instead, the CPU of one seal (``seal_partition``) of a run of that
many entries of 10 rows each, one upsert table of one partition per seal (median of 3): what a
seal costs as its run grows.

A SQLite metadata store with a local deep store; N upsert tables, each with E committed
batches per partition (a busy table's unsealed run, below every threshold). One
:class:`~millstream.sealing.sealer.Sealer` a table, as a worker has; a pass is ``seal_due``
over every table, as the worker's sealing loop runs it. Per pass: CPU seconds
(``time.process_time``) and manifest reads, with the skip and with the skip defeated (the
sealer's last read forgotten before each pass: every pass reads, as before the skip), the two
alternating in each round so both see the same load.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import common
import pyarrow as pa

from millstream.catalog import Catalog
from millstream.sealing.sealer import Sealer
from millstream.sealing.thresholds import Thresholds
from millstream.spec import TableSpec
from millstream.table.writer import commit_staged, stage_rows


def _spec(i: int) -> TableSpec:
    return TableSpec.parse(
        {
            "name": f"t{i}",
            "schema": {"k": "long", "v": "long"},
            "mode": "upsert",
            "primary_key": ["k"],
        }
    )


def _commit(cat: Catalog, spec: TableSpec, p: int, b: int) -> None:
    """Commit batch ``b`` of partition ``p`` (5 rows at offsets ``5b .. 5b+4``)."""
    rows = pa.Table.from_pylist(
        [
            {"k": k, "v": b, "_ms_partition": p, "_ms_offset": b * 5 + k, "_ms_tombstone": False}
            for k in range(5)
        ],
        schema=spec.arrow_schema(system_columns=True),
    )
    staged = stage_rows(cat.deep, spec, rows)
    commit_staged(cat.store, cat.deep, spec.name, staged, {p: (b * 5, b * 5 + 5)}, {p: 0})


def _child(args: argparse.Namespace) -> None:
    """One tree's busy passes over a copy of the store (``--child DB``); prints JSON."""
    home = Path(tempfile.mkdtemp(prefix="seal-pass-child-"))
    cat = Catalog.open(home=home, metadata_url=f"sqlite:///{args.child}", deep_store=args.deep)
    specs = [_spec(i) for i in range(args.tables)]
    sealers = [Sealer(cat, s.name, thresholds=Thresholds(flush_seconds=3600)) for s in specs]
    reads = [0]
    real = cat.manifest

    def counted(table: str, **kw: Any) -> Any:
        reads[0] += 1
        return real(table, **kw)

    setattr(cat, "manifest", counted)  # noqa: B010 (count the reads every Sealer makes)
    for s in sealers:
        s.seal_due()  # the first pass reads every table (and compaction finds nothing to do)
    cpu: list[float] = []
    n: list[int] = []
    for i in range(args.passes):
        for spec in specs:
            for p in range(args.partitions):
                _commit(cat, spec, p, args.at + i)
        before, t0 = reads[0], time.process_time()
        _worker_pass(cat, sealers)
        cpu.append(time.process_time() - t0)
        n.append(reads[0] - before)
    print(json.dumps({"cpu": cpu, "reads": n}), flush=True)
    cat.close()
    shutil.rmtree(home, ignore_errors=True)


def _worker_pass(cat: Catalog, sealers: list[Sealer]) -> None:
    """A pass over every table as the worker's sealing thread makes it: with one read of all
    the tables' force commits and changes (``MetadataStore.sealing_reads``) where the tree
    has it, else each table's pass reading its own."""
    batched = getattr(cat.store, "sealing_reads", None)
    if batched is None:
        for s in sealers:
            s.seal_due()
        return
    got = batched({s.table: s.remembered_version for s in sealers})
    for s in sealers:
        s.seal_due(got.get(s.table))


def _compare(args: argparse.Namespace) -> None:
    """Build the tables up to each ``--entries`` level; run every tree's child on a copy."""
    trees = dict(s.split("=", 1) for s in args.src)
    levels = [int(x) for x in args.entries.split(",")]
    home = Path(tempfile.mkdtemp(prefix="seal-pass-"))
    cat = Catalog.open(home=home)
    specs = [_spec(i) for i in range(args.tables)]
    for spec in specs:
        cat.create_table(spec)
    built = 0
    print(f"trees {trees}; load {os.getloadavg()[0]:.1f}", flush=True)
    for level in levels:
        t0 = time.monotonic()
        for b in range(built, level):
            for spec in specs:
                for p in range(args.partitions):
                    _commit(cat, spec, p, b)
        built = level
        db = home / f"at-{level}.db"
        with sqlite3.connect(home / "metadata.db") as src, sqlite3.connect(db) as dst:
            src.backup(dst)
        print(
            f"{args.tables} tables x {args.partitions} partitions at {level} unsealed entries "
            f"each (built in {time.monotonic() - t0:.0f} s)",
            flush=True,
        )
        got: dict[str, list[tuple[float, int]]] = {name: [] for name in trees}
        loads: list[float] = []
        for r in range(args.repeat):
            for name in list(trees) if r % 2 == 0 else list(reversed(trees)):
                row = common.run_tree_on_copy(
                    __file__,
                    trees[name],
                    db,
                    home / f"copy-{name}-{level}-{r}.db",
                    [
                        *("--deep", str(home / "deepstore")),
                        *("--tables", str(args.tables), "--partitions", str(args.partitions)),
                        *("--passes", str(args.passes), "--at", str(level)),
                    ],
                )
                got[name] += list(zip(row["cpu"], row["reads"], strict=True))
                loads.append(os.getloadavg()[0])
        first = statistics.median(c for c, _ in got[next(iter(trees))])
        for name, rows in got.items():
            cpu = statistics.median(c for c, _ in rows)
            reads = statistics.median(n for _, n in rows)
            print(
                f"  {name}: {cpu * 1000:.0f} ms CPU a pass over {args.tables} tables, "
                f"{reads:.0f} manifest reads a pass ({cpu / first:.2f}x the first tree)",
                flush=True,
            )
        print(f"  load during the level: {min(loads):.1f}-{max(loads):.1f}", flush=True)
    cat.close()
    shutil.rmtree(home, ignore_errors=True)


def _seal_cost(levels: list[int]) -> None:
    home = Path(tempfile.mkdtemp(prefix="seal-cost-"))
    cat = Catalog.open(home=home)
    for n in levels:
        got = []
        for r in range(3):
            spec = TableSpec.parse(
                {
                    "name": f"t{n}_{r}",
                    "schema": {"k": "long", "v": "long"},
                    "mode": "upsert",
                    "primary_key": ["k"],
                }
            )
            cat.create_table(spec)
            for b in range(n):
                rows = pa.Table.from_pylist(
                    [
                        {
                            "k": (b * 10 + k) % 500,
                            "v": b,
                            "_ms_partition": 0,
                            "_ms_offset": b * 10 + k,
                            "_ms_tombstone": False,
                        }
                        for k in range(10)
                    ],
                    schema=spec.arrow_schema(system_columns=True),
                )
                staged = stage_rows(cat.deep, spec, rows)
                commit_staged(
                    cat.store, cat.deep, spec.name, staged, {0: (b * 10, b * 10 + 10)}, {0: 0}
                )
            sealer = Sealer(cat, spec.name)
            t0 = time.process_time()
            assert sealer.seal_partition(0, force=True) is not None
            got.append(time.process_time() - t0)
        print(
            f"a run of {n} entries: {statistics.median(got) * 1000:.0f} ms CPU a seal", flush=True
        )
    print(f"load average {os.getloadavg()[0]:.1f}")
    cat.close()
    shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tables", type=int, default=50)
    ap.add_argument("--entries", default="20", help="entries a partition (--src: a comma list)")
    ap.add_argument("--passes", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=2, help="with --src (else 2)")
    ap.add_argument("--src", action="append", default=[], metavar="NAME=DIR")
    ap.add_argument("--repeat", type=int, default=3, help="alternations with --src")
    ap.add_argument("--seal-cost", default="", help="entries a run, a comma list (see above)")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    ap.add_argument("--deep", default="", help=argparse.SUPPRESS)
    ap.add_argument("--at", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.seal_cost:
        _seal_cost([int(x) for x in args.seal_cost.split(",")])
        return
    if args.child:
        _child(args)
        return
    if args.src:
        _compare(args)
        return
    entries = int(args.entries)
    home = Path(tempfile.mkdtemp(prefix="seal-pass-"))
    cat = Catalog.open(home=home)
    reads = [0]
    real = cat.manifest

    def counted(table: str, **kw: Any) -> Any:
        reads[0] += 1
        return real(table, **kw)

    sealers = []
    for i in range(args.tables):
        spec = _spec(i)
        cat.create_table(spec)
        for p in range(2):
            for b in range(entries):
                _commit(cat, spec, p, b)
        sealers.append(Sealer(cat, spec.name, thresholds=Thresholds(flush_seconds=3600)))
    setattr(cat, "manifest", counted)  # noqa: B010 (count the reads every Sealer makes)
    for s in sealers:
        s.seal_due()  # the first pass reads every table (and compaction finds nothing to do)

    def one_pass(skip: bool) -> tuple[float, int]:
        before, cpu = reads[0], time.process_time()
        for s in sealers:
            if not skip:
                s._last_read = None  # as before the skip: every pass reads the manifest
            s.seal_due()
        return time.process_time() - cpu, reads[0] - before

    got: dict[bool, list[tuple[float, int]]] = {True: [], False: []}
    for _ in range(args.rounds):
        for skip in (False, True):
            got[skip] += [one_pass(skip) for _ in range(args.passes)]
    load = os.getloadavg()
    for skip in (False, True):
        cpu = statistics.median(c for c, _ in got[skip])
        n = statistics.median(r for _, r in got[skip])
        print(
            f"{'skip' if skip else 'read every pass'}: {cpu * 1000:.0f} ms CPU a pass over "
            f"{args.tables} tables, {n:.0f} manifest reads a pass"
        )
    ratio = statistics.median(c for c, _ in got[False]) / statistics.median(c for c, _ in got[True])
    print(f"ratio {ratio:.1f}x; load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")


if __name__ == "__main__":
    main()
