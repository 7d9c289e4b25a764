"""A commit's metadata work grows with the batch, not with the partitions it touches: the
entries, new shards and shard compare-and-sets of one commit are one statement each, however
many partitions (bench/scale.py: a 256-partition commit took ~0.14 s when every partition had
statements of its own). ``cas_update_many`` keeps each row a compare-and-set: a row read at a
version that moved fails the whole transaction."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import event

from millstream.errors import CommitConflictError
from millstream.metastore import schema as s
from millstream.metastore.cas import CasRow, cas_update_many
from millstream.metastore.models import ShardAppend
from millstream.metastore.store import MetadataStore
from millstream.spec import TableSpec

TABLE = "events"
DL = "events__dead_letter"


def _open(request: pytest.FixtureRequest, tmp_path: Path, name: str) -> MetadataStore:
    """A fresh store: SQLite, or a database on the session PostgreSQL server (whose driver
    counts an ``executemany``'s rows differently)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / f'{name}.db'}"
    else:
        server = request.getfixturevalue("postgres_server")
        url = server.create_database(f"ms_{name}_{uuid.uuid4().hex[:12]}")
    st = MetadataStore(url)
    for table in (TABLE, DL):
        st.create_table(
            TableSpec.parse({"name": table, "schema": {"id": "long"}, "mode": "append"})
        )
    return st


BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MetadataStore]:
    st = _open(request, tmp_path, "main")
    yield st
    st.dispose()


@pytest.fixture(params=BACKENDS)
def stores(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[MetadataStore, MetadataStore]]:
    a, b = _open(request, tmp_path, "a"), _open(request, tmp_path, "b")
    yield a, b
    a.dispose()
    b.dispose()


def _batch(partitions: int, lo: int, hi: int) -> dict[str, list[ShardAppend]]:
    # every partition with a data file in the table, none with dead letters
    return {
        TABLE: [
            ShardAppend(p, lo, hi, 0, f"f-{lo}.parquet", hi - lo, 100) for p in range(partitions)
        ],
        DL: [ShardAppend(p, lo, hi, 0, None, 0, 0) for p in range(partitions)],
    }


def _statements(store: MetadataStore, partitions: int, lo: int, hi: int) -> int:
    seen: list[str] = []

    def count(conn: object, cursor: object, statement: str, *args: object) -> None:
        seen.append(statement)

    event.listen(store.engine, "before_cursor_execute", count)
    try:
        store.commit_batch(_batch(partitions, lo, hi), writer_id="w", batch_id=lo)
    finally:
        event.remove(store.engine, "before_cursor_execute", count)
    return len(seen)


def test_a_commit_issues_as_many_statements_for_256_partitions_as_for_4(
    stores: tuple[MetadataStore, MetadataStore],
) -> None:
    small, store = stores
    # the first commit creates the shards, the second moves them (compare-and-set)
    first = (_statements(small, 4, 0, 10), _statements(store, 256, 0, 10))
    second = (_statements(small, 4, 10, 20), _statements(store, 256, 10, 20))
    assert first[0] == first[1], first
    assert second[0] == second[1], second

    shards = {sh.partition: sh for sh in store.list_shards(TABLE)}
    assert len(shards) == 256
    assert {(sh.upper, sh.next_seq, sh.version) for sh in shards.values()} == {(20, 2, 2)}
    assert store.list_shards(DL) == [], "no dead letter: the dead-letter table is left alone"
    with store.read() as conn:
        entries = conn.execute(s.entries.select().where(s.entries.c.table_name == TABLE)).all()
    assert sorted((e.partition, e.seq, e.start_offset, e.end_offset) for e in entries) == sorted(
        (p, i, 10 * i, 10 * i + 10) for p in range(256) for i in range(2)
    )


def test_cas_update_many_moves_every_row_or_none(store: MetadataStore) -> None:
    store.commit_batch(_batch(3, 0, 10), writer_id="w", batch_id=0)
    before = {sh.partition: sh for sh in store.list_shards(TABLE)}

    def rows(stale: int | None) -> list[CasRow]:
        return [
            CasRow(
                {"table_name": TABLE, "partition": p},
                sh.version - (1 if p == stale else 0),
                {"upper": 99},
            )
            for p, sh in sorted(before.items())
        ]

    with pytest.raises(CommitConflictError), store.write() as conn:
        cas_update_many(conn, s.shards, rows(stale=1))
    assert store.list_shards(TABLE) == sorted(before.values(), key=lambda sh: sh.partition)

    with store.write() as conn:
        cas_update_many(conn, s.shards, rows(stale=None))
    after = store.list_shards(TABLE)
    assert [(sh.upper, sh.version) for sh in after] == [
        (99, before[p].version + 1) for p in sorted(before)
    ]
