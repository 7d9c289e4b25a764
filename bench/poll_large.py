"""Large poll benchmark: a cached reader polling a 2,000,000-key table while it is ingested.

The table is the streaming ground's (``bench/peers.py stream``): the peers' schema
(``bench/peers_workload.py``), an upsert table with the comparison column ``seq`` and the delete
column ``is_deleted``, 4 partitions, a key's records on partition ``key % 4`` (as Kafka's
partitioner by key puts them), not declared ``partitioned_by_key``. It is pre-loaded with key
``i`` once for every ``i < --keys`` and sealed, all through the production writer
(``stage_rows`` + ``commit_staged``) and sealer. Then ``--batches`` commits of ``--batch-rows``
stream records each (random existing keys, 2% deletes, ``seq`` rising) land one by one, and a
reader holding ``Catalog.open(read_cache_mb=...)`` reads the whole table after each; after
every ``--seal-every``-th commit one partition (in turn) is sealed and compacted first, so the
poll that follows reads a table whose sealed set moved.

Each tree (this one, and ``--baseline REV`` or ``--src DIR``: the code before) runs the
stream phase in its own process on its own copy of the pre-loaded table, with the same records,
rounds alternating. The plain baseline, measured in the same process: ``pyarrow.parquet
.read_table`` of one zstd file of the table's live rows. Every tree's last poll is checked
against a new reader's uncached read. Run from the repository root::

    .venv/bin/python bench/poll_large.py --keys 2000000 --baseline HEAD~3
    .venv/bin/python bench/poll_large.py --keys 200000 --batches 8          # quicker
    .venv/bin/python bench/poll_large.py --keys 2000000 --profile           # where a poll's time goes
    .venv/bin/python bench/poll_large.py --keys 2000000 --hot 50000         # updates of recent keys

``--pause 0.1`` waits before each poll as ``bench/peers.py``'s reader waits between reads (an
allocator may give freed memory back meanwhile); ``--src NAME=DIR`` may be given more than once.
Each tree reports a poll's wall, CPU, kernel time and minor page faults, and its RSS.

``--profile`` runs this tree alone under cProfile and prints, for the polls after a commit and
those after a seal separately, the functions with the most cumulative time.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common
import numpy as np
import peers_workload as wl
import pyarrow as pa
import pyarrow.parquet as pq
from rich.console import Console

from millstream.catalog import Catalog
from millstream.sealing.compaction import CompactionPolicy
from millstream.sealing.sealer import Sealer
from millstream.spec import TableSpec
from millstream.table.writer import commit_staged, stage_rows

PARTITIONS = 4
TABLE = "peers"
SEED = 7
SPEC = {
    "name": TABLE,
    "schema": wl.SCHEMA_SPEC,
    "primary_key": ["id"],
    "mode": "upsert",
    "comparison_column": "seq",
    "delete_column": "is_deleted",
}
HERE = Path(__file__).resolve().parent


def with_system_columns(
    spec: TableSpec, recs: wl.Records, offsets: dict[int, int]
) -> tuple[pa.Table, dict[int, tuple[int, int]]]:
    """The records as rows of partition ``id % 4``, each at its partition's next offset."""
    parts = (recs.id % PARTITIONS).astype(np.int32)
    offs = np.zeros(len(recs), np.int64)
    ranges = {}
    for p in range(PARTITIONS):
        mine = parts == p
        k = int(mine.sum())
        offs[mine] = np.arange(offsets[p], offsets[p] + k)
        ranges[p] = (offsets[p], offsets[p] + k)
        offsets[p] += k
    rows = wl.to_arrow(recs)
    rows = rows.append_column("_ms_partition", pa.array(parts))
    rows = rows.append_column("_ms_offset", pa.array(offs))
    rows = rows.append_column("_ms_tombstone", pa.array(np.zeros(len(recs), bool)))
    return rows.cast(spec.arrow_schema(system_columns=True)), ranges


