"""Fault campaign: the datastream lifecycle under interleaved commands and late completions.

Several clients (separate ``Registry`` objects on one SQLite store) issue create, pause,
resume, stop and delete calls on a few datastream names. In between, steps of other kinds
are interleaved at random:

* the leader's controller ticks, processing events and completions (INITIALIZING -> READY,
  STOPPING -> STOPPED and DELETING -> gone, the last two only once no writer runs);
* a worker starts or stops a datastream's writer, or reports it failed (-> ERROR);
* asynchronous completion work is captured when it starts (it sees INITIALIZING, STOPPING
  or DELETING) and replayed later, possibly after the datastream has moved on, possibly in
  another incarnation (Brooklin #974 in general form).

A reference model predicts whether each call is accepted. Accepted means it does not raise
InvalidTransitionError, NotFoundError or AlreadyExistsError, and every call must match the
model's prediction. The model also predicts every completion. After every step:

* the stored state equals the model's exactly;
* the stored state is what the last accepted command implies, up to the asynchronous
  completions that may have run since (INITIALIZING -> READY, STOPPING -> STOPPED,
  DELETING -> gone);
* every state change the store recorded is legal by ``TRANSITIONS``. The registry's
  compare-and-set writes are wrapped to record each (from, to), and successive observed
  states cover inserts and removals;
* at most one event is pending per (datastream, kind), because events coalesce.

The campaign is seeded. On failure it prints the seed (rerun with
``MILLSTREAM_FAULT_SEED=<seed>``), Hypothesis's ``@reproduce_failure`` blob, and the steps.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, note, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    get_state_machine_test,
    initialize,
    invariant,
    precondition,
    rule,
)
from sqlalchemy import Connection, Table, select

import millstream.metastore.datastreams as datastreams_module
from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.control import events
from millstream.control.controller import Controller, ControlSettings
from millstream.control.registry import Registry
from millstream.control.workers import heartbeat
from millstream.core.lifecycle import TRANSITIONS, Command, State
from millstream.datastream import DatastreamSpec
from millstream.errors import AlreadyExistsError, InvalidTransitionError, NotFoundError
from millstream.metastore import schema
from millstream.metastore.cas import cas_update

S = State
NAMES = ("alpha", "beta", "gamma")
CLIENTS = 3
WORKER = "worker-1"
SETTINGS = ControlSettings(lease_ttl=3600, worker_ttl=3600, tick_seconds=1)

#: The reference model of user commands (docs/design.md, "Control plane"), by the state found.
MODEL_COMMANDS: dict[tuple[State, Command], State] = {
    (S.READY, Command.PAUSE): S.PAUSED,
    (S.PAUSED, Command.RESUME): S.READY,
    (S.STOPPED, Command.RESUME): S.READY,
    (S.ERROR, Command.RESUME): S.READY,
    (S.READY, Command.STOP): S.STOPPING,
    (S.PAUSED, Command.STOP): S.STOPPING,
    **{(s, Command.DELETE): S.DELETING for s in State if s is not S.DELETING},
}
#: Asynchronous completions: the state they expect -> where they move it (None: gone).
COMPLETIONS: dict[State, State | None] = {
    S.INITIALIZING: S.READY,
    S.STOPPING: S.STOPPED,
    S.DELETING: None,
}

#: A RAM-backed tmp dir when there is one: each example opens a fresh SQLite store, and this
#: keeps their fsyncs off the disk (the campaign runs ~6,000 steps).
TMP_ROOT = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None

SEED = int(os.environ.get("MILLSTREAM_FAULT_SEED") or secrets.randbits(32))
CAMPAIGN = settings(
    max_examples=100,
    stateful_step_count=30,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)

#: Every (datastream, from, to) the registry's compare-and-set wrote, in order.
WRITES: list[tuple[str, State, State]] = []


def recording_cas_update(
    conn: Connection, table: Table, key: dict[str, Any], expected_version: int, values: Any
) -> int:
    """The registry's compare-and-set, recording each datastream state change it stores."""
    if table is not schema.datastreams or "state" not in values:
        return cas_update(conn, table, key, expected_version, values)
    before = conn.execute(
        select(schema.datastreams.c.state).where(schema.datastreams.c.name == key["name"])
    ).scalar_one()
    version = cas_update(conn, table, key, expected_version, values)
    WRITES.append((key["name"], State(before), State(values["state"])))
    return version


def closure(implied: State | None) -> set[State | None]:
    """What the stored state may be, given the target of the last accepted command."""
    if implied in COMPLETIONS:
        return {implied, COMPLETIONS[implied]}
    return {implied}


