"""/tables/{t}/segments and /tables/{t}/consumingSegmentsInfo: the manifest by partition, and
per partition the shard upper against the source's latest offset, the lags and the workers
serving it; a source that cannot be reached gives nulls and an error, never a failure."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path
from typing import Any

import pytest

from harness.api_support import TestClient, beat, spec_body, write_lines
from millstream.api import create_app
from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.control.controller import Controller
from millstream.metastore.models import ShardAppend


def commit(catalog: Catalog, table: str, partition: int, lo: int, hi: int, seq_file: str) -> None:
    catalog.store.compare_and_append(
        table,
        [ShardAppend(partition, lo, hi, 0, f"data/{table}/{seq_file}.parquet", hi - lo, 100)],
        writer_id="worker-a",
        batch_id=0,
    )


@pytest.fixture
def orders(
    api: TestClient, controller: Controller, catalog: Catalog, clock: ManualClock, source_dir: Path
) -> None:
    """READY datastream ``orders`` on a files source with partitions 0 (15 records upstream,
    10 committed in two segments), 1 (4 upstream, all committed) and 2 (3 upstream, none
    committed), served by ``worker-a``; 2.5 s pass after the last commit."""
    write_lines(source_dir, 0, 15)
    write_lines(source_dir, 1, 4)
    write_lines(source_dir, 2, 3)
    api.post("/datastreams", json=spec_body("orders", source_dir))
    beat(catalog, clock, "worker-a", "orders")
    controller.tick()
    commit(catalog, "orders", 0, 0, 6, "a")
    clock.advance(1.0)
    commit(catalog, "orders", 0, 6, 10, "b")
    commit(catalog, "orders", 1, 0, 4, "b")
    clock.advance(2.5)


def test_segments_lists_the_manifest_entries_grouped_by_partition(
    api: TestClient, orders: None
) -> None:
    r = api.get("/tables/orders/segments")

    assert r.status_code == 200
    body = r.json()
    assert (body["table"], body["segment_count"], body["row_count"]) == ("orders", 3, 14)
    assert body["manifest_version"] == 3
    by_partition = {p["partition"]: p["segments"] for p in body["partitions"]}
    assert sorted(by_partition) == [0, 1]
    assert [
        (s["name"], s["seq"], s["start_offset"], s["end_offset"], s["rows"], s["state"])
        for s in by_partition[0]
    ] == [
        ("orders__0__0", 0, 0, 6, 6, "CONSUMING"),
        ("orders__0__1", 1, 6, 10, 4, "CONSUMING"),
    ]
    assert by_partition[1][0]["file"] == "data/orders/b.parquet"
    assert by_partition[1][0]["size_bytes"] == 100


def test_segments_of_a_table_without_commits_is_empty(
    api: TestClient, controller: Controller, source_dir: Path
) -> None:
    api.post("/datastreams", json=spec_body("orders", source_dir))
    controller.tick()

    body = api.get("/tables/orders/segments").json()

    assert (body["segment_count"], body["partitions"]) == (0, [])


def test_consuming_segments_info_reports_offsets_lags_and_serving_workers(
    api: TestClient, orders: None
) -> None:
    r = api.get("/tables/orders/consumingSegmentsInfo")

    assert r.status_code == 200
    body = r.json()
    assert (body["table"], body["datastream"], body["state"]) == ("orders", "orders", "READY")
    assert body["upstream_error"] is None
    parts = {p["partition"]: p for p in body["partitions"]}
    assert {
        p: (
            x["current_offset"],
            x["latest_upstream_offset"],
            x["records_lag"],
            x["availability_lag_ms"],
        )
        for p, x in parts.items()
    } == {
        0: (10, 15, 5, 2500),  # lagging: 2.5 s since the commit that advanced it to 10
        1: (4, 4, 0, 0),  # caught up
        2: (None, 3, None, None),  # nothing committed yet
    }
    assert parts[0]["latest_segment"] == "orders__0__1"
    assert parts[0]["consuming_segments"] == 2
    assert parts[0]["serving_workers"] == [
        {"worker_id": "worker-a", "role": "active", "alive": True, "running": True}
    ]
    assert body["partition_offset_info"] == {
        "current_offsets_map": {"0": 10, "1": 4, "2": None},
        "latest_upstream_offset_map": {"0": 15, "1": 4, "2": 3},
        "records_lag_map": {"0": 5, "1": 0, "2": None},
        "availability_lag_ms_map": {"0": 2500, "1": 0, "2": None},
    }


def test_a_worker_past_its_ttl_is_reported_not_alive(
    api: TestClient, orders: None, clock: ManualClock
) -> None:
    clock.advance(10)  # worker TTL is 5 s and worker-a stopped heartbeating

    workers = api.get("/tables/orders/consumingSegmentsInfo").json()["partitions"][0][
        "serving_workers"
    ]

    assert workers == [{"worker_id": "worker-a", "role": "active", "alive": False, "running": True}]


def test_an_unreachable_source_gives_null_upstream_offsets_and_an_error(
    api: TestClient, orders: None, source_dir: Path
) -> None:
    shutil.rmtree(source_dir)

    r = api.get("/tables/orders/consumingSegmentsInfo")

    assert r.status_code == 200
    body = r.json()
    assert "cannot read the latest offsets" in body["upstream_error"]
    assert str(source_dir) in body["upstream_error"]
    p0 = body["partitions"][0]
    assert (p0["current_offset"], p0["latest_upstream_offset"], p0["records_lag"]) == (
        10,
        None,
        None,
    )
    assert p0["availability_lag_ms"] == 2500  # unknown upstream: time since the last advance
    assert p0["error"] == body["upstream_error"]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_a_broker_that_is_down_gives_null_upstream_offsets_and_an_error(
    catalog: Catalog, controller: Controller, clock: ManualClock
) -> None:
    app = create_app(catalog, controller=controller, clock=clock, upstream_timeout=1.0)
    bootstrap = f"127.0.0.1:{_closed_port()}"
    kafka = {
        "kind": "kafka",
        "bootstrap_servers": bootstrap,
        "topic": "orders",
        "options": {"log_level": "0"},  # the client's reconnect attempts stay out of the log
    }
    with TestClient(app) as api:
        api.post("/datastreams", json=spec_body("orders", Path("/unused"), source=kafka))
        controller.tick()
        commit(catalog, "orders", 0, 0, 5, "a")

        r = api.get("/tables/orders/consumingSegmentsInfo")

    assert r.status_code == 200
    body = r.json()
    assert bootstrap in body["upstream_error"]
    parts = body["partitions"]
    assert [(p["partition"], p["current_offset"], p["latest_upstream_offset"]) for p in parts] == [
        (0, 5, None)
    ]
    assert parts[0]["error"] == body["upstream_error"]


def test_the_dead_letter_table_reports_its_datastream(api: TestClient, orders: None) -> None:
    body = api.get("/tables/orders__dead_letter/consumingSegmentsInfo").json()

    assert body["datastream"] == "orders"
    # how far its dead letters are recorded: its table's uppers (its own shard moves only
    # with a dead letter, and these commits had none)
    assert [p["current_offset"] for p in body["partitions"]] == [10, 4, None]


def test_a_table_no_datastream_writes_reports_why_upstream_is_unknown(
    api: TestClient, catalog: Catalog
) -> None:
    catalog.create_table({"name": "manual", "schema": {"id": "long"}})

    body = api.get("/tables/manual/consumingSegmentsInfo").json()

    assert body["datastream"] is None
    assert body["upstream_error"] == "no datastream writes table 'manual'"


@pytest.mark.parametrize("route", ["segments", "consumingSegmentsInfo"])
def test_an_unknown_table_is_404_naming_it(api: TestClient, route: str) -> None:
    r = api.get(f"/tables/nope/{route}")

    assert r.status_code == 404
    body: dict[str, Any] = r.json()
    assert (body["error"], body["kind"], body["name"]) == ("TableNotFoundError", "table", "nope")
