"""Commit and read benchmark: how fast batches commit, and what a merged read costs.

Run from the repository root::

    .venv/bin/python bench/commit.py            # full run, ~2.5 minutes on 2 cores
    .venv/bin/python bench/commit.py --quick    # smoke test, well under a minute

Part A (commit) - writers commit micro-batches of 4 partitions x 1000 rows to one upsert table:

* ``metadata only``: ``MetadataStore.compare_and_append`` with a placeholder file path, so every
  commit records the same entries, shard and version rows as a real one but writes no Parquet.
* ``stage + commit``: ``stage_rows`` (one zstd Parquet file of 4000 rows) + ``commit_staged``.

Each runs with 1 writer, with 4 writers racing on the same partitions and offsets (active-active
replicas: each batch is committed once, the others find it committed and drop it), and with 4
writers on disjoint partitions (no lost races, but every commit bumps the same table row).
Writers are separate processes (multiprocessing "spawn") released together; each runs for a
fixed time. Both SQLite (the embedded default) and PostgreSQL (a throwaway server started here
with harness.servers.PostgresServer) are measured.

Part B (read) - an upsert table of N keys x 5 updates, written as 20 commits across 4
partitions, read through ``Catalog.read_table`` and, for comparison, as plain Parquet with
``pyarrow.parquet.read_table`` on the same files; then the read is broken down by stage.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import multiprocessing as mp
import os
import shutil
import sqlite3
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import common
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from rich import box
from rich.console import Console
from rich.table import Table

from harness.servers import PostgresServer, ServerStartError, find_postgres_bin_dir
from millstream.catalog import Catalog
from millstream.core import merge
from millstream.core.engines import engine_for
from millstream.errors import CommitConflictError
from millstream.metastore.models import ShardAppend
from millstream.metastore.store import MetadataStore
from millstream.spec import OFFSET_COL, PARTITION_COL, SYSTEM_COLUMNS, TOMBSTONE_COL, TableSpec
from millstream.storage.deepstore import DeepStore, table_data_prefix
from millstream.table.read import read_entries
from millstream.table.writer import commit_staged, stage_rows

PARTITIONS_PER_COMMIT = 4
ROWS_PER_PARTITION = 1000
COMMIT_TABLE = "bench_commit"
READ_TABLE = "bench_read"
MAX_WRITERS = 4

SCHEMA = {"id": "long", "amount": "double", "label": "string", "ts": "timestamp"}


def table_spec(
    name: str, *, partitioned_by_key: bool = False, string_key: bool = False
) -> TableSpec:
    """The benches' upsert table; ``string_key``: its ``id`` a string (``order-<n>``)."""
    return TableSpec.parse(
        {
            "name": name,
            "schema": SCHEMA | {"id": "string"} if string_key else SCHEMA,
            "primary_key": ["id"],
            "mode": "upsert",
            "partitioned_by_key": partitioned_by_key,
        }
    )


@dataclass(frozen=True)
class Settings:
    quick: bool
    commit_seconds: float
    read_keys: int
    read_updates: int
    read_commits: int
    read_partitions: int
    read_repeats: int

    @classmethod
    def for_mode(cls, quick: bool) -> Settings:
        if quick:
            return cls(True, 1.0, 40_000, 5, 20, 4, 2)
        return cls(False, 8.0, 200_000, 5, 20, 4, 7)


# ---------------------------------------------------------------------------------------------
# Part A: commits. Worker processes.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WriterTask:
    url: str
    deep_root: str
    table: str
    workload: str  # "meta" | "stage"
    writer: int
    partitions: tuple[int, ...]
    seconds: float
    hold_sqlite_connection: bool = False


@dataclass
class WriterResult:
    writer: int
    pid: int
    attempts: int = 0
    committed: int = 0
    lost_race: int = 0
    cas_retries: int = 0
    gave_up: int = 0
    rows_committed: int = 0
    stage_s: list[float] = field(default_factory=list)
    commit_s: list[float] = field(default_factory=list)
    started: float = 0.0
    ended: float = 0.0
    error: str | None = None


