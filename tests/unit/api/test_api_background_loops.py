"""A worker's sealing passes are supervised per table: a table whose pass fails (here: its
writer started, its table not created yet) is backed off while the other tables keep sealing,
and the operator sees the error in ``/metrics`` and in ``/tables/{t}/debugInfo``."""

from __future__ import annotations

import threading
from pathlib import Path

from harness.api_support import TestClient, running_worker, spec_body
from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.control.controller import Controller

WORKER = "w1"
ERRORS_ORDERS = 'millstream_background_errors_total{loop="sealer",table="orders",worker="w1"} 1.0'


def test_a_failing_sealing_pass_backs_off_its_table_only_and_is_shown_in_metrics_and_debug_info(
    api: TestClient,
    controller: Controller,
    catalog: Catalog,
    clock: ManualClock,
    source_dir: Path,
    tmp_path: Path,
    running: threading.Event,
) -> None:
    assert api.post("/datastreams", json=spec_body("payments", source_dir)).status_code == 201
    controller.tick()  # payments READY, its table created
    # orders' writer runs, but its table is not created yet (a brand-new datastream).
    assert api.post("/datastreams", json=spec_body("orders", source_dir)).status_code == 201
    worker = running_worker(
        catalog, clock, tmp_path / "state", running, "orders", "payments", worker_id=WORKER
    )

    worker.seal()  # must not raise: the orders pass fails, payments is sealed
    worker._heartbeat()

    loops = {s.table: s for s in worker.loop_statuses()}
    assert (loops["payments"].runs, loops["payments"].errors) == (1, 0)
    assert (loops["orders"].errors, loops["orders"].consecutive_failures) == (1, 1)
    text = api.get("/metrics").text
    assert ERRORS_ORDERS in text
    assert (
        'millstream_background_errors_total{loop="sealer",table="payments",worker="w1"} 0.0' in text
    )
    debug = api.get("/tables/payments/debugInfo").json()
    failing = debug["workers"][WORKER]["orders"]["loop"]
    assert failing["table"] == "orders" and failing["consecutive_failures"] == 1
    assert failing["last_error"] == "TableNotFoundError: table 'orders' does not exist"
    assert failing["next_attempt_at"] > clock.now()
    assert debug["workers"][WORKER]["payments"]["loop"]["last_success_at"] == clock.now()

    worker.seal()  # within the backoff: orders is not retried, payments seals on
    loops = {s.table: s for s in worker.loop_statuses()}
    assert (loops["orders"].errors, loops["payments"].runs) == (1, 2)

    controller.tick()  # orders READY: its table exists now
    clock.advance(worker.seal_backoff.base)  # past the backoff (at most base after 1 failure)
    worker.seal()
    worker._heartbeat()
    recovered = api.get("/tables/orders/debugInfo").json()["workers"][WORKER]["orders"]["loop"]
    assert recovered["consecutive_failures"] == 0 and recovered["errors"] == 1
    assert recovered["last_success_at"] == clock.now() and recovered["next_attempt_at"] is None
    # A counter: recovering does not reset it.
    assert ERRORS_ORDERS in api.get("/metrics").text


def test_a_workers_table_maintenance_runs_on_its_sealing_thread_and_is_in_the_metrics(
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

    worker.seal()  # the first sight schedules maintenance one jittered interval later
    clock.advance(worker.settings.maintenance_interval * 1.2 + 1)
    worker.seal()
    worker._heartbeat()

    text = api.get("/metrics").text
    for table in ("payments", "payments__dead_letter"):
        labels = f'{{table="{table}",worker="w1"}}'
        assert f"millstream_maintenance_versions_expired_total{labels} 0.0" in text
        assert f"millstream_maintenance_files_removed_total{labels} 0.0" in text
        assert (
            f"millstream_maintenance_last_run_timestamp_seconds{labels} {clock.now():.9e}" in text
        )
    assert (
        'millstream_background_errors_total{loop="maintainer",table="payments",worker="w1"} 0.0'
        in text
    )
