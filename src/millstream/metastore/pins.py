"""Read pins: a reader that needs a manifest version for a while keeps expiry off it.

A read through :meth:`~millstream.catalog.Catalog.read_table` is short and needs no pin: if
its version expires and loses a file to garbage collection mid-read it gets
:class:`~millstream.errors.VersionExpiredError`, never a partial result. A reader that plans
now and reads later (a Spark query, whose tasks run after the planning that chose the
version; a long export) pins the version instead: :func:`pin_version` records
``(table, version, holder, expires_at)`` and :func:`~millstream.metastore.expiry.expire_versions`
keeps every version at or above the oldest unexpired pin of the table, with everything those
versions see. A pin lasts until :func:`release_pin` or its expiry (a reader that died does not
hold history forever); expiry deletes pins past their expiry.

Pinning and expiry serialize on the table row: both take its row lock (``FOR UPDATE``; on
SQLite every write transaction is exclusive). So a pin either commits before an expiry reads
the pins (and the expiry keeps the version), or it runs after the expiry committed and finds
its version gone (:class:`VersionExpiredError`): never a pin on a version being deleted.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, delete, func, insert, select

from millstream.metastore import schema as s
from millstream.metastore.reads import resolve_version
from millstream.metastore.tables import find_table


@dataclass(frozen=True, slots=True)
class Pin:
    id: int
    table: str
    version: int
    holder: str
    expires_at: float


def pin_version(
    conn: Connection,
    table: str,
    as_of: int | float | datetime | None,
    *,
    holder: str,
    seconds: float,
    now: float,
) -> Pin:
    """Pin the version of ``table`` that ``as_of`` names (None: the current one; a version
    number; a point in time) for ``seconds``. Raises :class:`VersionExpiredError` if retention
    expired it already, :class:`InvalidSpecError` if the table never had it. In ``conn``'s
    transaction."""
    if seconds <= 0:
        raise ValueError(f"a pin must last a positive time, got {seconds}")
    # The table row's lock orders this pin against any expiry of the table.
    info = find_table(conn, table, for_update=True)
    assert info is not None
    v = resolve_version(conn, info, as_of)  # VersionExpiredError below the floor
    pid = conn.execute(
        insert(s.read_pins).values(
            table_name=table,
            manifest_version=v,
            holder=holder,
            pinned_at=now,
            expires_at=now + seconds,
        )
    ).inserted_primary_key
    assert pid is not None
    return Pin(int(pid[0]), table, v, holder, now + seconds)


def release_pin(conn: Connection, pin: Pin) -> bool:
    """Release ``pin``; False if it was gone already (it expired and an expiry removed it)."""
    n = conn.execute(delete(s.read_pins).where(s.read_pins.c.id == pin.id)).rowcount
    return n == 1


def oldest_pinned(conn: Connection, table: str, now: float) -> int | None:
    """The oldest version of ``table`` a pin unexpired at ``now`` holds (None: no pin)."""
    p = s.read_pins
    v = conn.execute(
        select(func.min(p.c.manifest_version)).where(p.c.table_name == table, p.c.expires_at > now)
    ).scalar()
    return None if v is None else int(v)


def drop_expired_pins(conn: Connection, table: str, now: float) -> int:
    """Delete the pins of ``table`` expired at ``now`` (inside an expiry's transaction);
    returns how many."""
    p = s.read_pins
    return int(
        conn.execute(delete(p).where(p.c.table_name == table, p.c.expires_at <= now)).rowcount
    )


def list_pins(conn: Connection, table: str) -> list[Pin]:
    p = s.read_pins
    rows = conn.execute(
        select(p).where(p.c.table_name == table).order_by(p.c.manifest_version, p.c.id)
    ).mappings()
    return [
        Pin(r["id"], r["table_name"], r["manifest_version"], r["holder"], r["expires_at"])
        for r in rows
    ]