def _batch_template(spec: TableSpec, partitions: tuple[int, ...]) -> tuple[pa.Table, np.ndarray]:
    """One batch's rows (all columns but the offsets, which change per batch) and the
    per-row offset within the batch."""
    n = ROWS_PER_PARTITION * len(partitions)
    rng = np.random.default_rng(42)
    within = np.tile(np.arange(ROWS_PER_PARTITION, dtype=np.int64), len(partitions))
    part = np.repeat(np.asarray(partitions, dtype=np.int32), ROWS_PER_PARTITION)
    ids = rng.integers(0, 1_000_000, n, dtype=np.int64)
    rows = pa.table(
        {
            "id": ids,
            "amount": rng.random(n),
            "label": pa.array([f"label-{i % 977}" for i in ids.tolist()]),
            "ts": pa.array(
                np.full(n, 1_700_000_000_000_000, dtype=np.int64) + within,
                pa.timestamp("us", tz="UTC"),
            ),
            PARTITION_COL: pa.array(part, pa.int32()),
            OFFSET_COL: pa.array(within),
            TOMBSTONE_COL: pa.array(np.zeros(n, dtype=bool)),
        }
    )
    return rows.cast(spec.arrow_schema(system_columns=True)), within


def _run_writer(task: WriterTask, go: Callable[[], float]) -> WriterResult:
    res = WriterResult(task.writer, os.getpid())
    store = MetadataStore(task.url)
    deep = DeepStore.from_uri(task.deep_root)
    spec = store.get_table(task.table).spec
    template, within = _batch_template(spec, task.partitions)
    offset_idx = template.schema.get_field_index(OFFSET_COL)
    keep: sqlite3.Connection | None = None
    if task.hold_sqlite_connection and store.is_sqlite:
        # Diagnostic only: an idle connection keeps SQLite from checkpointing and deleting the
        # WAL whenever the store's last connection closes (it did after every transaction
        # while the store used NullPool).
        keep = sqlite3.connect(task.url.removeprefix("sqlite:///"))
        keep.execute("SELECT 1 FROM ms_meta").fetchall()
    prefix = table_data_prefix(task.table)
    start_at = go()  # blocks until every writer of the run is ready
    while time.time() < start_at:
        time.sleep(0.0005)
    res.started = time.time()
    deadline = time.perf_counter() + task.seconds
    k = 0
    while time.perf_counter() < deadline:
        lo, hi = k * ROWS_PER_PARTITION, (k + 1) * ROWS_PER_PARTITION
        conflicts_before = store.conflicts
        t0 = time.perf_counter()
        try:
            if task.workload == "stage":
                offsets = pa.array(within + lo)
                rows = template.set_column(offset_idx, OFFSET_COL, offsets)
                staged = stage_rows(deep, spec, rows, name_hint=f"w{task.writer}")
                t1 = time.perf_counter()
                out = commit_staged(
                    store, deep, task.table, staged,
                    {p: (lo, hi) for p in task.partitions}, {},
                    writer_id=f"w{task.writer}", batch_id=k,
                )  # fmt: skip
            else:
                t1 = t0
                path = f"{prefix}/meta-w{task.writer}-{k}.parquet"
                appends = [
                    ShardAppend(p, lo, hi, 0, path, ROWS_PER_PARTITION, 100_000)
                    for p in task.partitions
                ]
                out = store.compare_and_append(
                    task.table, appends, writer_id=f"w{task.writer}", batch_id=k
                )
        except CommitConflictError:
            res.gave_up += 1
            res.cas_retries += store.conflicts - conflicts_before
            res.attempts += 1
            k += 1
            continue
        t2 = time.perf_counter()
        res.attempts += 1
        res.stage_s.append(t1 - t0)
        res.commit_s.append(t2 - t1)
        res.cas_retries += store.conflicts - conflicts_before
        if out.version is not None:
            res.committed += 1
            res.rows_committed += sum(
                s.decision.end - s.decision.start for s in out.shards if s.decision.appends
            )
        if out.lost_race:
            res.lost_race += 1
        k += 1
    res.ended = time.time()
    if keep is not None:
        keep.close()
    store.dispose()
    return res


def _handshake(inbox: Any, outbox: Any, writer: int) -> float:
    """Tell the parent this writer is ready; return the start time it sends back."""
    outbox.put(("ready", writer))
    return float(inbox.get())


def _worker_main(inbox: Any, outbox: Any) -> None:
    """A long-lived writer process: runs one WriterTask per message until it gets None."""
    while True:
        task = inbox.get()
        if task is None:
            return

        try:
            result = _run_writer(task, functools.partial(_handshake, inbox, outbox, task.writer))
        except Exception as exc:  # reported by the parent, which stops the run
            result = WriterResult(task.writer, os.getpid(), error=f"{type(exc).__name__}: {exc}")
        outbox.put(("done", result))


