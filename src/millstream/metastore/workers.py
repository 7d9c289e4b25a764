"""Worker membership rows: registering and heartbeating a worker, listing them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, insert, select

from millstream.clock import Clock
from millstream.metastore import schema as s
from millstream.metastore.cas import cas_update


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
    conn: Connection,
    clock: Clock,
    worker_id: str,
    *,
    status: str,
    info: dict[str, Any] | None,
    url: str | None = None,
) -> None:
    """In ``conn``'s transaction: register or refresh a worker (status STARTING, RUNNING or
    STOPPED) by compare-and-set on its row. ``info`` None leaves the stored status as it is
    (a liveness beat: the status, the heartbeat time and the url alone)."""
    now = clock.now()
    # Not the info: a worker of 100 tables stores ~200 KB of it, decoded here for nothing
    w = s.workers.c
    row = conn.execute(select(w.version, w.url).where(w.id == worker_id)).mappings().first()
    if row is None:
        conn.execute(
            insert(s.workers).values(
                id=worker_id,
                url=url,
                status=status,
                started_at=now,
                heartbeat_at=now,
                info=info if info is not None else {},
                version=1,
            )
        )
    else:
        values: dict[str, Any] = {"status": status, "heartbeat_at": now, "url": url or row["url"]}
        if info is not None:
            values["info"] = info
        cas_update(conn, s.workers, {"id": worker_id}, row["version"], values)


def list_workers(conn: Connection) -> list[WorkerInfo]:
    return [_worker(r) for r in conn.execute(select(s.workers).order_by(s.workers.c.id)).mappings()]
