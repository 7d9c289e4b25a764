"""Two datastreams creating one table at once, on PostgreSQL with real concurrent
transactions (SQLite serializes writers with BEGIN IMMEDIATE, which hides the race): both
read "no owner" before either inserts, and only the owner row's key stops the second. Exactly
one is created; the other gets the 409 error naming it."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from millstream.control.registry import Registry
from millstream.datastream import DatastreamSpec
from millstream.errors import TableOwnedError
from millstream.metastore.store import MetadataStore

pytestmark = pytest.mark.postgres


def _spec(name: str, tmp_path: Path) -> DatastreamSpec:
    return DatastreamSpec.parse(
        {
            "name": name,
            "source": {"kind": "files", "path": str(tmp_path / name)},
            "schema": {"id": "long", "status": "string"},
            "table": {"name": "orders", "mode": "upsert", "primary_key": ["id"]},
        }
    )


@pytest.fixture
def pg_url(postgres_server: Any) -> str:
    return str(postgres_server.create_database(f"ms_owner_{uuid.uuid4().hex[:12]}"))


@pytest.fixture
def stores(pg_url: str) -> Iterator[list[MetadataStore]]:
    """Two controllers' stores: their own engines and connections."""
    made = [MetadataStore(pg_url) for _ in range(2)]
    yield made
    for s in made:
        s.dispose()


def test_a_create_that_read_no_owner_before_another_create_committed_is_refused(
    stores: list[MetadataStore], tmp_path: Path
) -> None:
    mine, theirs = Registry(stores[0]), Registry(stores[1])
    me = threading.get_ident()
    done: list[Any] = []

    def other_create_commits_first(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        """Right before this create's INSERT of the table's owner (its check found none), the
        other controller's create of another datastream for the same table commits."""
        if done or threading.get_ident() != me:
            return
        if not statement.lstrip().upper().startswith("INSERT INTO MS_TABLE_OWNERS"):
            return
        t = threading.Thread(target=lambda: done.append(theirs.create(_spec("b", tmp_path))))
        t.start()
        t.join(timeout=60)

    event.listen(stores[0].engine, "before_cursor_execute", other_create_commits_first)
    try:
        with pytest.raises(TableOwnedError, match="table 'orders' belongs to datastream 'b'"):
            mine.create(_spec("a", tmp_path))
    finally:
        event.remove(stores[0].engine, "before_cursor_execute", other_create_commits_first)
    assert done and done[0].name == "b", "the other create committed in between"
    assert [r.name for r in mine.list()] == ["b"]


def test_concurrent_creates_of_one_table_create_one_datastream(
    stores: list[MetadataStore], tmp_path: Path, pg_url: str
) -> None:
    more = [MetadataStore(pg_url) for _ in range(4)]
    every = [*stores, *more]
    barrier = threading.Barrier(len(every))
    results: dict[str, BaseException | str] = {}

    def create(i: int, store: MetadataStore) -> None:
        barrier.wait()
        try:
            results[f"d{i}"] = Registry(store).create(_spec(f"d{i}", tmp_path)).name
        except BaseException as exc:
            results[f"d{i}"] = exc

    try:
        threads = [threading.Thread(target=create, args=(i, s)) for i, s in enumerate(every)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        for s in more:
            s.dispose()
    created = [n for n, r in results.items() if r == n]
    assert len(created) == 1, results
    refused = [r for r in results.values() if isinstance(r, BaseException)]
    assert len(refused) == len(every) - 1
    assert all(
        isinstance(r, TableOwnedError) and f"datastream {created[0]!r}" in r.message
        for r in refused
    ), refused
    assert [r.name for r in Registry(stores[0]).list()] == created
