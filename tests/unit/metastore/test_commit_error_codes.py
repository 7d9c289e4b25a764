"""The metadata store tells a lost race (run the transaction again) from an unreachable store
and from a COMMIT whose outcome is unknown by the error's code (PostgreSQL's SQLSTATE, SQLite's
result code), never by its message: a message quotes table names, values and the server's
wording, so "busy" or "connection" in a name made a bad statement look like a lost race or an
outage. Every error here is a real one from the database."""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError

from millstream.errors import CommitConflictError
from millstream.metastore.engine import is_retryable, unreachable
from millstream.metastore.store import MetadataStore

#: A quoted name full of the words the old substring rules looked for.
MISLEADING = "database is locked busy deadlock detected could not serialize connection timed out"


def _error(engine: Any, sql: str) -> DBAPIError:
    with engine.connect() as conn, pytest.raises(DBAPIError) as caught:
        conn.execute(text(sql))
    return caught.value


# -- SQLite ---------------------------------------------------------------------------------------


def test_sqlite_a_busy_database_is_retryable_and_a_statement_naming_it_is_not(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'm.db'}"
    holder = create_engine(url)
    impatient = create_engine(url, connect_args={"timeout": 0})
    try:
        with holder.connect() as held:
            held.exec_driver_sql("BEGIN IMMEDIATE")  # the write lock, held
            busy = _error(impatient, "BEGIN IMMEDIATE")
            held.exec_driver_sql("ROLLBACK")
        assert is_retryable(busy) and not unreachable(busy), busy

        misleading = _error(impatient, f'SELECT * FROM "{MISLEADING}"')  # no such table
        assert MISLEADING in str(misleading)
        assert not is_retryable(misleading)
        assert not unreachable(misleading)
    finally:
        holder.dispose()
        impatient.dispose()


def test_sqlite_a_database_that_cannot_be_opened_is_unreachable(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    engine = create_engine(f"sqlite:///{tmp_path / 'file' / 'under-a-file.db'}")
    try:
        with pytest.raises(DBAPIError) as caught:
            engine.connect()
    finally:
        engine.dispose()
    assert unreachable(caught.value) and not is_retryable(caught.value)


# -- PostgreSQL -----------------------------------------------------------------------------------


@pytest.fixture
def pg_url(postgres_server: Any) -> str:
    return str(postgres_server.create_database(f"ms_codes_{uuid.uuid4().hex[:12]}"))


@pytest.fixture
def pg_store(pg_url: str) -> Iterator[MetadataStore]:
    store = MetadataStore(pg_url)
    yield store
    store.dispose()


def _raise(code: str, message: str) -> str:
    return f"DO $$ BEGIN RAISE EXCEPTION '{message}' USING ERRCODE = '{code}'; END $$"


@pytest.mark.postgres
def test_postgres_errors_are_told_apart_by_sqlstate(pg_store: MetadataStore) -> None:
    engine = pg_store.engine
    deadlock = _error(engine, _raise("40P01", "aborted"))
    assert is_retryable(deadlock) and not unreachable(deadlock)
    # A query cancelled (an operational error) whose message says everything the old rules
    # looked for: neither a lost race nor an outage.
    cancelled = _error(engine, _raise("57014", MISLEADING))
    assert MISLEADING in str(cancelled)
    assert not is_retryable(cancelled) and not unreachable(cancelled)
    shutdown = _error(engine, _raise("57P01", "bye"))
    assert unreachable(shutdown) and not is_retryable(shutdown)


@pytest.mark.postgres
def test_postgres_a_server_that_is_not_there_is_unreachable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    engine = create_engine(f"postgresql+psycopg://u:p@127.0.0.1:{port}/db")
    try:
        with pytest.raises(DBAPIError) as caught:
            engine.connect()
    finally:
        engine.dispose()
    assert unreachable(caught.value) and not is_retryable(caught.value)


@pytest.mark.postgres
def test_postgres_a_commit_that_lost_a_serialization_race_is_a_conflict_not_unknown(
    pg_store: MetadataStore, pg_url: str
) -> None:
    """Two SERIALIZABLE transactions each read what the other writes; the second to COMMIT
    fails with SQLSTATE 40001. Through the store's write transaction that COMMIT is a lost
    race (CommitConflictError: nothing was committed, run it again), not an unknown outcome."""
    with pg_store.engine.begin() as conn:
        conn.execute(text("CREATE TABLE skew (k INT)"))
    other = create_engine(pg_url)
    started = threading.Event()

    def peer() -> None:
        with other.connect() as c:
            c.exec_driver_sql("BEGIN ISOLATION LEVEL SERIALIZABLE")
            c.execute(text("SELECT count(*) FROM skew WHERE k = 2")).scalar()
            started.wait(30)
            c.execute(text("INSERT INTO skew VALUES (1)"))
            c.exec_driver_sql("COMMIT")

    t = threading.Thread(target=peer)
    try:
        with pytest.raises(CommitConflictError, match="concurrent"), pg_store.write() as conn:
            conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
            conn.execute(text("SELECT count(*) FROM skew WHERE k = 1")).scalar()
            t.start()
            conn.execute(text("INSERT INTO skew VALUES (2)"))
            started.set()
            t.join(30)  # the peer committed first
    finally:
        started.set()
        t.join(30)
        other.dispose()
    with pg_store.engine.connect() as conn:
        assert conn.execute(text("SELECT k FROM skew")).scalars().all() == [1]
