"""A worker's sealer counts the renewals of its seals' claims (issue 35): renewed, failed
(tried again) and lost (the store refused: expired or taken over). The counts go out with the
worker's heartbeat and are Prometheus counters in ``/metrics``, per datastream and worker."""

from __future__ import annotations

import threading
from pathlib import Path

from harness.api_support import TestClient, running_worker, spec_body
from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.control.controller import Controller

WORKER = "w1"


def test_a_sealers_claim_renewals_are_counters_in_the_metrics(
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

    worker.seal()  # creates the datastream's sealer
    labels = f'{{datastream="payments",worker="{WORKER}"}}'
    worker._heartbeat()
    text = api.get("/metrics").text
    assert f"millstream_seal_claim_renewals_total{labels} 0.0" in text
    assert f"millstream_seal_claims_lost_total{labels} 0.0" in text

    sealer = worker.sealers["payments"]
    sealer.claim_renewals, sealer.claim_renewal_failures, sealer.claims_lost = 7, 2, 1
    worker._heartbeat()
    text = api.get("/metrics").text
    assert f"millstream_seal_claim_renewals_total{labels} 7.0" in text
    assert f"millstream_seal_claim_renewal_failures_total{labels} 2.0" in text
    assert f"millstream_seal_claims_lost_total{labels} 1.0" in text
    debug = api.get("/tables/payments/debugInfo").json()["workers"][WORKER]["payments"]
    assert (debug["claim_renewals"], debug["claims_lost"]) == (7, 1)


def test_a_workers_sealing_pass_over_an_unchanged_table_is_counted_as_skipped(
    api: TestClient,
    controller: Controller,
    catalog: Catalog,
    clock: ManualClock,
    source_dir: Path,
    tmp_path: Path,
    running: threading.Event,
) -> None:
    """Issue 38: the worker's sealing pass over a table where nothing can have become due
    skips the table's manifest read; the skipped passes are a counter and in debugInfo."""
    assert api.post("/datastreams", json=spec_body("payments", source_dir)).status_code == 201
    controller.tick()
    worker = running_worker(
        catalog, clock, tmp_path / "state", running, "payments", worker_id=WORKER
    )
    catalog.store.ensure_shards("payments", {0: 0})  # one partition, nothing committed yet
    worker.seal()  # the first pass reads the manifest
    worker.seal()
    worker.seal()
    labels = f'{{datastream="payments",worker="{WORKER}"}}'
    worker._heartbeat()
    assert f"millstream_seal_passes_skipped_total{labels} 2.0" in api.get("/metrics").text
    debug = api.get("/tables/payments/debugInfo").json()["workers"][WORKER]["payments"]
    assert debug["passes_skipped"] == 2
