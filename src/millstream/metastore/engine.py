"""Connections and transactions of the metadata store: the SQLAlchemy engine, read and write
transactions, the retry of lost compare-and-sets, and the schema migration.

Embedded default: a SQLite file in WAL mode. Multi-host: PostgreSQL by URL. Write transactions
on SQLite take the write lock up front (``BEGIN IMMEDIATE``) so two processes never deadlock
upgrading a read lock; on PostgreSQL every row change is a compare-and-set on ``version`` and a
lost race is retried from a fresh read.
"""

from __future__ import annotations

import random
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, Protocol, TypeAlias, TypeVar

from sqlalchemy import Connection, Engine, create_engine, event, insert
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, InterfaceError, OperationalError

from millstream.errors import (
    CommitConflictError,
    CommitStateUnknownError,
    MetadataSchemaError,
    MetadataStoreUnavailableError,
)
from millstream.metastore import schema as s

MAX_CAS_RETRIES = 50

#: An open transaction of the metadata store: what the metastore's functions take, and what a
#: caller's transaction function (run by ``MetadataStore.retrying``) hands on to them. Code
#: outside :mod:`millstream.metastore` names it, never runs SQL on it.
Txn: TypeAlias = Connection

#: What the database driver raises when the metadata store misbehaves (a connection refused,
#: reset or timed out; a lock not granted): supervised loops retry these, the REST API answers
#: 503 for the unreachable ones (:func:`unreachable`).
STORE_ERRORS = (OperationalError, InterfaceError)


P = ParamSpec("P")
T = TypeVar("T")


class Database(Protocol):
    """What the transaction machinery below needs of the store it runs on (the facade,
    :class:`millstream.metastore.store.MetadataStore`, is one): its engine and backend, the
    fault point run around COMMIT, its write transactions and its conflict counter."""

    engine: Engine
    is_sqlite: bool
    on_commit: Callable[[bool], None] | None

    def write(self) -> AbstractContextManager[Connection]: ...

    def _count_conflict(self) -> None: ...


