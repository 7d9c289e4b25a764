"""What a long-lived Iceberg publisher costs as its tables' unsealed runs grow, and whether
its memory follows the tables' live files: CPU a round, RSS, the Python heap and its cache.

Run from the repository root (not part of CI; 5-20 minutes, by the load)::

    .venv/bin/python bench/publisher_growth.py                   # 20 tables, 60 batches
    PYTHONPATH=/tmp/old/src .venv/bin/python bench/publisher_growth.py   # a tree before
    .venv/bin/python bench/publisher_growth.py --src before=/tmp/old/src --src after=src \
        --tables 30 --batches 70 --seal-at 0 --repeat 2     # A/B: each tree in its own process
    .venv/bin/python bench/publisher_growth.py --tables 30 --batches 70 --profile 15,70
    .venv/bin/python bench/publisher_growth.py --tables 20 --rounds 120 --seal-every 100 --memory
    # options: --tables N --batches B | --rounds R --every E --seal-at S (0: never)
    #          --seal-every S --profile B1,B2 --memory --memory-from R

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

``--rounds R`` runs ``R * --every`` batches; ``--seal-every S`` seals every table's unsealed run
every ``S`` batches (as a worker's ``flush_seconds`` does, several times in a long window).
``--worker-sealer``: as a worker's sealing thread, a long-lived
:class:`~millstream.sealing.sealer.Sealer` per table (the process's key-index cache, the
default thresholds: a run seals 300 s after it starts) runs ``seal_due()`` after every batch,
the bench's clock advancing 2.5 s a batch besides 20 s a round: the worker's own (driver)
process's sealing pass and the publisher's round, in one process.
``--memory``: each round also prints the bytes Arrow's memory pool holds allocated
(``pyarrow.total_allocated_bytes()``) and its backend, and at the end what grew from round
``--memory-from`` (20) to the last, as ``tracemalloc`` sees it by line (the Python heap: real
retention, a cache or a dict that only grows), then RSS after ``gc.collect()``, after the Arrow
pool's ``release_unused()`` and after glibc's ``malloc_trim(0)``: memory that comes back then
was freed and kept by an allocator, not held by the publisher.

With ``--src``, each tree's wall seconds a round are printed beside its CPU (a publish's fsyncs
wait, they do not compute).
``--profile B1,B2``: the rounds after those batches run under cProfile, and the functions
with the most own time and the most cumulative time are printed. ``--src NAME=DIR``
(repeated): each tree's ``src`` runs the same in a fresh process of its own (alternating,
``--repeat`` times, the first tree first in even repeats), and a table prints each round's
CPU seconds per tree and their ratio to the first tree's, same rounds.
"""

from __future__ import annotations

import argparse
import cProfile
import ctypes
import gc
import io
import json
import os
import pstats
import re
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


def arrow_mb() -> float:
    return pa.total_allocated_bytes() / 2**20


def heap_mb() -> float:
    """The Python heap tracemalloc traces, without tracemalloc's own bookkeeping."""
    return tracemalloc.get_traced_memory()[0] / 2**20