class WriterPool:
    """MAX_WRITERS spawned processes, reused across runs (spawning costs ~1 s each)."""

    def __init__(self, n: int) -> None:
        ctx = mp.get_context("spawn")
        self.outbox = ctx.Queue()
        self.inboxes = [ctx.Queue() for _ in range(n)]
        self.procs = [
            ctx.Process(target=_worker_main, args=(q, self.outbox), name=f"bench-writer-{i}")
            for i, q in enumerate(self.inboxes)
        ]
        for p in self.procs:
            p.start()

    def run(self, tasks: list[WriterTask]) -> list[WriterResult]:
        for i, task in enumerate(tasks):
            self.inboxes[i].put(task)
        results: list[WriterResult] = []
        ready = 0
        while len(results) < len(tasks):
            kind, payload = self.outbox.get(timeout=600)
            if kind == "ready":
                ready += 1
                if ready == len(tasks):
                    start_at = time.time() + 0.05
                    for i in range(len(tasks)):
                        self.inboxes[i].put(start_at)
            else:
                results.append(payload)
                if payload.error is not None and ready < len(tasks):
                    raise RuntimeError(f"writer {payload.writer} failed: {payload.error}")
        errors = [r.error for r in results if r.error]
        if errors:
            raise RuntimeError(f"writer failed: {errors[0]}")
        if len({r.pid for r in results}) != len(tasks):
            raise RuntimeError("writers did not run in separate processes")
        return sorted(results, key=lambda r: r.writer)

    def close(self) -> None:
        for q in self.inboxes:
            with contextlib.suppress(Exception):
                q.put(None)
        for p in self.procs:
            p.join(timeout=20)
            if p.is_alive():  # by its own Process object / PID, never by name
                p.terminate()
                p.join(timeout=5)


@dataclass
class CommitRow:
    backend: str
    workload: str
    writers: str
    seconds: float
    attempts: int
    committed: int
    lost_race: int
    cas_retries: int
    gave_up: int
    rows_committed: int
    stage_ms_p50: float | None
    commit_ms_p50: float
    commit_ms_p95: float
    manifest_version: int

    @property
    def commits_per_s(self) -> float:
        return self.committed / self.seconds

    @property
    def rows_per_s(self) -> float:
        return self.rows_committed / self.seconds


WRITER_MODES = {
    "1": (1, False),
    "4 racing": (4, False),  # same partitions and offsets: active-active replicas
    "4 disjoint": (4, True),  # writer w owns partitions 4w..4w+3
}


def run_commit_case(
    pool: WriterPool,
    backend: str,
    url: str,
    deep_root: str,
    workload: str,
    writers: str,
    seconds: float,
    *,
    hold_sqlite_connection: bool = False,
) -> CommitRow:
    n, disjoint = WRITER_MODES[writers]
    setup = MetadataStore(url)
    setup.create_table(table_spec(COMMIT_TABLE))
    setup.dispose()  # hold no connection (a pooled SQLite one would keep the WAL open)
    tasks = []
    for w in range(n):
        first = w * PARTITIONS_PER_COMMIT if disjoint else 0
        parts = tuple(range(first, first + PARTITIONS_PER_COMMIT))
        tasks.append(
            WriterTask(url, deep_root, COMMIT_TABLE, workload, w, parts, seconds,
                       hold_sqlite_connection)
        )  # fmt: skip
    results = pool.run(tasks)
    wall = max(r.ended for r in results) - min(r.started for r in results)
    check = MetadataStore(url)
    version = check.get_table(COMMIT_TABLE).manifest_version
    check.dispose()
    stage = [x for r in results for x in r.stage_s]
    commit = [x for r in results for x in r.commit_s]
    row = CommitRow(
        backend=backend,
        workload="metadata only" if workload == "meta" else "stage + commit",
        writers=writers + (" +idle conn" if hold_sqlite_connection else ""),
        seconds=wall,
        attempts=sum(r.attempts for r in results),
        committed=sum(r.committed for r in results),
        lost_race=sum(r.lost_race for r in results),
        cas_retries=sum(r.cas_retries for r in results),
        gave_up=sum(r.gave_up for r in results),
        rows_committed=sum(r.rows_committed for r in results),
        stage_ms_p50=common.percentile(stage, 50) * 1000 if workload == "stage" else None,
        commit_ms_p50=common.percentile(commit, 50) * 1000,
        commit_ms_p95=common.percentile(commit, 95) * 1000,
        manifest_version=version,
    )
    if row.manifest_version != row.committed:
        print(
            f"WARNING: {backend}/{row.workload}/{writers}: the table is at manifest version "
            f"{row.manifest_version} but writers counted {row.committed} commits"
        )
    return row


