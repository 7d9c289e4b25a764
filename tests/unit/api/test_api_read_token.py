"""The optional read token: with ``read_token`` set, a read without a valid token is 401
(naming what it needs) and shows nothing; the read token reads but never writes; the API
token does both; ``/health``, the console's pages and the API description stay open."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.api_support import AUTH, TOKEN, TestClient, spec_body, store_snapshot
from millstream.api import create_app
from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.control.controller import Controller

READ_TOKEN = "r3ad-only"
READ = {"Authorization": f"Bearer {READ_TOKEN}"}

READS = [
    "/datastreams",
    "/datastreams/orders",
    "/tables/orders/segments",
    "/settings",
    "/tables/orders/consumingSegmentsInfo",
    "/tables/orders/debugInfo",
    "/workers",
    "/metrics",
]


def _client(
    catalog: Catalog,
    controller: Controller,
    clock: ManualClock,
    source_dir: Path,
    *,
    api_token: str | None,
) -> Iterator[TestClient]:
    app = create_app(
        catalog, controller=controller, clock=clock, api_token=api_token, read_token=READ_TOKEN
    )
    with TestClient(app) as client:
        token = AUTH if api_token else READ
        assert client.post("/datastreams", json=spec_body("orders", source_dir), headers=token)
        controller.tick()
        yield client


@pytest.fixture
def both_tokens(
    catalog: Catalog, controller: Controller, clock: ManualClock, source_dir: Path
) -> Iterator[TestClient]:
    yield from _client(catalog, controller, clock, source_dir, api_token=TOKEN)


@pytest.fixture
def read_token_only(
    catalog: Catalog, controller: Controller, clock: ManualClock, source_dir: Path
) -> Iterator[TestClient]:
    yield from _client(catalog, controller, clock, source_dir, api_token=None)


@pytest.mark.parametrize("path", READS)
@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic cjNhZC1vbmx5"}],
    ids=["missing", "wrong-token", "wrong-scheme"],
)
def test_a_read_without_a_valid_token_is_401_and_shows_nothing(
    both_tokens: TestClient, path: str, headers: dict[str, str]
) -> None:
    r = both_tokens.get(path, headers=headers)

    assert r.status_code == 401
    assert r.headers["www-authenticate"] == "Bearer"
    assert r.json()["error"] == "UnauthorizedError"
    assert "orders" not in r.text.replace(path, "")
    if not headers:
        assert "read token" in r.json()["message"]


@pytest.mark.parametrize("path", READS)
@pytest.mark.parametrize("headers", [READ, AUTH], ids=["read-token", "api-token"])
def test_the_read_token_and_the_api_token_both_read(
    both_tokens: TestClient, path: str, headers: dict[str, str]
) -> None:
    assert both_tokens.get(path, headers=headers).status_code == 200


def test_the_read_token_never_writes(both_tokens: TestClient, catalog: Catalog) -> None:
    before = store_snapshot(catalog.store)

    r = both_tokens.post("/datastreams/orders/pause", headers=READ)

    assert r.status_code == 401
    assert store_snapshot(catalog.store) == before
    assert both_tokens.post("/datastreams/orders/pause", headers=AUTH).json()["state"] == "PAUSED"


@pytest.mark.parametrize("path", ["/health", "/openapi.json", "/docs", "/ui/", "/"])
def test_health_the_console_pages_and_the_api_description_stay_open(
    both_tokens: TestClient, path: str
) -> None:
    assert both_tokens.get(path).status_code == 200


def test_the_api_description_says_which_reads_need_the_token(both_tokens: TestClient) -> None:
    paths = both_tokens.get("/openapi.json").json()["paths"]

    assert paths["/datastreams"]["get"]["security"] == [{"bearer": []}]
    assert "security" not in paths["/health"]["get"]


def test_with_only_a_read_token_a_write_needs_it_too(
    read_token_only: TestClient, catalog: Catalog
) -> None:
    before = store_snapshot(catalog.store)

    assert read_token_only.post("/datastreams/orders/pause").status_code == 401
    assert store_snapshot(catalog.store) == before
    r = read_token_only.post("/datastreams/orders/pause", headers=READ)
    assert r.json()["state"] == "PAUSED"
