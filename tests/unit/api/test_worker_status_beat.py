"""A worker's heartbeat thread writes its liveness every beat and its whole status (writers,
each table's sealing, loops, maintenance, row counters) only when its writers changed or
``STATUS_SECONDS`` after it was last written: at 100 tables the status is ~170 KB of JSON,
and writing and building it twice a second was a quarter of the worker's own process (issue
38). What an operator reads stays whole: each table's sealer loop, stored once (under
``sealing``), is listed in ``GET /workers``' loops and in the metrics; a writer's failure
reaches its datastream's record at the next beat; the counters reach ``debugInfo`` within
``STATUS_SECONDS``."""

from __future__ import annotations

import threading
from pathlib import Path

from harness.api_support import TestClient, running_worker, spec_body
from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.control.controller import Controller
from millstream.control.worker import STATUS_SECONDS
from millstream.metastore import workers as stored_workers
from millstream.spark.sink import append_commit_log

WORKER = "w1"


def _sealer_runs(api: TestClient, table: str) -> int:
    loop = api.get(f"/tables/{table}/debugInfo").json()["workers"][WORKER][table]["loop"]
    return int(loop["runs"])


def test_a_beat_writes_liveness_always_a_writers_change_at_once_and_counters_within_the_interval(
    api: TestClient,
    controller: Controller,
    catalog: Catalog,
    clock: ManualClock,
    source_dir: Path,
    tmp_path: Path,
    running: threading.Event,
) -> None:
    for ds in ("orders", "payments"):
        assert api.post("/datastreams", json=spec_body(ds, source_dir)).status_code == 201
    controller.tick()  # both READY, their tables created
    worker = running_worker(
        catalog, clock, tmp_path / "state", running, "orders", "payments", worker_id=WORKER
    )
    worker.seal()
    worker._heartbeat()  # the whole status, as at the worker's start
    assert _sealer_runs(api, "payments") == 1

    # Each table's sealer loop is stored once (under sealing), and listed in loops for readers
    with catalog.store.read() as conn:
        (row,) = stored_workers.list_workers(conn)
    assert [(lp["loop"], lp["table"]) for lp in row.info["loops"] if lp["loop"] == "sealer"] == [
        ("sealer", None)
    ]
    assert {ds: st["loop"]["table"] for ds, st in row.info["sealing"].items()} == {
        "orders": "orders",
        "payments": "payments",
    }
    (listed,) = api.get("/workers").json()
    sealers = [lp["table"] for lp in listed["loops"] if lp["loop"] == "sealer"]
    assert sealers == [None, "orders", "payments"]
    text = api.get("/metrics").text
    for table in ("orders", "payments"):
        labels = f'loop="sealer",table="{table}",worker="{WORKER}"'
        assert f"millstream_background_errors_total{{{labels}}} 0.0" in text

    # A beat with nothing but counters moved: the liveness is written, the status is not yet
    worker.seal()
    clock.advance(0.5)
    worker._pulse()
    (listed,) = api.get("/workers").json()
    assert listed["heartbeat_at"] == clock.now()
    assert _sealer_runs(api, "payments") == 1

    # STATUS_SECONDS after the status was written, the next beat writes it again
    clock.advance(STATUS_SECONDS - 0.5)
    worker._pulse()
    assert _sealer_runs(api, "payments") == 2

    # A writer's failure is in its datastream's record at the next beat, not STATUS_SECONDS on
    assert api.get("/datastreams/orders").json()["health"]["status"] == "running"
    worker._failed(worker.writers["orders"], "SourceReadError: the broker did not answer")
    clock.advance(0.5)
    worker._pulse()
    health = api.get("/datastreams/orders").json()["health"]
    assert health["status"] == "retrying" and "did not answer" in health["error"]

    # The wall clock stepped back a minute (NTP): the status is not held back for a minute
    runs = _sealer_runs(api, "payments")
    worker.seal()
    clock.advance(-60.0)
    worker._pulse()
    assert _sealer_runs(api, "payments") == runs + 1


def test_a_writers_last_commits_are_counted_when_it_leaves_before_the_status_is_due(
    api: TestClient,
    controller: Controller,
    catalog: Catalog,
    clock: ManualClock,
    source_dir: Path,
    tmp_path: Path,
    running: threading.Event,
) -> None:
    """The commit logs are read for the row counters with the whole status, every
    STATUS_SECONDS: a writer that commits and then leaves (paused, moved, deleted) before the
    next one still has those rows in ``millstream_rows_consumed_total`` and its dead-letter
    and lost-offset counters."""
    assert api.post("/datastreams", json=spec_body("orders", source_dir)).status_code == 201
    controller.tick()
    worker = running_worker(catalog, clock, tmp_path / "state", running, "orders")
    worker._heartbeat()
    runner = worker.writers["orders"].runner
    assert runner is not None
    entry = {"rows": 7, "at": clock.now(), "consumed": {"0": 9}, "dead_lettered": {"0": 2}}
    append_commit_log(runner.stats_file, {**entry, "lost": {"0": 3}})
    clock.advance(1.0)
    running.set()  # the writer's query ends
    worker._stop_writer("orders")  # as a pause or a move does, 1 s after its commit
    clock.advance(STATUS_SECONDS)
    worker._pulse()
    text = api.get("/metrics").text
    labels = f'datastream="orders",partition="0",table="orders",worker="{WORKER}"'
    assert f"millstream_rows_consumed_total{{{labels}}} 9.0" in text
    assert f"millstream_rows_dead_lettered_total{{{labels}}} 2.0" in text
    assert f"millstream_source_records_lost_total{{{labels}}} 3.0" in text
