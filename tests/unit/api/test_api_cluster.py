"""/workers, /health, /settings, /metrics and the OpenAPI document."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from harness.api_support import TestClient, beat, spec_body, write_lines
from millstream.api import create_app
from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.control.controller import Controller
from millstream.control.workers import heartbeat
from millstream.metastore.engine import public_url
from millstream.metastore.models import ShardAppend


def test_workers_shows_the_shared_query_a_worker_reports(
    api: TestClient, catalog: Catalog, clock: ManualClock
) -> None:
    """A worker's shared query as its heartbeat reports it: the run id that stays the same
    while datastreams join and leave it, and its counts of starts, joins and leaves."""
    status = {"run_id": "r1", "members": ["a", "b"], "starts": 1, "joins": 2, "leaves": 1}
    heartbeat(
        catalog.store,
        "worker-a",
        status="RUNNING",
        info={"writers": [], "shared_query": status},
        clock=clock,
    )
    heartbeat(catalog.store, "worker-b", status="RUNNING", info={"writers": []}, clock=clock)
    workers = {w["id"]: w for w in api.get("/workers").json()}
    assert workers["worker-a"]["shared_query"] == status
    assert workers["worker-b"]["shared_query"] is None


def test_workers_lists_heartbeats_with_the_alive_flag_and_assignments(
    api: TestClient, controller: Controller, catalog: Catalog, clock: ManualClock, source_dir: Path
) -> None:
    api.post("/datastreams", json=spec_body("orders", source_dir))
    beat(catalog, clock, "worker-a", "orders")
    beat(catalog, clock, "worker-b")
    controller.tick()
    clock.advance(3)
    beat(catalog, clock, "worker-b")
    clock.advance(3)  # worker-a's last heartbeat is 6 s old, past the 5 s TTL

    r = api.get("/workers")

    assert r.status_code == 200
    workers = {w["id"]: w for w in r.json()}
    assert {k: (w["alive"], w["status"]) for k, w in workers.items()} == {
        "worker-a": (False, "RUNNING"),
        "worker-b": (True, "RUNNING"),
    }
    assert workers["worker-a"]["heartbeat_age_s"] == 6.0
    assert workers["worker-a"]["writers"] == [
        {"datastream": "orders", "role": "active", "running": True}
    ]
    placed = {w: x["assignments"] for w, x in workers.items()}
    assert sum(len(a) for a in placed.values()) == 1
    assert [a for a in placed.values() if a] == [[{"datastream": "orders", "role": "active"}]]


def test_health_says_whether_this_controller_leads(api: TestClient, controller: Controller) -> None:
    before = api.get("/health").json()
    controller.tick()
    after = api.get("/health").json()

    assert before == {"status": "ok", "leader": False, "controller_id": "controller-1"}
    assert after == {"status": "ok", "leader": True, "controller_id": "controller-1"}


def test_health_without_a_controller_is_ok_and_not_leader(catalog: Catalog) -> None:
    with TestClient(create_app(catalog)) as api:
        assert api.get("/health").json() == {
            "status": "ok",
            "leader": False,
            "controller_id": None,
        }


def test_settings_give_a_worker_the_stores_and_timings(api: TestClient, catalog: Catalog) -> None:
    body = api.get("/settings").json()

    assert body == {
        "metadata_url": catalog.settings.metadata_url,
        "deep_store": catalog.settings.deep_store,
        "s3_endpoint": None,
        "control": {
            "lease_ttl": 10.0,
            "worker_ttl": 5.0,
            "takeover_ttl": 1.5,
            "tick_seconds": 1.0,
            "stall_seconds": 300.0,
            "iceberg_publish_interval": 15.0,
        },
    }


def test_a_metadata_url_is_served_without_its_password() -> None:
    url = "postgresql+psycopg://millstream:hunter2@db.example:5432/ms"

    assert public_url(url) == "postgresql+psycopg://millstream@db.example:5432/ms"
    assert public_url("sqlite:////srv/ms/metadata.db") == "sqlite:////srv/ms/metadata.db"


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_are_computed_at_scrape_time(
    api: TestClient, controller: Controller, catalog: Catalog, clock: ManualClock, source_dir: Path
) -> None:
    write_lines(source_dir, 0, 12)
    write_lines(source_dir, 1, 3)
    api.post("/datastreams", json=spec_body("orders", source_dir))
    api.post("/datastreams", json=spec_body("payments", source_dir))
    beat(catalog, clock, "worker-a", "orders")
    controller.tick()
    api.post("/datastreams/payments/pause")
    # The last records' timestamps: 2 s ago in partition 0, 60 s ago in (caught-up) 1.
    now_ms = round(clock.now() * 1000)
    catalog.store.compare_and_append(
        "orders",
        [
            ShardAppend(0, 0, 8, 0, "f.parquet", 8, 10, last_record_ms=now_ms - 2000),
            ShardAppend(1, 0, 3, 0, "f.parquet", 3, 10, last_record_ms=now_ms - 60_000),
        ],
    )
    clock.advance(1.5)

    r = api.get("/metrics")

    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    m = _samples(r.text)
    orders0 = (("partition", "0"), ("table", "orders"))
    orders1 = (("partition", "1"), ("table", "orders"))
    assert m["millstream_offset_lag", orders0] == 4
    assert m["millstream_offset_lag", orders1] == 0
    # Pinot's ingestion delay: now minus the last committed record's timestamp, 0 when
    # caught up; the availability lag: since the shard last advanced, 0 when caught up.
    assert m["millstream_ingestion_delay_ms", orders0] == 3500
    assert m["millstream_ingestion_delay_ms", orders1] == 0
    assert m["millstream_availability_lag_ms", orders0] == 1500
    assert m["millstream_availability_lag_ms", orders1] == 0
    assert m["millstream_datastreams", (("state", "READY"),)] == 1
    assert m["millstream_datastreams", (("state", "PAUSED"),)] == 1
    assert m["millstream_datastreams", (("state", "STOPPED"),)] == 0
    assert m["millstream_workers_alive", ()] == 1
    assert m["millstream_commit_conflicts_total", ()] >= 0


def test_metrics_expose_every_metric_name_on_an_empty_deployment(api: TestClient) -> None:
    text = api.get("/metrics").text

    for name in (
        "millstream_ingestion_delay_ms",
        "millstream_availability_lag_ms",
        "millstream_offset_lag",
        "millstream_table_rows",
        "millstream_commit_conflicts_total",
        "millstream_datastreams",
        "millstream_workers_alive",
        "millstream_rows_consumed_total",
        "millstream_rows_dead_lettered_total",
        "millstream_rows_superseded_total",
    ):
        assert f"# TYPE {name.removesuffix('_total')}" in text


def test_each_app_has_its_own_metrics_registry(catalog: Catalog) -> None:
    a, b = create_app(catalog), create_app(catalog)

    assert a.state.metrics_registry is not b.state.metrics_registry


def test_the_openapi_document_describes_the_spec_body_and_the_bearer_scheme(
    secured_api: TestClient, api: TestClient
) -> None:
    doc = secured_api.get("/openapi.json").json()
    open_doc = api.get("/openapi.json").json()

    create = doc["paths"]["/datastreams"]["post"]
    body_schema = create["requestBody"]["content"]["application/json"]["schema"]
    assert body_schema == {"$ref": "#/components/schemas/DatastreamSpec"}
    spec = doc["components"]["schemas"]["DatastreamSpec"]
    assert {"name", "source"} <= set(spec["required"])
    # a datastream of many topics may take its tables' columns from the schema registry
    assert "schema" in spec["properties"] and "schema" not in spec["required"]
    assert create["security"] == [{"bearer": []}]
    assert "security" not in doc["paths"]["/datastreams"]["get"]
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert "securitySchemes" not in open_doc["components"]
    assert set(doc["paths"]) >= {
        "/datastreams/{name}/pause",
        "/tables/{table}/consumingSegmentsInfo",
        "/tables/{table}/segments",
        "/workers",
        "/health",
        "/settings",
        "/metrics",
    }
    assert api.get("/docs").status_code == 200
