"""An operator accepts a loss the datastream stopped at (``SourceGapError``) by updating its
kafka source's ``on_data_loss`` to ``accept``: the one source field an update may change. The
new spec is stored (the writer started at the next resume reads with it); any other source
change is still refused naming the field."""

from __future__ import annotations

import pytest

from millstream.control.registry import Registry
from millstream.datastream import DatastreamSpec
from millstream.errors import IncompatibleChangeError


def _spec(**source: str) -> DatastreamSpec:
    return DatastreamSpec.parse(
        {
            "name": "orders",
            "source": {
                "kind": "kafka",
                "bootstrap_servers": "127.0.0.1:9092",
                "topic": "orders",
                **source,
            },
            "schema": {"id": "long"},
            "table": {"mode": "append"},
        }
    )


def test_an_update_may_accept_data_loss_and_nothing_else_of_the_source(registry: Registry) -> None:
    registry.create(_spec())

    rec, changes, _ = registry.update("orders", _spec(on_data_loss="accept"))

    assert changes == []
    assert rec.spec.source.on_data_loss == "accept"  # type: ignore[union-attr]
    assert registry.get("orders").spec.source.on_data_loss == "accept"  # type: ignore[union-attr]
    with pytest.raises(IncompatibleChangeError, match=r"source\.topic"):
        registry.update("orders", _spec(on_data_loss="accept", topic="other"))
