"""What a manifest read and a status request cost as a busy table's removed entries pile up:
a table keeps the entries its seals and compactions removed until retention expires them
(24 h by default), one a micro-batch, so a table committing every second holds ~86,000 removed
rows after a day.

Run from the repository root (not part of CI; a few minutes), with the tree that builds the
stores (the oldest of the trees compared, so that every tree can open them) on PYTHONPATH::

    PYTHONPATH=/tmp/manread-before/src .venv/bin/python bench/manifest_reads.py \\
        --src before=/tmp/manread-before/src --src after=src
    # options: --removed 1500,6000,86000 --runs N --repeats N --run-length N --no-postgres

For each ``--removed`` size, one table's manifest rows are written as a busy table's history
leaves them, one manifest version a step: a micro-batch's entry (CONSUMING) every version, a
seal every ``--run-length`` batches (the run's entries removed, one ONLINE entry covering
them and a delete vector added), a compaction every 10 seals (the live ONLINE entries and
delete vectors removed, one ONLINE entry added), until the table holds that many removed
entries; its shard and its version rows too. (Written directly, not through the commit path:
86,000 commits would take the bench an hour; the rows are those the commit path, the sealer
and compaction write.) The same history goes into a SQLite file and into a database of a
throwaway PostgreSQL server (``ANALYZE``d, as autovacuum leaves a busy table).

Each ``--src NAME=DIR`` tree then runs in a fresh process of its own (its store opened, i.e.
migrated, before anything is timed) on a fresh copy of each store, ``--runs`` times, the trees
alternating. Timed, the median of ``--repeats`` each (wall and this process's CPU): the table's
manifest at its head version (``MetadataStore.manifest``), a run of batches back (the version a
seal reads its run at), and halfway back (time travel 12 h into a day); the status requests'
reads: every table's row count (``api.status.rows_per_table``, the metrics' and console's)
and when each partition last advanced (``api.status.last_commit_times``, a table's
consumingSegmentsInfo). On PostgreSQL also the server's own time for the read's statements
(their ``EXPLAIN ANALYZE`` execution and planning times, summed; median of ``--repeats``),
which a loaded machine's round trips and scheduling do not blur. Printed: each tree's medians
(of its runs' medians) and ratios to the first tree's, and whether every tree gave the same
answers.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import common
from sqlalchemy import event, insert, text, update

from millstream.metastore import schema as s
from millstream.metastore.store import MetadataStore
from millstream.spec import TableSpec

TABLE = "t"
SPEC = TableSpec.parse(
    {"name": TABLE, "schema": {"id": "long"}, "primary_key": ["id"], "mode": "upsert"}
)
READS = (
    "manifest_head",
    "manifest_run_back",
    "manifest_half_back",
    "rows_per_table",
    "last_commit",
)


def _history(removed: int, run: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """The entry and delete-vector rows a busy table of one partition holds once ``removed`` of
    its entries are removed, and its head version."""
    entries: list[dict[str, Any]] = []
    dvs: list[dict[str, Any]] = []
    live: list[dict[str, Any]] = []
    live_dvs: list[dict[str, Any]] = []
    version, seq, offset, seals, gone = 0, 0, 0, 0, 0
    t0 = time.time() - 86_400

    def entry(seq_: int, lo: int, hi: int, state: str, rows: int) -> dict[str, Any]:
        e = {
            "table_name": TABLE,
            "partition": 0,
            "seq": seq_,
            "file_path": f"data/f-{len(entries)}.parquet",
            "start_offset": lo,
            "end_offset": hi,
            "state": state,
            "row_count": rows,
            "size_bytes": 1000 + rows,
            "added_version": version,
            "removed_version": None,
            "writer_id": "w",
            "batch_id": version,
            "created_at": t0 + version,
            "last_error": None,
            "version": 0,
            "claimed_by": None,
            "claim_expires_at": None,
        }
        entries.append(e)
        return e

    def remove(es: list[dict[str, Any]]) -> None:
        for e in es:
            e["removed_version"] = version
            e["version"] += 1

    while gone < removed:
        version += 1
        live.append(entry(seq, offset, offset + 5, "CONSUMING", 5))
        seq, offset = seq + 1, offset + 5
        consuming = [e for e in live if e["state"] == "CONSUMING"]
        if len(consuming) < run:
            continue
        version += 1  # a seal of the run
        remove(consuming)
        gone += len(consuming)
        live = [e for e in live if e["state"] == "ONLINE"]
        sealed = consuming[0]["seq"]
        lo, hi = consuming[0]["start_offset"], consuming[-1]["end_offset"]
        live.append(entry(sealed, lo, hi, "ONLINE", hi - lo))
        dv = {
            "table_name": TABLE,
            "partition": 0,
            "source_seq": sealed,
            "file_path": f"dv/{len(dvs)}.parquet",
            "row_count": 2,
            "added_version": version,
            "removed_version": None,
            "version": 0,
        }
        dvs.append(dv)
        live_dvs.append(dv)
        seals += 1
        if seals % 10 == 0:
            version += 1  # a compaction of the sealed entries
            remove(live)
            remove(live_dvs)
            gone += len(live)
            lo, hi = live[0]["start_offset"], live[-1]["end_offset"]
            live = [entry(live[0]["seq"], lo, hi, "ONLINE", hi - lo - 2 * len(live_dvs))]
            live_dvs = []
    return entries, dvs, version


def _write(url: str, removed: int, run: int) -> dict[str, int]:
    entries, dvs, head = _history(removed, run)
    store = MetadataStore(url)
    try:
        store.create_table(SPEC)
        with store.write() as conn:
            conn.execute(insert(s.entries), entries)
            conn.execute(insert(s.delete_vectors), dvs)
            t0 = time.time() - 86_400
            conn.execute(
                insert(s.table_versions),
                [
                    {
                        "table_name": TABLE,
                        "manifest_version": v,
                        "committed_at": t0 + v,
                        "operation": "append",
                        "writer_id": "w",
                        "batch_id": v,
                    }
                    for v in range(1, head + 1)
                ],
            )
            conn.execute(
                update(s.tables).where(s.tables.c.name == TABLE).values(manifest_version=head)
            )
            last = max(e["end_offset"] for e in entries)
            conn.execute(
                insert(s.shards).values(
                    table_name=TABLE,
                    partition=0,
                    upper=last,
                    epoch=0,
                    next_seq=len(entries),
                    version=1,
                    last_record_ms=None,
                )
            )
        if url.startswith("postgresql"):
            with store.write() as conn:
                conn.execute(text("ANALYZE"))
    finally:
        store.dispose()
    n_removed = sum(e["removed_version"] is not None for e in entries)
    return {
        "rows": len(entries),
        "removed": n_removed,
        "live": len(entries) - n_removed,
        "delete_vectors": len(dvs),
        "head": head,
    }


def _digest(value: object) -> str:
    return hashlib.sha256(repr(value).encode()).hexdigest()[:16]


def _child(args: argparse.Namespace) -> None:
    from millstream.api import status

    url = args.child if "://" in args.child else f"sqlite:///{args.child}"
    store = MetadataStore(url)  # opened (and migrated) before anything is timed
    head = store.manifest(TABLE).version

    def manifest_at(version: int) -> Callable[[], object]:
        def read() -> object:
            m = store.manifest(TABLE, as_of=version)
            return (
                [(e.id, e.partition, e.seq, e.state, e.removed_version) for e in m.entries],
                [d.id for d in m.delete_vectors],
            )

        return read

    reads: dict[str, Callable[[], object]] = {
        "manifest_head": manifest_at(head),
        "manifest_run_back": manifest_at(head - args.run_length),
        "manifest_half_back": manifest_at(head // 2),
        "rows_per_table": lambda: status.rows_per_table(store),
        "last_commit": lambda: status.last_commit_times(store, TABLE),
    }
    out: dict[str, Any] = {}
    for name, fn in reads.items():
        answer = fn()  # warm
        server = _server_ms(store, fn, args.repeats) if url.startswith("postgresql") else None
        walls, cpus = [], []
        for _ in range(args.repeats):
            w0, c0 = time.perf_counter(), time.process_time()
            fn()
            walls.append(time.perf_counter() - w0)
            cpus.append(time.process_time() - c0)
        out[name] = {
            "wall": statistics.median(walls),
            "cpu": statistics.median(cpus),
            "server": server,
            "answer": _digest(answer),
            "size": len(answer[0]) if isinstance(answer, tuple) else len(answer),  # type: ignore[arg-type]
        }
    store.dispose()
    print(json.dumps(out), flush=True)


def _server_ms(store: MetadataStore, fn: Callable[[], object], repeats: int) -> float:
    """PostgreSQL's own time for ``fn``'s statements (the sum of their ``EXPLAIN ANALYZE``
    execution and planning times, median of ``repeats``): what the server spends on a read,
    without the round trips and the scheduling of a loaded machine."""
    seen: list[tuple[str, Any]] = []

    def grab(_c: Any, _cur: Any, statement: str, parameters: Any, *_: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            seen.append((statement, parameters))

    event.listen(store.engine, "before_cursor_execute", grab)
    try:
        fn()
    finally:
        event.remove(store.engine, "before_cursor_execute", grab)
    raw = store.engine.raw_connection()
    try:
        cur = raw.cursor()
        times = []
        for _ in range(repeats):
            total = 0.0
            for statement, parameters in seen:
                cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, parameters)
                plan = cur.fetchone()[0][0]
                total += plan["Execution Time"] + plan["Planning Time"]
            times.append(total)
        raw.rollback()
    finally:
        raw.close()
    return statistics.median(times) / 1e3


def _run_pg(server: Any, base: str, tree: str, args: list[str]) -> dict[str, Any]:
    """The child on a fresh copy of PostgreSQL database ``base`` (``CREATE DATABASE ...
    TEMPLATE``), dropped afterwards."""
    import psycopg

    copy = f"{base}_copy"
    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {copy} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {copy} TEMPLATE {base}")
    env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve())}
    try:
        out = subprocess.run(
            [sys.executable, __file__, "--child", server.database_url(copy), *args],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
    finally:
        with psycopg.connect(server.dsn(), autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {copy} WITH (FORCE)")
    row: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return row


def _compare(args: argparse.Namespace) -> None:
    trees = dict(x.split("=", 1) for x in args.src)
    first = next(iter(trees))
    home = Path(tempfile.mkdtemp(prefix="manifest-reads-"))
    server = None
    if not args.no_postgres:
        from harness.servers import PostgresServer

        server = PostgresServer(home / "pg")
        server.start()
    child_args = ["--repeats", str(args.repeats), "--run-length", str(args.run_length)]
    same = True
    try:
        print(f"trees {trees}; load {common.load_text()}", flush=True)
        for removed in (int(x) for x in args.removed.split(",")):
            stores = {"SQLite": f"sqlite:///{home / f'm{removed}.db'}"}
            if server is not None:
                stores["PostgreSQL"] = server.create_database(f"m{removed}")
            shape = {}
            for url in stores.values():
                shape = _write(url, removed, args.run_length)
            print(f"{removed} removed: {shape}", flush=True)
            for backend in stores:
                got: dict[str, dict[str, list[float]]] = {n: {} for n in trees}
                answers: dict[str, dict[str, set[str]]] = {n: {} for n in trees}
                loads = []
                for r in range(args.runs):
                    for name in list(trees) if r % 2 == 0 else list(reversed(trees)):
                        if backend == "SQLite":
                            db = home / f"m{removed}.db"
                            row = common.run_tree_on_copy(
                                __file__, trees[name], db, home / f"copy-{name}.db", child_args
                            )
                        else:
                            row = _run_pg(server, f"m{removed}", trees[name], child_args)
                        loads.append(os.getloadavg()[0])
                        for read, v in row.items():
                            for k in ("wall", "cpu", "server"):
                                if v.get(k) is not None:
                                    got[name].setdefault(f"{read}.{k}", []).append(v[k])
                            answers[name].setdefault(read, set()).add(f"{v['answer']}/{v['size']}")
                print(f"  {backend} (load {min(loads):.1f}-{max(loads):.1f}):", flush=True)
                for read in READS:
                    parts = []
                    for name in trees:
                        w = statistics.median(got[name][f"{read}.wall"]) * 1e3
                        c = statistics.median(got[name][f"{read}.cpu"]) * 1e3
                        w0 = statistics.median(got[first][f"{read}.wall"]) * 1e3
                        c0 = statistics.median(got[first][f"{read}.cpu"]) * 1e3
                        part = f"{name} {w:.3f} ms wall ({w / w0:.2f}x), {c:.3f} ms CPU ({c / c0:.2f}x)"
                        if f"{read}.server" in got[name]:
                            sv = statistics.median(got[name][f"{read}.server"]) * 1e3
                            sv0 = statistics.median(got[first][f"{read}.server"]) * 1e3
                            part += f", {sv:.3f} ms in the server ({sv / sv0:.2f}x)"
                        parts.append(part)
                    agree = len({frozenset(answers[n][read]) for n in trees}) == 1
                    agree = agree and all(len(answers[n][read]) == 1 for n in trees)
                    same = same and agree
                    size = next(iter(answers[first][read])).split("/")[1]
                    print(
                        f"    {read} ({size} items): "
                        + "; ".join(parts)
                        + f"; same answer: {agree}",
                        flush=True,
                    )
    finally:
        if server is not None:
            server.stop()  # by its PID
        shutil.rmtree(home, ignore_errors=True)
    if not same:
        sys.exit("the trees' answers differ")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--removed", default="1500,6000,86000")
    ap.add_argument("--run-length", type=int, default=100, help="batches a seal")
    ap.add_argument("--runs", type=int, default=3, help="processes a tree and store")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--src", action="append", default=[], metavar="NAME=DIR")
    ap.add_argument("--no-postgres", action="store_true")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args)
    elif args.src:
        _compare(args)
    else:
        ap.error("--src NAME=DIR (twice or more)")


if __name__ == "__main__":
    main()
