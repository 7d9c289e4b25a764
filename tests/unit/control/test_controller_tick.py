"""The controller, one tick at a time with a ManualClock: one leader among many, takeover
after the TTL with a higher fencing token, a fenced old leader, and the leader's work
(set up, assign, complete stops and deletes)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import select

from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.control import events
from millstream.control.controller import Controller, ControlSettings
from millstream.control.registry import Registry
from millstream.control.workers import heartbeat
from millstream.core.assignment import ACTIVE, STANDBY
from millstream.core.lifecycle import Command, State
from millstream.datastream import DatastreamSpec
from millstream.errors import LeaseLostError, NotFoundError
from millstream.metastore import schema

SETTINGS = ControlSettings(lease_ttl=10.0, worker_ttl=5.0, tick_seconds=1.0)
MakeSpec = Callable[..., DatastreamSpec]


def controller(catalog: Catalog, clock: ManualClock, cid: str) -> Controller:
    return Controller(catalog, controller_id=cid, settings=SETTINGS, clock=clock)


def beat(catalog: Catalog, clock: ManualClock, worker: str, *running: str, **kw: Any) -> None:
    """A worker heartbeat, reporting a running writer for each datastream in ``running``."""
    writers = [{"datastream": ds, "role": ACTIVE, "running": True} for ds in running]
    heartbeat(
        catalog.store,
        worker,
        status=kw.get("status", "RUNNING"),
        info={"writers": writers},
        clock=clock,
    )


def assignment_tokens(catalog: Catalog) -> set[int]:
    with catalog.store.read() as conn:
        return set(conn.execute(select(schema.assignments.c.token)).scalars())


def ready(registry: Registry, leader: Controller, *names: str, spec: MakeSpec, **kw: Any) -> None:
    for name in names:
        registry.create(spec(name, **kw))
    assert leader.tick()
    for name in names:
        assert registry.get(name).state is State.READY


# -- leadership ----------------------------------------------------------------------------


def test_only_one_of_two_controllers_leads(catalog: Catalog, clock: ManualClock) -> None:
    c1, c2 = controller(catalog, clock, "c1"), controller(catalog, clock, "c2")
    assert c1.tick()
    assert not c2.tick()
    for _ in range(5):
        clock.advance(SETTINGS.lease_ttl / 2)
        assert c1.tick()
        assert not c2.tick()
    assert c1.is_leader and not c2.is_leader
    assert c1.lease is not None and c1.lease.token == 1


def test_when_the_leader_stops_ticking_past_the_ttl_the_other_takes_over_with_a_higher_token(
    catalog: Catalog, clock: ManualClock, registry: Registry, make_spec: MakeSpec
) -> None:
    c1, c2 = controller(catalog, clock, "c1"), controller(catalog, clock, "c2")
    beat(catalog, clock, "w1")
    registry.create(make_spec("orders"))
    assert c1.tick()
    old = c1.lease
    assert old is not None
    assert catalog.store.read_assignments() == {"orders": [("w1", ACTIVE)]}

    clock.advance(SETTINGS.lease_ttl - 1)
    assert not c2.tick(), "the lease has not expired yet"
    clock.advance(1)  # c1 has not renewed for a whole TTL
    beat(catalog, clock, "w2")
    assert not c1.is_leader
    assert c2.tick()
    assert c2.lease is not None and c2.lease.token == old.token + 1

    # The old leader wakes up: it cannot renew, and a write under its old lease is fenced.
    before = catalog.store.read_assignments()
    with pytest.raises(LeaseLostError):
        c1.reconcile(old)
    assert catalog.store.read_assignments() == before
    assert not c1.tick()
    assert c1.lease is None


def test_a_leader_paused_mid_tick_past_its_ttl_is_fenced_and_steps_down(
    catalog: Catalog, clock: ManualClock, registry: Registry, make_spec: MakeSpec
) -> None:
    c1, c2 = controller(catalog, clock, "c1"), controller(catalog, clock, "c2")
    beat(catalog, clock, "w1")
    assert c1.tick()
    registry.create(make_spec("orders"))
    real_handle = c1._handle

    def handle_then_pause(ev: events.Event) -> None:
        """c1 handles the event, then stalls (GC, SIGSTOP) past its TTL; c2 takes over."""
        real_handle(ev)
        clock.advance(SETTINGS.lease_ttl + 1)
        beat(catalog, clock, "w1")
        assert c2.tick()
        registry.command("orders", Command.STOP)  # c1 would unassign it if it could write

    c1._handle = handle_then_pause  # type: ignore[method-assign]
    assert not c1.tick()
    assert c1.lease is None and not c1.is_leader
    assert c2.lease is not None and c2.lease.token == 2
    # c1's assignment write was refused: what is stored is c2's, under c2's token.
    assert catalog.store.read_assignments() == {"orders": [("w1", ACTIVE)]}
    assert assignment_tokens(catalog) == {2}
    assert registry.get("orders").state is State.STOPPING  # nor did c1 complete the stop

    assert c2.tick()
    assert catalog.store.read_assignments() == {}
    assert registry.get("orders").state is State.STOPPED


def test_a_stopped_controller_releases_its_lease_for_the_next_one(
    catalog: Catalog, clock: ManualClock
) -> None:
    c1, c2 = controller(catalog, clock, "c1"), controller(catalog, clock, "c2")
    c1.stop()
    assert c1.tick()
    c1.run_forever()  # stopped already: no loop, releases the lease on the way out
    assert c2.tick()
    assert c2.lease is not None and c2.lease.token == 2


# -- the leader's work ---------------------------------------------------------------------


def test_create_becomes_ready_once_the_leader_has_created_its_tables(
    catalog: Catalog, clock: ManualClock, registry: Registry, make_spec: MakeSpec
) -> None:
    leader = controller(catalog, clock, "c1")
    registry.create(make_spec("orders", table={"name": "orders_t", "mode": "append"}))
    assert leader.tick()
    assert registry.get("orders").state is State.READY
    assert catalog.table("orders_t").name == "orders_t"
    assert catalog.table("orders_t__dead_letter").name == "orders_t__dead_letter"
    assert events.pending(catalog.store) == []


def test_a_table_that_cannot_be_created_puts_the_datastream_in_error(
    catalog: Catalog, clock: ManualClock, registry: Registry, make_spec: MakeSpec
) -> None:
    catalog.create_table({"name": "orders", "schema": {"other": "string"}})
    leader = controller(catalog, clock, "c1")
    registry.create(make_spec("orders"))
    assert leader.tick()
    rec = registry.get("orders")
    assert rec.state is State.ERROR
    assert rec.last_error is not None and "cannot create table" in rec.last_error


def test_the_leader_assigns_ready_and_paused_datastreams_to_live_workers(
    catalog: Catalog, clock: ManualClock, registry: Registry, make_spec: MakeSpec
) -> None:
    leader = controller(catalog, clock, "c1")
    beat(catalog, clock, "w1")
    beat(catalog, clock, "w2")
    ready(registry, leader, "a", "b", spec=make_spec, replicas=2)
    expected = catalog.store.read_assignments()
    for name in ("a", "b"):
        assert sorted(w for w, _ in expected[name]) == ["w1", "w2"]
        assert [r for _, r in expected[name]] == [ACTIVE, STANDBY]

    registry.command("a", Command.PAUSE)
    assert leader.tick()
    assert catalog.store.read_assignments() == expected, "a paused writer keeps its placement"

    registry.command("b", Command.STOP)
    assert leader.tick()
    assert catalog.store.read_assignments() == {"a": expected["a"]}


def test_a_standby_is_promoted_when_its_actives_worker_stops_heartbeating(
    catalog: Catalog, clock: ManualClock, registry: Registry, make_spec: MakeSpec
) -> None:
    leader = controller(catalog, clock, "c1")
    beat(catalog, clock, "w1")
    beat(catalog, clock, "w2")
    ready(registry, leader, "orders", spec=make_spec, replicas=2)
    assert catalog.store.read_assignments() == {"orders": [("w1", ACTIVE), ("w2", STANDBY)]}
    now = clock.now()
    assert not catalog.store.may_commit("orders", "w2", takeover_ttl=SETTINGS.takeover_ttl, now=now)
    assert catalog.store.may_commit("orders", "w1", takeover_ttl=SETTINGS.takeover_ttl, now=now)

    # w1 goes silent; w2 and a new w3 keep heartbeating.
    clock.advance(SETTINGS.takeover_ttl - 0.1)
    beat(catalog, clock, "w2")
    assert not catalog.store.may_commit(
        "orders", "w2", takeover_ttl=SETTINGS.takeover_ttl, now=clock.now()
    )
    clock.advance(0.1)
    # The standby's commit gate opens after the takeover TTL, long before the controller
    # counts w1 dead (the worker TTL) and moves its writers.
    assert SETTINGS.takeover_ttl < SETTINGS.worker_ttl
    assert catalog.store.may_commit(
        "orders", "w2", takeover_ttl=SETTINGS.takeover_ttl, now=clock.now()
    )
    assert leader.tick()
    assert catalog.store.read_assignments() == {"orders": [("w1", ACTIVE), ("w2", STANDBY)]}
    clock.advance(SETTINGS.worker_ttl - SETTINGS.takeover_ttl)
    beat(catalog, clock, "w2")
    beat(catalog, clock, "w3")
    assert leader.tick()
    assert catalog.store.read_assignments() == {"orders": [("w2", ACTIVE), ("w3", STANDBY)]}
    assert not catalog.store.may_commit(
        "orders", "w1", takeover_ttl=SETTINGS.takeover_ttl, now=clock.now()
    )


def test_a_stop_completes_only_once_no_live_worker_runs_the_writer(
    catalog: Catalog, clock: ManualClock, registry: Registry, make_spec: MakeSpec
) -> None:
    leader = controller(catalog, clock, "c1")
    beat(catalog, clock, "w1", "orders")
    ready(registry, leader, "orders", spec=make_spec)
    registry.command("orders", Command.STOP)
    assert leader.tick()
    assert registry.get("orders").state is State.STOPPING
    assert events.pending(catalog.store) == []  # the event is done; the sweep finishes it

    beat(catalog, clock, "w1")  # the worker stopped the writer
    assert leader.tick()
    assert registry.get("orders").state is State.STOPPED


def test_a_dead_workers_last_heartbeat_does_not_block_a_stop(
    catalog: Catalog, clock: ManualClock, registry: Registry, make_spec: MakeSpec
) -> None:
    leader = controller(catalog, clock, "c1")
    beat(catalog, clock, "w1", "orders")
    ready(registry, leader, "orders", spec=make_spec)
    registry.command("orders", Command.STOP)
    assert leader.tick()
    assert registry.get("orders").state is State.STOPPING
    clock.advance(SETTINGS.worker_ttl)
    assert leader.tick()
    assert registry.get("orders").state is State.STOPPED


def test_a_delete_removes_the_record_and_its_assignment_once_no_writer_runs(
    catalog: Catalog, clock: ManualClock, registry: Registry, make_spec: MakeSpec
) -> None:
    leader = controller(catalog, clock, "c1")
    beat(catalog, clock, "w1", "orders")
    ready(registry, leader, "orders", spec=make_spec)
    assert catalog.store.read_assignments() == {"orders": [("w1", ACTIVE)]}
    registry.command("orders", Command.DELETE)
    assert leader.tick()
    assert registry.get("orders").state is State.DELETING
    assert catalog.store.read_assignments() == {}
    beat(catalog, clock, "w1")
    assert leader.tick()
    with pytest.raises(NotFoundError):
        registry.get("orders")


def test_a_follower_does_no_leader_work(
    catalog: Catalog, clock: ManualClock, registry: Registry, make_spec: MakeSpec
) -> None:
    c1, c2 = controller(catalog, clock, "c1"), controller(catalog, clock, "c2")
    assert c1.tick()
    registry.create(make_spec("orders"))
    assert not c2.tick()
    assert registry.get("orders").state is State.INITIALIZING
    assert [e.kind for e in events.pending(catalog.store)] == [events.CREATE]
