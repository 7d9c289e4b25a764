"""Reading the stored assignments (datastream -> placement), and the commit gate a standby
writer consults: below the control plane, so the writers' Spark adapters can ask it without
importing the control package; and writing them, fenced by the controller's lease
(:func:`write_assignments`, run by :func:`millstream.control.workers.write_assignments`)."""

from __future__ import annotations

from sqlalchemy import Connection, delete, insert, select

from millstream.clock import Clock
from millstream.core.assignment import Placement
from millstream.metastore import schema as s
from millstream.metastore.leases import check_fence


def assignments_in(conn: Connection) -> dict[str, Placement]:
    """The assignments as seen by ``conn``'s transaction; the active first in a placement."""
    out: dict[str, Placement] = {}
    rows = conn.execute(select(s.assignments).order_by(s.assignments.c.datastream)).mappings()
    for r in rows:
        out.setdefault(r["datastream"], []).append((r["worker_id"], r["role"]))
    for placement in out.values():
        placement.sort(key=lambda p: (p[1] != "active", p[0]))
    return out


def may_commit(
    conn: Connection, datastream: str, worker_id: str, *, takeover_ttl: float, now: float
) -> bool:
    """Whether a standby-mode writer on ``worker_id`` may commit: it is the active, or the
    active's worker has not heartbeaten for ``takeover_ttl`` seconds (or stopped). A writer no
    longer assigned anywhere may not commit."""
    placement = assignments_in(conn).get(datastream, [])
    roles = dict(placement)
    if worker_id not in roles:
        return False
    if roles[worker_id] == "active":
        return True
    active = next((w for w, r in placement if r == "active"), None)
    if active is None:
        return True
    w = s.workers.c  # not its info: a worker of 100 tables stores ~170 KB of it
    row = conn.execute(select(w.status, w.heartbeat_at).where(w.id == active)).mappings().first()
    return row is None or (row["status"] == "STOPPED" or row["heartbeat_at"] + takeover_ttl <= now)


def write_assignments(
    conn: Connection,
    clock: Clock,
    lease: str,
    target: dict[str, Placement],
    *,
    holder: str,
    token: int,
) -> bool:
    """In ``conn``'s transaction: replace the stored assignments with ``target``, fenced by
    ``holder``'s token of ``lease`` (LeaseLostError if the lease moved on). Returns whether
    anything changed."""
    check_fence(conn, lease, holder, token, clock.now())
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
