"""A failing datastream looks failed: its REST record carries its writer's health (retrying,
with the error and since when) while its state is READY and its last error empty, and
``create`` warns when the source cannot be reached (the record is created all the same)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.api_support import TestClient, run_failing_writer, spec_body
from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.control.controller import Controller
from millstream.ingest.sources.kafka import CONSUMERS


def missing_topic(broker: Any, name: str = "broken") -> dict[str, Any]:
    """A datastream reading a topic that does not exist on a live broker."""
    return {
        "name": name,
        "source": {"kind": "kafka", "bootstrap_servers": broker.bootstrap, "topic": "no-such"},
        "schema": {"id": "long", "status": "string"},
        "table": {"mode": "upsert", "primary_key": ["id"]},
    }


def test_a_failing_writer_shows_in_the_record_and_create_warns(
    api: TestClient,
    catalog: Catalog,
    controller: Controller,
    clock: ManualClock,
    tmp_path: Path,
    kafka_broker: Any,
) -> None:
    created = api.post("/datastreams", json=missing_topic(kafka_broker))
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["state"] == "INITIALIZING"
    (warning,) = body["warnings"]
    assert warning.startswith(
        f"cannot read the latest offsets of kafka topic 'no-such' on {kafka_broker.bootstrap}"
    )
    assert "the topic was not found" in warning
    assert "created and its writer will retry" in warning

    worker = run_failing_writer(catalog, controller, clock, tmp_path / "state", "worker-b")
    failed_at = clock.now()
    try:
        rec = api.get("/datastreams/broken").json()
        assert rec["state"] == "READY" and rec["last_error"] is None
        health = rec["health"]
        assert health["status"] == "retrying"
        assert "datastream 'broken'" in health["error"]
        assert "kafka topic 'no-such'" in health["error"] and "not found" in health["error"]
        assert health["since"] == failed_at
        assert health["retry_at"] == failed_at + 5.0  # the first backoff
        assert health["worker"] == "worker-b"
        assert [d["health"] for d in api.get("/datastreams").json()] == [health]

        # Restarted after its backoff, it fails again: still retrying, since the first failure.
        clock.advance(6)
        worker.tick()
        assert worker.shared_thread is not None
        worker.shared_thread.join(30)
        worker._heartbeat()
        again = api.get("/datastreams/broken").json()["health"]
        assert again["status"] == "retrying" and again["since"] == failed_at
        assert again["failures"] == 2 and again["retry_at"] == clock.now() + 10.0
    finally:
        worker._stop_shared()
        CONSUMERS.close()  # its clients of the test broker, before the broker stops


def test_a_reachable_source_creates_without_a_warning(api: TestClient, source_dir: Path) -> None:
    created = api.post("/datastreams", json=spec_body("orders", source_dir))
    assert created.status_code == 201 and created.json()["warnings"] == []
    assert api.get("/datastreams/orders").json()["health"] is None  # INITIALIZING: no writer
