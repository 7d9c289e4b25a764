"""A datastream stored by a version that still had ``segments.pauseless: false`` keeps loading:
the store's every read of the datastreams (the controller's tick, ``GET /datastreams``) would
otherwise fail on it, while a spec a user sends with the field is still refused naming it."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import update

from harness.api_support import spec_body
from millstream.catalog import Catalog
from millstream.control.registry import Registry
from millstream.datastream import DatastreamSpec
from millstream.errors import InvalidSpecError
from millstream.metastore import schema as s


def test_a_spec_stored_with_pauseless_false_loads_and_a_new_one_is_refused(
    tmp_path: Path,
) -> None:
    body = spec_body("orders", tmp_path / "source")
    with Catalog.open(home=tmp_path / "home") as cat:
        registry = Registry(cat.store)
        registry.create(DatastreamSpec.parse(body))
        stored = registry.get("orders").spec.model_dump(mode="json", by_alias=True)
        assert stored["segments"]["pauseless"] is True
        stored["segments"]["pauseless"] = False  # as an older version stored it
        with cat.store.engine.begin() as conn:
            conn.execute(
                update(s.datastreams).where(s.datastreams.c.name == "orders").values(spec=stored)
            )

        record = registry.get("orders")
        assert record.spec.segments.pauseless is True
        assert [r.name for r in registry.list()] == ["orders"]

    old = {**body, "segments": {"pauseless": False}}
    with pytest.raises(InvalidSpecError) as refused:
        DatastreamSpec.parse(old)
    assert refused.value.field == "segments.pauseless"
