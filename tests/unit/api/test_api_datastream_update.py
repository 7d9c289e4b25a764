"""PATCH /datastreams/{name}: compatible schema changes are applied in one transaction (the
table's schema version, the datastream's spec), a dry run changes nothing, and every refusal
(409 naming the column and the rule, 422 for an invalid spec, 404) leaves the metadata store
exactly as it was."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.api_support import TestClient, spec_body, store_snapshot
from millstream.catalog import Catalog
from millstream.control.controller import Controller

EVOLVED = {"id": "long", "status": "string", "discount": "double"}


@pytest.fixture
def ready(api: TestClient, controller: Controller, source_dir: Path) -> dict[str, Any]:
    body = spec_body("orders", source_dir, schema={"id": "long", "status": "string", "qty": "int"})
    assert api.post("/datastreams", json=body).status_code == 201
    controller.tick()
    rec: dict[str, Any] = api.get("/datastreams/orders").json()
    assert rec["state"] == "READY"
    return body


def test_adding_a_column_and_widening_a_type_updates_table_and_datastream(
    api: TestClient, catalog: Catalog, ready: dict[str, Any]
) -> None:
    new_schema = {**ready["schema"], "qty": "long", "discount": "double"}
    r = api.patch("/datastreams/orders", json={**ready, "schema": new_schema})

    assert r.status_code == 200, r.text
    out = r.json()
    assert [c["description"] for c in out["changes"]] == [
        "~ column qty int -> long",
        "+ column discount double",
    ]
    assert (out["dry_run"], out["schema_version"]) == (False, 2)
    assert out["datastream"]["spec"]["schema"] == new_schema
    assert out["datastream"]["state"] == "READY"
    table = catalog.table("orders")
    assert (dict(table.spec.columns), table.schema_version) == (new_schema, 2)
    assert api.get("/datastreams/orders").json()["spec"]["schema"] == new_schema
    # The dead-letter table has no schema change to make.
    assert catalog.table("orders__dead_letter").schema_version == 1


def test_a_dry_run_lists_the_changes_and_writes_nothing(
    api: TestClient, catalog: Catalog, ready: dict[str, Any]
) -> None:
    before = store_snapshot(catalog.store)
    body = {**ready, "schema": {**ready["schema"], "discount": "double"}}
    r = api.patch("/datastreams/orders?dry_run=true", json=body)
    assert r.status_code == 200, r.text
    assert [c["description"] for c in r.json()["changes"]] == ["+ column discount double"]
    assert r.json()["dry_run"] is True
    assert store_snapshot(catalog.store) == before


def test_the_same_spec_again_is_no_change(
    api: TestClient, catalog: Catalog, ready: dict[str, Any]
) -> None:
    before = store_snapshot(catalog.store)
    r = api.patch("/datastreams/orders", json=ready)
    assert (r.status_code, r.json()["changes"]) == (200, [])
    assert store_snapshot(catalog.store) == before


@pytest.mark.parametrize(
    ("schema", "column", "rule"),
    [
        ({"id": "long", "status": "string"}, "qty", "cannot be removed or renamed"),
        ({"id": "long", "status": "long", "qty": "int"}, "status", "not a lossless widening"),
        ({"id": "long", "qty": "int", "status": "string"}, "qty", "cannot be reordered"),
        ({"id": "int", "status": "string", "qty": "int"}, "id", "key column cannot change"),
    ],
)
def test_an_incompatible_change_is_refused_with_409_naming_column_and_rule(
    api: TestClient,
    catalog: Catalog,
    ready: dict[str, Any],
    schema: dict[str, str],
    column: str,
    rule: str,
) -> None:
    before = store_snapshot(catalog.store)
    r = api.patch("/datastreams/orders", json={**ready, "schema": schema})
    assert r.status_code == 409, r.text
    body = r.json()
    assert body["error"] == "IncompatibleChangeError"
    assert (body["column"], body["field"]) == (column, f"schema.{column}")
    assert rule in body["rule"]
    assert f"column {column!r}" in body["message"]
    assert store_snapshot(catalog.store) == before


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"table": {"mode": "dedup", "primary_key": ["id"]}}, "table.mode"),
        ({"max_records_per_batch": 7}, "max_records_per_batch"),
        ({"replicas": 2}, "replicas"),
    ],
)
def test_other_fields_cannot_change_with_an_update(
    api: TestClient,
    catalog: Catalog,
    ready: dict[str, Any],
    change: dict[str, Any],
    field: str,
) -> None:
    before = store_snapshot(catalog.store)
    r = api.patch("/datastreams/orders", json={**ready, **change})
    assert r.status_code == 409, r.text
    assert r.json()["field"] == field
    assert store_snapshot(catalog.store) == before


def test_a_source_change_is_refused_naming_the_source_field(
    api: TestClient, catalog: Catalog, ready: dict[str, Any], tmp_path: Path
) -> None:
    body = {**ready, "source": {**ready["source"], "path": str(tmp_path / "elsewhere")}}
    r = api.patch("/datastreams/orders", json=body)
    assert r.status_code == 409
    assert r.json()["field"] == "source.path"
    assert "only the schema and table.retention" in r.json()["rule"]


def test_retention_may_change_for_the_table_and_its_dead_letter_table(
    api: TestClient, catalog: Catalog, ready: dict[str, Any]
) -> None:
    body = {**ready, "table": {**ready["table"], "retention": {"time": "7d"}}}
    r = api.patch("/datastreams/orders", json=body)
    assert r.status_code == 200, r.text
    assert [c["kind"] for c in r.json()["changes"]] == ["retention"]
    assert catalog.table("orders").spec.retention.time == "7d"
    assert catalog.table("orders__dead_letter").spec.retention.time == "7d"
    assert catalog.table("orders").schema_version == 1


def test_an_invalid_spec_is_422_and_an_unknown_datastream_404(
    api: TestClient, catalog: Catalog, ready: dict[str, Any], source_dir: Path
) -> None:
    before = store_snapshot(catalog.store)
    bad = {**ready, "schema": {**ready["schema"], "x": "uuid"}}
    r = api.patch("/datastreams/orders", json=bad)
    assert r.status_code == 422
    assert r.json()["field"] == "schema.x"
    other = api.patch("/datastreams/orders", json={**ready, "name": "other"})
    assert (other.status_code, other.json()["field"]) == (422, "name")
    missing = api.patch("/datastreams/nope", json=spec_body("nope", source_dir))
    assert missing.status_code == 404
    assert store_snapshot(catalog.store) == before


def test_an_update_before_the_table_exists_changes_the_spec_the_leader_creates_it_from(
    api: TestClient, catalog: Catalog, controller: Controller, source_dir: Path
) -> None:
    body = spec_body("orders", source_dir)
    assert api.post("/datastreams", json=body).status_code == 201
    r = api.patch("/datastreams/orders", json={**body, "schema": EVOLVED})
    assert r.status_code == 200, r.text
    assert r.json()["schema_version"] is None
    controller.tick()
    assert dict(catalog.table("orders").spec.columns) == EVOLVED