# ---------------------------------------------------------------------------------------------
# Part B: reads.
# ---------------------------------------------------------------------------------------------


@dataclass
class ReadReport:
    total_rows: int
    keys: int
    files: int
    data_bytes: int
    write_s: float
    timings_ms: dict[str, list[float]]

    def median(self, name: str) -> float:
        return statistics.median(self.timings_ms[name])


def _timed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[float, Any]:
    """Milliseconds ``fn(*args, **kwargs)`` took, and its result."""
    out, seconds = common.timed(fn, *args, **kwargs)
    return seconds * 1000, out


def _last_per_key(ordered: pa.Table, keys: list[str]) -> pa.Table:
    picked = ordered.group_by(keys, use_threads=False).aggregate([(merge.IDX, "max")])
    return ordered.take(picked.column(f"{merge.IDX}_max"))


def _read_once(
    cat: Catalog, spec: TableSpec, abs_paths: list[str], rec: Callable[[str, float], None]
) -> None:
    """One repetition: the end-to-end read, the plain-Parquet baseline, then the same read
    stage by stage (what ``read_manifest`` does, timed separately)."""
    rec("Catalog.read_table", _timed(cat.read_table, READ_TABLE)[0])
    rec("pq.read_table (same files)", _timed(pq.read_table, abs_paths)[0])

    ms, man = _timed(cat.manifest, READ_TABLE)
    rec("manifest (metadata query)", ms)
    ms, raw = _timed(read_entries, cat.deep, spec, man.entries)
    rec("file read (read_entries)", ms)
    ms, resolved = _timed(engine_for(spec).resolve, raw)
    rec("merge resolve (MergeEngine.resolve)", ms)
    rec("drop system columns", _timed(resolved.drop_columns, list(SYSTEM_COLUMNS))[0])

    # Inside resolve (upsert): the pyarrow calls the upsert engine makes, one at a time.
    sort_keys = [(k, o, "at_end") for k, o in merge.order_sort_keys(spec)]
    ms, idx = _timed(pc.sort_indices, raw, sort_keys=sort_keys)
    rec("  order-key sort (sort_indices)", ms)
    ms, ordered = _timed(raw.take, idx)
    rec("  reorder rows (take)", ms)
    n = ordered.num_rows
    rec("  row index (pa.array(range(n)))", _timed(pa.array, range(n), pa.int64())[0])
    ms, index = _timed(pa.array, np.arange(n, dtype=np.int64))
    rec("  (same index built with numpy)", ms)
    ordered = ordered.append_column(merge.IDX, index)
    ms, last = _timed(_last_per_key, ordered, list(spec.primary_key))
    rec("  last row per key (group_by + take)", ms)
    rec("  restore order (sort_by)", _timed(last.sort_by, [(merge.IDX, "ascending")])[0])


def _string_ids(ids: np.ndarray) -> pa.Array:
    return pc.binary_join_element_wise("order-", pa.array(ids).cast(pa.string()), "")


