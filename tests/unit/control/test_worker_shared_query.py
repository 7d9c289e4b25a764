"""A worker's shared query is restarted only when its membership really changes: a datastream
whose state directory someone else holds is probed first and retried after a doubling wait,
instead of restarting the query (every member's freshness) at each tick; meanwhile the worker
reports STARTING (KAFKA-8187). A member in its failure backoff keeps its lock."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.shared_query import FakeSharedQuery as FakeShared
from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.control.controller import Controller, ControlSettings
from millstream.control.registry import Registry
from millstream.control.worker import Worker
from millstream.control.workers import heartbeat, list_workers
from millstream.core.lifecycle import Command
from millstream.datastream import DatastreamSpec
from millstream.storage.statedir import StateDirectory


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    FakeShared.install(monkeypatch)
    clock = ManualClock(start=1_800_000_000.0)
    catalog = Catalog.open(home=tmp_path / "home")
    for name in ("a", "b"):
        src = tmp_path / name / "0"
        src.mkdir(parents=True)
        (src / "0.jsonl").write_text('{"id": 1}\n')
        Registry(catalog.store, clock=clock).create(
            DatastreamSpec.parse(
                {
                    "name": name,
                    "source": {"kind": "files", "path": str(src.parent)},
                    "schema": {"id": "long"},
                }
            )
        )
    heartbeat(catalog.store, "w", status="RUNNING", info={}, clock=clock)
    Controller(catalog, controller_id="c", clock=clock).tick()  # READY, assigned to w
    worker = Worker(
        catalog,
        None,
        worker_id="w",
        settings=ControlSettings(),
        clock=clock,
        state_root=tmp_path / "state",
    )
    yield catalog, clock, worker
    worker._stop_shared()
    catalog.close()


def _status(catalog: Catalog) -> str:
    return {w.id: w for w in list_workers(catalog.store)}["w"].status


def test_a_held_state_directory_does_not_restart_the_query_at_every_tick(setup: Any) -> None:
    catalog, clock, worker = setup
    elsewhere = StateDirectory(worker.state_root, "b")
    elsewhere.lock()
    worker.tick()
    assert FakeShared.starts == [["a"]]
    assert _status(catalog) == "STARTING", "b is listed without its lock"
    for _ in range(3):
        worker.tick()
    clock.advance(6)
    worker.tick()  # tried again after 5 s: still held, the next try waits 10 s
    clock.advance(6)
    worker.tick()
    assert FakeShared.starts == [["a"]], "the query was restarted for a member it cannot lock"

    elsewhere.unlock()
    clock.advance(5)
    worker.tick()
    assert FakeShared.starts == [["a"]] and FakeShared.changes == ["+b"], "b joined the query"
    assert _status(catalog) == "RUNNING"
    assert all(w.state_dir.held for w in worker.writers.values())


def test_a_member_in_its_backoff_keeps_its_lock(setup: Any) -> None:
    catalog, clock, worker = setup
    worker.tick()
    assert FakeShared.starts == [["a", "b"]]
    worker._member_failed("b", "SourceReadError: the broker did not answer", fail=False)
    assert worker.shared is not None
    worker.shared.stop()  # the query ends with b's error
    assert worker.shared_thread is not None
    worker.shared_thread.join(5)
    worker.tick()  # b waits out its backoff: the query runs a alone
    assert FakeShared.starts[-1] == ["a"]
    assert worker.writers["b"].state_dir.held, "b's lock is kept through its backoff"
    assert _status(catalog) == "RUNNING"
    clock.advance(6)
    worker.tick()
    assert FakeShared.starts[-1] == ["a"] and FakeShared.changes == ["+b"], "b joined it"
    assert worker.writers["b"].error is None and worker.writers["b"].failures == 1
    assert worker.writers["b"].state_dir.held


def test_members_join_and_leave_the_running_query_without_a_restart(setup: Any) -> None:
    """A pause, a stop and a datastream back from its backoff change the running query's
    members; only a change it cannot take (its answer False) restarts it."""
    catalog, clock, worker = setup
    registry = Registry(catalog.store, clock=clock)
    worker.tick()
    assert FakeShared.starts == [["a", "b"]]
    registry.command("b", Command.PAUSE)
    worker.tick()
    assert FakeShared.starts == [["a", "b"]] and FakeShared.changes == ["-b"]
    assert "b" not in worker.writers and not StateDirectory(worker.state_root, "b").held
    assert _status(catalog) == "RUNNING"
    registry.command("b", Command.RESUME)
    worker.tick()
    assert FakeShared.changes == ["-b", "+b"] and len(FakeShared.starts) == 1
    assert worker.writers["b"].state_dir.held and worker.writers["b"].running
    info = {w.id: w for w in list_workers(catalog.store)}["w"].info
    assert info["shared_query"] == {"members": ["a", "b"]}

    # b's watchdog restart: it leaves and waits out its backoff (keeping its lock)
    worker._failed(worker.writers["b"], "stalled")
    worker.tick()
    assert FakeShared.changes[-1] == "-b" and worker.writers["b"].state_dir.held
    FakeShared.refuse = True  # the query cannot take b back (say its trigger is shorter)
    clock.advance(6)
    worker.tick()
    assert FakeShared.starts[-1] == ["a", "b"] and len(FakeShared.starts) == 2
    assert all(w.state_dir.held for w in worker.writers.values())
