"""Seed 002: Brooklin #974, a late stop completion overrides a resume.

In Brooklin, a stop request moves a datastream READY -> STOPPING and queues an event; the
leader's LEADER_DO_ASSIGNMENT handler then stops *every* STOPPING datastream, whatever the
event it was called for, and marks each STOPPED asynchronously. With stops for A (event ABC)
and B (event XYZ) queued separately:

* the leader dequeues ABC and starts stopping both A and B;
* it dequeues XYZ while B is still STOPPING and starts stopping B again, asynchronously;
* ABC's work marks A and B STOPPED; the user resumes B, which becomes READY;
* XYZ's work finishes and marks B STOPPED again. It had checked B's state, but from a
  stale cache. B went READY -> STOPPING -> STOPPED -> READY -> STOPPED.

The fix: mark STOPPED only if the authoritative record is still STOPPING. In Millstream an
asynchronous completion is ``Registry.complete(name, expected=STOPPING, to=STOPPED)``, which
re-reads the record inside its transaction and applies only if it is still in ``expected``.
The controller's stop sweep completes every STOPPING datastream that has no running writer,
like Brooklin's handler, so the exact shape arises here too. These tests drive it by hand
(events, one controller, a ManualClock, SQLite in a tmp dir). The last test is the control:
with an unconditional completion the same steps end with B STOPPED, so the scenario can fail.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import Connection

from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.control import events
from millstream.control.controller import Controller, ControlSettings
from millstream.control.registry import Registry
from millstream.core.lifecycle import Command, State
from millstream.datastream import DatastreamSpec
from millstream.errors import InvalidTransitionError
from millstream.metastore import schema
from millstream.metastore.cas import cas_update

A, B = "datastream-a", "datastream-b"
#: Long TTLs: the clock moves by seconds, and leadership is not what this test is about.
SETTINGS = ControlSettings(lease_ttl=3600, worker_ttl=3600, tick_seconds=1)


def spec(name: str, tmp_path: Path) -> DatastreamSpec:
    return DatastreamSpec.parse(
        {
            "name": name,
            "source": {"kind": "files", "path": str(tmp_path / "source" / name)},
            "schema": {"id": "long", "amount": "long"},
            "table": {"mode": "upsert", "primary_key": ["id"]},
        }
    )


@dataclass
class Setup:
    catalog: Catalog
    clock: ManualClock
    registry: Registry
    leader: Controller


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Setup]:
    clock = ManualClock()
    with Catalog.open(home=tmp_path / "home") as cat:
        registry = Registry(cat.store, clock=clock)
        leader = Controller(cat, controller_id="leader", settings=SETTINGS, clock=clock)
        for name in (A, B):
            registry.create(spec(name, tmp_path))
        assert leader.tick()
        assert [registry.get(n).state for n in (A, B)] == [State.READY, State.READY]
        assert events.pending(cat.store) == []
        yield Setup(cat, clock, registry, leader)


def pending(s: Setup) -> list[tuple[str | None, str]]:
    return [(e.datastream, e.kind) for e in events.pending(s.catalog.store)]


def state(s: Setup, name: str) -> State:
    return s.registry.get(name).state


def handle_one_event(s: Setup, ev: events.Event) -> None:
    """What ``Controller.tick`` does for one dequeued event: handle it, mark it processed,
    then run the leader's assignment pass. That pass's stop sweep acts on every STOPPING
    datastream, not only the one the event is about, as LEADER_DO_ASSIGNMENT does."""
    s.leader._handle(ev)
    events.mark_processed(s.catalog.store, ev.id, s.clock.now())
    assert s.leader.lease is not None
    s.leader.reconcile(s.leader.lease)


@dataclass
class InFlightStopWork:
    """The asynchronous stop work XYZ started for B. It saw B as STOPPING when it started
    and calls ``complete(B, expected=STOPPING, to=STOPPED)`` when it finishes, possibly
    long after B has moved on."""

    registry: Registry
    name: str
    seen: State

    @classmethod
    def start(cls, registry: Registry, name: str) -> InFlightStopWork:
        return cls(registry, name, registry.get(name).state)

    def finish(self) -> bool:
        return self.registry.complete(self.name, expected=self.seen, to=State.STOPPED)


@dataclass
class Outcome:
    pending_stops: list[tuple[str | None, str]]
    after_abc: dict[str, State]
    xyz_still_pending: bool
    after_resume: State
    late_completion_applied: bool
    b_at_the_end: State
    a_at_the_end: State


def brooklin_974(s: Setup) -> Outcome:
    """The report's timeline, step by step. Returns what each step left behind."""
    s.registry.command(A, Command.STOP)  # t=0: event ABC
    s.clock.advance(10)
    s.registry.command(B, Command.STOP)  # t=10: event XYZ
    pending_stops = pending(s)
    abc, xyz = events.pending(s.catalog.store)

    s.clock.advance(15)  # t=25: XYZ is dequeued while B is still STOPPING; its work starts
    xyz_work = InFlightStopWork.start(s.registry, B)
    assert xyz_work.seen is State.STOPPING

    s.clock.advance(5)  # t=30: ABC's work stops every STOPPING datastream, B included
    handle_one_event(s, abc)
    after_abc = {A: state(s, A), B: state(s, B)}
    xyz_still_pending = [e.id for e in events.pending(s.catalog.store)] == [xyz.id]

    s.clock.advance(5)  # t=35: the user resumes B
    after_resume = s.registry.command(B, Command.RESUME).state

    s.clock.advance(5)  # t=40: XYZ's late work finishes
    applied = xyz_work.finish()
    b_after_late_work = state(s, B)

    s.clock.advance(1)  # the leader catches up with the rest of the queue
    assert s.leader.tick()
    assert state(s, B) is b_after_late_work, "the leader's next tick must not move B either"
    return Outcome(
        pending_stops=pending_stops,
        after_abc=after_abc,
        xyz_still_pending=xyz_still_pending,
        after_resume=after_resume,
        late_completion_applied=applied,
        b_at_the_end=state(s, B),
        a_at_the_end=state(s, A),
    )


