"""What a worker's repeated reads of a busy table cost as its removed entries pile up: a table
keeps the entries its seals removed until retention expires them (24 h by default), one a
micro-batch, so a table committing every second holds ~3,600 more rows an hour.

Run from the repository root (not part of CI; about a minute)::

    .venv/bin/python bench/removed_entries_reads.py
    # options: --commits N (batches committed, a seal every --seal-every), --repeats N

One table is built through the production commit path (``stage_rows`` + ``commit_staged``,
one file a batch, a forced seal every ``--seal-every`` batches; SQLite metadata store, local
deep store). Then, on two copies of its metadata store, one without the index
``ix_entries_removed`` (as before schema v13) and one with it, in alternating rounds, the CPU
(``time.process_time``) of: a sealing pass's read of what changed since the version before the
last (``MetadataStore.sealing_reads``), a seal's claim-time read of the partition's live
entries (``reads.live_entries``) and a manifest read (``MetadataStore.manifest``). Printed:
the median per read for each copy and the ratio, with the answers checked equal.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
from sqlalchemy import text

from millstream.catalog import Catalog
from millstream.metastore import reads
from millstream.metastore.store import MetadataStore
from millstream.sealing.sealer import Sealer
from millstream.spec import TableSpec
from millstream.table.writer import commit_staged, stage_rows

SPEC = TableSpec.parse({"name": "t", "schema": {"id": "long"}})


def _build(home: Path, commits: int, seal_every: int) -> None:
    with Catalog.open(
        metadata_url=f"sqlite:///{home / 'm.db'}", deep_store=str(home / "deep")
    ) as c:
        c.create_table(SPEC)
        sealer = Sealer(c, "t")
        for batch in range(commits):
            lo = batch * 5
            rows = pa.table(
                {
                    "id": pa.array(range(lo, lo + 5), pa.int64()),
                    "_ms_partition": pa.array([0] * 5, pa.int32()),
                    "_ms_offset": pa.array(range(lo, lo + 5), pa.int64()),
                    "_ms_tombstone": pa.array([False] * 5),
                }
            )
            staged = stage_rows(c.deep, SPEC, rows)
            commit_staged(c.store, c.deep, "t", staged, {0: (lo, lo + 5)}, {})
            if batch % seal_every == seal_every - 1:
                sealer.seal_partition(0, force=True)


def _cpu(fn: Callable[[], object], repeats: int) -> tuple[float, object]:
    out = fn()
    t0 = time.process_time()
    for _ in range(repeats):
        fn()
    return (time.process_time() - t0) / repeats, out


def _round(url: str, repeats: int) -> dict[str, tuple[float, object]]:
    store = MetadataStore(url)
    try:
        version = store.manifest("t").version

        def live() -> object:
            with store.read() as conn:
                return len(reads.live_entries(conn, "t", 0))

        return {
            "sealing_reads": _cpu(
                lambda: store.sealing_reads({"t": version - 1})["t"].changes, repeats
            ),
            "live_entries": _cpu(live, repeats),
            "manifest": _cpu(lambda: len(store.manifest("t").entries), repeats),
        }
    finally:
        store.dispose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commits", type=int, default=3000)
    ap.add_argument("--seal-every", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="removed-entries-"))
    try:
        t0 = time.monotonic()
        _build(work, args.commits, args.seal_every)
        before, after = work / "before.db", work / "after.db"
        shutil.copy(work / "m.db", after)
        shutil.copy(work / "m.db", before)
        b = MetadataStore(f"sqlite:///{before}")
        with b.write() as conn:
            n, removed = conn.execute(
                text("SELECT count(*), count(removed_version) FROM ms_entries")
            ).one()
            conn.execute(text("DROP INDEX ix_entries_removed"))
        b.dispose()
        print(
            f"one table, {n} entry rows ({removed} removed), built in {time.monotonic() - t0:.0f} s"
        )
        got: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
        answers: dict[str, dict[str, object]] = {"before": {}, "after": {}}
        for r in range(args.rounds):
            order = [("before", before), ("after", after)]
            for name, path in order if r % 2 == 0 else order[::-1]:
                # a fresh store a round (the index dropped above must not be recreated: the
                # schema version stays current, so no migration runs)
                for read, (cpu, answer) in _round(f"sqlite:///{path}", args.repeats).items():
                    got[name].setdefault(read, []).append(cpu)
                    answers[name][read] = answer
        for read in got["before"]:
            b_ms = statistics.median(got["before"][read]) * 1e3
            a_ms = statistics.median(got["after"][read]) * 1e3
            same = answers["before"][read] == answers["after"][read]
            print(
                f"  {read}: before {b_ms:.3f} ms, after {a_ms:.3f} ms CPU a read "
                f"({a_ms / b_ms:.2f}x); same answer: {same}"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
