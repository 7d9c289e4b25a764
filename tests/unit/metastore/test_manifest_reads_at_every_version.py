"""A manifest read at a version sees exactly the entries visible at it (``added_version <= v <
removed_version``), found from the removed version (the entries live now and those removed
after ``v``) instead of every row added at or before ``v``, which scanned every removed entry
a table keeps until retention expires them (~86,000 a day for a table committing every
second; issue 38). A reader at an older version (time travel, a seal's read at its base
version, a snapshot of the Iceberg view) must see what it saw before: every version of a
table with seals, delete vectors, a compaction, a rollback, a re-ingest and re-commits is read
through the statement used before and through both of today's, on SQLite and PostgreSQL. When
a partition last advanced is read with two index seeks a partition and gives what the scan
of every entry gave; every table's rows are counted from the live entries' partial index."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from sqlalchemy import Connection, and_, func, inspect, or_, select, text
from sqlalchemy.sql import Executable

from millstream.catalog import Catalog
from millstream.metastore import reads
from millstream.metastore import schema as s
from millstream.metastore.store import MetadataStore
from millstream.sealing.compaction import CompactionPolicy
from millstream.sealing.sealer import Sealer
from millstream.table.writer import commit_staged, stage_rows

BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]


@pytest.fixture(params=BACKENDS)
def cat(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Catalog]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'm.db'}"
    else:
        server = request.getfixturevalue("postgres_server")
        url = server.create_database(f"ms_reads_{uuid.uuid4().hex[:12]}")
    with Catalog.open(metadata_url=url, deep_store=str(tmp_path / "deep")) as c:
        c.create_table(
            {"name": "t", "schema": {"id": "long"}, "mode": "upsert", "primary_key": ["id"]}
        )
        yield c


def _commit(cat: Catalog, partition: int, lo: int, ids: list[int], epoch: int = 0) -> None:
    """Rows ``ids`` at offsets ``lo``, ``lo + 1``, ... of ``partition`` (at ``epoch``), one
    staged file."""
    spec = cat.table("t").spec
    n = len(ids)
    rows = pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "_ms_partition": pa.array([partition] * n, pa.int32()),
            "_ms_offset": pa.array(range(lo, lo + n), pa.int64()),
            "_ms_tombstone": pa.array([False] * n),
        }
    )
    staged = stage_rows(cat.deep, spec, rows)
    commit_staged(cat.store, cat.deep, "t", staged, {partition: (lo, lo + n)}, {partition: epoch})


def _old_entries(version: int) -> Executable:
    """The manifest read's statement before the removed version found its rows."""
    e = s.entries
    return (
        select(e.c.id)
        .where(
            e.c.table_name == "t",
            e.c.added_version <= version,
            or_(e.c.removed_version.is_(None), e.c.removed_version > version),
        )
        .order_by(e.c.partition, e.c.seq)
    )


def _old_last_commit_times(conn: Connection) -> dict[int, float]:
    """When each partition last advanced, as read before: a scan of every entry of the table."""
    e = s.entries
    furthest = (
        select(e.c.partition, func.max(e.c.end_offset).label("end_offset"))
        .where(e.c.table_name == "t")
        .group_by(e.c.partition)
        .subquery()
    )
    q = (
        select(e.c.partition, func.min(e.c.created_at))
        .join(
            furthest,
            and_(e.c.partition == furthest.c.partition, e.c.end_offset == furthest.c.end_offset),
        )
        .where(e.c.table_name == "t")
        .group_by(e.c.partition)
    )
    return {int(p): float(t) for p, t in conn.execute(q)}


def _history(cat: Catalog) -> list[dict[int, float]]:
    """Adds, seals (with delete vectors), a compaction, a rollback, a re-ingest and re-commits
    over two partitions; after each step, when each partition last advanced, as read before
    and as read now (they must agree)."""
    sealer = Sealer(cat, "t", compaction=CompactionPolicy(min_segments=2, size_ratio=100.0))
    seen: list[dict[int, float]] = []

    def step() -> None:
        with cat.store.read() as conn:
            old, new = _old_last_commit_times(conn), reads.last_commit_times(conn, "t")
        assert new == old
        seen.append(new)

    offsets, epochs = {0: 0, 1: 0}, {0: 0, 1: 0}

    def commit(partition: int, ids: list[int]) -> None:
        _commit(cat, partition, offsets[partition], ids, epochs[partition])
        offsets[partition] += len(ids)
        step()

    for round_ in range(3):  # three sealed runs in partition 0, keys rewritten each time
        for b in range(3):
            commit(0, list(range(b * 4, b * 4 + 5)))
            commit(1, [100 + round_ * 10 + b])
        assert sealer.seal_partition(0, force=True) is not None
        step()
    assert sealer.compact_partition(0) is not None  # the sealed runs merged, vectors removed
    step()
    assert sealer.seal_partition(1, force=True) is not None
    step()
    commit(0, [1, 2, 3])
    commit(0, [4, 5, 6])
    newest = max((e for e in cat.manifest("t").entries if e.partition == 0), key=lambda e: e.seq)
    cat.store.rollback_partition("t", 0, newest.seq, dry_run=False)  # removes [4, 5, 6]
    offsets[0], epochs[0] = newest.start, 1  # a rollback bumps the shard's epoch
    step()
    commit(0, [7, 8])  # the rolled-back range written again
    one = next(e for e in cat.manifest("t").entries if e.partition == 1)
    cat.store.replace_entry(  # a re-ingest of partition 1's sealed segment
        one, file_path=one.file_path or "", row_count=one.row_count, size_bytes=one.size_bytes
    )
    step()
    commit(1, [200])
    return seen