def commit(cat: Catalog, spec: TableSpec, recs: wl.Records, offsets: dict[int, int]) -> None:
    rows, ranges = with_system_columns(spec, recs, offsets)
    staged = stage_rows(cat.deep, spec, rows)
    commit_staged(cat.store, cat.deep, TABLE, staged, ranges, {})


def build(home: Path, keys: int) -> None:
    """The pre-loaded table: key ``i`` once (``seq = i``), sealed."""
    with Catalog.open(home=home) as cat:
        spec = cat.create_table(TableSpec.parse(SPEC)).spec
        offsets = {p: 0 for p in range(PARTITIONS)}
        step = 500_000
        for lo in range(0, keys, step):
            commit(cat, spec, wl.preload(keys, lo, step), offsets)
        sealer = Sealer(cat, TABLE, compaction=CompactionPolicy())
        for p in range(PARTITIONS):
            while sealer.seal_partition(p, force=True) is not None:
                pass
        (home / "offsets.json").write_text(json.dumps(offsets))


def child(args: argparse.Namespace) -> dict[str, Any]:
    """The stream phase on ``args.home``: commits, seals and a timed poll after each."""
    home = Path(args.home)
    offsets = {int(p): o for p, o in json.loads((home / "offsets.json").read_text()).items()}
    profiles = {"commit": cProfile.Profile(), "seal": cProfile.Profile()}
    polls: dict[str, list[float]] = {"commit": [], "seal": []}
    # CPU seconds of the process a poll, of them in the kernel, and its minor page faults
    cpus: dict[str, list[float]] = {"commit": [], "seal": []}
    sys_s: dict[str, list[float]] = {"commit": [], "seal": []}
    faults: dict[str, list[int]] = {"commit": [], "seal": []}
    plain: list[float] = []
    live = home.parent / f"live-{os.getpid()}.parquet"
    with Catalog.open(home=home) as cat, Catalog.open(home=home, read_cache_mb=args.cache_mb) as r:
        spec = cat.table(TABLE).spec
        sealer = Sealer(cat, TABLE, compaction=CompactionPolicy())
        t0, c0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        current = r.read_table(TABLE)  # the first read fills the cache
        first = time.perf_counter() - t0
        c1 = resource.getrusage(resource.RUSAGE_SELF)
        first_cpu = c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime
        sent = 0
        for i in range(args.batches):
            recs = wl.records(SEED, args.keys, sent, args.batch_rows, wl.STREAM_SEQ_BASE)
            if args.hot:  # the keys among the newest --hot ones (recent orders updated)
                hot = args.keys - 1 - recs.id % args.hot
                recs = wl.Records(hot, recs.seq, recs.amount, recs.status, recs.deleted)
            sent += len(recs)
            commit(cat, spec, recs, offsets)
            kind = "commit"
            if args.seal_every and (i + 1) % args.seal_every == 0:
                p = (i // args.seal_every) % PARTITIONS
                sealer.seal_partition(p, force=True)
                sealer.compact_partition(p)
                kind = "seal"
            time.sleep(args.pause)  # the reader's wait between reads (bench/peers.py's 0.1 s)
            prof = profiles[kind] if args.profile else None
            t0, c0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
            if prof is not None:
                prof.enable()
            current = r.read_table(TABLE)
            if prof is not None:
                prof.disable()
            polls[kind].append(time.perf_counter() - t0)
            c1 = resource.getrusage(resource.RUSAGE_SELF)
            cpus[kind].append(c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime)
            sys_s[kind].append(c1.ru_stime - c0.ru_stime)
            faults[kind].append(c1.ru_minflt - c0.ru_minflt)
            if i % 10 == 0:
                pq.write_table(current, live, compression="zstd")
            t0 = time.perf_counter()
            pq.read_table(live)
            plain.append(time.perf_counter() - t0)
        rss_mb = (
            os.sysconf("SC_PAGE_SIZE")
            * int(Path("/proc/self/statm").read_text().split()[1])
            / 2**20
        )
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        expected = cat.read_table(TABLE)  # a reader without a cache: the same rows
        same = current.sort_by("id").equals(expected.sort_by("id"))
    live.unlink(missing_ok=True)
    out: dict[str, Any] = {
        "first_s": first,
        "first_cpu_s": first_cpu,
        "polls_s": polls,
        "poll_cpu_s": cpus,
        "poll_sys_s": sys_s,
        "poll_minor_faults": faults,
        "plain_s": plain,
        "rows": current.num_rows,
        "rss_after_polls_mb": rss_mb,
        "peak_rss_mb": peak_mb,
        "same_as_uncached": same,
    }
    if args.profile:
        for kind, prof in profiles.items():
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(28)
            out[f"profile_{kind}"] = text.getvalue()
    return out


def trees_of(args: argparse.Namespace, work: Path) -> dict[str, Path]:
    """The other trees' ``src`` by name: each ``--src [NAME=]DIR`` (NAME "before" if none),
    or ``--baseline`` exported with git archive as "before"."""
    trees: dict[str, Path] = {}
    for given in args.src:
        name, _, path = given.rpartition("=")
        trees[name or "before"] = Path(path).resolve()
    if not args.baseline:
        return trees
    dest = work / "baseline"
    dest.mkdir()
    archive = subprocess.run(
        ["git", "archive", args.baseline, "src"], check=True, capture_output=True, cwd=HERE.parent
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    trees["before"] = dest / "src"
    return trees


def run_tree(src: Path, home: Path, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    copy = work / f"home-{time.monotonic_ns()}"
    shutil.copytree(home, copy)
    env = dict(os.environ, PYTHONPATH=str(src))
    cmd = [sys.executable, str(HERE / "poll_large.py"), "--child", str(copy)]
    cmd += ["--keys", str(args.keys), "--batches", str(args.batches)]
    cmd += ["--batch-rows", str(args.batch_rows), "--seal-every", str(args.seal_every)]
    cmd += ["--cache-mb", str(args.cache_mb), "--hot", str(args.hot), "--pause", str(args.pause)]
    cmd += ["--profile"] if args.profile else []
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env, cwd=HERE)
    shutil.rmtree(copy)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def ms(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values) * 1000:,.0f} ms (p90 {common.percentile(values, 90) * 1000:,.0f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=2_000_000)
    parser.add_argument("--batches", type=int, default=16, help="commits, one poll each")
    parser.add_argument("--batch-rows", type=int, default=5_000)
    parser.add_argument("--seal-every", type=int, default=4, help="0: never seal")
    parser.add_argument("--cache-mb", type=float, default=2048)
    parser.add_argument(
        "--hot", type=int, default=0, help="stream keys among the newest N only (0: all keys)"
    )
    parser.add_argument(
        "--pause", type=float, default=0.0, help="seconds the reader waits before each poll"
    )
    parser.add_argument("--rounds", type=int, default=1, help="rounds per tree, alternating")
    parser.add_argument("--baseline", default="", help="git revision of the code before")
    parser.add_argument(
        "--src",
        action="append",
        default=[],
        help="another tree's src directory, as [NAME=]DIR (NAME: before); repeatable",
    )
    parser.add_argument("--profile", action="store_true", help="cProfile this tree's polls")
    parser.add_argument("--json", type=Path, default=None, help="save the figures here")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        args.home = args.child
        print(json.dumps(child(args)))
        return 0
    console = Console(soft_wrap=True)
    console.print(f"$ {common.command_line('poll_large.py')}")
    console.print(f"load {common.load_text()}; {common.cpu_model()}")
    with tempfile.TemporaryDirectory(prefix="millstream-bench-poll-large-") as tmp:
        work = Path(tmp)
        home = work / "home"
        t0 = time.perf_counter()
        build(home, args.keys)
        console.print(
            f"pre-loaded and sealed {args.keys:,} keys in {time.perf_counter() - t0:.0f} s"
        )
        trees = {"this tree": HERE.parent / "src"}
        if not args.profile:
            trees.update(trees_of(args, work))
        results: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
        for _ in range(args.rounds):
            for name, src in trees.items():
                results[name].append(run_tree(src, home, args, work))
                console.print(f"  {name}: done (load {common.load_text()})")
    summary: dict[str, Any] = {}
    for name, runs in results.items():
        commit_polls = [x for r in runs for x in r["polls_s"]["commit"]]
        seal_polls = [x for r in runs for x in r["polls_s"]["seal"]]
        plain = [x for r in runs for x in r["plain_s"]]
        commit_cpu = [x for r in runs for x in r["poll_cpu_s"]["commit"]]
        seal_cpu = [x for r in runs for x in r["poll_cpu_s"]["seal"]]
        commit_sys = [x for r in runs for x in r["poll_sys_s"]["commit"]]
        commit_faults = [x for r in runs for x in r["poll_minor_faults"]["commit"]]
        same = all(r["same_as_uncached"] for r in runs)
        console.print(
            f"{name}: {runs[-1]['rows']:,} live rows; first read {runs[-1]['first_s']:.2f} s "
            f"({statistics.median(r['first_cpu_s'] for r in runs):.2f} CPU-s, median); "
            f"poll after a {args.batch_rows:,}-row commit {ms(commit_polls)}; after a seal "
            f"{ms(seal_polls)}; CPU a poll after a commit {ms(commit_cpu)}, after a seal "
            f"{ms(seal_cpu)} (after a commit: in the kernel {ms(commit_sys)}, minor page faults "
            f"{statistics.median(commit_faults) if commit_faults else 0:,.0f}); "
            f"plain Parquet of the live rows {ms(plain)}; RSS after the polls "
            f"{statistics.median(r['rss_after_polls_mb'] for r in runs):,.0f} MB, peak "
            f"{statistics.median(r['peak_rss_mb'] for r in runs):,.0f} MB (medians); "
            f"same as an uncached read: {common.verdict(same)}"
        )
        summary[name] = {
            "commit_ms": statistics.median(commit_polls) * 1000 if commit_polls else None,
            "seal_ms": statistics.median(seal_polls) * 1000 if seal_polls else None,
            "commit_cpu_ms": statistics.median(commit_cpu) * 1000 if commit_cpu else None,
            "seal_cpu_ms": statistics.median(seal_cpu) * 1000 if seal_cpu else None,
            "commit_sys_ms": statistics.median(commit_sys) * 1000 if commit_sys else None,
            "commit_faults": statistics.median(commit_faults) if commit_faults else None,
            "plain_ms": statistics.median(plain) * 1000,
            "same_as_uncached": same,
            "runs": runs,
        }
        # a reader's first two polls after its first (full) read, each process's
        first_two = [r["poll_cpu_s"]["commit"][:2] for r in runs]
        first_faults = [r["poll_minor_faults"]["commit"][:2] for r in runs]
        console.print(
            f"{name}: the first two polls after the first read, CPU-s "
            + "; ".join(" / ".join(f"{x:.3f}" for x in xs) for xs in first_two)
            + ", minor page faults "
            + "; ".join(" / ".join(f"{x:,}" for x in xs) for xs in first_faults)
        )
        summary[name]["first_two_cpu_s"] = first_two
        for kind in ("commit", "seal"):
            text = runs[-1].get(f"profile_{kind}")
            if text:
                console.print(f"--- {name}: polls after a {kind} ---\n{text}")
    measures = [
        ("a poll after a commit", "commit_ms"),
        ("a poll after a seal", "seal_ms"),
        ("CPU of a poll after a commit", "commit_cpu_ms"),
        ("CPU of a poll after a seal", "seal_cpu_ms"),
        ("kernel time of a poll after a commit", "commit_sys_ms"),
        ("minor page faults of a poll after a commit", "commit_faults"),
    ]
    for other in [n for n in summary if n != "this tree"]:
        for what, field in measures:
            now, old = summary["this tree"][field], summary[other][field]
            if now and old:
                console.print(f"{what}: this tree / {other} {common.ratio(now, old):.2f}x")
    if args.json is not None:
        common.write_json(
            args.json, {"machine": common.machine("pyarrow"), "args": vars(args), **summary}
        )
    ok = all(s["same_as_uncached"] for s in summary.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