class Transactions(Protocol):
    """Read transactions and retried write transactions: what a metastore function that runs
    its own transactions (:func:`millstream.metastore.manifest.reconcile`) takes, instead of
    the facade that offers them."""

    def read(self) -> AbstractContextManager[Connection]: ...

    def retrying(
        self,
        fn: Callable[Concatenate[Connection, P], T],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> tuple[T, int]: ...


def public_url(url: str) -> str:
    """The metadata URL without its password (never served)."""
    u = make_url(url)
    # URL.set(password=None) means "unchanged"; the namedtuple replace really drops it.
    return u._replace(password=None).render_as_string(hide_password=False) if u.password else url


def sqlite_url(home: str | Path) -> str:
    return f"sqlite:///{Path(home).resolve() / 'metadata.db'}"


#: What psycopg says when SQLAlchemy's pre-ping restores autocommit on a connection whose
#: ping just failed mid-query (the socket went away): a disconnect in disguise.
_PING_ON_A_DEAD_CONNECTION = "can't change 'autocommit' now"


#: Seconds a new PostgreSQL connection may take (TCP connect and the startup handshake). Without
#: it a stalled network or a server that accepts but never answers hangs the caller (a REST
#: call, a heartbeat, a commit) until the kernel gives up, minutes later; with it the call
#: fails like any unreachable store and is retried by the caller's backoff. A URL may set its
#: own (``?connect_timeout=N``).
CONNECT_TIMEOUT_SECONDS = 10


def make_engine(url: str, *, is_sqlite: bool) -> Engine:
    if not is_sqlite:
        connect_args = (
            {} if "connect_timeout=" in url else {"connect_timeout": CONNECT_TIMEOUT_SECONDS}
        )
        engine = create_engine(
            url, pool_pre_ping=True, pool_size=4, max_overflow=4, connect_args=connect_args
        )

        @event.listens_for(engine, "handle_error")
        def _dead_ping(ctx: Any) -> None:
            # SQLAlchemy's psycopg pre-ping sets autocommit back in a ``finally`` after its
            # SELECT 1; when the SELECT failed because the connection broke mid-query, psycopg
            # refuses (ProgrammingError, transaction status ACTIVE) and that error replaced the
            # disconnect: the checkout failed instead of reconnecting (the process campaign
            # hit it once in a cut of PostgreSQL connections). It is a disconnect.
            if ctx.is_pre_ping and _PING_ON_A_DEAD_CONNECTION in str(ctx.original_exception):
                ctx.is_disconnect = True

        return engine
    if url.startswith("sqlite:///") and not url.startswith("sqlite:///:memory:"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    # A pool keeps connections (and the WAL) open: with NullPool every transaction paid a
    # connect plus a WAL checkpoint on close (15 ms vs 5.6 ms per commit, measured).
    engine = create_engine(url, pool_size=4, max_overflow=8, connect_args={"timeout": 60})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy, not the driver, issue BEGIN (the documented pysqlite recipe).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA busy_timeout=60000")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        mode = "IMMEDIATE" if conn.get_execution_options().get("ms_write") else "DEFERRED"
        conn.exec_driver_sql(f"BEGIN {mode}")

    return engine


@contextmanager
def read_transaction(store: Database) -> Iterator[Connection]:
    """A read-only transaction over one consistent snapshot."""
    with store.engine.connect() as conn:
        if not store.is_sqlite:
            conn = conn.execution_options(isolation_level="REPEATABLE READ")
        with conn.begin():
            yield conn


@contextmanager
def write_transaction(store: Database) -> Iterator[Connection]:
    """A write transaction. A failure inside COMMIT becomes CommitStateUnknownError; the
    store's ``on_commit`` fault point runs right before and right after the COMMIT."""
    with store.engine.connect() as conn:
        conn = conn.execution_options(ms_write=True)
        txn = conn.begin()
        try:
            yield conn
        except BaseException:
            txn.rollback()
            raise
        try:
            if store.on_commit is not None:
                store.on_commit(False)
            txn.commit()
            if store.on_commit is not None:
                store.on_commit(True)
        except CommitStateUnknownError:
            raise
        except (OperationalError, DBAPIError) as exc:
            if is_retryable(exc):
                raise CommitConflictError(
                    f"transaction aborted by a concurrent one: {exc}"
                ) from exc
            raise CommitStateUnknownError(
                f"the metadata store failed during COMMIT ({exc}); the outcome is unknown: "
                "re-read shard uppers before doing anything else"
            ) from exc
        except Exception as exc:  # an injected fault (on_commit)
            if txn.is_active:
                txn.rollback()
            raise CommitStateUnknownError(
                f"COMMIT failed ({exc}); the outcome is unknown: re-read before doing anything else"
            ) from exc


def retrying(
    store: Database,
    fn: Callable[Concatenate[Connection, P], T],
    /,
    *args: P.args,
    **kwargs: P.kwargs,
) -> tuple[T, int]:
    """Run ``fn(conn, *args, **kwargs)`` in a write transaction of ``store``, retrying lost
    compare-and-sets (each one counted in ``store.conflicts``). Returns (result, retries)."""
    for attempt in range(MAX_CAS_RETRIES):
        try:
            with store.write() as conn:
                return fn(conn, *args, **kwargs), attempt
        except CommitConflictError:
            store._count_conflict()
        except (OperationalError, IntegrityError) as exc:
            if not (is_retryable(exc) or isinstance(exc, IntegrityError)):
                raise
            store._count_conflict()
        time.sleep(random.uniform(0, 0.002 * (attempt + 1)))
    raise CommitConflictError(f"gave up after {MAX_CAS_RETRIES} lost compare-and-sets")


def rerun_if_aborted(
    store: Database,
    fn: Callable[Concatenate[Connection, P], T],
    /,
    *args: P.args,
    **kwargs: P.kwargs,
) -> T:
    """Run ``fn(conn, *args, **kwargs)`` in a write transaction of ``store``, running it again
    when the server aborted it (a deadlock, a serialization failure, a busy SQLite database:
    :func:`is_retryable`; nothing of it was committed, and ``fn``'s own compare-and-sets check
    their preconditions again). Unlike :func:`retrying`, a lost compare-and-set
    (:class:`CommitConflictError`) and a duplicate row propagate: for these writes they are an
    answer (another publisher moved the pointer first, another controller took the job), not a
    reason to try again."""
    for attempt in range(MAX_CAS_RETRIES):
        try:
            with store.write() as conn:
                return fn(conn, *args, **kwargs)
        except OperationalError as exc:
            if not is_retryable(exc) or attempt == MAX_CAS_RETRIES - 1:
                raise
            store._count_conflict()
        time.sleep(random.uniform(0, 0.002 * (attempt + 1)))
    raise AssertionError("unreachable")  # pragma: no cover


def migrate(store: Database) -> None:
    """Create or upgrade the schema to :data:`schema.LATEST_SCHEMA_VERSION` (racing processes
    that do the same at once are tolerated)."""
    last: Exception | None = None
    for _ in range(5):
        try:
            with store.write() as conn:
                current = s.current_schema_version(conn)
                if current > s.LATEST_SCHEMA_VERSION:
                    raise MetadataSchemaError(
                        f"metadata schema version {current} is newer than this Millstream "
                        f"understands ({s.LATEST_SCHEMA_VERSION}); upgrade Millstream",
                        found=current,
                    )
                for v in range(current + 1, s.LATEST_SCHEMA_VERSION + 1):
                    s.MIGRATIONS[v](conn)
                if current == 0:
                    conn.execute(insert(s.meta).values(key="schema_version", value="0"))
                if current < s.LATEST_SCHEMA_VERSION:
                    conn.execute(
                        s.meta.update()
                        .where(s.meta.c.key == "schema_version")
                        .values(value=str(s.LATEST_SCHEMA_VERSION))
                    )
            return
        except (IntegrityError, OperationalError, DBAPIError, CommitConflictError) as exc:
            # Another process is creating the schema at the same moment; look again.
            last = exc
            time.sleep(0.05)
    if isinstance(last, DBAPIError) and unreachable(last):
        raise MetadataStoreUnavailableError(
            f"could not reach the metadata store to check its schema: {first_line(last)}"
        ) from last
    raise MetadataSchemaError("could not create or migrate the metadata schema") from last


def first_line(exc: BaseException) -> str:
    """The driver's own message of ``exc`` (its first line, without SQLAlchemy's SQL echo)."""
    orig = getattr(exc, "orig", None) or exc
    return (str(orig).strip().splitlines() or [type(orig).__name__])[0][:300]


#: PostgreSQL SQLSTATEs of a transaction that may simply be run again: serialization_failure
#: and deadlock_detected (the server aborted it; nothing of it was committed).
RETRYABLE_SQLSTATES = frozenset({"40001", "40P01"})
#: SQLite's primary result codes of the same: SQLITE_BUSY and SQLITE_LOCKED (another connection
#: holds the lock past the busy timeout; nothing of the transaction was committed).
RETRYABLE_SQLITE_CODES = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})
#: PostgreSQL SQLSTATEs of a server that went away: admin_shutdown, crash_shutdown and
#: cannot_connect_now (class 08, connection_exception, is matched as a class).
GONE_SQLSTATES = frozenset({"57P01", "57P02", "57P03"})


