"""The datastream registry: user commands by compare-and-set with events for the leader,
and asynchronous completions that apply only if the record is still where they expect."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.control import events
from millstream.control.registry import Registry
from millstream.core.lifecycle import Command, State
from millstream.datastream import DatastreamSpec
from millstream.errors import AlreadyExistsError, InvalidTransitionError, NotFoundError

MakeSpec = Callable[..., DatastreamSpec]


def pending(catalog: Catalog) -> list[tuple[str | None, str]]:
    return [(e.datastream, e.kind) for e in events.pending(catalog.store)]


def test_create_stores_initializing_and_asks_the_leader_to_set_it_up(
    registry: Registry, catalog: Catalog, clock: ManualClock, make_spec: MakeSpec
) -> None:
    rec = registry.create(make_spec("orders", replicas=2))
    assert (rec.name, rec.state, rec.version, rec.last_error) == (
        "orders",
        State.INITIALIZING,
        1,
        None,
    )
    assert rec.created_at == rec.updated_at == clock.now()
    assert rec.spec == make_spec("orders", replicas=2)
    assert registry.get("orders") == rec
    assert pending(catalog) == [("orders", events.CREATE)]
    assert rec.to_dict()["state"] == "INITIALIZING"


def test_creating_a_taken_name_fails_and_changes_nothing(
    registry: Registry, catalog: Catalog, make_spec: MakeSpec
) -> None:
    registry.create(make_spec("orders"))
    with pytest.raises(AlreadyExistsError):
        registry.create(make_spec("orders", replicas=3))
    assert registry.get("orders").spec.replicas == 1
    assert pending(catalog) == [("orders", events.CREATE)]


def test_unknown_datastreams_are_not_found(registry: Registry) -> None:
    with pytest.raises(NotFoundError):
        registry.get("nope")
    with pytest.raises(NotFoundError):
        registry.command("nope", Command.STOP)
    assert registry.find("nope") is None
    assert not registry.complete("nope", expected=State.STOPPING, to=State.STOPPED)
    assert not registry.fail("nope", "boom")
    assert not registry.remove("nope")


def test_an_illegal_command_is_refused_and_changes_nothing(
    registry: Registry, catalog: Catalog, make_spec: MakeSpec
) -> None:
    before = registry.create(make_spec("orders"))
    with pytest.raises(InvalidTransitionError, match="may go to: DELETING, ERROR, READY"):
        registry.command("orders", Command.PAUSE)
    assert registry.get("orders") == before
    assert pending(catalog) == [("orders", events.CREATE)]


def test_commands_move_the_record_bump_its_version_and_enqueue_events(
    registry: Registry, catalog: Catalog, clock: ManualClock, make_spec: MakeSpec
) -> None:
    registry.create(make_spec("orders"))
    assert registry.complete("orders", expected=State.INITIALIZING, to=State.READY)
    for e in events.pending(catalog.store):
        events.mark_processed(catalog.store, e.id, clock.now())

    clock.advance(1)
    rec = registry.command("orders", Command.PAUSE)
    assert (rec.state, rec.version, rec.updated_at) == (State.PAUSED, 3, clock.now())
    assert registry.command("orders", Command.RESUME).state is State.READY
    assert registry.command("orders", Command.STOP).state is State.STOPPING
    assert pending(catalog) == [("orders", events.ASSIGN), ("orders", events.STOP)]
    assert registry.command("orders", Command.DELETE).state is State.DELETING
    assert pending(catalog)[-1] == ("orders", events.DELETE)


def test_pending_events_of_one_kind_for_one_datastream_coalesce(
    registry: Registry, catalog: Catalog, clock: ManualClock, make_spec: MakeSpec
) -> None:
    registry.create(make_spec("orders"))
    registry.complete("orders", expected=State.INITIALIZING, to=State.READY)
    registry.command("orders", Command.STOP)
    registry.complete("orders", expected=State.STOPPING, to=State.STOPPED)
    registry.command("orders", Command.RESUME)
    registry.command("orders", Command.STOP)  # the first stop event is still pending
    kinds = [k for ds, k in pending(catalog) if ds == "orders"]
    assert kinds.count(events.STOP) == 1

    with catalog.store.write() as conn:
        assert not events.enqueue(conn, "orders", events.STOP, clock.now())
        assert events.enqueue(conn, "other", events.STOP, clock.now())
    stop = next(e for e in events.pending(catalog.store) if e.kind == events.STOP)
    events.mark_processed(catalog.store, stop.id, clock.now())
    with catalog.store.write() as conn:  # once processed, a new stop is a new event
        assert events.enqueue(conn, "orders", events.STOP, clock.now())


def test_marking_an_event_processed_twice_keeps_the_first_time(
    registry: Registry, catalog: Catalog, clock: ManualClock, make_spec: MakeSpec
) -> None:
    registry.create(make_spec("orders"))
    (ev,) = events.pending(catalog.store)
    events.mark_processed(catalog.store, ev.id, clock.now())
    events.mark_processed(catalog.store, ev.id, clock.now() + 5)
    assert events.pending(catalog.store) == []


def test_a_completion_applies_only_if_the_record_is_still_in_the_expected_state(
    registry: Registry, make_spec: MakeSpec
) -> None:
    registry.create(make_spec("orders"))
    assert not registry.complete("orders", expected=State.STOPPING, to=State.STOPPED)
    assert registry.complete("orders", expected=State.INITIALIZING, to=State.READY)
    assert not registry.complete("orders", expected=State.INITIALIZING, to=State.READY)
    registry.command("orders", Command.STOP)
    registry.command("orders", Command.DELETE)
    assert not registry.complete("orders", expected=State.STOPPING, to=State.STOPPED)
    assert registry.get("orders").state is State.DELETING


def test_a_completion_to_an_illegal_state_is_refused(
    registry: Registry, make_spec: MakeSpec
) -> None:
    registry.create(make_spec("orders"))
    with pytest.raises(InvalidTransitionError):
        registry.complete("orders", expected=State.INITIALIZING, to=State.STOPPED)
    assert registry.get("orders").state is State.INITIALIZING


def test_fail_records_the_error_from_any_state_but_deleting(
    registry: Registry, make_spec: MakeSpec
) -> None:
    registry.create(make_spec("orders"))
    assert registry.fail("orders", "table mismatch")
    rec = registry.get("orders")
    assert (rec.state, rec.last_error) == (State.ERROR, "table mismatch")
    assert not registry.fail("orders", "again")  # already failed: the first error stays
    assert registry.get("orders").last_error == "table mismatch"
    resumed = registry.command("orders", Command.RESUME)
    assert (resumed.state, resumed.last_error) == (State.READY, None)
    registry.command("orders", Command.DELETE)
    assert not registry.fail("orders", "late")
    assert registry.get("orders").state is State.DELETING


def test_remove_deletes_only_a_deleting_record(
    registry: Registry, catalog: Catalog, make_spec: MakeSpec
) -> None:
    registry.create(make_spec("orders"))
    assert not registry.remove("orders")
    registry.command("orders", Command.DELETE)
    assert registry.remove("orders")
    assert registry.find("orders") is None
    assert not registry.remove("orders")
    registry.create(make_spec("orders"))  # the name is free again
    assert registry.get("orders").state is State.INITIALIZING


def test_list_returns_every_record_by_name(registry: Registry, make_spec: MakeSpec) -> None:
    for name in ("b", "c", "a"):
        registry.create(make_spec(name))
    assert [r.name for r in registry.list()] == ["a", "b", "c"]
