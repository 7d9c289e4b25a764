"""/tables/{t}/debugInfo and the sealing metrics: an operator sees what is waiting to be sealed,
what is being built, and which segment keeps failing and why."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.api_support import TestClient, spec_body
from harness.fault_points import at_sealer
from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.control.controller import Controller
from millstream.errors import InjectedFault, SegmentUnavailableError
from millstream.metastore.models import ShardAppend
from millstream.sealing.sealer import Sealer


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
    sealer = Sealer(catalog, "orders", max_failures=2)
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
    sealer = Sealer(catalog, "orders", max_failures=1)
    at_sealer(sealer, fail={"before_build": 1})
    with pytest.raises(InjectedFault):
        sealer.seal_partition(0, force=True)
    info = api.get("/tables/orders/debugInfo").json()
    assert "before_build" in info["segments_in_error"][0]["last_error"]


def test_debug_info_names_who_is_sealing_a_segment_and_when_the_claim_expires(
    api: TestClient,
    controller: Controller,
    catalog: Catalog,
    source_dir: Path,
    clock: ManualClock,
) -> None:
    assert api.post("/datastreams", json=spec_body("orders", source_dir)).status_code == 201
    controller.tick()
    catalog.store.compare_and_append("orders", [ShardAppend(0, 0, 5, 0, "data/x.parquet", 5, 10)])
    seen: list[dict[str, object]] = []

    def look(point: str, _partition: int) -> None:
        if point == "before_build":
            seen.extend(api.get("/tables/orders/debugInfo").json()["committing_segments"])
            raise InjectedFault(point, _partition)  # stop here

    sealer = Sealer(catalog, "orders", clock=clock)

    at_sealer(sealer, hook=look)
    with pytest.raises(InjectedFault):
        sealer.seal_partition(0, force=True)
    assert [(s["segment"], s["claimed_by"]) for s in seen] == [("orders__0__0", sealer.claim_owner)]
    expires_in = seen[0]["claim_expires_in_s"]
    assert isinstance(expires_in, float) and 0 < expires_in <= sealer.claim_ttl
    assert api.get("/tables/orders/debugInfo").json()["committing_segments"] == []


def test_segments_and_debug_info_report_the_rows_delete_vectors_skip(
    api: TestClient, controller: Controller, catalog: Catalog, source_dir: Path
) -> None:
    import pyarrow as pa

    from millstream.table.writer import commit_staged, stage_rows

    assert api.post("/datastreams", json=spec_body("orders", source_dir)).status_code == 201
    controller.tick()
    spec = catalog.table("orders").spec
    sealer = Sealer(catalog, "orders")
    for lo in (0, 10):  # the same ten ids twice: the second seal supersedes all ten
        rows = pa.table(
            {
                "id": pa.array(range(10), pa.int64()),
                "status": ["new"] * 10,
                "_ms_partition": pa.array([0] * 10, pa.int32()),
                "_ms_offset": pa.array(range(lo, lo + 10), pa.int64()),
                "_ms_tombstone": [False] * 10,
            }
        )
        staged = stage_rows(catalog.deep, spec, rows)
        commit_staged(catalog.store, catalog.deep, "orders", staged, {0: (lo, lo + 10)}, {0: 0})
        assert sealer.seal_partition(0, force=True) is not None
    segs = api.get("/tables/orders/segments").json()
    assert (segs["row_count"], segs["deleted_rows"]) == (10, 10)
    assert segs["partitions"][0]["delete_vectors"] == 1
    assert catalog.read_table("orders").num_rows == 10
    info = api.get("/tables/orders/debugInfo").json()
    assert info["delete_vectors"] == [{"partition": 0, "vectors": 1, "rows": 10}]
    assert 'millstream_table_rows{table="orders"} 10.0' in api.get("/metrics").text
