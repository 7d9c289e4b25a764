"""/datastreams: create, list, show, pause/resume/stop, delete, and every way a request is
refused (422 naming the field, 404 naming the datastream, 409 naming both states, 413, 401),
each leaving the metadata store exactly as it was."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.api_support import AUTH, TestClient, spec_body, store_snapshot
from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.control.controller import Controller


@pytest.fixture
def ready(api: TestClient, controller: Controller, source_dir: Path) -> dict[str, Any]:
    """Datastream ``orders`` made READY by the leader."""
    assert api.post("/datastreams", json=spec_body("orders", source_dir)).status_code == 201
    controller.tick()
    rec: dict[str, Any] = api.get("/datastreams/orders").json()
    assert rec["state"] == "READY"
    return rec


# -- happy paths --------------------------------------------------------------------------


def test_create_returns_201_with_the_record_and_the_leader_makes_it_ready(
    api: TestClient, controller: Controller, catalog: Catalog, source_dir: Path
) -> None:
    r = api.post("/datastreams", json=spec_body("orders", source_dir))

    assert r.status_code == 201
    assert r.headers["location"] == "/datastreams/orders"
    rec = r.json()
    assert (rec["name"], rec["state"], rec["version"], rec["table"]) == (
        "orders",
        "INITIALIZING",
        1,
        "orders",
    )
    assert rec["spec"]["table"]["primary_key"] == ["id"]
    assert rec["spec"]["schema"] == {"id": "long", "status": "string"}

    controller.tick()

    assert api.get("/datastreams/orders").json()["state"] == "READY"
    assert {t.name for t in catalog.store.list_tables()} == {"orders", "orders__dead_letter"}


def test_the_spec_fields_of_the_yaml_file_are_accepted_as_json(
    api: TestClient, source_dir: Path
) -> None:
    body = spec_body(
        "orders",
        source_dir,
        table={"name": "orders_t", "mode": "dedup", "primary_key": ["id"]},
        segments={"flush_rows": 1000, "flush_bytes": "64MiB", "flush_seconds": "30s"},
        replicas=2,
        trigger_interval="250ms",
        bad_records="fail",
    )

    rec = api.post("/datastreams", json=body).json()

    assert rec["table"] == "orders_t"
    assert rec["spec"]["segments"]["flush_bytes"] == 64 * 1024**2
    assert rec["spec"]["segments"]["flush_seconds"] == 30
    assert (rec["spec"]["replicas"], rec["spec"]["bad_records"]) == (2, "fail")


def test_list_and_show_return_the_records_by_name(api: TestClient, source_dir: Path) -> None:
    for name in ("payments", "orders"):
        api.post("/datastreams", json=spec_body(name, source_dir))

    listed = api.get("/datastreams")
    shown = api.get("/datastreams/payments")

    assert listed.status_code == 200
    assert [r["name"] for r in listed.json()] == ["orders", "payments"]
    assert shown.status_code == 200
    assert shown.json() == listed.json()[1]


def test_pause_resume_stop_move_the_record_and_bump_its_version(
    api: TestClient, controller: Controller, ready: dict[str, Any]
) -> None:
    v = ready["version"]

    paused = api.post("/datastreams/orders/pause")
    resumed = api.post("/datastreams/orders/resume")
    stopping = api.post("/datastreams/orders/stop")
    controller.tick()  # no worker runs it: the leader completes the stop
    stopped = api.get("/datastreams/orders").json()
    restarted = api.post("/datastreams/orders/resume")

    assert [r.status_code for r in (paused, resumed, stopping, restarted)] == [200] * 4
    assert [
        (r["state"], r["version"])
        for r in (paused.json(), resumed.json(), stopping.json(), stopped, restarted.json())
    ] == [
        ("PAUSED", v + 1),
        ("READY", v + 2),
        ("STOPPING", v + 3),
        ("STOPPED", v + 4),
        ("READY", v + 5),
    ]


def test_delete_returns_202_deleting_and_the_leader_removes_it(
    api: TestClient, controller: Controller, ready: dict[str, Any]
) -> None:
    r = api.delete("/datastreams/orders")

    assert r.status_code == 202
    assert r.json()["state"] == "DELETING"

    controller.tick()

    gone = api.get("/datastreams/orders")
    assert gone.status_code == 404
    assert api.get("/datastreams").json() == []


# -- refused requests leave the store unchanged -------------------------------------------


@pytest.fixture
def unchanged(catalog: Catalog, ready: dict[str, Any]) -> Iterator[None]:
    """Asserts, after the test, that no row of the metadata store changed (no record, version
    or event), with one READY datastream ``orders`` in it beforehand."""
    before = store_snapshot(catalog.store)
    yield
    assert store_snapshot(catalog.store) == before


def _without(body: dict[str, Any], *path: str) -> dict[str, Any]:
    body = json.loads(json.dumps(body))
    node = body
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return body


def _with(body: dict[str, Any], value: Any, *path: str) -> dict[str, Any]:
    body = json.loads(json.dumps(body))
    node = body
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    return body


KAFKA = {"kind": "kafka", "bootstrap_servers": "127.0.0.1:9092", "topic": "orders"}
BASE = spec_body("payments", Path("/nonexistent"), source=KAFKA)
INVALID_SPECS = {
    "source.topic": _without(BASE, "source", "topic"),
    "source.bootstrap_servers": _with(BASE, "", "source", "bootstrap_servers"),
    "table.mode": _with(BASE, "merge", "table", "mode"),
    "table.primary_key": _with(BASE, ["nope"], "table", "primary_key"),
    "name": _with(BASE, "Payments Stream", "name"),
    "schema": _without(BASE, "schema"),
    "schema.status": _with(BASE, "varchar", "schema", "status"),
    "replicas": _with(BASE, 0, "replicas"),
    "trigger_interval": _with(BASE, "soon", "trigger_interval"),
    "source.kind": _with(BASE, "ftp", "source", "kind"),
    # sealing inside the micro-batch's commit was removed: sealing is always pauseless
    "segments.pauseless": _with(BASE, False, "segments", "pauseless"),
    "unexpected": _with(BASE, 1, "unexpected"),
}


@pytest.mark.parametrize(("field", "body"), INVALID_SPECS.items(), ids=list(INVALID_SPECS))
def test_an_invalid_spec_is_422_naming_the_field(
    api: TestClient, unchanged: None, field: str, body: dict[str, Any]
) -> None:
    r = api.post("/datastreams", json=body)

    assert r.status_code == 422
    err = r.json()
    assert err["error"] == "InvalidSpecError"
    assert err["field"] == field
    assert field in err["message"]


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b'{"name": "payments", ', "is not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b"", "is required"),
        (b'"orders"', "must be a JSON object"),
    ],
    ids=["truncated", "array", "empty", "string"],
)
def test_a_body_that_is_not_a_json_object_is_422_naming_the_problem(
    api: TestClient, unchanged: None, content: bytes, problem: str
) -> None:
    r = api.post("/datastreams", content=content, headers={"Content-Type": "application/json"})

    assert r.status_code == 422
    assert r.json()["field"] == "body"
    assert problem in r.json()["message"]


def test_creating_a_datastream_that_exists_is_409_naming_it(
    api: TestClient, unchanged: None, source_dir: Path
) -> None:
    r = api.post("/datastreams", json=spec_body("orders", source_dir, replicas=3))

    assert r.status_code == 409
    assert r.json()["error"] == "AlreadyExistsError"
    assert r.json()["name"] == "orders"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/datastreams/nope"),
        ("POST", "/datastreams/nope/pause"),
        ("POST", "/datastreams/nope/resume"),
        ("POST", "/datastreams/nope/stop"),
        ("DELETE", "/datastreams/nope"),
    ],
)
def test_an_unknown_datastream_is_404_naming_it(
    api: TestClient, unchanged: None, method: str, path: str
) -> None:
    r = api.request(method, path)

    assert r.status_code == 404
    assert r.json()["error"] == "NotFoundError"
    assert (r.json()["kind"], r.json()["name"]) == ("datastream", "nope")
    assert "'nope'" in r.json()["message"]


@pytest.fixture
def stopped(api: TestClient, controller: Controller, ready: dict[str, Any]) -> None:
    api.post("/datastreams/orders/stop")
    controller.tick()
    assert api.get("/datastreams/orders").json()["state"] == "STOPPED"


@pytest.mark.parametrize(
    ("action", "to_state"), [("pause", "PAUSED"), ("stop", "STOPPING")], ids=["pause", "stop"]
)
def test_an_illegal_transition_is_409_naming_from_and_to_states(
    api: TestClient, catalog: Catalog, stopped: None, action: str, to_state: str
) -> None:
    before = store_snapshot(catalog.store)

    r = api.post(f"/datastreams/orders/{action}")

    assert r.status_code == 409
    err = r.json()
    assert err["error"] == "InvalidTransitionError"
    assert (err["name"], err["from_state"], err["to_state"]) == ("orders", "STOPPED", to_state)
    assert "from STOPPED it may go to: DELETING, ERROR, READY" in err["message"]
    assert store_snapshot(catalog.store) == before


def test_a_body_over_1_mib_is_413_before_parsing(
    api: TestClient, unchanged: None, source_dir: Path
) -> None:
    body = spec_body("payments", source_dir, padding="x" * (1024 * 1024))

    r = api.post("/datastreams", json=body)

    assert r.status_code == 413
    assert r.json()["error"] == "RequestTooLargeError"
    assert r.json()["limit"] == 1024 * 1024


def test_a_chunked_body_over_1_mib_is_413_while_reading(api: TestClient, unchanged: None) -> None:
    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit applies as bytes arrive
        yield b'{"name": "payments", "padding": "'
        for _ in range(20):
            yield b"x" * 65536
        yield b'"}'

    r = api.post("/datastreams", content=chunks(), headers={"Content-Type": "application/json"})

    assert "content-length" not in {k.lower() for k in r.request.headers}
    assert r.status_code == 413


# -- bearer token ---------------------------------------------------------------------------


@pytest.fixture
def secured_ready(secured_api: TestClient, controller: Controller, source_dir: Path) -> TestClient:
    assert secured_api.post("/datastreams", json=spec_body("orders", source_dir), headers=AUTH)
    controller.tick()
    return secured_api


MUTATIONS = [
    ("POST", "/datastreams"),
    ("POST", "/datastreams/orders/pause"),
    ("POST", "/datastreams/orders/stop"),
    ("DELETE", "/datastreams/orders"),
    ("PUT", "/datastreams/orders"),
    ("PATCH", "/datastreams/orders"),
]


@pytest.mark.parametrize(("method", "path"), MUTATIONS)
@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic czNjcmV0LXRva2Vu"}],
    ids=["missing", "wrong-token", "wrong-scheme"],
)
def test_a_mutating_call_without_the_bearer_token_is_401_and_changes_nothing(
    secured_ready: TestClient,
    catalog: Catalog,
    source_dir: Path,
    method: str,
    path: str,
    headers: dict[str, str],
) -> None:
    before = store_snapshot(catalog.store)

    r = secured_ready.request(method, path, json=spec_body("payments", source_dir), headers=headers)

    assert r.status_code == 401
    assert r.headers["www-authenticate"] == "Bearer"
    assert r.json()["error"] == "UnauthorizedError"
    assert "s3cret" not in r.text
    assert store_snapshot(catalog.store) == before


def test_reads_stay_open_and_the_token_allows_mutations(
    secured_ready: TestClient, clock: ManualClock
) -> None:
    assert secured_ready.get("/datastreams/orders").status_code == 200
    assert secured_ready.get("/datastreams").status_code == 200
    assert secured_ready.get("/health").status_code == 200

    r = secured_ready.post("/datastreams/orders/pause", headers=AUTH)

    assert r.status_code == 200
    assert r.json()["state"] == "PAUSED"
