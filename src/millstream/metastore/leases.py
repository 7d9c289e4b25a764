"""Leases with a TTL and a fencing token (controller leadership).

The token grows by one every time the lease is taken (by a new holder, or by the same holder
after its lease lapsed), never on a renewal. A leader passes
its token to every write it makes on the leader's behalf; :func:`check_fence` inside the same
transaction refuses the write if the lease has moved on, so a leader that was paused past its
TTL (GC, SIGSTOP, a network partition) cannot make an assignment after a successor took over.

**Why the fence holds under concurrency.** Checking the token is not enough by itself: the
check and the commit of the fenced write are two moments, and a leader may pause between them.
The guarantee is an order: *every fenced write commits before the takeover that ends its
token, or not at all.* Both backends get it from the lease row itself:

* **PostgreSQL** (READ COMMITTED): :func:`check_fence` reads the lease row ``FOR UPDATE``, so
  the fenced transaction holds the row lock until it commits or rolls back. A takeover (and a
  renewal, and a release) is an ``UPDATE`` of that row, so it waits for the fenced write to
  finish; the write therefore commits before the takeover. Conversely, a fence that finds a
  takeover in flight waits for it, and then reads the row as committed by it (READ COMMITTED
  re-reads a row locked ``FOR UPDATE`` after the lock is released), sees the new token and
  refuses the write. With a plain ``SELECT`` neither waits: a leader paused after its check
  commits assignments with its old token after the successor's takeover committed
  (``tests/scenarios/test_lease_fence_on_postgres.py`` shows both).
* **SQLite**: every write transaction starts with ``BEGIN IMMEDIATE``, so write transactions,
  the fenced write and the takeover included, run one at a time and the ``FOR UPDATE`` (which
  SQLite does not have, and SQLAlchemy omits) is not needed.

The lock is held only for the fenced transaction (one short assignment write per controller
tick); a successor therefore takes over at most that long after the TTL ran out.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, insert, select

from millstream.clock import Clock
from millstream.errors import LeaseLostError
from millstream.metastore import schema as s
from millstream.metastore.cas import cas_update


@dataclass(frozen=True, slots=True)
class Lease:
    name: str
    holder: str | None
    token: int
    expires_at: float
    version: int

    def held_by(self, holder: str, now: float) -> bool:
        return self.holder == holder and self.expires_at > now


def read_lease(conn: Connection, name: str, *, lock: bool = False) -> Lease | None:
    """The lease ``name``; with ``lock``, its row stays locked until the transaction ends (on
    PostgreSQL; SQLite write transactions are serialized anyway)."""
    q = select(s.leases).where(s.leases.c.name == name)
    r = conn.execute(q.with_for_update() if lock else q).mappings().first()
    return (
        None
        if r is None
        else Lease(r["name"], r["holder"], r["token"], r["expires_at"], r["version"])
    )


def acquire_or_renew(
    conn: Connection, clock: Clock, name: str, holder: str, ttl: float
) -> Lease | None:
    """In ``conn``'s transaction: renew the lease if ``holder`` has it, take it if it is free
    or expired; else None. A lost compare-and-set raises CommitConflictError (run it through
    ``MetadataStore.retrying``, which re-reads the lease and decides again)."""
    now = clock.now()
    cur = read_lease(conn, name)
    if cur is None:
        conn.execute(
            insert(s.leases).values(
                name=name, holder=holder, token=1, expires_at=now + ttl, version=1
            )
        )
        return Lease(name, holder, 1, now + ttl, 1)
    if cur.holder == holder and cur.expires_at > now:
        v = cas_update(conn, s.leases, {"name": name}, cur.version, {"expires_at": now + ttl})
        return Lease(name, holder, cur.token, now + ttl, v)
    if cur.expires_at > now:
        return None
    token = cur.token + 1
    v = cas_update(
        conn,
        s.leases,
        {"name": name},
        cur.version,
        {"holder": holder, "token": token, "expires_at": now + ttl},
    )
    return Lease(name, holder, token, now + ttl, v)


def release(conn: Connection, clock: Clock, name: str, holder: str) -> None:
    """In ``conn``'s transaction: let the lease lapse now if ``holder`` has it."""
    cur = read_lease(conn, name)
    if cur is not None and cur.holder == holder:
        cas_update(conn, s.leases, {"name": name}, cur.version, {"expires_at": clock.now() - 1})


def check_fence(conn: Connection, name: str, holder: str, token: int, now: float) -> None:
    """Refuse the write of ``conn``'s transaction unless ``holder`` still holds lease ``name``
    with ``token`` at ``now``; otherwise lock the lease row until that transaction ends, so no
    takeover can commit before the fenced write does (see the module docstring)."""
    cur = read_lease(conn, name, lock=True)
    if cur is None or cur.holder != holder or cur.token != token or cur.expires_at <= now:
        raise LeaseLostError(
            name,
            holder,
            token,
            now_held_by=cur.holder if cur else None,
            now_token=cur.token if cur else None,
        )