def _driver_error(exc: BaseException) -> BaseException:
    """The DB-API driver's exception under a SQLAlchemy one (or ``exc`` itself)."""
    return getattr(exc, "orig", None) or exc


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE PostgreSQL sent with the error (psycopg's ``sqlstate``, psycopg2's
    ``pgcode``); None for an error the client raised itself (no server answer: a connection
    refused, reset or timed out) and for other drivers."""
    orig = _driver_error(exc)
    code = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    return code if isinstance(code, str) else None


def sqlite_code(exc: BaseException) -> int | None:
    """SQLite's primary result code of the error (the low byte of ``sqlite_errorcode``,
    Python 3.11+), or None if it is not a SQLite error."""
    orig = _driver_error(exc)
    if not isinstance(orig, sqlite3.Error):
        return None
    code = getattr(orig, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


def _is_postgres(exc: BaseException) -> bool:
    return type(_driver_error(exc)).__module__.split(".")[0] in ("psycopg", "psycopg2")


def unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says the metadata store could not be reached (a connection refused,
    reset, closed or timed out), as opposed to a conflict, a lock or a bad statement: by the
    error's code, never its text. PostgreSQL: an error the driver raised without a server
    answer (no SQLSTATE), a connection_exception (class 08) or a server shutting down (57P0x).
    SQLite: SQLITE_CANTOPEN (the database file cannot be opened)."""
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    if not isinstance(exc, (OperationalError, InterfaceError)) or is_retryable(exc):
        return False
    if _is_postgres(exc):
        code = sqlstate(exc)
        return code is None or code.startswith("08") or code in GONE_SQLSTATES
    return sqlite_code(exc) == sqlite3.SQLITE_CANTOPEN


def is_retryable(exc: BaseException) -> bool:
    """A deadlock, serialization failure or busy database: the transaction may simply be run
    again (it was aborted, nothing of it committed). Decided by PostgreSQL's SQLSTATE or
    SQLite's result code, never by the message (which names tables, values and columns)."""
    code = sqlstate(exc)
    if code is not None:
        return code in RETRYABLE_SQLSTATES
    return sqlite_code(exc) in RETRYABLE_SQLITE_CODES
