"""The PostgreSQL engine's pre-ping: a pooled connection that broke while its ping ran is
replaced, not reported as an error. psycopg then refuses SQLAlchemy's attempt to restore
autocommit ("can't change 'autocommit' now: connection in transaction status ACTIVE"), and
that ProgrammingError hid the disconnect: a REST call failed with a 500 during the process
campaign's cut of PostgreSQL. The broken connection here is a stand-in with psycopg's own
exceptions, as the moment (a reset between the ping's send and its answer) cannot be timed
from outside."""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy.exc import ProgrammingError

from millstream.metastore.engine import make_engine


class _BrokenMidPing:
    """A DBAPI connection whose ping fails as the socket goes away and which then refuses to
    change autocommit, as psycopg does for a connection left ACTIVE."""

    closed = False
    broken = False  # psycopg only learns on the next call

    def __init__(self) -> None:
        self._autocommit = False

    @property
    def autocommit(self) -> bool:
        return self._autocommit

    @autocommit.setter
    def autocommit(self, value: bool) -> None:
        if not value:
            raise psycopg.ProgrammingError(
                "can't change 'autocommit' now: connection in transaction status ACTIVE"
            )
        self._autocommit = value

    def cursor(self) -> _BrokenMidPing:
        return self

    def execute(self, _sql: str) -> None:
        raise psycopg.OperationalError("connection socket closed")

    def close(self) -> None:
        pass


def test_a_connection_that_broke_during_its_ping_counts_as_disconnected() -> None:
    engine = make_engine("postgresql+psycopg://u@127.0.0.1:1/db", is_sqlite=False)
    # False: the pool discards the connection and opens a new one.
    assert engine.dialect._do_ping_w_event(_BrokenMidPing()) is False  # type: ignore[arg-type]


def test_without_the_listener_the_same_ping_raises() -> None:
    """What the listener fixes: the bare dialect lets the ProgrammingError out."""
    from sqlalchemy import create_engine

    bare = create_engine("postgresql+psycopg://u@127.0.0.1:1/db", pool_pre_ping=True)
    with pytest.raises((psycopg.ProgrammingError, ProgrammingError)):
        bare.dialect._do_ping_w_event(_BrokenMidPing())  # type: ignore[arg-type]
