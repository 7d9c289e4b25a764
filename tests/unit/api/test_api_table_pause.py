"""Pausing one table of a datastream that writes a table per topic, through the REST API and
Pinot's paths: the datastream stays READY and lists the table in ``paused_tables``, Pinot's
``pauseStatus`` says which table is paused and empties its consuming segments once the worker
stops its writer, a rollback is allowed for the paused table only, and every refusal names
the table and changes nothing. (That the worker stops the table's commits while the others run
on is tested over the real broker: tests/integration/test_multi_table_lifecycle.py.)"""

from __future__ import annotations

from typing import Any

import pytest

from harness.api_support import TestClient, spec_body, store_snapshot
from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.control.controller import Controller
from millstream.control.workers import heartbeat
from millstream.metastore.models import ShardAppend

INVENTORY: dict[str, Any] = {
    "name": "inventory",
    "source": {
        "kind": "kafka",
        "bootstrap_servers": "127.0.0.1:1",
        "topics": ["db.inventory.customers", "db.inventory.orders"],
    },
    "table": {"mode": "upsert", "primary_key": ["id"]},
    "schema": {"id": "long", "status": "string"},
}


def _beat(catalog: Catalog, clock: ManualClock, *tables: str) -> None:
    """worker-a reports a running writer of each of ``tables`` of ``inventory``."""
    writers = [
        {
            "datastream": "inventory",
            "table": t,
            "member": f"inventory.{t}",
            "role": "active",
            "running": True,
        }
        for t in tables
    ]
    heartbeat(catalog.store, "worker-a", status="RUNNING", info={"writers": writers}, clock=clock)


@pytest.fixture
def inventory(
    api: TestClient, controller: Controller, catalog: Catalog, clock: ManualClock
) -> None:
    """READY ``inventory``: tables customers and orders, each with segments 0 and 1 in
    partition 0; worker-a runs both writers."""
    assert api.post("/datastreams", json=INVENTORY).status_code == 201
    _beat(catalog, clock, "customers", "orders")
    controller.tick()
    for t in ("customers", "orders"):
        for lo, hi in ((0, 6), (6, 10)):
            catalog.store.compare_and_append(
                t,
                [ShardAppend(0, lo, hi, 0, f"data/{t}/0-{lo}.parquet", hi - lo, 10)],
                writer_id="worker-a",
                batch_id=lo,
            )
    assert api.get("/datastreams/inventory").json()["state"] == "READY"


def test_one_table_pauses_and_resumes_alone(
    api: TestClient, inventory: None, catalog: Catalog, clock: ManualClock
) -> None:
    paused = api.post("/datastreams/inventory/tables/customers/pause")
    assert paused.status_code == 200, paused.text
    body = paused.json()
    assert (body["state"], body["paused_tables"], body["tables"]) == (
        "READY",
        ["customers"],
        ["customers", "orders"],
    )
    assert api.get("/datastreams/inventory").json()["paused_tables"] == ["customers"]
    assert [d["paused_tables"] for d in api.get("/datastreams").json()] == [["customers"]]

    # Pinot's pauseStatus: the paused table alone; its segments listed until its writer stops
    status = api.get("/tables/customers/pauseStatus").json()
    assert (status["pauseFlag"], status["state"]) == (True, "READY")
    assert status["consumingSegments"] == ["customers__0__2"]
    assert api.get("/tables/orders/pauseStatus").json()["pauseFlag"] is False
    _beat(catalog, clock, "orders")  # the worker took customers' writer out
    assert api.get("/tables/customers/pauseStatus").json()["consumingSegments"] == []
    assert api.get("/tables/orders/pauseStatus").json()["consumingSegments"] == ["orders__0__2"]

    # A rollback needs its own table paused: a sibling's pause does not let it through.
    refused = api.delete(
        "/tables/orders/segments", params={"partition": 0, "fromSequence": 1, "dryRun": False}
    )
    assert refused.status_code == 409, refused.text
    assert "table 'orders' of datastream 'inventory'" in refused.json()["message"]
    rolled = api.delete(
        "/tables/customers/segments", params={"partition": 0, "fromSequence": 1, "dryRun": False}
    )
    assert rolled.status_code == 200, rolled.text
    assert rolled.json()["upper"] == {"from": 10, "to": 6}
    assert [s.upper for s in catalog.store.list_shards("orders")] == [10]

    resumed = api.post("/datastreams/inventory/tables/customers/resume")
    assert resumed.status_code == 200, resumed.text
    assert (resumed.json()["state"], resumed.json()["paused_tables"]) == ("READY", [])


def test_pinots_pause_paths_pause_one_table_of_a_multi_table_datastream(
    api: TestClient, inventory: None
) -> None:
    paused = api.post("/tables/orders/pauseConsumption").json()
    assert (paused["pauseFlag"], paused["state"], paused["datastream"]) == (
        True,
        "READY",
        "inventory",
    )
    assert api.get("/datastreams/inventory").json()["paused_tables"] == ["orders"]
    assert api.get("/tables/customers/pauseStatus").json()["pauseFlag"] is False
    assert api.post("/tables/orders/pauseConsumption").json()["pauseFlag"] is True  # harmless
    resumed = api.post("/tables/orders/resumeConsumption").json()
    assert (resumed["pauseFlag"], resumed["state"]) == (False, "READY")
    assert api.get("/datastreams/inventory").json()["paused_tables"] == []


def test_a_refused_table_command_names_the_table_and_changes_nothing(
    api: TestClient, inventory: None, catalog: Catalog, source_dir: Any, controller: Controller
) -> None:
    assert api.post("/datastreams", json=spec_body("single", source_dir)).status_code == 201
    controller.tick()
    api.post("/datastreams/inventory/tables/customers/pause")
    before = store_snapshot(catalog.store)
    cases = [
        (
            "inventory/tables/customers/pause",
            409,
            "table 'customers' of datastream 'inventory' is paused already",
        ),
        (
            "inventory/tables/orders/resume",
            409,
            "table 'orders' of datastream 'inventory' is not paused",
        ),
        ("inventory/tables/nope/pause", 404, "datastream 'inventory' table 'nope' does not"),
        ("inventory/tables/orders__dead_letter/pause", 404, "'orders__dead_letter'"),
        ("inventory/tables/single/pause", 404, "'single'"),  # another datastream's table
        ("single/tables/single/pause", 422, "writes one table ('single')"),
        ("nope/tables/orders/pause", 404, "datastream 'nope' does not exist"),
    ]
    for path, code, message in cases:
        r = api.post(f"/datastreams/{path}")
        assert r.status_code == code, (path, r.text)
        assert message in r.json()["message"], (path, r.json())
    assert api.post("/datastreams/single/tables/single/pause").json()["field"] == "table"
    assert store_snapshot(catalog.store) == before