def test_every_version_reads_the_entries_the_old_statement_read(cat: Catalog) -> None:
    advanced = _history(cat)
    assert sorted(advanced[-1]) == [0, 1]  # both partitions, each step as read before
    info = cat.table("t")
    head = info.manifest_version
    with cat.store.read() as conn:
        removed = conn.execute(
            select(func.count()).where(
                s.entries.c.table_name == "t", s.entries.c.removed_version.is_not(None)
            )
        ).scalar()
        assert removed and removed > 20  # the seals', the compaction's, the rollback's, ...
        for version in range(head + 1):
            params = {"table": "t", "version": version}
            old = [r[0] for r in conn.execute(_old_entries(version))]
            live_at = [r.id for r in conn.execute(reads._LIVE_AT, params)]
            added_by = [r.id for r in conn.execute(reads._ADDED_BY, params)]
            read = [e.id for e in reads.manifest_at(conn, info, version).entries]
            assert live_at == added_by == read == old, version
    assert [e.id for e in cat.manifest("t").entries] == read
    assert cat.manifest("t", as_of=0).entries == ()


def _plan(conn: Connection, stmt: Executable, params: dict[str, object]) -> str:
    """The database's plan of the production statement ``stmt`` with ``params``."""
    compiled = stmt.compile(dialect=conn.dialect)
    bound = compiled.construct_params(params)
    if conn.dialect.name == "sqlite":
        positional = tuple(bound[k] for k in compiled.positiontup or ())
        rows = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + str(compiled), positional).all()
        return " | ".join(str(r[-1]) for r in rows)
    # PostgreSQL: its planner picks by statistics (a table this small is read whole); with
    # sequential scans priced out, a plan shows which indexes can serve the statement
    conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
    rows = conn.exec_driver_sql("EXPLAIN " + str(compiled), bound).all()
    return " | ".join(str(r[0]) for r in rows)


def test_the_reads_find_their_rows_from_the_indexes(cat: Catalog) -> None:
    _history(cat)
    if not cat.store.url.startswith("sqlite"):
        with cat.store.write() as conn:
            conn.exec_driver_sql("ANALYZE ms_entries")  # as autovacuum leaves a busy table
    info = cat.table("t")
    e = s.entries
    rows = select(e.c.table_name, func.sum(e.c.row_count)).where(e.c.removed_version.is_(None))
    with cat.store.read() as conn:
        version = info.manifest_version - 2
        at = _plan(conn, reads._entries_at(conn, info, version), {"table": "t", "version": version})
        counted = _plan(conn, rows.group_by(e.c.table_name), {})
    with cat.store.read() as conn:
        advanced = _plan(conn, reads._LAST_COMMIT_TIMES, {"table": "t"})
    if cat.store.url.startswith("sqlite"):
        assert "ix_entries_live (table_name=?)" in at
        assert "ix_entries_removed (table_name=? AND removed_version>?)" in at
        assert "SCAN ms_entries USING INDEX ix_entries_live" in counted
        assert "ix_entries_end (table_name=? AND partition=? AND end_offset=?)" in advanced
    else:
        # the single statement: the live entries from either index of the removed version,
        # those removed after the version from ix_entries_removed's range (a BitmapOr)
        assert "on ix_entries_removed" in at and "AND (removed_version > " in at
        assert "ix_entries_live" in counted
        assert "ix_entries_end" in advanced
    assert "ix_entries_table_version" not in at and "Seq Scan" not in at


def _index_ddl(conn: Any, name: str) -> str:
    if conn.dialect.name == "sqlite":
        q = "SELECT sql FROM sqlite_master WHERE type = 'index' AND name = :n"
    else:
        q = "SELECT indexdef FROM pg_indexes WHERE indexname = :n"
    return str(conn.execute(text(q), {"n": name}).scalar())


def test_a_new_store_creates_the_live_entries_index_partial(cat: Catalog) -> None:
    with cat.store.read() as conn:
        ddl = _index_ddl(conn, "ix_entries_live")
    assert "removed_version IS NULL" in ddl, ddl


def test_a_version_13_store_gets_the_indexes_when_opened(cat: Catalog) -> None:
    _commit(cat, 0, 0, [1, 2])
    with cat.store.write() as conn:  # what a version 13 database looks like
        conn.execute(text("DROP INDEX ix_entries_live"))
        conn.execute(text("DROP INDEX ix_entries_end"))
        conn.execute(text("UPDATE ms_meta SET value = '13' WHERE key = 'schema_version'"))
    again = MetadataStore(cat.store.url)
    try:
        with again.read() as conn:
            names = {ix["name"] for ix in inspect(conn).get_indexes("ms_entries")}
            version = conn.execute(
                text("SELECT value FROM ms_meta WHERE key = 'schema_version'")
            ).scalar()
            ddl = _index_ddl(conn, "ix_entries_live")
        assert {"ix_entries_live", "ix_entries_end"} <= names
        assert "removed_version IS NULL" in ddl, ddl  # partial on either store
        assert version == str(s.LATEST_SCHEMA_VERSION) == "14"
        assert [e.row_count for e in again.manifest("t").entries] == [2]
    finally:
        again.dispose()