@dataclass(frozen=True)
class StaleWork:
    """Completion work that read ``expected`` when it started and finishes later."""

    name: str
    expected: State
    to: State | None


def spec(name: str) -> DatastreamSpec:
    return DatastreamSpec.parse(
        {
            "name": name,
            "source": {"kind": "files", "path": f"/nonexistent/{name}"},
            "schema": {"id": "long", "amount": "long"},
            "table": {"mode": "upsert", "primary_key": ["id"]},
        }
    )


SPECS = {name: spec(name) for name in NAMES}
NAME = st.sampled_from(NAMES)
CLIENT = st.integers(0, CLIENTS - 1)


class Lifecycle(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        note(f"campaign seed {SEED}")
        self.home = tempfile.mkdtemp(prefix="ms-lifecycle-", dir=TMP_ROOT)
        self.clock = ManualClock()
        self.catalog = Catalog.open(home=self.home)
        self.clients = [Registry(self.catalog.store, clock=self.clock) for _ in range(CLIENTS)]
        self.leader = Controller(
            self.catalog, controller_id="leader", settings=SETTINGS, clock=self.clock
        )
        self.model: dict[str, State | None] = dict.fromkeys(NAMES)
        self.implied: dict[str, State | None] = dict.fromkeys(NAMES)
        self.observed: dict[str, State | None] = dict.fromkeys(NAMES)
        self.running: set[str] = set()
        self.in_flight: list[StaleWork] = []
        WRITES.clear()

    def teardown(self) -> None:
        self.catalog.close()
        shutil.rmtree(self.home, ignore_errors=True)

    # -- clients -------------------------------------------------------------------------

    @initialize(names=st.lists(NAME, unique=True), tick=st.booleans())
    def start_with(self, names: list[str], tick: bool) -> None:
        """Some datastreams exist from the start, set up by the leader or not yet."""
        for name in names:
            self.create(0, name)
        if tick:
            self.after_every_step()  # one step at a time: created, then set up
            self.controller_tick()

    @rule(client=CLIENT, name=NAME)
    def create(self, client: int, name: str) -> None:
        self.clock.advance(1)
        accepted = self.model[name] is None
        try:
            rec = self.clients[client].create(SPECS[name])
        except AlreadyExistsError:
            note(f"client {client}: create {name} -> AlreadyExistsError")
            assert not accepted, f"create {name} refused, but {name} does not exist"
            return
        note(f"client {client}: create {name} -> {rec.state}")
        assert accepted, f"create {name} accepted while it is {self.model[name]}"
        assert rec.state is S.INITIALIZING
        self.model[name] = self.implied[name] = S.INITIALIZING

    def command(self, client: int, name: str, command: Command) -> None:
        self.clock.advance(1)
        current = self.model[name]
        target = None if current is None else MODEL_COMMANDS.get((current, command))
        try:
            rec = self.clients[client].command(name, command)
        except NotFoundError:
            note(f"client {client}: {command} {name} -> NotFoundError")
            assert current is None, f"{command} {name}: not found, but it is {current}"
            return
        except InvalidTransitionError as exc:
            note(f"client {client}: {command} {name} -> InvalidTransitionError")
            assert current is not None and target is None, (
                f"{command} {name} refused in {current}: {exc.message}"
            )
            assert exc.fields["from_state"] == current.value
            return
        note(f"client {client}: {command} {name} -> {rec.state}")
        assert target is not None, f"{command} {name} accepted in {current}"
        assert rec.state is target
        self.model[name] = self.implied[name] = target

    @rule(client=CLIENT, name=NAME)
    def pause(self, client: int, name: str) -> None:
        self.command(client, name, Command.PAUSE)

    @rule(client=CLIENT, name=NAME)
    def resume(self, client: int, name: str) -> None:
        self.command(client, name, Command.RESUME)

    @rule(client=CLIENT, name=NAME)
    def stop(self, client: int, name: str) -> None:
        self.command(client, name, Command.STOP)

    @rule(client=CLIENT, name=NAME)
    def delete(self, client: int, name: str) -> None:
        self.command(client, name, Command.DELETE)

    # -- the leader ------------------------------------------------------------------------

    @rule()
    def controller_tick(self) -> None:
        self.clock.advance(1)
        assert self.leader.tick(), "the only controller must lead"
        for name, state in self.model.items():
            if state is S.INITIALIZING:
                self.model[name] = S.READY
            elif state in (S.STOPPING, S.DELETING) and name not in self.running:
                self.model[name] = COMPLETIONS[state]
        note(f"controller tick -> {self.model}")

    # -- a worker --------------------------------------------------------------------------

    def heartbeat(self) -> None:
        writers = [{"datastream": ds, "role": "active", "running": True} for ds in self.running]
        heartbeat(
            self.catalog.store,
            WORKER,
            status="RUNNING",
            info={"writers": sorted(writers, key=str)},
            clock=self.clock,
        )

    @rule(name=NAME, running=st.booleans())
    def writer_starts_or_stops(self, name: str, running: bool) -> None:
        """The worker heartbeats that ``name``'s writer runs (or no longer does)."""
        if running:
            self.running.add(name)
        else:
            self.running.discard(name)
        self.heartbeat()
        note(f"worker: running writers {sorted(self.running)}")

    @rule(name=NAME)
    def writer_fails(self, name: str) -> None:
        self.clock.advance(1)
        current = self.model[name]
        applies = current is not None and current not in (S.ERROR, S.DELETING)
        applied = self.clients[0].fail(name, "writer failed")
        note(f"worker: {name} failed -> applied={applied}")
        assert applied == applies, f"fail {name} in {current}: applied={applied}"
        if applied:
            self.model[name] = self.implied[name] = S.ERROR

    # -- asynchronous completion work, captured and replayed late -----------------------

    @precondition(lambda self: any(s in COMPLETIONS for s in self.model.values()))
    @rule(name=NAME)
    def completion_work_starts(self, name: str) -> None:
        rec = self.clients[1].find(name)
        if rec is None or rec.state not in COMPLETIONS:
            return
        work = StaleWork(name, rec.state, COMPLETIONS[rec.state])
        self.in_flight.append(work)
        note(f"completion work starts: {work}")

    @precondition(lambda self: self.in_flight)
    @rule(pick=st.integers(0, 15))
    def late_completion_finishes(self, pick: int) -> None:
        self.clock.advance(1)
        work = self.in_flight.pop(pick % len(self.in_flight))
        applies = self.model[work.name] is work.expected
        registry = self.clients[2]
        if work.to is None:
            applied = registry.remove(work.name)
        else:
            applied = registry.complete(work.name, expected=work.expected, to=work.to)
        note(f"late completion {work} -> applied={applied}")
        assert applied == applies, (
            f"{work} applied={applied} with {work.name} in {self.model[work.name]}"
        )
        if applied:
            self.model[work.name] = work.to

    # -- invariants --------------------------------------------------------------------------

    def stored(self) -> dict[str, State | None]:
        found = {r.name: r.state for r in self.clients[0].list()}
        assert set(found) <= set(NAMES)
        return {name: found.get(name) for name in NAMES}

    @invariant()
    def after_every_step(self) -> None:
        stored = self.stored()
        self.stored_state_is_the_models(stored)
        self.every_stored_transition_is_legal(stored)
        self.pending_events_are_coalesced()

    def stored_state_is_the_models(self, stored: dict[str, State | None]) -> None:
        assert stored == self.model, f"stored {stored} but the model expects {self.model}"
        for name, state in stored.items():
            assert state in closure(self.implied[name]), (
                f"{name} is {state} but the last accepted command implies {self.implied[name]}"
            )

    def every_stored_transition_is_legal(self, stored: dict[str, State | None]) -> None:
        for name, before, after in WRITES:
            assert after in TRANSITIONS[before], (
                f"illegal transition stored: {name} {before}->{after}"
            )
        WRITES.clear()
        for name in NAMES:
            before, after = self.observed[name], stored[name]
            if before == after:
                continue
            if before is None:
                assert after is S.INITIALIZING, f"{name} appeared as {after}"
            elif after is None:
                assert before is S.DELETING, f"{name} vanished from {before}"
            else:
                assert after in TRANSITIONS[before], f"{name} went {before} -> {after}"
        self.observed = stored

    def pending_events_are_coalesced(self) -> None:
        pending = Counter((e.datastream, e.kind) for e in events.pending(self.catalog.store))
        assert all(n == 1 for n in pending.values()), f"uncoalesced events: {pending}"


def test_lifecycle_under_interleaved_commands_and_late_completions_only_moves_legally(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Runs the campaign: 100 examples of up to 30 steps each, seeded (see module doc)."""
    print(f"lifecycle campaign seed: {SEED} (rerun with MILLSTREAM_FAULT_SEED={SEED})")
    monkeypatch.setattr(datastreams_module, "cas_update", recording_cas_update)
    campaign = seed(SEED)(get_state_machine_test(Lifecycle, settings=CAMPAIGN))
    try:
        campaign()
    except BaseException as exc:
        exc.add_note(f"campaign seed {SEED}: rerun with MILLSTREAM_FAULT_SEED={SEED}")
        raise
