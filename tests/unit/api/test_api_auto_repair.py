"""Automatic repair and durable re-ingest jobs: a segment whose data file is lost is rebuilt
from the source by the leading controller with no human call, as a job in the metadata store
that any controller lists (after a restart too); a segment whose source range is gone is
reported unrecoverable with the reason and not retried in a loop."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from test_api_reingest import _ingest, _write_source

from harness.api_support import TestClient, spec_body
from millstream.api import create_app
from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.control.controller import Controller, ControlSettings
from millstream.datastream import DatastreamSpec
from millstream.errors import SegmentUnavailableError
from millstream.reference.model import canonical
from millstream.reference.oracle import expected_table
from millstream.sealing.sealer import Sealer

#: The api fixture's controller runs with the default repair settings.
CONTROL = ControlSettings(lease_ttl=10.0, worker_ttl=5.0, tick_seconds=1.0)


def _setup(
    api: TestClient, controller: Controller, catalog: Catalog, source_dir: Path
) -> tuple[DatastreamSpec, list[dict[str, Any]]]:
    """orders from a files source, 3 micro-batches per partition, partition 0 sealed."""
    records = _write_source(source_dir)
    assert api.post("/datastreams", json=spec_body("orders", source_dir)).status_code == 201
    controller.tick()
    spec = DatastreamSpec.parse(spec_body("orders", source_dir))
    for p in range(2):
        for lo in range(0, 30, 10):
            _ingest(catalog, spec, p, lo, lo + 10)
    expected, _ = expected_table(spec.table_spec(), records)
    return spec, expected


def _scan(controller: Controller, clock: ManualClock) -> None:
    """One leader tick after the repair interval, and the jobs it started run to their end."""
    clock.advance(CONTROL.repair_interval)
    controller.tick()
    assert controller.reingest.wait(120)


def _jobs(api: TestClient) -> list[dict[str, Any]]:
    r = api.get("/reingestJobs")
    assert r.status_code == 200, r.text
    jobs: list[dict[str, Any]] = r.json()
    return jobs


def _metric(api: TestClient, line_start: str) -> float | None:
    for line in api.get("/metrics").text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_a_sealed_segment_whose_file_is_deleted_is_repaired_with_no_human_call(
    api: TestClient,
    controller: Controller,
    catalog: Catalog,
    clock: ManualClock,
    source_dir: Path,
) -> None:
    _, expected = _setup(api, controller, catalog, source_dir)
    sealed = Sealer(catalog, "orders").seal_partition(0, force=True)
    assert sealed is not None and sealed.sealed.file_path is not None
    before = canonical(catalog.read_table("orders").to_pylist())
    assert before == canonical(expected)
    catalog.deep.delete(sealed.sealed.file_path)
    with pytest.raises(SegmentUnavailableError, match="orders__0__0"):
        catalog.read_table("orders")

    _scan(controller, clock)

    assert canonical(catalog.read_table("orders").to_pylist()) == before
    [job] = _jobs(api)
    assert (job["segment"], job["state"], job["trigger"], job["attempts"]) == (
        "orders__0__0",
        "SUCCEEDED",
        "auto",
        1,
    )
    assert job["controller"] == controller.id
    # Any controller sees it: a second app over the same store, with no controller of its own.
    with TestClient(create_app(catalog, clock=clock)) as other:
        assert [j["id"] for j in _jobs(other)] == [job["id"]]
        assert [j["id"] for j in other.get("/reingestSegment/jobs").json()] == [job["id"]]
    assert _metric(api, 'millstream_auto_repairs_total{outcome="succeeded",table="orders"}') == 1
    # Nothing left to repair: later scans start no job.
    _scan(controller, clock)
    assert len(_jobs(api)) == 1


def test_a_consuming_segment_whose_file_is_corrupt_goes_to_error_and_is_repaired_then_sealed(
    api: TestClient,
    controller: Controller,
    catalog: Catalog,
    clock: ManualClock,
    source_dir: Path,
) -> None:
    _, expected = _setup(api, controller, catalog, source_dir)
    lost = next(e for e in catalog.manifest("orders").entries if (e.partition, e.seq) == (1, 1))
    assert lost.file_path is not None
    with catalog.deep.fs.open_output_stream(catalog.deep._abs(lost.file_path)) as out:
        out.write(b"not a parquet file")  # the file is there, but unreadable
    sealer = Sealer(catalog, "orders", max_failures=2)
    for _ in range(2):
        with pytest.raises(SegmentUnavailableError, match="orders__1__1"):
            sealer.seal_partition(1, force=True)
    debug = api.get("/tables/orders/debugInfo").json()
    assert [e["segment"] for e in debug["segments_in_error"]] == ["orders__1__0"]

    _scan(controller, clock)

    [job] = _jobs(api)
    assert (job["segment"], job["state"]) == ("orders__1__1", "SUCCEEDED"), job
    assert canonical(catalog.read_table("orders").to_pylist()) == canonical(expected)
    assert sealer.seal_partition(1, force=True) is not None  # the sealer goes on
    assert api.get("/tables/orders/debugInfo").json()["segments_in_error"] == []
    assert canonical(catalog.read_table("orders").to_pylist()) == canonical(expected)


def test_a_segment_whose_source_is_gone_is_unrecoverable_with_its_reason_and_not_retried_in_a_loop(
    api: TestClient,
    controller: Controller,
    catalog: Catalog,
    clock: ManualClock,
    source_dir: Path,
) -> None:
    _setup(api, controller, catalog, source_dir)
    sealed = Sealer(catalog, "orders").seal_partition(0, force=True)
    assert sealed is not None and sealed.sealed.file_path is not None
    catalog.deep.delete(sealed.sealed.file_path)
    for f in (source_dir / "0").iterdir():  # the source's files of partition 0 are gone too
        f.unlink()
    assert (
        _metric(api, 'millstream_segments_unrecoverable{reason="source_gone",table="orders"}') == 0
    )

    _scan(controller, clock)

    [job] = _jobs(api)
    assert (job["state"], job["unrecoverable"], job["attempts"]) == ("FAILED", "source_gone", 1)
    assert "ends at offset 0, before the segment's end 30" in job["error"]
    # Nothing was swapped in: reads still fail loudly, naming the segment (never rows missing).
    with pytest.raises(SegmentUnavailableError, match="orders__0__0"):
        catalog.read_table("orders")
    assert (
        _metric(api, 'millstream_segments_unrecoverable{reason="source_gone",table="orders"}') == 1
    )
    assert (
        _metric(api, 'millstream_segments_unrecoverable{reason="retention_expired",table="orders"}')
        == 0
    )
    assert (
        _metric(api, 'millstream_auto_repairs_total{outcome="unrecoverable",table="orders"}') == 1
    )
    [stuck] = api.get("/tables/orders/debugInfo").json()["repair"]["unrecoverable_segments"]
    assert (stuck["segment"], stuck["reason"]) == ("orders__0__0", "source_gone")

    for _ in range(5):  # scans go on: the segment is not tried again
        _scan(controller, clock)
    [job] = _jobs(api)
    assert job["attempts"] == 1
    # Rarely, it is: an operator may have restored the source.
    clock.advance(CONTROL.repair_unrecoverable_retry)
    _scan(controller, clock)
    [job] = _jobs(api)
    assert (job["state"], job["attempts"]) == ("FAILED", 2)


def test_a_failed_repair_is_retried_with_backoff_and_succeeds_once_the_source_is_back(
    api: TestClient,
    controller: Controller,
    catalog: Catalog,
    clock: ManualClock,
    source_dir: Path,
) -> None:
    _, expected = _setup(api, controller, catalog, source_dir)
    sealed = Sealer(catalog, "orders").seal_partition(0, force=True)
    assert sealed is not None and sealed.sealed.file_path is not None
    catalog.deep.delete(sealed.sealed.file_path)
    backup = source_dir.parent / "backup"
    shutil.move(source_dir, backup)  # the whole source is unreadable for now
    _scan(controller, clock)
    [job] = _jobs(api)
    assert (job["state"], job["unrecoverable"], job["attempts"]) == ("FAILED", None, 1)
    retrying = api.get("/tables/orders/debugInfo").json()["repair"]["retrying"]
    assert [(r["segment"], r["attempts"]) for r in retrying] == [("orders__0__0", 1)]
    _scan(controller, clock)  # within the backoff (60 s after the first failure): waits
    assert _jobs(api)[0]["attempts"] == 1
    clock.advance(CONTROL.repair_backoff_base)
    _scan(controller, clock)  # due, fails again: the next wait doubles
    [job] = _jobs(api)
    assert job["attempts"] == 2 and job["next_attempt_at"] - job["finished_at"] == pytest.approx(
        2 * CONTROL.repair_backoff_base
    )
    shutil.move(backup, source_dir)
    clock.advance(2 * CONTROL.repair_backoff_base)
    _scan(controller, clock)
    [job] = _jobs(api)
    assert (job["state"], job["attempts"]) == ("SUCCEEDED", 3)
    assert canonical(catalog.read_table("orders").to_pylist()) == canonical(expected)


def test_a_job_survives_a_restart_and_one_a_dead_controller_left_running_is_taken_over(
    api: TestClient,
    controller: Controller,
    catalog: Catalog,
    clock: ManualClock,
    source_dir: Path,
) -> None:
    _, expected = _setup(api, controller, catalog, source_dir)
    sealed = Sealer(catalog, "orders").seal_partition(0, force=True)
    assert sealed is not None and sealed.sealed.file_path is not None
    catalog.deep.delete(sealed.sealed.file_path)
    # A controller took the segment's job and died before finishing it.
    dead = catalog.store.start_reingest(
        "orders",
        "orders__0__0",
        entry_id=sealed.sealed.id,
        owner="controller-dead",
        now=clock.now(),
        lease=CONTROL.reingest_job_lease,
        trigger="api",
    )
    assert dead is not None
    # The API restarts (a new app over the same store): the job is still there, RUNNING.
    with TestClient(create_app(catalog, clock=clock)) as restarted:
        [job] = _jobs(restarted)
        assert (job["id"], job["state"], job["controller"]) == (
            dead.id,
            "RUNNING",
            "controller-dead",
        )
        assert restarted.post("/segments/orders__0__0/reingest").status_code == 409
        # Its controller never renews the lease: the job reads ABANDONED, not RUNNING forever.
        clock.advance(CONTROL.reingest_job_lease)
        [job] = _jobs(restarted)
        assert job["state"] == "ABANDONED"
    _scan(controller, clock)  # the leader takes the job over and runs it
    [job] = _jobs(api)
    assert (job["id"], job["state"], job["attempts"], job["controller"]) == (
        dead.id,
        "SUCCEEDED",
        2,
        controller.id,
    )
    assert canonical(catalog.read_table("orders").to_pylist()) == canonical(expected)


def test_auto_repair_can_be_turned_off(
    catalog: Catalog, clock: ManualClock, source_dir: Path, api: TestClient
) -> None:
    off = Controller(
        catalog,
        controller_id="controller-off",
        settings=replace(CONTROL, auto_repair=False),
        clock=clock,
    )
    records = _write_source(source_dir)
    assert api.post("/datastreams", json=spec_body("orders", source_dir)).status_code == 201
    off.tick()
    spec = DatastreamSpec.parse(spec_body("orders", source_dir))
    _ingest(catalog, spec, 0, 0, 30)
    assert records
    sealed = Sealer(catalog, "orders").seal_partition(0, force=True)
    assert sealed is not None and sealed.sealed.file_path is not None
    catalog.deep.delete(sealed.sealed.file_path)
    _scan(off, clock)
    assert _jobs(api) == []
    with TestClient(create_app(catalog, controller=off, clock=clock)) as off_api:
        assert off_api.get("/tables/orders/debugInfo").json()["repair"]["auto_repair"] is False