def pymalloc_mb() -> tuple[float, float]:
    """Python's small-object allocator: MB of its arenas mapped, and MB of blocks in use in
    them (``sys._debugmallocstats``, which writes to the C stderr)."""
    with tempfile.TemporaryFile() as out:
        saved = os.dup(2)
        sys.stderr.flush()
        os.dup2(out.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read().decode()
    mapped = re.search(r"^\d+ arenas \* \d+ bytes/arena\s+=\s+([\d,]+)", text, re.M)
    used = re.search(r"^# bytes in allocated blocks\s+=\s+([\d,]+)", text, re.M)
    arenas = int(mapped.group(1).replace(",", "")) if mapped else 0
    in_use = int(used.group(1).replace(",", "")) if used else 0
    return arenas / 2**20, in_use / 2**20


def released() -> list[tuple[str, float, float]]:
    """RSS and Arrow's allocated MB after each step that returns freed memory to the system."""
    out = [("as it is", rss_mb(), arrow_mb())]
    gc.collect()
    out.append(("after gc.collect()", rss_mb(), arrow_mb()))
    pa.default_memory_pool().release_unused()
    out.append(("after the Arrow pool's release_unused()", rss_mb(), arrow_mb()))
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        out.append(("after glibc's malloc_trim(0)", rss_mb(), arrow_mb()))
    except (OSError, AttributeError):  # not glibc
        pass
    return out


def cache_stats(cache: object) -> dict[str, int]:
    """What the publisher's cache holds (files, the Arrow tables they are held in, bytes) and
    its hits and misses so far; a tree whose cache has no ``describe()`` keeps a table a file
    in its ``columns`` (a ``ReadCache``, which counts its hits and misses)."""
    describe = getattr(cache, "describe", None)
    if describe is not None:
        found: dict[str, int] = describe()
        return found
    columns = cache.columns  # type: ignore[attr-defined]
    n = len(columns)
    return {
        "files": n,
        "arrays": n,
        "bytes": columns.bytes,
        "hits": columns.hits,
        "misses": columns.misses,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tables", type=int, default=20)
    ap.add_argument("--batches", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=0, help="publish rounds (batches = R x every)")
    ap.add_argument("--every", type=int, default=5, help="batches between publish rounds")
    ap.add_argument(
        "--seal-at", type=int, default=40, help="the batch after which all seal (0: never)"
    )
    ap.add_argument("--seal-every", type=int, default=0, help="seal every S batches (0: never)")
    ap.add_argument(
        "--worker-sealer",
        action="store_true",
        help="a long-lived Sealer per table runs its seal_due() after every batch",
    )
    ap.add_argument("--memory", action="store_true", help="what grew, and what an allocator kept")
    ap.add_argument("--memory-from", type=int, default=20, help="the round --memory compares from")
    ap.add_argument("--top", type=int, default=15, help="lines --memory prints")
    ap.add_argument(
        "--no-tracemalloc",
        action="store_true",
        help="--memory: pymalloc's arenas at --memory-from and at the end instead",
    )
    ap.add_argument("--frames", type=int, default=1, help="--memory: frames of each allocation")
    ap.add_argument("--profile", default="", help="batches whose round is profiled: 15,70")
    ap.add_argument("--profile-dir", default="", help="also save each profile there (.prof)")
    ap.add_argument(
        "--view-snapshots",
        type=int,
        default=0,
        help="the tables' retention.iceberg_snapshots (0: the default)",
    )
    ap.add_argument("--src", action="append", default=[], metavar="NAME=DIR")
    ap.add_argument("--repeat", type=int, default=1, help="alternations with --src")
    ap.add_argument("--together", action="store_true", help="with --src: the trees at once")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rounds:
        args.batches = args.rounds * args.every
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
    # As the publisher's process runs it (millstream.sealing.publishing.serve).
    pa.set_cpu_count(1)
    common.log(f"Arrow's memory pool: {pa.default_memory_pool().backend_name}")
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
                **(
                    {"retention": {"iceberg_snapshots": args.view_snapshots}}
                    if args.view_snapshots
                    else {}
                ),
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
    sealers = {n: Sealer(cat, n, clock=clock) for n in names} if args.worker_sealer else {}
    if not args.no_tracemalloc:
        tracemalloc.start(args.frames)
    base: tracemalloc.Snapshot | None = None
    marks: list[tuple[int, float, float, float]] = []  # (round, RSS, heap, Arrow) by round
    rounds = 0
    c_all = 0.0
    seen = (0, 0)  # the cache's hits and misses so far
    for b in range(args.batches):
        for n in names:
            commit(n)
        if sealers:
            clock.advance(2.5)
            for sealer in sealers.values():
                sealer.seal_due()
        if args.seal_every and (b + 1) % args.seal_every == 0:
            for n in names:
                Sealer(cat, n, index_cache=IndexCache()).seal_partition(0, force=True)
        if args.seal_at and b + 1 == args.seal_at:
            c0 = time.process_time()
            for n in names:
                Sealer(cat, n, index_cache=IndexCache()).seal_partition(0, force=True)
            common.log(f"sealed every table: {time.process_time() - c0:.2f} CPU-s")
        if (b + 1) % args.every == 0:
            clock.advance(20)
            profiler = cProfile.Profile() if b + 1 in profiled else None
            c0, w0 = time.process_time(), time.perf_counter()
            if profiler is not None:
                profiler.enable()
            publisher.run_due(handed)
            if profiler is not None:
                profiler.disable()
            cpu, wall = time.process_time() - c0, time.perf_counter() - w0
            rounds += 1
            c_all += cpu
            entries = len(cat.manifest(names[0]).entries)
            cache = cache_stats(publisher.cache)
            hits, misses = cache["hits"] - seen[0], cache["misses"] - seen[1]
            seen = (cache["hits"], cache["misses"])
            rss, heap, arrow = rss_mb(), heap_mb(), arrow_mb()
            marks.append((rounds, rss, heap, arrow))
            common.log(
                f"round {rounds} (batch {b + 1}): {entries} entries a table, {cpu:.2f} CPU-s "
                f"({cpu / args.tables * 1000:.0f} ms a table), RSS {rss:.0f} MB, Python heap "
                f"{heap:.1f} MB, Arrow {arrow:.1f} MB, cache {cache['files']} files in "
                f"{cache['arrays']} tables ({cache['bytes'] / 2**20:.1f} MB of Arrow buffers), "
                f"{hits} hits, {misses} misses"
            )
            if args.memory and rounds == args.memory_from:
                gc.collect()
                if args.no_tracemalloc:
                    arenas, used = pymalloc_mb()
                    common.log(f"pymalloc: {arenas:.1f} MB of arenas mapped, {used:.1f} MB used")
                base = tracemalloc.take_snapshot() if tracemalloc.is_tracing() else None
            if args.child:
                row = {
                    "batch": b + 1,
                    "entries": entries,
                    "cpu": cpu,
                    "wall": wall,
                    "rss": rss,
                    "heap": heap,
                    "misses": misses,
                }
                print(json.dumps(row), flush=True)
            if profiler is not None:
                if args.profile_dir:
                    profiler.dump_stats(Path(args.profile_dir) / f"round-{b + 1}.prof")
                for order in ("tottime", "cumulative"):
                    out = io.StringIO()
                    pstats.Stats(profiler, stream=out).sort_stats(order).print_stats(30)
                    common.log(f"-- round after batch {b + 1}, by {order}:\n{out.getvalue()}")
    if rounds:
        common.log(f"{rounds} rounds, {c_all / rounds:.3f} CPU-s a round on average")
    if args.memory and args.no_tracemalloc:
        gc.collect()
        arenas, used = pymalloc_mb()
        common.log(f"pymalloc: {arenas:.1f} MB of arenas mapped, {used:.1f} MB used")
        for what, rss, arrow in released():
            common.log(f"RSS {rss:.0f} MB, Arrow {arrow:.1f} MB {what}")
    if args.memory and base is not None:
        gc.collect()
        last = marks[-1]
        first = next(m for m in marks if m[0] == args.memory_from)
        per = 100 / max(1, last[0] - first[0])
        common.log(
            f"from round {first[0]} to {last[0]}: RSS {first[1]:.0f} -> {last[1]:.0f} MB "
            f"({(last[1] - first[1]) * per:+.1f} MB a 100 rounds), Python heap {first[2]:.1f} "
            f"-> {last[2]:.1f} MB ({(last[2] - first[2]) * per:+.1f}), Arrow {first[3]:.1f} -> "
            f"{last[3]:.1f} MB ({(last[3] - first[3]) * per:+.1f})"
        )
        by = "lineno" if args.frames == 1 else "traceback"
        stats = tracemalloc.take_snapshot().compare_to(base, by)
        common.log(f"the Python heap's growth by {by}, top {args.top}:")
        for st in stats[: args.top]:
            where = st.traceback.format() if args.frames > 1 else [str(st.traceback)]
            common.log(f"  {st.size_diff / 2**10:+9.1f} KiB {st.count_diff:+7d} blocks")
            for line in where:
                common.log(f"      {line}")
        tracemalloc.stop()  # pymalloc's statistics are empty while tracemalloc hooks it
        arenas, used = pymalloc_mb()
        common.log(
            f"pymalloc: {arenas:.1f} MB of arenas mapped, {used:.1f} MB of blocks in use in them"
        )
        for what, rss, arrow in released():
            common.log(f"RSS {rss:.0f} MB, Arrow {arrow:.1f} MB {what}")
        if args.child:
            print(json.dumps({"released": released()[-1][1]}), flush=True)
    cat.close()


def compare(args: argparse.Namespace) -> None:
    """Each ``--src`` tree in a fresh process, alternating (``--together``: all at once, so
    they share the machine's load); each round's CPU-s side by side, and with ``--memory``
    each tree's RSS and Python heap growth."""
    trees = dict(s.split("=", 1) for s in args.src)
    common.log(f"trees {trees}, load {common.load_text()}")
    child = [
        sys.executable,
        __file__,
        "--child",
        *("--tables", str(args.tables), "--batches", str(args.batches)),
        *("--every", str(args.every), "--seal-at", str(args.seal_at)),
        *("--seal-every", str(args.seal_every), "--memory-from", str(args.memory_from)),
        *(["--memory"] if args.memory else []),
        *(["--worker-sealer"] if args.worker_sealer else []),
        *(["--no-tracemalloc"] if args.no_tracemalloc else []),
        *(["--view-snapshots", str(args.view_snapshots)] if args.view_snapshots else []),
    ]
    rounds: dict[str, dict[int, list[float]]] = {n: {} for n in trees}
    rss: dict[str, dict[int, list[float]]] = {n: {} for n in trees}
    heap: dict[str, dict[int, list[float]]] = {n: {} for n in trees}
    read: dict[str, dict[int, list[float]]] = {n: {} for n in trees}
    walls: dict[str, dict[int, list[float]]] = {n: {} for n in trees}
    trimmed: dict[str, list[float]] = {n: [] for n in trees}
    entries: dict[int, int] = {}

    def start(name: str) -> subprocess.Popen[str]:
        env = {**os.environ, "PYTHONPATH": str(Path(trees[name]).resolve())}
        return subprocess.Popen(child, env=env, stdout=subprocess.PIPE, text=True)

    def collect(name: str, proc: subprocess.Popen[str]) -> None:
        out, _ = proc.communicate()
        if proc.returncode:
            raise SystemExit(f"tree {name}: exit {proc.returncode}")
        for line in out.splitlines():
            if line.startswith('{"released"'):
                trimmed[name].append(json.loads(line)["released"])
            elif line.startswith("{"):
                row = json.loads(line)
                rounds[name].setdefault(row["batch"], []).append(row["cpu"])
                rss[name].setdefault(row["batch"], []).append(row["rss"])
                heap[name].setdefault(row["batch"], []).append(row["heap"])
                read[name].setdefault(row["batch"], []).append(row.get("misses", 0))
                walls[name].setdefault(row["batch"], []).append(row.get("wall", 0.0))
                entries[row["batch"]] = row["entries"]
            elif args.memory and line.startswith(("  ", "from", "RSS", "the Python", "pymalloc")):
                common.log(f"  [{name}] {line}")

    for r in range(args.repeat):
        order = list(trees) if r % 2 == 0 else list(reversed(trees))
        if args.together:
            procs = [(name, start(name)) for name in order]
            for name, proc in procs:
                collect(name, proc)
        else:
            for name in order:
                collect(name, start(name))
        common.log(f"repeat {r + 1} done, load {common.load_text()}")
    first = next(iter(trees))
    med = statistics.median
    common.log(
        f"CPU-s a publish round over {args.tables} tables, RSS MB after it, files whose "
        f"columns it read (median of {args.repeat} per tree):"
    )
    common.log("| after batch | entries a table | " + " | ".join(trees) + " |")
    every = max(1, len(entries) // 12)
    for i, b in enumerate(sorted(entries)):
        if i % every and b != max(entries):
            continue
        cells = []
        for name in trees:
            cpu, base = med(rounds[name][b]), med(rounds[first][b])
            ratio = "" if name == first else f" ({cpu / base:.2f}x)"
            cells.append(
                f"{cpu:.2f}{ratio}, {med(rss[name][b]):.0f} MB, {med(read[name][b]):.0f} read"
            )
        common.log(f"| {b} | {entries[b]} | " + " | ".join(cells) + " |")
    batches = sorted(entries)
    b0 = batches[min(args.memory_from, len(batches)) - 1]
    b1 = batches[-1]
    per = 100 / max(1, (b1 - b0) / args.every)
    for name in trees:
        cpu = [med(v) for v in rounds[name].values()]
        grow = (med(rss[name][b1]) - med(rss[name][b0])) * per
        hgrow = (med(heap[name][b1]) - med(heap[name][b0])) * per
        after = f", {med(trimmed[name]):.0f} MB after a trim" if trimmed[name] else ""
        wall = [med(v) for v in walls[name].values()]
        late = batches[len(batches) // 2 :]  # the second half: the longest snapshot lists
        late_cpu = sum(med(rounds[name][b]) for b in late) / len(late)
        late_wall = sum(med(walls[name][b]) for b in late) / len(late)
        common.log(
            f"{name}: {sum(cpu) / len(cpu):.3f} CPU-s and {sum(wall) / len(wall):.3f} s of wall "
            f"a round ({late_cpu:.3f} and {late_wall:.3f} over the second half's rounds); RSS {med(rss[name][b0]):.0f} MB "
            f"at batch {b0}, {med(rss[name][b1]):.0f} at {b1} ({grow:+.1f} MB a 100 rounds; "
            f"Python heap {hgrow:+.1f}){after}"
        )


if __name__ == "__main__":
    main()
