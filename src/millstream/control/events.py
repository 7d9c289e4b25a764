"""The leader's event queue, in the metadata store (the rows and statements live in
:mod:`millstream.metastore.events`). Events for the same datastream and kind that are still
pending coalesce into one (so a burst of stop requests is one stop)."""

from __future__ import annotations

from millstream.metastore import events
from millstream.metastore.events import ASSIGN, CREATE, DELETE, STOP, Event, enqueue
from millstream.metastore.store import MetadataStore


def pending(store: MetadataStore, limit: int = 100) -> list[Event]:
    with store.read() as conn:
        return events.pending(conn, limit)


def mark_processed(store: MetadataStore, event_id: int, now: float) -> None:
    with store.write() as conn:
        events.mark_processed(conn, event_id, now)


__all__ = ["ASSIGN", "CREATE", "DELETE", "STOP", "Event", "enqueue", "mark_processed", "pending"]
