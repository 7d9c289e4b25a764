"""DELETE /tables/{t}/segments: a dry run by default; a real rollback needs the datastream
paused (409 naming its state otherwise, store unchanged) unless force; it fences writers."""

from __future__ import annotations

from pathlib import Path

from harness.api_support import TestClient, spec_body, store_snapshot
from millstream.catalog import Catalog
from millstream.control.controller import Controller
from millstream.metastore.models import ShardAppend

URL = "/tables/orders/segments?partition=0&fromSequence=1"


def _ready_with_segments(
    api: TestClient, controller: Controller, catalog: Catalog, source_dir: Path
) -> None:
    assert api.post("/datastreams", json=spec_body("orders", source_dir)).status_code == 201
    controller.tick()
    for lo, hi in ((0, 5), (5, 10), (10, 12)):
        catalog.store.compare_and_append(
            "orders", [ShardAppend(0, lo, hi, 0, f"data/orders/{lo}.parquet", hi - lo, 10)]
        )


def test_rollback_is_a_dry_run_by_default_and_changes_nothing(
    api: TestClient, controller: Controller, catalog: Catalog, source_dir: Path
) -> None:
    _ready_with_segments(api, controller, catalog, source_dir)
    before = store_snapshot(catalog.store)
    r = api.delete(URL)
    assert r.status_code == 200, r.text
    plan = r.json()
    assert plan["dry_run"] is True
    assert [s["name"] for s in plan["removed_segments"]] == ["orders__0__1", "orders__0__2"]
    assert plan["upper"] == {"from": 12, "to": 5}
    assert store_snapshot(catalog.store) == before


def test_a_real_rollback_of_a_running_datastream_is_refused_until_paused(
    api: TestClient, controller: Controller, catalog: Catalog, source_dir: Path
) -> None:
    _ready_with_segments(api, controller, catalog, source_dir)
    before = store_snapshot(catalog.store)
    r = api.delete(URL + "&dryRun=false")
    assert r.status_code == 409
    assert "READY" in r.json()["message"] and "pause" in r.json()["message"]
    assert store_snapshot(catalog.store) == before

    assert api.post("/datastreams/orders/pause").status_code == 200
    r = api.delete(URL + "&dryRun=false")
    assert r.status_code == 200, r.text
    assert r.json()["epoch"] == {"from": 0, "to": 1}
    shard = catalog.store.get_shard("orders", 0)
    assert shard is not None and (shard.upper, shard.epoch) == (5, 1)
    assert [e.seq for e in catalog.manifest("orders").entries] == [0]


def test_force_rolls_back_a_running_datastream_and_unknown_segments_are_404(
    api: TestClient, controller: Controller, catalog: Catalog, source_dir: Path
) -> None:
    _ready_with_segments(api, controller, catalog, source_dir)
    assert api.delete(URL + "&dryRun=false&force=true").status_code == 200
    r = api.delete("/tables/orders/segments?partition=0&fromSequence=9")
    assert r.status_code == 404 and "orders__0__9" in r.json()["message"]
