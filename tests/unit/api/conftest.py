"""Fixtures of the REST API tests: a SQLite catalog in a tmp dir whose store uses the same
ManualClock as the controller and the app, a controller driven by tick(), and TestClients."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.api_support import TOKEN, TestClient
from millstream.api import create_app
from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.config import Settings
from millstream.control.controller import Controller, ControlSettings
from millstream.metastore.store import MetadataStore
from millstream.storage.deepstore import DeepStore

CONTROL = ControlSettings(lease_ttl=10.0, worker_ttl=5.0, tick_seconds=1.0)


@pytest.fixture
def running() -> Iterator[threading.Event]:
    """Set at the end of the test: stand-in writer threads run until then."""
    done = threading.Event()
    yield done
    done.set()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def catalog(tmp_path: Path, clock: ManualClock) -> Iterator[Catalog]:
    settings = Settings.load(home=tmp_path / "home")
    store = MetadataStore(settings.metadata_url, clock=clock)
    with Catalog(settings, store, DeepStore.from_uri(settings.deep_store)) as cat:
        yield cat


@pytest.fixture
def controller(catalog: Catalog, clock: ManualClock) -> Controller:
    return Controller(catalog, controller_id="controller-1", settings=CONTROL, clock=clock)


@pytest.fixture
def source_dir(tmp_path: Path) -> Path:
    d = tmp_path / "source"
    d.mkdir()
    return d


@pytest.fixture
def api(catalog: Catalog, controller: Controller, clock: ManualClock) -> Iterator[TestClient]:
    app = create_app(catalog, controller=controller, clock=clock, upstream_timeout=10)
    with TestClient(app) as client:
        yield client


@pytest.fixture
def secured_api(
    catalog: Catalog, controller: Controller, clock: ManualClock
) -> Iterator[TestClient]:
    """The API started with a bearer token."""
    app = create_app(catalog, controller=controller, clock=clock, api_token=TOKEN)
    with TestClient(app) as client:
        yield client
