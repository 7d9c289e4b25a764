"""Publishing is on by default: a worker started with the controller's default settings
publishes the Iceberg view of each table it writes, incrementally after the first, on its own
supervised loop. The operator sees the view's lag in ``/metrics`` and ``debugInfo``; a table
whose publish fails is counted and backed off, and never stops another table's publishing or
its writer's commits. The publishes run in the worker's publisher process (a child of the
worker; see tests/unit/sealing/test_publisher_process.py for its crashes and its end)."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pyarrow as pa

from harness.api_support import TestClient, running_worker, spec_body
from harness.iceberg_readers import pyiceberg_rows
from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.control.controller import Controller, ControlSettings
from millstream.control.worker import STATUS_SECONDS, Worker
from millstream.reference.model import canonical
from millstream.sealing.maintenance import DEFAULT_PUBLISH_INTERVAL
from millstream.spec import OFFSET_COL, PARTITION_COL, TOMBSTONE_COL
from millstream.table.iceberg import current_location
from millstream.table.writer import commit_staged, stage_rows

WORKER = "w1"


def _commit(catalog: Catalog, table: str, ids: list[int], lo: int) -> None:
    spec = catalog.table(table).spec
    rows = pa.Table.from_pylist(
        [
            {
                "id": k,
                "status": f"at {lo + i}",
                PARTITION_COL: 0,
                OFFSET_COL: lo + i,
                TOMBSTONE_COL: False,
            }
            for i, k in enumerate(ids)
        ],
        schema=spec.arrow_schema(system_columns=True),
    )
    staged = stage_rows(catalog.deep, spec, rows)
    commit_staged(catalog.store, catalog.deep, table, staged, {0: (lo, lo + len(ids))}, {})


def _metric(text: str, sample: str) -> float | None:
    """The value of ``sample`` (a metric name with its labels) in a Prometheus text page."""
    for line in text.splitlines():
        if line.startswith(sample + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_a_worker_publishes_every_table_it_writes_at_the_default_interval(
    api: TestClient,
    controller: Controller,
    catalog: Catalog,
    clock: ManualClock,
    source_dir: Path,
    tmp_path: Path,
    running: threading.Event,
) -> None:
    assert ControlSettings().iceberg_publish_interval == DEFAULT_PUBLISH_INTERVAL
    assert api.get("/settings").json()["control"]["iceberg_publish_interval"] == (
        DEFAULT_PUBLISH_INTERVAL
    )
    assert api.post("/datastreams", json=spec_body("payments", source_dir)).status_code == 201
    controller.tick()  # payments READY, its table created
    # orders' writer runs, but its table is not created yet: its publishes fail.
    assert api.post("/datastreams", json=spec_body("orders", source_dir)).status_code == 201
    worker = running_worker(
        catalog, clock, tmp_path / "state", running, "orders", "payments", worker_id=WORKER
    )
    assert worker.publish_loop is not None and worker.publisher is not None

    def view() -> list[object]:
        where = current_location(catalog.deep, catalog.store, "payments")
        assert where is not None
        return pyiceberg_rows(where)

    _commit(catalog, "payments", [1, 2, 1], 0)
    lag_metric = 'millstream_iceberg_publish_lag_seconds{table="payments"}'
    clock.advance(7)
    assert _metric(api.get("/metrics").text, lag_metric) == 7.0  # never published yet
    worker.publish_loop.run_once()  # the publisher thread's step
    assert view() == canonical(catalog.read_table("payments").to_pylist())
    assert _metric(api.get("/metrics").text, lag_metric) == 0.0

    _commit(catalog, "payments", [2, 3], 3)  # committing goes on whatever the publisher does
    clock.advance(DEFAULT_PUBLISH_INTERVAL / 2)
    worker.publish_loop.run_once()  # not due yet
    assert _metric(api.get("/metrics").text, lag_metric) == DEFAULT_PUBLISH_INTERVAL / 2
    clock.advance(DEFAULT_PUBLISH_INTERVAL / 2)
    worker.publish_loop.run_once()
    assert view() == canonical(catalog.read_table("payments").to_pylist())
    worker._heartbeat()
    text = api.get("/metrics").text
    assert _metric(text, lag_metric) == 0.0
    assert 'millstream_iceberg_publishes_total{table="payments",worker="w1"} 2.0' in text
    # orders failed at each attempt its backoff allowed (a jittered wait, so 2 or 3)
    orders_errors = _metric(
        text, 'millstream_background_errors_total{loop="publisher",table="orders",worker="w1"}'
    )
    assert orders_errors is not None and orders_errors >= 2
    assert (
        _metric(
            text,
            'millstream_background_errors_total{loop="publisher",table="payments",worker="w1"}',
        )
        == 0.0
    )

    debug = api.get("/tables/payments/debugInfo").json()["iceberg"]
    assert debug["manifest_version"] == catalog.manifest("payments").version
    assert debug["lag_seconds"] == 0.0
    published = debug["publishers"][WORKER]
    assert published["publishes"] == 2 and published["last"]["incremental"] == 1
    orders = api.get("/tables/orders/debugInfo")
    assert orders.status_code == 404  # no table: its errors show in the worker's loops
    loops = {(s.loop, s.table): s for s in worker.loop_statuses()}
    failing = loops[("publisher", "orders")]
    assert failing.consecutive_failures == orders_errors and failing.last_error is not None
    assert "orders" in failing.last_error
    # The publishes ran in the worker's publisher process, a child of this one.
    assert worker.publisher.pid is not None and worker.publisher.pid != os.getpid()
    assert worker.publisher.alive and worker.publisher.starts == 1
    worker.publisher.close()
    assert not worker.publisher.alive


def test_publishing_can_be_turned_off(catalog: Catalog, clock: ManualClock, tmp_path: Path) -> None:
    settings = ControlSettings(iceberg_publish_interval=None)
    worker = Worker(catalog, None, worker_id=WORKER, clock=clock, settings=settings)
    assert worker.publisher is None and worker.publish_loop is None
    worker.publish()  # nothing to do, nothing published
    assert not [s for s in worker.loop_statuses() if s.loop == "publisher"]


def test_a_crashed_publisher_process_is_counted_shown_and_restarted_with_backoff(
    api: TestClient,
    controller: Controller,
    catalog: Catalog,
    clock: ManualClock,
    source_dir: Path,
    tmp_path: Path,
    running: threading.Event,
) -> None:
    assert api.post("/datastreams", json=spec_body("payments", source_dir)).status_code == 201
    controller.tick()
    worker = running_worker(
        catalog, clock, tmp_path / "state", running, "payments", worker_id=WORKER
    )
    assert worker.publish_loop is not None and worker.publisher is not None
    try:
        _commit(catalog, "payments", [1, 2, 1], 0)
        worker.publish_loop.run_once()
        first = worker.publisher.pid
        assert first is not None and worker.publisher.status()["payments"]["manifest_version"] == 1
        os.kill(first, signal.SIGKILL)
        _commit(catalog, "payments", [2, 3], 3)
        clock.advance(DEFAULT_PUBLISH_INTERVAL)
        wait = worker.publish_loop.run_once()  # finds its child gone: a failed step
        status = worker.publish_loop.status()
        assert status.errors == 1 and status.consecutive_failures == 1
        assert status.last_error is not None
        assert f"pid {first}" in status.last_error and "exit code -9" in status.last_error
        assert f"worker {WORKER}" in status.last_error
        assert 0 < wait < DEFAULT_PUBLISH_INTERVAL  # the loop waits its backoff, not an interval
        worker._heartbeat()
        text = api.get("/metrics").text
        sample = (
            f'millstream_background_errors_total{{loop="publishing",table="",worker="{WORKER}"}}'
        )
        assert _metric(text, sample) == 1.0
        listed = {w["id"]: w for w in api.get("/workers").json()}
        loops = [lp for lp in listed[WORKER]["loops"] if lp["loop"] == "publishing"]
        assert loops and f"pid {first}" in loops[0]["last_error"]
        assert worker.publisher.starts == 1
        clock.advance(wait)
        worker.publish_loop.run_once()  # the loop's next step, after the backoff: a new child, which publishes (in full: a new cache)
        assert worker.publisher.starts == 2 and worker.publisher.pid != first
        assert worker.publish_loop.status().consecutive_failures == 0
        view = worker.publisher.status()["payments"]
        assert view["manifest_version"] == 2 and view["last"]["incremental"] == 0
        where = current_location(catalog.deep, catalog.store, "payments")
        assert where is not None
        assert pyiceberg_rows(where) == canonical(catalog.read_table("payments").to_pylist())
        worker._heartbeat()
        debug = api.get("/tables/payments/debugInfo").json()["iceberg"]
        assert [lp["loop"] for lp in debug["publisher_loops"]].count("publishing") == 1
    finally:
        worker.publisher.close()


def test_the_views_garbage_collection_shows_its_cache_and_last_pass_in_debuginfo_and_metrics(
    api: TestClient,
    controller: Controller,
    catalog: Catalog,
    clock: ManualClock,
    source_dir: Path,
    tmp_path: Path,
    running: threading.Event,
) -> None:
    """An operator sees what the worker's maintenance pass spent collecting the view's
    garbage and whether its references were warm: the table's last collection and the
    worker's last pass (CPU, files read and found kept) in debugInfo, the references' hits,
    misses and size in /metrics."""
    assert api.post("/datastreams", json=spec_body("payments", source_dir)).status_code == 201
    controller.tick()
    worker = running_worker(
        catalog, clock, tmp_path / "state", running, "payments", worker_id=WORKER
    )
    assert worker.publish_loop is not None
    passes = []
    for lo in (0, 2):
        _commit(catalog, "payments", [lo, lo + 1], lo)
        clock.advance(DEFAULT_PUBLISH_INTERVAL)
        worker.publish_loop.run_once()
        worker.maintainer.maintain(["payments"])
        clock.advance(STATUS_SECONDS)
        worker._heartbeat()
        passes.append(api.get("/tables/payments/debugInfo").json()["iceberg"])
    first, second = (p["garbage_collection"][WORKER] for p in passes)
    assert first["last_pass"]["tables"] == 1 and first["table"]["misses"] > 0
    assert first["table"]["read"]["manifest_list"] >= 1
    # The second pass found the first's manifest list and manifests kept: only the files
    # published since were read.
    assert second["table"]["hits"] > 0
    assert second["table"]["read"]["manifest_list"] == 1
    assert (
        second["last_pass"]["cpu_seconds"] >= 0
        and second["last_pass"]["at"] == clock.now() - STATUS_SECONDS
    )
    held = second["references"]
    assert 0 < held["references"] <= held["max_references"]
    text = api.get("/metrics").text
    hits = _metric(text, f'millstream_iceberg_gc_reference_hits_total{{worker="{WORKER}"}}')
    assert hits == held["hits"] > 0
    assert (
        _metric(text, f'millstream_iceberg_gc_references{{worker="{WORKER}"}}')
        == (held["references"])
    )
