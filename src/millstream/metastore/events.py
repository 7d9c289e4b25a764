"""The leader's event queue, in the metadata store. Events for the same datastream and kind
that are still pending coalesce into one (so a burst of stop requests is one stop)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, insert, select, update

from millstream.metastore import schema as s

CREATE = "create"
STOP = "stop"
DELETE = "delete"
ASSIGN = "assign"  # pause/resume/worker changes: recompute assignment


@dataclass(frozen=True, slots=True)
class Event:
    id: int
    datastream: str | None
    kind: str
    created_at: float


def enqueue(conn: Connection, datastream: str | None, kind: str, now: float) -> bool:
    """Add an event unless an identical one is still pending. Returns whether it was added."""
    pending = conn.execute(
        select(s.events.c.id).where(
            s.events.c.datastream == datastream,
            s.events.c.kind == kind,
            s.events.c.processed_at.is_(None),
        )
    ).first()
    if pending is not None:
        return False
    conn.execute(
        insert(s.events).values(datastream=datastream, kind=kind, created_at=now, version=1)
    )
    return True


def pending(conn: Connection, limit: int = 100) -> list[Event]:
    """The oldest ``limit`` events not processed yet, oldest first."""
    rows = conn.execute(
        select(s.events)
        .where(s.events.c.processed_at.is_(None))
        .order_by(s.events.c.id)
        .limit(limit)
    ).mappings()
    return [Event(r["id"], r["datastream"], r["kind"], r["created_at"]) for r in rows]


def mark_processed(conn: Connection, event_id: int, now: float) -> None:
    conn.execute(
        update(s.events)
        .where(s.events.c.id == event_id, s.events.c.processed_at.is_(None))
        .values(processed_at=now, version=s.events.c.version + 1)
    )
