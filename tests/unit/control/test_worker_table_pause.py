"""A worker and one table of a datastream of many topics paused on its own: at the worker's
next tick that table's writer leaves the running shared query (no restart: the other tables'
writers stay in it) and the heartbeat reports it stopped; once the table is resumed its
writer joins the query again. The query is a stand-in (no Spark): what is checked is the
membership the worker's reconcile asks for. The same over the real broker and Spark, with the
commits: tests/integration/test_multi_table_lifecycle.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.shared_query import FakeSharedQuery as FakeShared
from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.control.controller import Controller, ControlSettings
from millstream.control.registry import Registry
from millstream.control.worker import Worker
from millstream.control.workers import heartbeat, list_workers
from millstream.datastream import DatastreamSpec


def _running(catalog: Catalog) -> set[str]:
    info = {w.id: w for w in list_workers(catalog.store)}["w"].info
    return {x["member"] for x in info["writers"] if x["running"]}


def test_a_paused_table_leaves_the_shared_query_and_rejoins_on_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    FakeShared.install(monkeypatch)
    clock = ManualClock(start=1_800_000_000.0)
    catalog = Catalog.open(home=tmp_path / "home")
    registry = Registry(catalog.store, clock=clock)
    registry.create(
        DatastreamSpec.parse(
            {
                "name": "inventory",
                "source": {
                    "kind": "kafka",
                    "bootstrap_servers": "127.0.0.1:1",
                    "topics": ["db.inventory.customers", "db.inventory.orders", "db.x.items"],
                },
                "table": {"mode": "upsert", "primary_key": ["id"]},
                "schema": {"id": "long", "status": "string"},
            }
        )
    )
    heartbeat(catalog.store, "w", status="RUNNING", info={}, clock=clock)
    Controller(catalog, controller_id="c", clock=clock).tick()  # READY, tables made, on w
    worker = Worker(
        catalog,
        None,
        worker_id="w",
        settings=ControlSettings(),
        clock=clock,
        state_root=tmp_path / "state",
    )
    every = {"inventory.customers", "inventory.items", "inventory.orders"}
    try:
        worker.tick()
        assert FakeShared.starts == [sorted(every)]
        assert _running(catalog) == every

        registry.pause_table("inventory", "orders")
        worker.tick()
        assert FakeShared.changes == ["-inventory.orders"], "orders left; nothing restarted"
        assert worker.shared is not None
        assert set(worker.shared.members) == every - {"inventory.orders"}
        assert _running(catalog) == every - {"inventory.orders"}
        worker.tick()  # still paused: nothing changes
        assert FakeShared.changes == ["-inventory.orders"]

        registry.resume_table("inventory", "orders")
        worker.tick()
        assert FakeShared.changes == ["-inventory.orders", "+inventory.orders"]
        assert set(worker.shared.members) == every and FakeShared.starts == [sorted(every)]
        assert _running(catalog) == every
    finally:
        worker._stop_shared()
        catalog.close()


def _pattern_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Catalog, Worker]:
    """A worker assigned a ``topic_pattern`` datastream whose topics are shop.alpha and
    shop.beta, its shared query a fake that makes no table."""
    FakeShared.install(monkeypatch)
    clock = ManualClock(start=1_800_000_000.0)
    catalog = Catalog.open(home=tmp_path / "home")
    Registry(catalog.store, clock=clock).create(
        DatastreamSpec.parse(
            {
                "name": "shop",
                "source": {
                    "kind": "kafka",
                    "bootstrap_servers": "127.0.0.1:1",
                    "topic_pattern": r"shop\..*",
                },
                "table": {"mode": "upsert", "primary_key": ["id"]},
                "schema": {"id": "long", "v": "string"},
            }
        )
    )
    heartbeat(catalog.store, "w", status="RUNNING", info={}, clock=clock)
    Controller(catalog, controller_id="c", clock=clock).tick()
    worker = Worker(
        catalog,
        None,
        worker_id="w",
        settings=ControlSettings(),
        clock=clock,
        state_root=tmp_path / "state",
    )
    worker.topics.lister = lambda source: ["shop.alpha", "shop.beta"]
    return catalog, worker


def test_a_patterns_table_is_not_sealed_or_maintained_before_its_writer_made_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``topic_pattern``'s tables are made by their writers as the shared query takes them
    in; until then the worker's sealing and maintenance leave them alone (no error, no
    traceback in the worker's log), and take them up once they exist."""
    catalog, worker = _pattern_worker(tmp_path, monkeypatch)
    try:
        worker.tick()
        assert FakeShared.starts == [["shop.alpha", "shop.beta"]]  # the fake makes no table
        worker.seal()
        assert worker.active_tables() == {}
        assert all(s.status(alive=True).errors == 0 for s in worker.seal_supervisors.values())
        for w in worker.writers.values():  # what the shared query does first with a member
            assert w.runner is not None
            w.runner.ensure_tables()
        worker.seal()
        assert sorted(worker.active_tables()) == ["shop.alpha", "shop.beta"]
        assert sorted(worker.seal_supervisors) == ["shop.alpha", "shop.beta"]
        assert all(s.status(alive=True).errors == 0 for s in worker.seal_supervisors.values())
    finally:
        worker._stop_shared()
        catalog.close()


def test_a_workers_sealing_pass_reads_its_tables_changes_at_once_or_each_on_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's sealing pass reads every table's force commits and manifest changes in one
    store read (``sealing_reads``), not two reads a table; when that read fails, each table's
    pass reads its own and the pass goes on (none of the tables' passes fails)."""
    catalog, worker = _pattern_worker(tmp_path, monkeypatch)
    store = catalog.store
    calls: list[str] = []
    for name in ("sealing_reads", "force_commit_targets", "manifest_changes"):
        real = getattr(store, name)

        def counted(*args: object, _real: object = real, _name: str = name, **kw: object) -> object:
            calls.append(_name)
            return _real(*args, **kw)  # type: ignore[operator]

        monkeypatch.setattr(store, name, counted)
    try:
        worker.tick()
        for w in worker.writers.values():
            assert w.runner is not None
            w.runner.ensure_tables()
        worker.seal()  # the first pass reads each manifest and remembers it
        calls.clear()
        worker.seal()
        assert calls == ["sealing_reads"]  # not a read of each table's force commits

        def down(afters: object) -> object:
            calls.append("sealing_reads")
            raise ConnectionError("metadata store unreachable")

        monkeypatch.setattr(store, "sealing_reads", down)
        calls.clear()
        worker.seal()
        assert calls == ["sealing_reads", "force_commit_targets", "force_commit_targets"]
        assert sorted(worker.sealers) == ["shop.alpha", "shop.beta"]
        assert all(s.status(alive=True).errors == 0 for s in worker.seal_supervisors.values())
    finally:
        worker._stop_shared()
        catalog.close()
