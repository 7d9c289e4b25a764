"""A metadata store that does not answer: the REST API says so with a 503 naming the store's
outage (not a 500 with a traceback), changes nothing, and answers again once the store is
back; a process opening the store while it is down is told the store is unreachable (not that
its schema could not be migrated); the controller's loop goes on. Real PostgreSQL behind a
TCP proxy that resets every connection."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.api_support import TestClient, spec_body
from harness.chaos.proxy import TcpProxy
from harness.servers import PostgresServer
from millstream.api import create_app
from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.control.controller import Controller, ControlSettings
from millstream.control.registry import Registry
from millstream.core.lifecycle import State
from millstream.datastream import DatastreamSpec
from millstream.errors import MetadataStoreUnavailableError

pytestmark = pytest.mark.postgres


def wait_until(probe: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture
def proxied(postgres_server: PostgresServer, tmp_path: Path) -> Iterator[tuple[str, TcpProxy]]:
    """A fresh database, its URL through a proxy, and the proxy."""
    name = f"outage_{uuid.uuid4().hex[:10]}"
    direct = postgres_server.create_database(name)
    with TcpProxy(postgres_server.port, name="postgres") as proxy:
        port = f":{postgres_server.port}/"
        yield direct.replace(port, f":{proxy.port}/"), proxy


@pytest.fixture
def outage_api(
    proxied: tuple[str, TcpProxy], tmp_path: Path
) -> Iterator[tuple[TestClient, Controller, Catalog]]:
    url, _ = proxied
    clock = ManualClock()
    with Catalog.open(home=tmp_path / "home", metadata_url=url) as cat:
        controller = Controller(
            cat,
            controller_id="controller-1",
            settings=ControlSettings(lease_ttl=10.0, worker_ttl=5.0, tick_seconds=1.0),
            clock=clock,
        )
        with TestClient(create_app(cat, controller=controller, clock=clock)) as client:
            yield client, controller, cat


def test_a_request_while_the_store_is_down_gets_503_naming_the_outage_and_changes_nothing(
    outage_api: tuple[TestClient, Controller, Catalog],
    proxied: tuple[str, TcpProxy],
    postgres_server: PostgresServer,
    tmp_path: Path,
) -> None:
    api, controller, cat = outage_api
    _, proxy = proxied
    source = tmp_path / "source"
    source.mkdir()
    assert api.post("/datastreams", json=spec_body("orders", source)).status_code == 201
    controller.tick()
    assert api.get("/datastreams/orders").json()["state"] == "READY"

    proxy.down(600)  # every live connection reset, every new one refused
    r = api.post("/datastreams/orders/pause")

    assert r.status_code == 503, r.text
    body: dict[str, Any] = r.json()
    assert body["error"] == "MetadataStoreUnavailableError"
    assert "metadata store did not answer" in body["message"]

    proxy.resume()
    # Nothing changed: still READY, read through a connection of its own.
    rec = Registry(cat.store).find("orders")
    assert rec is not None and rec.state is State.READY
    # And the API answers again (the pool replaces the connections the outage broke).
    r = api.post("/datastreams/orders/pause")
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "PAUSED"


def test_opening_a_store_that_is_down_says_it_is_unreachable(
    proxied: tuple[str, TcpProxy], tmp_path: Path
) -> None:
    url, proxy = proxied
    proxy.down(600)

    with (
        pytest.raises(MetadataStoreUnavailableError, match="could not reach the metadata store"),
        Catalog.open(home=tmp_path / "home", metadata_url=url),
    ):
        pass


def test_the_controller_loop_outlives_a_store_outage_and_goes_on_once_it_is_back(
    proxied: tuple[str, TcpProxy], tmp_path: Path
) -> None:
    """The controller's loop, as ``millstream controller`` runs it: ticks the store fails
    are retried, not the end of the process; a datastream created once the store is back
    becomes READY."""
    url, proxy = proxied
    with Catalog.open(home=tmp_path / "home", metadata_url=url) as cat:
        ctl = Controller(
            cat,
            controller_id="controller-1",
            settings=ControlSettings(lease_ttl=10.0, worker_ttl=5.0, tick_seconds=0.1),
        )
        loop = threading.Thread(target=ctl.run_forever, name="controller", daemon=True)
        loop.start()
        try:
            refused = proxy.refused
            proxy.down(600)
            # Several ticks meet the outage (each one's new connection is refused).
            wait_until(lambda: proxy.refused >= refused + 5 or not loop.is_alive(), 30)
            assert loop.is_alive(), "the controller's loop ended on a store outage"
            assert proxy.refused >= refused + 5, "no tick met the outage"
            proxy.resume()

            source = tmp_path / "source"
            source.mkdir()
            Registry(cat.store).create(DatastreamSpec.parse(spec_body("orders", source)))

            def ready() -> bool:
                rec = Registry(cat.store).find("orders")
                return rec is not None and rec.state is State.READY

            assert wait_until(ready, 30), "the controller did not tick again after the outage"
        finally:
            ctl.stop()
            loop.join(10)
