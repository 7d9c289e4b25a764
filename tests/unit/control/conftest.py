"""Fixtures of the control-plane unit tests: a catalog on SQLite in a tmp dir and a clock
the tests move by hand."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.control.registry import Registry
from millstream.datastream import DatastreamSpec


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def catalog(tmp_path: Path) -> Iterator[Catalog]:
    with Catalog.open(home=tmp_path / "home") as cat:
        yield cat


@pytest.fixture
def registry(catalog: Catalog, clock: ManualClock) -> Registry:
    return Registry(catalog.store, clock=clock)


@pytest.fixture
def make_spec(tmp_path: Path) -> Callable[..., DatastreamSpec]:
    """A valid datastream spec (files source) named ``name``."""

    def make(name: str, **extra: Any) -> DatastreamSpec:
        return DatastreamSpec.parse(
            {
                "name": name,
                "source": {"kind": "files", "path": str(tmp_path / "source" / name)},
                "schema": {"id": "long", "amount": "long"},
                "table": {"mode": "upsert", "primary_key": ["id"]},
                **extra,
            }
        )

    return make
