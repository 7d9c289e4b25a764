"""A shared query's commit of N busy tables on PostgreSQL (issue 38): a constant number of
statements whatever N (one read of the table rows, one of the shards, one statement of each
kind of write for them all), and every table's compare-and-set still checked: a concurrent
writer that moves one table's shard between the commit's read and its write is detected, that
table alone is decided again from a fresh read, and the other tables' rows land.

Guards 424-425 (docs/design.md): without the fallback to a savepoint per table, the moved shard's
conflict fails every table's commit.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, event, text

from harness.contract_support import EVENTS, stage
from millstream.catalog import Catalog
from millstream.core.frontier import Outcome
from millstream.datastream import dead_letter_spec
from millstream.metastore import append as append_module
from millstream.table.commit import BatchCommit, StagedWrite, TableBatch, commit_many

pytestmark = pytest.mark.postgres


@pytest.fixture
def url(postgres_server: Any) -> str:
    return str(postgres_server.create_database(f"ms_mt_{uuid.uuid4().hex[:12]}"))


@pytest.fixture
def cat(url: str, tmp_path: Path) -> Iterator[Catalog]:
    with Catalog.open(metadata_url=url, deep_store=str(tmp_path / "deep")) as c:
        yield c


def names(n: int) -> list[str]:
    return [f"t{i:02d}" for i in range(n)]


def create(cat: Catalog, tables: list[str]) -> None:
    for t in tables:
        cat.create_table(dead_letter_spec(t))
        cat.create_table({**EVENTS, "name": t})
        cat.store.ensure_shards(t, {0: 0}, together_with=[dead_letter_spec(t).name])


def staged(cat: Catalog, tables: list[str], lo: int, hi: int) -> dict[str, TableBatch]:
    """One batch of every table (records [lo, hi) of partition 0 each), staged."""
    return {
        t: TableBatch(
            t,
            [StagedWrite({0: (lo, hi)}, stage(cat, {0: (lo, hi)}, table=t))],
            dead_letter_table=dead_letter_spec(t).name,
            writer_id="w1",
            batch_id=lo,
        )
        for t in tables
    }


def commit(cat: Catalog, batches: dict[str, TableBatch]) -> dict[str, BatchCommit]:
    """The batches through the shared query's commit."""
    out = commit_many(cat.store, cat.deep, batches)
    assert all(isinstance(r, BatchCommit) for r in out.values()), out
    return {k: r for k, r in out.items() if isinstance(r, BatchCommit)}


def batch(cat: Catalog, tables: list[str], lo: int, hi: int) -> dict[str, BatchCommit]:
    return commit(cat, staged(cat, tables, lo, hi))


def statements(cat: Catalog, tables: list[str], lo: int, hi: int) -> int:
    """The statements the commit of one batch of ``tables`` sends."""
    batches = staged(cat, tables, lo, hi)
    seen: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    event.listen(cat.store.engine, "before_cursor_execute", count)
    try:
        commit(cat, batches)
    finally:
        event.remove(cat.store.engine, "before_cursor_execute", count)
    return len(seen)


def test_a_batch_of_many_tables_costs_as_many_statements_as_one_of_few(cat: Catalog) -> None:
    few, many = names(3), names(24)
    create(cat, many)
    batch(cat, many, 0, 10)  # every table has a version and its shard moved once
    counts = (statements(cat, few, 10, 20), statements(cat, many[3:], 10, 20))
    assert counts[0] == counts[1], f"3 tables: {counts[0]} statements, 21 tables: {counts[1]}"
    assert counts[1] < 21, counts  # one round trip per table or more before
    assert {cat.manifest(t).version for t in many} == {2}
    assert {sh.upper for t in many for sh in cat.store.list_shards(t)} == {20}


def test_a_concurrent_writers_move_of_one_table_is_detected_and_the_others_land(
    cat: Catalog, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    tables = names(6)
    create(cat, tables)
    batch(cat, tables, 0, 10)
    other = create_engine(url)
    real = append_module.shards_of_tables
    moves: list[int] = []

    def a_writer_moves_t03_meanwhile(*args: Any, **kwargs: Any) -> Any:
        """Right after the commit read the shards, another transaction changes t03's shard
        row (its version moves; its upper stays) and commits."""
        read = real(*args, **kwargs)
        with other.begin() as conn:
            conn.execute(
                text(
                    "UPDATE ms_shards SET version = version + 1 "
                    "WHERE table_name = 't03' AND partition = 0"
                )
            )
        moves.append(1)
        return read

    monkeypatch.setattr(append_module, "shards_of_tables", a_writer_moves_t03_meanwhile)
    try:
        results = batch(cat, tables, 10, 20)
    finally:
        other.dispose()
    assert moves, "the concurrent writer ran"
    # t03's compare-and-set fell short: it was decided again from a fresh read (and lands),
    # and the other tables' rows landed in the same transaction, not after a retry of it.
    for t in tables:
        assert results[t].table.version == 2, t
        assert results[t].table.shards[0].decision.outcome is Outcome.COMMIT, t
        assert cat.read_table(t).num_rows == 20, t
        assert cat.store.get_shard(t, 0).upper == 20  # type: ignore[union-attr]
    assert cat.store.conflicts == 0, "the whole transaction was run again"
