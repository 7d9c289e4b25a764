"""A leader paused between its fence check and its commit must not assign after its successor
took over (PostgreSQL, real concurrent transactions).

Controller A holds the lease with token 1 and writes assignments: ``write_assignments`` checks
the fence (``check_fence``) and then replaces the assignment rows, in one READ COMMITTED
transaction. A pauses right after the check (GC, SIGSTOP). Its TTL runs out; successor B, whose
clock is past it, takes the lease over (token 2). Then A resumes and commits.

The invariant a user relies on: once B's takeover has committed, no assignment written under
token 1 ever commits. With the fence reading the lease row ``FOR UPDATE``, B's takeover waits
for A's transaction (here it gives up after a 500 ms ``lock_timeout`` and retries after A
committed), so A's assignments commit before the takeover, never after. The control test runs
the old fence, a plain ``SELECT``: B takes over at once, and A's stale assignments commit after.

Deterministic: A is held by a ``threading.Event`` inside the patched ``check_fence``, each
controller has its own store (engine, connections), and the threads are joined in order.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import psycopg
import pytest
from psycopg import sql
from sqlalchemy import Connection
from sqlalchemy.exc import OperationalError

from harness.servers import PostgresServer
from millstream.clock import ManualClock
from millstream.control import leases
from millstream.control.leases import acquire_or_renew, read_lease
from millstream.control.workers import CONTROLLER_LEASE, write_assignments
from millstream.core.assignment import ACTIVE, STANDBY
from millstream.errors import LeaseLostError
from millstream.metastore import assignments
from millstream.metastore.store import MetadataStore

pytestmark = pytest.mark.postgres

TTL = 10.0
#: A's assignments (written under token 1) and B's (token 2).
OLD = {"orders": [("w1", ACTIVE), ("w2", STANDBY)]}
NEW = {"orders": [("w2", ACTIVE)]}
#: Generous bound for a thread that must finish; never used to order anything.
JOIN = 30.0

Fence = Callable[[Connection, str, str, int, float], None]


@pytest.fixture
def database(postgres_server: PostgresServer) -> Iterator[str]:
    """A fresh database on the session PostgreSQL server; its SQLAlchemy URL."""
    name = f"ms_fence_{uuid.uuid4().hex[:12]}"
    try:
        yield postgres_server.create_database(name)
    finally:
        with psycopg.connect(postgres_server.dsn(), autocommit=True, connect_timeout=10) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def unguarded_fence(conn: Connection, name: str, holder: str, token: int, now: float) -> None:
    """The old fence: the same check, by a plain SELECT that locks nothing."""
    cur = read_lease(conn, name)
    if cur is None or cur.holder != holder or cur.token != token or cur.expires_at <= now:
        raise LeaseLostError(name, holder, token)


@dataclass
class Run:
    #: What committed (or failed), in the order it happened.
    events: list[tuple[str, int | str]] = field(default_factory=list)
    final_lease_token: int = 0
    final_assignments: dict[str, list[tuple[str, str]]] = field(default_factory=dict)

    def stale_commits_after_takeover(self) -> list[tuple[str, int | str]]:
        """Assignments committed under token 1 after a takeover to token 2 committed."""
        taken = [i for i, (what, _) in enumerate(self.events) if what == "takeover committed"]
        if not taken:
            return []
        return [e for e in self.events[taken[0] :] if e == ("assignments committed", 1)]


def run_scenario(url: str, monkeypatch: pytest.MonkeyPatch, fence: Fence) -> Run:
    run = Run()
    record_lock = threading.Lock()

    def record(what: str, detail: int | str) -> None:
        with record_lock:
            run.events.append((what, detail))

    clock_a = ManualClock()
    clock_b = ManualClock(clock_a.now() + TTL + 1)  # B sees A's lease expired
    store_a = MetadataStore(url, clock=clock_a)
    # B's connections give up on a row lock after 500 ms instead of waiting for it.
    store_b = MetadataStore(f"{url}?options=-c%20lock_timeout%3D500ms", clock=clock_b)
    try:
        lease_a = acquire_or_renew(store_a, CONTROLLER_LEASE, "controller-a", TTL, clock_a)
        assert lease_a is not None and lease_a.token == 1

        fenced, resume = threading.Event(), threading.Event()

        def paused_fence(conn: Connection, name: str, holder: str, token: int, now: float) -> None:
            fence(conn, name, holder, token, now)
            if holder == "controller-a":
                fenced.set()
                assert resume.wait(JOIN), "the test never resumed controller A"

        monkeypatch.setattr(assignments, "check_fence", paused_fence)

        def leader_a() -> None:
            try:
                write_assignments(
                    store_a, OLD, holder="controller-a", token=lease_a.token, clock=clock_a
                )
                record("assignments committed", lease_a.token)
            except LeaseLostError:
                record("assignments fenced", lease_a.token)

        def take_over() -> None:
            try:
                lease_b = acquire_or_renew(store_b, CONTROLLER_LEASE, "controller-b", TTL, clock_b)
            except OperationalError as exc:  # lock_timeout: A's fenced write is in flight
                record("takeover waited", str(exc.orig).splitlines()[0])
                return
            assert lease_b is not None
            record("takeover committed", lease_b.token)

        a = threading.Thread(target=leader_a, name="leader-a")
        a.start()
        assert fenced.wait(JOIN), "controller A never reached its fence"
        b = threading.Thread(target=take_over, name="successor-b")
        b.start()
        b.join(JOIN)  # B returns: taken over, or timed out waiting for A's lock
        assert not b.is_alive()
        resume.set()
        a.join(JOIN)
        assert not a.is_alive()
        if not any(what == "takeover committed" for what, _ in run.events):
            take_over()  # A's write is done: nothing holds the lease row any more
        with store_b.read() as conn:
            final = read_lease(conn, CONTROLLER_LEASE)
        assert final is not None
        run.final_lease_token = final.token
        run.final_assignments = store_b.read_assignments()
    finally:
        store_a.dispose()
        store_b.dispose()
    return run


def test_a_paused_leader_cannot_commit_assignments_after_its_successor_took_over_on_postgres(
    database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = run_scenario(database, monkeypatch, leases.check_fence)

    assert run.stale_commits_after_takeover() == [], run.events
    # B could not take over while A's fenced write was in flight; it did once A committed.
    assert [what for what, _ in run.events] == [
        "takeover waited",
        "assignments committed",
        "takeover committed",
    ], run.events
    assert "lock timeout" in str(run.events[0][1])
    assert run.final_lease_token == 2
    assert run.final_assignments == OLD


def test_a_new_leaders_assignments_replace_the_old_ones_and_the_old_token_stays_fenced_on_postgres(
    database: str,
) -> None:
    clock = ManualClock()
    store = MetadataStore(database, clock=clock)
    try:
        old = acquire_or_renew(store, CONTROLLER_LEASE, "controller-a", TTL, clock)
        assert old is not None
        assert write_assignments(store, OLD, holder="controller-a", token=old.token, clock=clock)
        clock.advance(TTL + 1)
        new = acquire_or_renew(store, CONTROLLER_LEASE, "controller-b", TTL, clock)
        assert new is not None and new.token == 2
        assert write_assignments(store, NEW, holder="controller-b", token=new.token, clock=clock)
        with pytest.raises(LeaseLostError):
            write_assignments(store, OLD, holder="controller-a", token=old.token, clock=clock)
        assert store.read_assignments() == NEW
    finally:
        store.dispose()


def test_control_with_a_plain_select_fence_the_paused_leader_assigns_after_the_takeover(
    database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: the same steps with the old, unlocked fence break the invariant."""
    run = run_scenario(database, monkeypatch, unguarded_fence)

    assert [what for what, _ in run.events] == ["takeover committed", "assignments committed"]
    assert run.stale_commits_after_takeover() == [("assignments committed", 1)]
    # The user-visible damage: the new leader holds token 2, the assignments carry token 1.
    assert run.final_lease_token == 2 and run.final_assignments == OLD
