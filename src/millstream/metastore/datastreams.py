"""Datastream records: the rows behind :class:`millstream.control.registry.Registry`.

Every change of a record is a compare-and-set on its ``version`` (:func:`cas_update`); the
lifecycle decisions (which transition, from which state) stay with the registry, which runs
these functions inside its own transactions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, delete, insert, select

from millstream.core.lifecycle import State
from millstream.datastream import DatastreamSpec
from millstream.metastore import owners
from millstream.metastore import schema as s
from millstream.metastore.cas import cas_update


@dataclass(frozen=True, slots=True)
class DatastreamRecord:
    name: str
    spec: DatastreamSpec
    state: State
    version: int
    last_error: str | None
    created_at: float
    updated_at: float
    #: A multi-table datastream's tables paused on their own (by name, sorted): their
    #: writers stop at their shard uppers while the other tables run on.
    paused_tables: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "state": self.state.value,
            "version": self.version,
            "last_error": self.last_error,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "spec": self.spec.model_dump(mode="json", by_alias=True),
            "paused_tables": list(self.paused_tables),
        }


def _record(r: Any) -> DatastreamRecord:
    return DatastreamRecord(
        name=r["name"],
        spec=DatastreamSpec.parse_stored(r["spec"]),
        state=State(r["state"]),
        version=r["version"],
        last_error=r["last_error"],
        created_at=r["created_at"],
        updated_at=r["updated_at"],
        paused_tables=tuple(sorted(r["paused_tables"] or ())),
    )


def find(conn: Connection, name: str) -> DatastreamRecord | None:
    row = conn.execute(select(s.datastreams).where(s.datastreams.c.name == name)).mappings().first()
    return None if row is None else _record(row)


def list_all(conn: Connection) -> list[DatastreamRecord]:
    rows = conn.execute(select(s.datastreams).order_by(s.datastreams.c.name)).mappings()
    return [_record(r) for r in rows]


def insert_new(conn: Connection, spec: DatastreamSpec, now: float) -> None:
    """Insert ``spec``'s record in INITIALIZING (its name's key refuses a second one)."""
    conn.execute(
        insert(s.datastreams).values(
            name=spec.name,
            spec=spec.model_dump(mode="json", by_alias=True),
            state=State.INITIALIZING.value,
            last_error=None,
            created_at=now,
            updated_at=now,
            version=1,
        )
    )


def set_spec(
    conn: Connection, name: str, expected_version: int, spec: DatastreamSpec, now: float
) -> None:
    """Compare-and-set the record's spec (CommitConflictError if it changed since
    ``expected_version``)."""
    cas_update(
        conn,
        s.datastreams,
        {"name": name},
        expected_version,
        {
            "spec": spec.model_dump(mode="json", by_alias=True),
            "updated_at": now,
        },
    )


def set_state(
    conn: Connection,
    name: str,
    expected_version: int,
    state: State,
    now: float,
    last_error: str | None,
) -> None:
    """Compare-and-set the record's state and last error (CommitConflictError if it changed
    since ``expected_version``)."""
    cas_update(
        conn,
        s.datastreams,
        {"name": name},
        expected_version,
        {"state": state.value, "updated_at": now, "last_error": last_error},
    )


def set_paused_tables(
    conn: Connection, name: str, expected_version: int, paused: list[str], now: float
) -> None:
    """Compare-and-set the record's tables paused on their own (CommitConflictError if the
    record changed since ``expected_version``: a concurrent pause of another table is not
    overwritten, the caller's retry re-reads it)."""
    cas_update(
        conn,
        s.datastreams,
        {"name": name},
        expected_version,
        {"paused_tables": sorted(paused) or None, "updated_at": now},
    )


def delete_at(conn: Connection, name: str, version: int) -> bool:
    """Delete the record if it is still at ``version``, with its assignments; its table names
    are free from then on. Returns whether it was deleted."""
    n = conn.execute(
        delete(s.datastreams).where(
            s.datastreams.c.name == name, s.datastreams.c.version == version
        )
    ).rowcount
    conn.execute(delete(s.assignments).where(s.assignments.c.datastream == name))
    if n == 1:
        owners.release_tables(conn, name)  # its table names are free from now on
    return bool(n == 1)
