"""A table's removed entries stay in ``ms_entries`` until retention expires them (24 h by
default: ~86,000 rows a day for a table committing every second). The reads a worker makes of
each busy table over and over (a sealing pass's count of the entries removed since its last
read, a seal's claim of a partition's live entries) find their rows through
``ix_entries_removed`` and no longer scan every removed row of the table (issue 38: the
worker's own process grew with them). A store made before the index gets it when opened."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Connection, inspect, select, text
from sqlalchemy.sql import Select

from harness.publish_support import commit_ids
from millstream.catalog import Catalog
from millstream.metastore import reads
from millstream.metastore import schema as s
from millstream.metastore.store import MetadataStore
from millstream.sealing.sealer import Sealer
from millstream.spec import TableSpec

SPEC = TableSpec.parse({"name": "t", "schema": {"id": "long"}})


@pytest.fixture
def cat(tmp_path: Path) -> Iterator[Catalog]:
    """A table whose first 6 entries were sealed (removed) and 2 more committed after."""
    with Catalog.open(
        metadata_url=f"sqlite:///{tmp_path / 'm.db'}", deep_store=str(tmp_path / "deep")
    ) as c:
        c.create_table(SPEC)
        for batch in range(8):
            commit_ids(c, "t", batch * 10, 10)
            if batch == 5:
                assert Sealer(c, "t").seal_partition(0, force=True) is not None
        yield c


def _plan(conn: Connection, stmt: Select[tuple[object, ...]], params: dict[str, object]) -> str:
    """SQLite's plan of the production statement ``stmt`` with ``params``."""
    compiled = stmt.compile(dialect=conn.dialect)
    bound = compiled.construct_params(params)
    positional = tuple(bound[k] for k in compiled.positiontup or ())
    rows = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + str(compiled), positional).all()
    return " | ".join(str(r[-1]) for r in rows)


def test_the_removals_since_a_version_are_counted_from_the_index(cat: Catalog) -> None:
    version = cat.table("t").manifest_version
    with cat.store.read() as conn:
        plan = _plan(conn, reads._REMOVED_SINCE, {"table": "t", "after": 0, "version": version})
    assert "ix_entries_removed (table_name=? AND removed_version>? AND removed_version<?)" in plan
    # and the count is the removals': the seal removed the 6 entries it sealed
    assert cat.store.manifest_changes("t", after=0).removed == 6


def test_a_partitions_live_entries_are_found_from_the_index(cat: Catalog) -> None:
    e = s.entries
    live = select(e).where(e.c.table_name == "t", e.c.partition == 0, e.c.removed_version.is_(None))
    with cat.store.read() as conn:
        plan = _plan(conn, live, {})
        found = reads.live_entries(conn, "t", 0)
    assert "ix_entries_removed (table_name=? AND removed_version=? AND partition=?)" in plan
    assert len(found) == 3  # the sealed segment and the 2 entries committed after it


def test_a_version_12_store_gets_the_index_when_opened(cat: Catalog) -> None:
    with cat.store.write() as conn:  # what a version 12 database looks like
        conn.execute(text("DROP INDEX ix_entries_removed"))
        conn.execute(text("UPDATE ms_meta SET value = '12' WHERE key = 'schema_version'"))
    again = MetadataStore(cat.store.url)
    try:
        with again.read() as conn:
            names = {ix["name"] for ix in inspect(conn).get_indexes("ms_entries")}
            version = conn.execute(
                text("SELECT value FROM ms_meta WHERE key = 'schema_version'")
            ).scalar()
        assert "ix_entries_removed" in names
        assert version == str(s.LATEST_SCHEMA_VERSION)
        assert again.manifest_changes("t", after=0).removed == 6
    finally:
        again.dispose()
