"""/tables/{t}/debugInfo and the sealing metrics: an operator sees what is waiting to be sealed,
what is being built, and which segment keeps failing and why."""

from __future__ import annotations

from pathlib import Path

import pytest
from api_support import TestClient, spec_body

from millstream.catalog import Catalog
from millstream.control.controller import Controller
from millstream.errors import SegmentUnavailableError
from millstream.metastore.models import ShardAppend
from millstream.sealing.sealer import InjectedSealFault, Sealer, SealFaults


def test_debug_info_and_metrics_report_the_sealer_queue_and_segments_in_error(
    api: TestClient, controller: Controller, catalog: Catalog, source_dir: Path
) -> None:
    assert api.post("/datastreams", json=spec_body("orders", source_dir)).status_code == 201
    controller.tick()
    for lo, hi in ((0, 5), (5, 10)):
        catalog.store.compare_and_append(
            "orders", [ShardAppend(0, lo, hi, 0, f"data/orders/{lo}.parquet", hi - lo, 10)]
        )
    catalog.store.compare_and_append(
        "orders", [ShardAppend(1, 0, 3, 0, "data/orders/p1.parquet", 3, 10)]
    )
    info = api.get("/tables/orders/debugInfo").json()
    assert info["sealer_queue"] == [
        {"partition": 0, "segments": 2},
        {"partition": 1, "segments": 1},
    ]
    assert info["segments_in_error"] == [] and info["committing_segments"] == []

    # The data files of these hand-made entries do not exist, so every seal fails to build;
    # after max_failures the run's first segment is ERROR with the reason.
    sealer = Sealer(catalog, "orders", faults=SealFaults(), max_failures=2)
    for _ in range(2):
        with pytest.raises(SegmentUnavailableError):
            sealer.seal_partition(0, force=True)
    info = api.get("/tables/orders/debugInfo").json()
    assert [e["segment"] for e in info["segments_in_error"]] == ["orders__0__0"]
    assert info["segments_in_error"][0]["last_error"]

    text = api.get("/metrics").text
    assert 'millstream_segments_in_error{table="orders"} 1.0' in text
    assert 'millstream_seal_lag_segments{partition="0",table="orders"} 2.0' in text
    assert 'millstream_pauseless_enabled{datastream="orders"} 1.0' in text
    assert api.get("/tables/nope/debugInfo").status_code == 404


def test_an_injected_fault_names_its_point_in_the_segment_error(
    api: TestClient, controller: Controller, catalog: Catalog, source_dir: Path
) -> None:
    assert api.post("/datastreams", json=spec_body("orders", source_dir)).status_code == 201
    controller.tick()
    catalog.store.compare_and_append("orders", [ShardAppend(0, 0, 5, 0, "data/x.parquet", 5, 10)])
    sealer = Sealer(catalog, "orders", faults=SealFaults({"before_build": 1}), max_failures=1)
    with pytest.raises(InjectedSealFault):
        sealer.seal_partition(0, force=True)
    info = api.get("/tables/orders/debugInfo").json()
    assert "before_build" in info["segments_in_error"][0]["last_error"]