def test_late_stop_completion_does_not_override_a_resume(setup: Setup) -> None:
    out = brooklin_974(setup)
    assert out.pending_stops == [(A, events.STOP), (B, events.STOP)], "two separate events"
    assert out.after_abc == {A: State.STOPPED, B: State.STOPPED}, "ABC's sweep also stops B"
    assert out.xyz_still_pending, "B's own event is still in flight"
    assert out.after_resume is State.READY
    assert not out.late_completion_applied
    assert out.b_at_the_end is State.READY
    assert out.a_at_the_end is State.STOPPED


def test_duplicate_stop_requests_while_the_stop_event_is_pending_coalesce(setup: Setup) -> None:
    s = setup
    other = Registry(s.catalog.store, clock=s.clock)  # a second client
    s.registry.command(B, Command.STOP)
    with pytest.raises(InvalidTransitionError, match="from STOPPING"):
        other.command(B, Command.STOP)  # a repeated stop of a stopping datastream is refused
    assert pending(s) == [(B, events.STOP)]

    # Another event's sweep stops B while B's own stop event is still pending; B is resumed
    # and stopped again: the second stop request joins the pending event.
    s.registry.command(A, Command.PAUSE)
    (stop_b, pause_a) = events.pending(s.catalog.store)
    handle_one_event(s, pause_a)
    assert state(s, B) is State.STOPPED
    s.registry.command(B, Command.RESUME)
    other.command(B, Command.STOP)
    stops = [e for e in events.pending(s.catalog.store) if e.kind == events.STOP]
    assert [(e.id, e.datastream) for e in stops] == [(stop_b.id, B)], "one event, not two"

    assert s.leader.tick()  # one stop event is enough to stop B
    assert state(s, B) is State.STOPPED
    assert events.pending(s.catalog.store) == []


def unconditional_complete(
    self: Registry, name: str, *, expected: State, to: State, error: str | None = None
) -> bool:
    """The pre-fix behaviour: ``expected`` came from a (stale) cached check and is trusted;
    the state is set by a plain compare-and-set on whatever version is current."""

    def _txn(conn: Connection) -> bool:
        rec = self._get(conn, name)
        if rec is None:
            return False
        cas_update(
            conn,
            schema.datastreams,
            {"name": name},
            rec.version,
            {"state": to.value, "updated_at": self.clock.now(), "last_error": error},
        )
        return True

    applied, _ = self.store.retrying(_txn)
    return bool(applied)


def test_control_unconditional_completion_lets_the_late_stop_override_the_resume(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: with the expected-state check removed, the same steps end with B
    STOPPED after the user resumed it, so the test above can fail."""
    monkeypatch.setattr(Registry, "complete", unconditional_complete)
    out = brooklin_974(setup)
    assert out.after_abc == {A: State.STOPPED, B: State.STOPPED}
    assert out.after_resume is State.READY
    assert out.late_completion_applied
    assert out.b_at_the_end is State.STOPPED  # READY -> STOPPING -> STOPPED -> READY -> STOPPED
