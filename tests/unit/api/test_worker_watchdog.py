"""No silent stalls: a writer whose shard upper stops moving while its source holds newer
records is reported (its health in the REST record, ``millstream_datastream_stalled``,
debugInfo) and restarted with backoff by its worker's watchdog; a healthy idle datastream
(no new records, for an hour) raises nothing, nor does the first record after the idle hour.

The writers here are wedged stand-ins for the Spark query: they start as the real one does
(tables and shards created at the uppers) and never commit. The stall time passes on a
:class:`ManualClock`: no test sleeps it."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from harness.api_support import TestClient, write_lines
from millstream.api import create_app
from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.control import worker as worker_module
from millstream.control.controller import Controller, ControlSettings
from millstream.control.registry import Registry
from millstream.control.worker import Worker
from millstream.control.workers import heartbeat
from millstream.datastream import DatastreamSpec
from millstream.errors import InvalidSpecError
from millstream.metastore.models import ShardAppend
from millstream.spark.runner import RestartsInARow
from millstream.storage.statedir import StateDirectory

STALL = 300.0


class WedgedQuery:
    """The shared query of a worker whose commits never advance: it starts as the real one
    (each member's tables and shards at their uppers) and then runs without committing."""

    starts: list[list[str]] = []

    def __init__(self, members: list[Any], spark: Any, state_dir: StateDirectory, **_: Any) -> None:
        self.members = {m.spec.name: m for m in members}
        self.restarts: dict[str, RestartsInARow] = {}
        self._stop = threading.Event()
        for m in members:
            m.ensure_tables()
            m.bootstrap()
        WedgedQuery.starts.append(sorted(self.members))

    def run(self) -> None:
        self._stop.wait(60)

    def stop(self) -> None:
        self._stop.set()

    def add(self, member: Any) -> bool:
        return False  # a member joins only by a restart here (the starts are counted)

    def remove(self, name: str) -> bool:
        return False

    def status(self) -> dict[str, Any]:
        return {"members": sorted(self.members)}


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    WedgedQuery.starts = []
    monkeypatch.setattr(worker_module, "SharedQueryRunner", WedgedQuery)
    clock = ManualClock(start=1_800_000_000.0)
    catalog = Catalog.open(home=tmp_path / "home")
    source = tmp_path / "orders"
    write_lines(source, 0, 10)
    Registry(catalog.store, clock=clock).create(
        DatastreamSpec.parse(
            {
                "name": "orders",
                "source": {"kind": "files", "path": str(source), "starting_offsets": "latest"},
                "schema": {"id": "long", "status": "string"},
            }
        )
    )
    heartbeat(catalog.store, "w", status="RUNNING", info={}, clock=clock)
    controller = Controller(catalog, controller_id="c", clock=clock)
    controller.tick()  # READY, assigned to w
    api = TestClient(create_app(catalog, controller=controller, clock=clock))
    workers: list[Worker] = []

    def worker() -> Worker:
        w = Worker(
            catalog,
            None,
            worker_id="w",
            settings=ControlSettings(stall_seconds=STALL),
            clock=clock,
            state_root=tmp_path / "state",
        )
        workers.append(w)
        return w

    yield catalog, clock, source, api, worker
    for w in workers:
        w._stop_shared()
        for ds in list(w.writers):
            w._stop_writer(ds)
    catalog.close()


def _health(api: TestClient) -> dict[str, Any]:
    body = api.get("/datastreams/orders").json()
    assert body["state"] == "READY"
    return dict(body["health"])


def _stalled_metric(api: TestClient) -> str:
    text = api.get("/metrics").text
    return next(
        line.split()[-1]
        for line in text.splitlines()
        if line.startswith('millstream_datastream_stalled{datastream="orders"}')
    )


def test_a_wedged_writer_is_reported_and_restarted_with_backoff(
    cluster: Any, caplog: pytest.LogCaptureFixture
) -> None:
    catalog, clock, source, api, make_worker = cluster
    worker = make_worker()
    worker.tick()
    assert WedgedQuery.starts == [["orders"]]
    assert {sh.partition: sh.upper for sh in catalog.store.list_shards("orders")} == {0: 10}
    write_lines(source, 0, 5)  # offsets 10..14 wait; the writer never commits them
    worker.watch()
    worker._heartbeat()
    assert _health(api)["status"] == "running"

    clock.advance(STALL - 1)
    worker.watch()  # behind for less than the stall time: nothing yet
    worker._heartbeat()
    assert _health(api)["status"] == "running" and _stalled_metric(api) == "0.0"

    with caplog.at_level(logging.ERROR, logger="millstream.control.worker"):
        clock.advance(2)
        worker.watch()
    assert worker.stall_restarts == {"orders": 1}
    assert any(
        "writer orders on worker w" in r.message and "partition 0 at offset 10" in r.message
        for r in caplog.records
    ), [r.message for r in caplog.records]
    worker._heartbeat()
    health = _health(api)
    assert health["status"] == "stalled"
    assert "partition 0 at offset 10 (source latest 15)" in health["error"]
    assert health["stalled"]["partitions"] == {"0": {"upper": 10, "latest": 15}}
    assert health["since"] == pytest.approx(clock.now() - STALL - 1)
    assert health["worker"] == "w" and health["stall_restarts"] == 1
    assert _stalled_metric(api) == "1.0"
    assert 'millstream_writer_stall_restarts_total{datastream="orders",worker="w"} 1.0' in (
        api.get("/metrics").text
    )
    debug = api.get("/tables/orders/debugInfo").json()["writer_health"]
    assert debug["datastream"] == "orders" and debug["status"] == "stalled"
    assert any(loop["loop"] == "watchdog" for loop in api.get("/workers").json()[0]["loops"])

    worker.tick()  # the query stops; the writer waits out its backoff (5 s)
    assert worker.shared is None and WedgedQuery.starts == [["orders"]]
    clock.advance(6)
    worker.tick()
    assert WedgedQuery.starts == [["orders"], ["orders"]], "restarted after the backoff"
    worker._heartbeat()
    assert _health(api)["status"] == "stalled", "until it is seen advancing again"

    # Still wedged: stalled again after a full stall time, and the backoff doubled.
    worker.watch()
    clock.advance(STALL + 1)
    worker.watch()
    assert worker.stall_restarts == {"orders": 2}
    worker.tick()
    clock.advance(6)
    worker.tick()
    assert len(WedgedQuery.starts) == 2, "within the doubled backoff (10 s)"
    clock.advance(5)
    worker.tick()
    assert len(WedgedQuery.starts) == 3

    # It commits again: healthy, the metric back to 0.
    worker.watch()
    catalog.store.compare_and_append(
        "orders", [ShardAppend(0, 10, 15, 0, "data/orders/x.parquet", 5, 100)]
    )
    clock.advance(1)
    worker.watch()
    worker._heartbeat()
    assert _health(api) | {"since": None} == {
        "status": "running",
        "error": None,
        "since": None,
        "retry_at": None,
        "failures": 2,
        "worker": "w",
        "stalled": None,
        "stall_restarts": 2,
        "transient_restarts": 0,
        "transient_error": None,
        "restarts": 0,
        "restarts_in_a_row": 0,
    }
    assert _stalled_metric(api) == "0.0"


def test_a_healthy_idle_datastream_raises_nothing(cluster: Any) -> None:
    _catalog, clock, source, api, make_worker = cluster
    worker = make_worker()
    worker.tick()
    for _ in range(60):  # an hour without a new record, watched every minute
        clock.advance(60)
        worker.watch()
        worker.tick()
    worker._heartbeat()
    assert worker.stall_restarts == {}
    assert WedgedQuery.starts == [["orders"]], "never restarted"
    assert _health(api)["status"] == "running" and _stalled_metric(api) == "0.0"
    # The first record after the idle hour is not a stall: the clock starts when it arrives.
    write_lines(source, 0, 1)
    worker.watch()
    clock.advance(60)
    worker.watch()
    worker._heartbeat()
    assert worker.stall_restarts == {} and _health(api)["status"] == "running"


def test_the_stall_time_is_bounded() -> None:
    for bad in (0.0, 9.9, 86_401.0):
        with pytest.raises(InvalidSpecError, match="stall_seconds"):
            ControlSettings(stall_seconds=bad)
    assert ControlSettings().stall_seconds == 300.0


def test_a_slow_writer_that_advances_is_not_stalled(cluster: Any) -> None:
    """Behind for longer than the stall time, but its upper moves: a lag, not a stall."""
    catalog, clock, source, api, make_worker = cluster
    worker = make_worker()
    worker.tick()
    upper = 10
    for minute in range(15):
        write_lines(source, 0, 10)  # the producer: 10 records a minute
        worker.watch()
        catalog.store.compare_and_append(  # the writer: 5 a minute, never caught up
            "orders",
            [ShardAppend(0, upper, upper + 5, 0, f"data/orders/{minute}.parquet", 5, 100)],
        )
        upper += 5
        clock.advance(60)
    worker.watch()
    worker._heartbeat()
    assert worker.stall_restarts == {} and WedgedQuery.starts == [["orders"]]
    assert _health(api)["status"] == "running" and _stalled_metric(api) == "0.0"


class TransientQuery(WedgedQuery):
    """A shared query that meets one of Spark's transient failures and restarts itself, as
    :meth:`SharedQueryRunner.run` does: it tells the worker through ``on_transient``."""

    def __init__(
        self, members: list[Any], spark: Any, state_dir: StateDirectory, **kw: Any
    ) -> None:
        super().__init__(members, spark, state_dir)
        self.on_transient = kw["on_transient"]

    def run(self) -> None:
        self.on_transient(
            sorted(self.members),
            "PYTHON_WORKER_CONNECT_BACK: Python worker failed to connect back.",
        )
        self._stop.wait(60)


def test_a_shared_querys_transient_restart_is_counted_without_failing_its_writer(
    cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _catalog, _clock, _source, api, make_worker = cluster
    monkeypatch.setattr(worker_module, "SharedQueryRunner", TransientQuery)
    worker = make_worker()
    worker.tick()
    assert worker.shared_thread is not None
    worker.shared_thread.join(0.5)  # its run() reported the restart and runs on
    worker._heartbeat()
    health = _health(api)
    assert health["status"] == "running" and health["error"] is None, health
    assert health["transient_restarts"] == 1
    assert health["transient_error"].startswith("PYTHON_WORKER_CONNECT_BACK: ")
    assert (
        'millstream_writer_transient_restarts_total{datastream="orders",worker="w"} 1.0'
        in api.get("/metrics").text
    )
    debug = api.get("/tables/orders/debugInfo").json()["writer_health"]
    assert debug["transient_restarts"] == 1 and debug["status"] == "running"
    worker.tick()  # nothing to restart: the worker did not fail the writer
    assert TransientQuery.starts == [["orders"]]


class RolledBackQuery(WedgedQuery):
    """A shared query whose member ``orders`` was fenced twice in a row (a rollback, say) and
    restarted each time, as :meth:`SharedQueryRunner.run` counts it."""

    def run(self) -> None:
        counted = self.restarts.setdefault("orders", RestartsInARow())
        counted.failed(False)
        counted.failed(False)
        self._stop.wait(60)


def test_a_members_restarts_in_a_row_show_in_its_health_and_metrics(
    cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _catalog, _clock, _source, api, make_worker = cluster
    monkeypatch.setattr(worker_module, "SharedQueryRunner", RolledBackQuery)
    worker = make_worker()
    worker.tick()
    assert worker.shared_thread is not None
    worker.shared_thread.join(0.5)  # its run() counted the restarts and runs on
    worker._heartbeat()
    health = _health(api)
    assert health["restarts"] == 2 and health["restarts_in_a_row"] == 2, health
    assert (
        'millstream_writer_restarts_in_a_row{datastream="orders",worker="w"} 2.0'
        in api.get("/metrics").text
    )
    debug = api.get("/tables/orders/debugInfo").json()["writer_health"]
    assert debug["restarts_in_a_row"] == 2


class RestartedThenCommittingQuery(WedgedQuery):
    """A shared query whose member ``orders`` was fenced twice in a row and restarted each
    time, its entry starting again at the shard uppers (10), as :meth:`SharedQueryRunner.run`
    counts and starts it."""

    def run(self) -> None:
        counted = self.restarts.setdefault("orders", RestartsInARow())
        counted.failed(False)
        counted.failed(False)
        counted.began({0: 10})
        self._stop.wait(60)


def test_a_members_restarts_in_a_row_show_0_once_it_commits_after_them(
    cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    catalog, _clock, _source, api, make_worker = cluster
    monkeypatch.setattr(worker_module, "SharedQueryRunner", RestartedThenCommittingQuery)
    worker = make_worker()
    worker.tick()
    assert worker.shared_thread is not None
    worker.shared_thread.join(0.5)
    worker._heartbeat()
    assert _health(api)["restarts_in_a_row"] == 2  # no commit since its last start

    catalog.store.compare_and_append(
        "orders", [ShardAppend(0, 10, 15, 0, "data/orders/x.parquet", 5, 100)]
    )
    worker._heartbeat()
    health = _health(api)
    assert health["restarts"] == 2 and health["restarts_in_a_row"] == 0, health
    assert (
        'millstream_writer_restarts_in_a_row{datastream="orders",worker="w"} 0.0'
        in api.get("/metrics").text
    )
    assert api.get("/tables/orders/debugInfo").json()["writer_health"]["restarts_in_a_row"] == 0
    # a rollback below where it started (its uppers back under 10) fences its next commit: the
    # commit seen in between still ends the row, so this restart is the first of a new one
    assert worker.shared is not None
    assert worker.shared.restarts["orders"].failed(False) == 1
