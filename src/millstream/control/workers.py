"""Worker membership (register, heartbeat) and writing the stored assignments (reading them,
and the standby commit gate, live in :mod:`millstream.metastore.assignments`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, delete, insert, select

from millstream.clock import Clock
from millstream.control.leases import check_fence
from millstream.core.assignment import Placement
from millstream.metastore import schema as s
from millstream.metastore.assignments import assignments_in, may_commit, read_assignments
from millstream.metastore.cas import cas_update
from millstream.metastore.store import MetadataStore

CONTROLLER_LEASE = "controller"


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    id: str
    url: str | None
    status: str
    started_at: float
    heartbeat_at: float
    info: dict[str, Any]
    version: int

    def alive(self, now: float, ttl: float) -> bool:
        return self.status != "STOPPED" and self.heartbeat_at + ttl > now

    def to_dict(self, now: float, ttl: float) -> dict[str, Any]:
        return {
            "id": self.id,
            "url": self.url,
            "status": self.status,
            "alive": self.alive(now, ttl),
            "heartbeat_age_s": round(now - self.heartbeat_at, 3),
            "started_at": self.started_at,
            **self.info,
        }


def _worker(r: Any) -> WorkerInfo:
    return WorkerInfo(
        r["id"],
        r["url"],
        r["status"],
        r["started_at"],
        r["heartbeat_at"],
        r["info"] or {},
        r["version"],
    )


def heartbeat(
    store: MetadataStore,
    worker_id: str,
    *,
    status: str,
    info: dict[str, Any],
    clock: Clock,
    url: str | None = None,
) -> None:
    """Register or refresh a worker (status STARTING, RUNNING or STOPPED)."""

    def _txn(conn: Connection) -> None:
        now = clock.now()
        row = conn.execute(select(s.workers).where(s.workers.c.id == worker_id)).mappings().first()
        if row is None:
            conn.execute(
                insert(s.workers).values(
                    id=worker_id,
                    url=url,
                    status=status,
                    started_at=now,
                    heartbeat_at=now,
                    info=info,
                    version=1,
                )
            )
        else:
            cas_update(
                conn,
                s.workers,
                {"id": worker_id},
                row["version"],
                {"status": status, "heartbeat_at": now, "info": info, "url": url or row["url"]},
            )

    store.retrying(_txn)


def list_workers(store: MetadataStore) -> list[WorkerInfo]:
    with store.read() as conn:
        return [
            _worker(r) for r in conn.execute(select(s.workers).order_by(s.workers.c.id)).mappings()
        ]


def write_assignments(
    store: MetadataStore, target: dict[str, Placement], *, holder: str, token: int, clock: Clock
) -> bool:
    """Replace the stored assignments with ``target``, fenced by the leader's lease token.
    Returns whether anything changed. Raises LeaseLostError if the lease moved on."""

    def _txn(conn: Connection) -> bool:
        check_fence(conn, CONTROLLER_LEASE, holder, token, clock.now())
        # A datastream with no live worker has an empty placement, which is stored as no rows.
        if assignments_in(conn) == {k: v for k, v in target.items() if v}:
            return False
        conn.execute(delete(s.assignments))
        for name, placement in target.items():
            for worker_id, role in placement:
                conn.execute(
                    insert(s.assignments).values(
                        datastream=name, worker_id=worker_id, role=role, token=token, version=1
                    )
                )
        return True

    changed, _ = store.retrying(_txn)
    return bool(changed)


__all__ = [
    "CONTROLLER_LEASE",
    "WorkerInfo",
    "heartbeat",
    "list_workers",
    "may_commit",
    "read_assignments",
    "write_assignments",
]