def build_read_table(
    cat: Catalog, s: Settings, *, partitioned_by_key: bool = False, string_key: bool = False
) -> tuple[float, int]:
    """Write keys x updates rows as ``read_commits`` commits over ``read_partitions`` partitions.

    Keys are partition-affine (key k lives on partition k % P). Each partition's stream is
    ``updates`` rounds; every round updates each of the partition's keys once, in a fresh
    random order, so the last update of a key is in the last round. ``string_key``: key k is
    the string ``order-<k>``.
    """
    named = table_spec(READ_TABLE, partitioned_by_key=partitioned_by_key, string_key=string_key)
    spec = cat.create_table(named).spec
    n_part = s.read_partitions
    keys_per_part = s.read_keys // n_part
    stream_len = keys_per_part * s.read_updates
    per_commit = stream_len // s.read_commits
    rng = np.random.default_rng(7)
    # order[p][round] = the partition-local key index at each position of that round
    order = [[rng.permutation(keys_per_part) for _ in range(s.read_updates)]
             for _ in range(n_part)]  # fmt: skip
    labels = np.array([f"label-{i}" for i in range(997)], dtype=object)
    t0 = time.perf_counter()
    for c in range(s.read_commits):
        lo, hi = c * per_commit, (c + 1) * per_commit
        if c == s.read_commits - 1:
            hi = stream_len
        parts = []
        for p in range(n_part):
            off = np.arange(lo, hi, dtype=np.int64)
            rnd, pos = off // keys_per_part, off % keys_per_part
            local = np.empty(len(off), dtype=np.int64)
            for r in np.unique(rnd):
                m = rnd == r
                local[m] = order[p][r][pos[m]]
            ids = local * n_part + p
            parts.append(
                pa.table(
                    {
                        "id": _string_ids(ids) if string_key else ids,
                        "amount": rnd.astype(np.float64),  # = the update round
                        "label": pa.array(labels[ids % 997]),
                        "ts": pa.array(1_700_000_000_000_000 + off, pa.timestamp("us", tz="UTC")),
                        PARTITION_COL: pa.array(np.full(len(off), p, dtype=np.int32)),
                        OFFSET_COL: off,
                        TOMBSTONE_COL: np.zeros(len(off), dtype=bool),
                    }
                )
            )
        staged = stage_rows(cat.deep, spec, pa.concat_tables(parts), name_hint="read")
        out = commit_staged(
            cat.store, cat.deep, READ_TABLE, staged, {p: (lo, hi) for p in range(n_part)}, {}
        )
        assert out.version is not None
    return time.perf_counter() - t0, stream_len * n_part


def run_read_bench(home: Path, s: Settings) -> ReadReport:
    timings: dict[str, list[float]] = {}

    def rec(name: str, ms: float) -> None:
        timings.setdefault(name, []).append(ms)

    with Catalog.open(home=home) as cat:
        write_s, total_rows = build_read_table(cat, s)
        manifest = cat.manifest(READ_TABLE)
        spec = manifest.table.spec
        paths = sorted({e.file_path for e in manifest.entries if e.file_path})
        abs_paths = [f"{cat.deep.root}/{p}" for p in paths]
        data_bytes = sum(os.path.getsize(p) for p in abs_paths)
        keys = s.read_keys // s.read_partitions * s.read_partitions

        # Warm the page cache and check both reads return what they should.
        plain = pq.read_table(abs_paths)
        assert plain.num_rows == total_rows, (plain.num_rows, total_rows)
        current = cat.read_table(READ_TABLE)
        assert current.num_rows == keys, (current.num_rows, keys)
        last_round = float(s.read_updates - 1)
        assert pc.all(pc.equal(current.column("amount"), last_round)).as_py(), "stale rows"
        del plain, current

        for _ in range(s.read_repeats):
            _read_once(cat, spec, abs_paths, rec)

    return ReadReport(total_rows, keys, len(paths), data_bytes, write_s, timings)


# ---------------------------------------------------------------------------------------------
# Environment and output.
# ---------------------------------------------------------------------------------------------


def fdatasync_ms(directory: Path, n: int = 30) -> float:
    """Median latency of a 4 KiB write + fdatasync in ``directory`` (what a durable commit waits
    for at least once)."""
    path = directory / "fsync-probe"
    lat = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for i in range(n):
            os.pwrite(fd, os.urandom(4096), (i % 8) * 4096)
            t0 = time.perf_counter()
            os.fdatasync(fd)
            lat.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
        path.unlink()
    return statistics.median(lat) * 1000


def pg_settings(server: PostgresServer) -> dict[str, str]:
    import psycopg

    with psycopg.connect(server.dsn(), connect_timeout=10) as conn:
        out = {}
        for name in ("server_version", "fsync", "synchronous_commit"):
            row = conn.execute(f"SHOW {name}").fetchone()
            out[name] = str(row[0]) if row else "?"
        return out


def fmt(x: float | None, digits: int = 0) -> str:
    if x is None or x != x:
        return "-"
    return f"{x:,.{digits}f}"


