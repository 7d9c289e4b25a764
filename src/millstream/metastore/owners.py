"""Which datastream writes a table (:data:`~millstream.metastore.schema.table_owners`).

Two datastreams writing one table would share its shards by partition number: the second
would start at the first one's upper, and its commits of its own source's offsets would be
decided already covered and dropped, with no gap recorded. So a datastream owns its table and
its dead-letter table from its creation until it is removed, and every writer checks the
owner before it writes. The owner row's primary key decides a race: of two creates on two
connections, one insert fails (IntegrityError), the transaction is retried, and the retry
finds the other owner.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection, delete, insert, select

from millstream.errors import TableOwnedError
from millstream.metastore import schema as s


def owners(conn: Connection, tables: Sequence[str]) -> dict[str, str]:
    """The owning datastream of each of ``tables`` that has one."""
    rows = conn.execute(
        select(s.table_owners.c.table_name, s.table_owners.c.datastream).where(
            s.table_owners.c.table_name.in_(s.in_list(tables))
        )
    )
    return {r[0]: r[1] for r in rows}


def claim_tables(conn: Connection, tables: Sequence[str], datastream: str, now: float) -> None:
    """Make ``datastream`` the owner of every one of ``tables`` (in the caller's transaction):
    :class:`TableOwnedError` naming the owner if another datastream owns one. Tables it owns
    already stay as they are; an insert that loses a race raises IntegrityError (retry the
    transaction: the retry sees the winner)."""
    found = owners(conn, tables)
    for t in tables:
        owner = found.get(t)
        if owner is not None and owner != datastream:
            raise TableOwnedError(t, owner, datastream)
    for t in tables:
        if t not in found:
            conn.execute(
                insert(s.table_owners).values(table_name=t, datastream=datastream, created_at=now)
            )


def owned_by(conn: Connection, datastream: str) -> list[str]:
    """The tables ``datastream`` owns (its dead-letter tables included), by name."""
    rows = conn.execute(
        select(s.table_owners.c.table_name)
        .where(s.table_owners.c.datastream == datastream)
        .order_by(s.table_owners.c.table_name)
    )
    return [r[0] for r in rows]


def release_tables(conn: Connection, datastream: str) -> None:
    """Free every table ``datastream`` owns (in the caller's transaction: its removal)."""
    conn.execute(delete(s.table_owners).where(s.table_owners.c.datastream == datastream))
