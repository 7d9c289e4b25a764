"""What a collection of an Iceberg view's garbage costs as the view keeps many snapshots:
CPU a pass, the first (cold) and the later ones (warm), A/B by tree.

Run from the repository root (not part of CI; a few minutes)::

    git worktree add /tmp/viewgc-before <commit>
    .venv/bin/python bench/view_gc.py --src before=/tmp/viewgc-before/src --src after=src
    # options: --tables N --snapshots S --passes P --between B --repeat R --bound-scale F

Builds once (with the first tree) ``--tables`` small upsert tables on the embedded metadata
store and a local deep store, each published ``--snapshots`` times (20 rows a commit, keys
drawn from 1,000, a seal every 50 publishes, every version kept: as many snapshots retained
as published, the view's metadata log at its 100 files). Then, per tree, in a fresh process
of its own on a copy of that home (at the same path) (alternating, ``--repeat`` times, the first tree first in
even repeats): ``--passes`` collection passes over every table
(:func:`~millstream.table.iceberg.collect_view_garbage`, ``dry_run``: the listing and the
references, nothing deleted), with ``--between`` publishes of every table between two passes
(not timed: a maintainer runs every 600 s, a publisher every 15 s, so 40). A tree with
:class:`~millstream.table.iceberg.ViewReferences` collects through one instance kept across
the passes (a maintainer's), as :func:`~millstream.table.maintain.maintain` does; a tree
without it reads every file at each pass. Prints each pass's CPU seconds
(``time.process_time``) per tree and their ratio to the first tree's, and, for a tree with
references, what the instance holds after the passes (entries, references, and the bytes
``tracemalloc`` sees it hold after a cold pass of a fresh one).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common

SEAL_EVERY = 50


def _commit(cat: Any, table: str, rng: random.Random, lo: int) -> int:
    import pyarrow as pa

    from millstream.spec import OFFSET_COL, PARTITION_COL, TOMBSTONE_COL
    from millstream.table.writer import commit_staged, stage_rows

    spec = cat.table(table).spec
    rows = pa.Table.from_pylist(
        [
            {
                "k": rng.randrange(1000),
                "v": f"value {lo + i}",
                PARTITION_COL: 0,
                OFFSET_COL: lo + i,
                TOMBSTONE_COL: False,
            }
            for i in range(20)
        ],
        schema=spec.arrow_schema(system_columns=True),
    )
    commit_staged(
        cat.store, cat.deep, table, stage_rows(cat.deep, spec, rows), {0: (lo, lo + 20)}, {}
    )
    return lo + 20


def _publish_rounds(cat: Any, tables: list[str], rounds: int, start: int) -> None:
    """``rounds`` commits and publishes of every table (a seal every 50)."""
    from millstream.sealing.keyindex import IndexCache
    from millstream.sealing.sealer import Sealer
    from millstream.table.iceberg import PublishCache, publish

    cache = PublishCache()
    for t in tables:
        rng = random.Random(t)
        lo = max((s.upper for s in cat.store.list_shards(t)), default=0)
        for i in range(start, start + rounds):
            lo = _commit(cat, t, rng, lo)
            if i % SEAL_EVERY == SEAL_EVERY - 1:
                Sealer(cat, t, index_cache=IndexCache()).seal_partition(0, force=True)
            publish(cat.store, cat.deep, t, cache=cache)


def _build(home: Path, tables: int, snapshots: int) -> None:
    from millstream.catalog import Catalog

    with Catalog.open(home=home) as cat:
        names = [f"t{i}" for i in range(tables)]
        for t in names:
            cat.create_table(
                {
                    "name": t,
                    "schema": {"k": "long", "v": "string"},
                    "mode": "upsert",
                    "primary_key": ["k"],
                    "retention": {"time": "24h", "min_versions": 100_000},
                }
            )
        _publish_rounds(cat, names, snapshots, 0)


def _child(
    home: Path, passes: int, between: int, snapshots: int, bound_scale: float = 1.0
) -> dict[str, Any]:
    from millstream.catalog import Catalog
    from millstream.table import iceberg

    references_type = getattr(iceberg, "ViewReferences", None)
    bound = int(getattr(iceberg, "DEFAULT_VIEW_REFERENCES", 0) * bound_scale)
    references = references_type(bound) if references_type is not None else None
    out: dict[str, Any] = {"cpu": [], "removable": []}
    with Catalog.open(home=home) as cat:
        names = sorted(t.name for t in cat.store.list_tables() if not t.name.endswith("_dlq"))
        for p in range(passes):
            if p:
                _publish_rounds(cat, names, between, snapshots + (p - 1) * between)
            gc.collect()
            kwargs = {} if references is None else {"references": references}
            c0 = time.process_time()
            removable = 0
            for t in names:
                removable += len(
                    iceberg.collect_view_garbage(
                        cat.store, cat.deep, t, grace_seconds=0, now=4e9, dry_run=True, **kwargs
                    )
                )
            out["cpu"].append(time.process_time() - c0)
            out["removable"].append(removable)
            if references is not None:  # files read this pass (not found kept)
                out.setdefault("misses_by_pass", []).append(
                    references.misses - sum(out.get("misses_by_pass", []))
                )
        if references is not None:
            out["entries"] = len(references)
            out["refs"] = references.refs
            out["hits"] = references.hits
            out["misses"] = references.misses
            out["evicted"] = getattr(references, "evicted", None)
            out["bound"] = bound
            import tracemalloc

            fresh = references_type(bound)  # type: ignore[misc]
            gc.collect()
            tracemalloc.start()
            before = tracemalloc.get_traced_memory()[0]
            for t in names:
                iceberg.referenced_view_files(cat.store, cat.deep, t, fresh)
            gc.collect()
            out["held_bytes"] = tracemalloc.get_traced_memory()[0] - before
            out["held_refs"] = fresh.refs
            tracemalloc.stop()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tables", type=int, default=4)
    ap.add_argument("--snapshots", type=int, default=200)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--between", type=int, default=40)
    ap.add_argument("--src", action="append", default=[], metavar="NAME=DIR")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument(
        "--bound-scale",
        type=float,
        default=1.0,
        help="each tree's default bound of its references times this (0.1 with --tables 10: "
        "the proportion of 100 tables to the default bound, built in a tenth of the time)",
    )
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(
            json.dumps(
                _child(args.child, args.passes, args.between, args.snapshots, args.bound_scale)
            )
        )
        return 0
    trees = [tuple(s.split("=", 1)) for s in args.src] or [("this", "src")]
    common.log(f"{common.command_line('view_gc.py')}; load {common.load_text()}")
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in trees}
    with tempfile.TemporaryDirectory(prefix="view-gc-") as tmp:
        fixture = Path(tmp) / "home"  # each run's copy goes back here (paths are absolute)
        pristine = Path(tmp) / "pristine"

        def env_of(src: str) -> dict[str, str]:
            return dict(os.environ, PYTHONPATH=str(Path(src).resolve()))

        t0 = time.time()
        code = (
            "import sys; sys.path.insert(0, 'bench'); import view_gc; "
            f"view_gc._build(__import__('pathlib').Path({str(fixture)!r}), "
            f"{args.tables}, {args.snapshots})"
        )
        subprocess.run([sys.executable, "-c", code], env=env_of(trees[0][1]), check=True)
        common.log(
            f"built {args.tables} tables x {args.snapshots} snapshots in {time.time() - t0:.0f}s"
        )
        fixture.rename(pristine)
        for r in range(args.repeat):
            for name, src in trees if r % 2 == 0 else list(reversed(trees)):
                home = fixture
                shutil.copytree(pristine, home)
                out = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--child",
                        str(home),
                        "--passes",
                        str(args.passes),
                        "--between",
                        str(args.between),
                        "--snapshots",
                        str(args.snapshots),
                        "--bound-scale",
                        str(args.bound_scale),
                    ],
                    env=env_of(src),
                    capture_output=True,
                    text=True,
                )
                if out.returncode:
                    sys.stderr.write(out.stderr)
                    raise SystemExit(f"{name}'s run failed")
                shutil.rmtree(home)
                result = json.loads(out.stdout.strip().splitlines()[-1])
                runs[name].append(result)
                cpu = ", ".join(f"{c:.3f}" for c in result["cpu"])
                common.log(f"repeat {r} {name}: CPU-s a pass {cpu} (load {common.load_text()})")
    first = trees[0][0]
    print(f"\nCPU-s of a collection pass over {args.tables} tables (median of {args.repeat}):")
    print("pass  " + "  ".join(f"{name:>10} {'x ' + first:>10}" for name, _ in trees))
    for p in range(args.passes):
        base = statistics.median(r["cpu"][p] for r in runs[first])
        cells = []
        for name, _ in trees:
            med = statistics.median(r["cpu"][p] for r in runs[name])
            cells.append(f"{med:>10.3f} {common.ratio(med, base):>10.3f}")
        print(f"{p:>4}  " + "  ".join(cells))
    for name, _ in trees:
        last = runs[name][-1]
        if "entries" in last:
            print(
                f"{name}: references after {args.passes} passes: {last['entries']} entries, "
                f"{last['refs']} references, {last['hits']} hits / {last['misses']} misses "
                f"(files read by pass {last.get('misses_by_pass')}, bound {last.get('bound')}, evicted "
                f"{last.get('evicted')}); "
                f"a fresh instance after one pass holds {last['held_refs']} references in "
                f"{last['held_bytes'] / 2**20:.1f} MiB "
                f"({last['held_bytes'] / max(last['held_refs'], 1):.1f} bytes a reference)"
            )
        removable = {tuple(r["removable"]) for r in runs[name]}
        print(f"{name}: files a pass would remove: {sorted(removable)}")
    print(f"load at the end: {common.load_text()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