def commit_table(rows: list[CommitRow]) -> Table:
    t = Table(
        title="A. Commits (4 partitions x 1000 rows per commit)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
    )
    for col, justify in [
        ("backend", "left"), ("workload", "left"), ("writers", "left"),
        ("commits/s", "right"), ("rows/s", "right"), ("attempts", "right"),
        ("lost race", "right"), ("CAS retries", "right"),
        ("stage p50", "right"), ("commit p50", "right"), ("commit p95", "right"),
    ]:  # fmt: skip
        t.add_column(col, justify=justify, no_wrap=True)
    for r in rows:
        t.add_row(
            r.backend, r.workload, r.writers,
            fmt(r.commits_per_s, 1),
            fmt(r.rows_per_s) if r.workload != "metadata only" else "-",
            str(r.attempts), str(r.lost_race),
            str(r.cas_retries) + (f" ({r.gave_up} gave up)" if r.gave_up else ""),
            fmt(r.stage_ms_p50, 1), fmt(r.commit_ms_p50, 1), fmt(r.commit_ms_p95, 1),
        )  # fmt: skip
    return t


def read_table_out(rep: ReadReport) -> Table:
    t = Table(
        title=(
            f"B. Read: upsert table, {rep.keys:,} keys x {rep.total_rows // rep.keys} updates = "
            f"{rep.total_rows:,} rows in {rep.files} files ({rep.data_bytes / 1e6:.1f} MB)"
        ),
        title_justify="left",
        box=box.SIMPLE_HEAD,
    )
    t.add_column("step", no_wrap=True)
    t.add_column("median ms", justify="right")
    t.add_column("min ms", justify="right")
    for name, values in rep.timings_ms.items():
        t.add_row(name, fmt(statistics.median(values), 1), fmt(min(values), 1))
    return t


@contextlib.contextmanager
def postgres(base: Path, console: Console) -> Iterator[PostgresServer | None]:
    if find_postgres_bin_dir() is None:
        console.print(
            "skipped: PostgreSQL - server binaries (initdb, postgres) not found; install "
            "them (apt-get install -y postgresql) or set MILLSTREAM_PG_BIN"
        )
        yield None
        return
    server = PostgresServer(base / "pg")
    try:
        server.start()
    except ServerStartError as exc:
        console.print(f"skipped: PostgreSQL - server did not start: {str(exc).splitlines()[0]}")
        yield None
        return
    try:
        yield server
    finally:
        server.stop()  # by its PID


def run_commit_part(
    s: Settings, base: Path, console: Console, env: dict[str, Any], *, use_postgres: bool
) -> list[CommitRow]:
    rows: list[CommitRow] = []
    pool = WriterPool(MAX_WRITERS)
    try:
        with postgres(base, console) if use_postgres else contextlib.nullcontext() as pg:
            if pg is not None:
                settings = pg_settings(pg)
                env["postgresql"] = (
                    f"{settings['server_version']} (fsync={settings['fsync']}, "
                    f"synchronous_commit={settings['synchronous_commit']})"
                )
            elif not use_postgres:
                console.print("skipped: PostgreSQL - --no-postgres")
            _print_env(console, env)
            run_no = 0

            def case(backend: str, workload: str, writers: str, *, hold: bool = False) -> None:
                nonlocal run_no
                run_no += 1
                run_dir = base / f"run{run_no}"
                if backend == "SQLite":
                    url = f"sqlite:///{run_dir / 'metadata.db'}"
                else:
                    assert pg is not None
                    url = pg.create_database(f"bench_{run_no}")
                row = run_commit_case(
                    pool, backend, url, str(run_dir / "deep"), workload, writers,
                    s.commit_seconds, hold_sqlite_connection=hold,
                )  # fmt: skip
                rows.append(row)
                console.print(
                    f"  {backend:10} {row.workload:15} {row.writers:14} "
                    f"{row.commits_per_s:8.1f} commits/s  ({row.committed} commits, "
                    f"{row.lost_race} lost races, {row.cas_retries} CAS retries)"
                )
                shutil.rmtree(run_dir, ignore_errors=True)

            console.print(f"A. commits: {s.commit_seconds:g} s per case")
            backends = ["SQLite"] + (["PostgreSQL"] if pg is not None else [])
            for backend in backends:
                for workload in ("meta", "stage"):
                    for writers in WRITER_MODES:
                        case(backend, workload, writers)
                        if (backend, workload, writers) == ("SQLite", "meta", "1"):
                            # Diagnostic, run right after its reference case: the same
                            # commits with an idle connection held open, so closing the
                            # store's per-transaction connection does not checkpoint the WAL.
                            case(backend, workload, writers, hold=True)
    finally:
        pool.close()
    return rows


