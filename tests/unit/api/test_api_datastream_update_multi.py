"""PATCH /datastreams/{name} of a datastream that writes a table per topic: the safe changes
(topics added to its list, the topic poll interval, retention, overrides of topics whose
tables do not exist yet) are made in one transaction, with the retention of every existing
table and the claim of the new topics' tables; any other change is refused with 409 naming the
field, and a refused update leaves the metadata store exactly as it was."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from harness.api_support import TestClient, spec_body, store_snapshot
from millstream.catalog import Catalog
from millstream.control.controller import Controller

BODY: dict[str, Any] = {
    "name": "inventory",
    "source": {
        "kind": "kafka",
        "bootstrap_servers": "127.0.0.1:1",
        "topics": ["db.inventory.customers", "db.inventory.orders"],
    },
    "table": {"mode": "upsert", "primary_key": ["id"]},
    "schema": {"id": "long", "status": "string"},
}


@pytest.fixture
def ready(api: TestClient, controller: Controller) -> None:
    assert api.post("/datastreams", json=BODY).status_code == 201
    controller.tick()
    assert api.get("/datastreams/inventory").json()["tables"] == ["customers", "orders"]


def _body(**change: Any) -> dict[str, Any]:
    body = copy.deepcopy(BODY)
    for path, value in change.items():
        section, _, key = path.partition("__")
        if key:
            body[section][key] = value
        else:
            body[section] = value
    return body


def test_topics_settings_retention_and_new_tables_overrides_change_in_one_update(
    api: TestClient, catalog: Catalog, ready: None
) -> None:
    body = _body(
        source__topics=[*BODY["source"]["topics"], "db.inventory.items"],
        source__topic_poll_interval="5s",
        table__retention={"time": "7d", "min_versions": 3},
        overrides={"db.inventory.items": {"mode": "dedup"}},
    )
    before = store_snapshot(catalog.store)
    dry = api.patch("/datastreams/inventory?dry_run=true", json=body)
    assert dry.status_code == 200, dry.text
    assert store_snapshot(catalog.store) == before

    r = api.patch("/datastreams/inventory", json=body)
    assert r.status_code == 200, r.text
    described = [c["description"] for c in r.json()["changes"]]
    assert described == [c["description"] for c in dry.json()["changes"]]
    assert described[:3] == [
        "+ topic db.inventory.items (table items)",
        "~ source.topic_poll_interval 30s -> 5s",
        '~ overrides.db.inventory.items {} -> {"mode": "dedup"}',
    ]
    assert [c["table"] for c in r.json()["changes"][3:]] == ["customers", "orders"]
    assert all(c["kind"] == "retention" for c in r.json()["changes"][3:])
    for t in ("customers", "orders", "customers__dead_letter", "orders__dead_letter"):
        assert catalog.table(t).spec.retention.time == "7d", t
    rec = api.get("/datastreams/inventory").json()
    assert rec["spec"]["source"]["topics"][-1] == "db.inventory.items"
    assert rec["tables"] == ["customers", "items", "orders"]  # claimed: the worker makes it
    # the same spec again changes nothing
    assert api.patch("/datastreams/inventory", json=body).json()["changes"] == []

    # an existing table's override may change its retention
    body["overrides"]["db.inventory.orders"] = {"retention": {"time": "1h"}}
    r = api.patch("/datastreams/inventory", json=body)
    assert r.status_code == 200, r.text
    assert [(c["table"], c["kind"]) for c in r.json()["changes"]] == [("orders", "retention")]
    assert catalog.table("orders").spec.retention.time == "1h"
    assert catalog.table("customers").spec.retention.time == "7d"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"source__topics": ["db.inventory.customers"]}, "source.topics"),
        ({"source__topics": None, "source__topic_pattern": r"db\..*"}, "source.topic_pattern"),
        ({"source__bootstrap_servers": "127.0.0.1:2"}, "source.bootstrap_servers"),
        ({"schema": {"id": "long", "status": "string", "qty": "int"}}, "schema.qty"),
        ({"table__mode": "dedup"}, "table.mode"),
        ({"replicas": 2}, "replicas"),
        (
            {"overrides": {"db.inventory.orders": {"mode": "dedup"}}},
            "overrides.db.inventory.orders.mode",
        ),
    ],
)
def test_other_changes_are_refused_naming_the_field_and_change_nothing(
    api: TestClient, catalog: Catalog, ready: None, change: dict[str, Any], field: str
) -> None:
    body = _body(**change)
    if body["source"].get("topics") is None:
        body["source"].pop("topics")
    before = store_snapshot(catalog.store)
    r = api.patch("/datastreams/inventory", json=body)
    assert r.status_code == 409, r.text
    assert r.json()["field"] == field, r.json()
    assert store_snapshot(catalog.store) == before


def test_a_topic_whose_table_another_datastream_has_is_refused(
    api: TestClient, catalog: Catalog, ready: None, controller: Controller, source_dir: Path
) -> None:
    assert api.post("/datastreams", json=spec_body("items", source_dir)).status_code == 201
    controller.tick()
    before = store_snapshot(catalog.store)
    body = _body(source__topics=[*BODY["source"]["topics"], "db.inventory.items"])
    r = api.patch("/datastreams/inventory", json=body)
    assert r.status_code == 409, r.text
    assert "table 'items' belongs to datastream 'items'" in r.json()["message"]
    assert store_snapshot(catalog.store) == before