COMMIT_NOTES = (
    "commits/s and rows/s count committed work only (each batch once); 'lost race' = attempts "
    "that found their range already committed by another writer (DROP/TRIM); 'CAS retries' = "
    "transactions re-run after a lost compare-and-set. 'stage' = stage_rows (Parquet write), "
    "'commit' = compare_and_append / commit_staged, in ms, percentiles over every attempt of "
    "every writer. '4 racing' = 4 writers committing the same partitions and offsets "
    "(active-active replicas); '4 disjoint' = 4 writers on their own partitions of the same "
    "table. '+idle conn' is a diagnostic: the same run with one extra idle SQLite connection "
    "held open; if it is much faster than the row above, the store closes its connection "
    "after each transaction and SQLite checkpoints the WAL on every commit."
)

BREAKDOWN = (
    "manifest (metadata query)",
    "file read (read_entries)",
    "merge resolve (MergeEngine.resolve)",
    "drop system columns",
)


def print_read_summary(console: Console, rep: ReadReport, s: Settings) -> float:
    read = rep.median("Catalog.read_table")
    plain = rep.median("pq.read_table (same files)")
    ratio = read / plain
    staged = {name: rep.median(name) for name in BREAKDOWN}
    total = sum(staged.values())
    console.print(
        f"Catalog.read_table / plain pq.read_table = {ratio:.1f}x ({read:.0f} ms vs "
        f"{plain:.0f} ms, medians of {s.read_repeats}). Stage by stage (sum {total:.0f} ms): "
        f"file read {staged[BREAKDOWN[1]] / total:.0%}, merge resolve "
        f"{staged[BREAKDOWN[2]] / total:.0%}, manifest {staged[BREAKDOWN[0]] / total:.0%}. "
        f"Writing the table took {rep.write_s:.1f} s ({rep.total_rows / rep.write_s:,.0f} rows/s)."
    )
    return ratio


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke-test sizes (< 60 s)")
    ap.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    ap.add_argument("--workdir", type=Path, help="scratch directory (default: a temp dir)")
    ap.add_argument("--no-postgres", action="store_true", help="skip PostgreSQL")
    ap.add_argument(
        "--only", choices=["commit", "read"], help="run only part A (commit) or B (read)"
    )
    args = ap.parse_args(argv)
    s = Settings.for_mode(args.quick)
    console = Console(width=150, highlight=False)
    began = time.perf_counter()

    rows: list[CommitRow] = []
    rep: ReadReport | None = None
    with common.workdir("millstream-bench-", parent=args.workdir) as base:
        m = common.machine("millstream", "pyarrow", "numpy", "sqlalchemy")
        env: dict[str, Any] = {
            "mode": "quick" if s.quick else "full",
            "cpu": f"{m['cores']} cores, {m['cpu']}",
            "python": m["python"],
            "millstream": m["millstream"],
            "pyarrow": m["pyarrow"],
            "numpy": m["numpy"],
            "sqlalchemy": m["sqlalchemy"],
            "sqlite": sqlite3.sqlite_version,
            "platform": m["platform"],
            "fdatasync_ms_p50": round(fdatasync_ms(base), 2),
            "loadavg_start": common.load_text(),
        }
        if common.busy(0.5):
            console.print(
                f"WARNING: the machine is busy (load average {common.load_text()}) before the "
                "benchmark starts; the figures below will be lower and noisier than on an idle "
                "machine."
            )
        if args.only != "read":
            rows = run_commit_part(s, base, console, env, use_postgres=not args.no_postgres)
        if args.only != "commit":
            console.print("B. read: writing the table ...")
            rep = run_read_bench(base / "read", s)
    env["loadavg_end"] = common.load_text()

    console.print()
    _print_env(console, env)
    ratio = None
    if rows:
        console.print(commit_table(rows))
        console.print(COMMIT_NOTES)
        console.print()
    if rep is not None:
        console.print(read_table_out(rep))
        ratio = print_read_summary(console, rep, s)
    console.print(f"total bench time {time.perf_counter() - began:.0f} s")
    if args.json:
        payload = {
            "env": env,
            "commits": [
                {**asdict(r), "commits_per_s": r.commits_per_s, "rows_per_s": r.rows_per_s}
                for r in rows
            ],
            "read": None if rep is None else asdict(rep) | {"ratio": ratio},
        }
        common.write_json(args.json, payload)
    return 0


def _print_env(console: Console, env: dict[str, Any]) -> None:
    console.print("machine: " + "; ".join(f"{k}={v}" for k, v in env.items()))


if __name__ == "__main__":
    sys.exit(main())
