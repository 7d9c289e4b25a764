"""A ``millstream run`` that publishes its tables' Iceberg views by a publisher process of its
own leaves the views to that publisher in its maintenance: it does not publish them itself,
in full and in the driver, every maintenance interval, racing its own publisher (which drops
the expired snapshots at its next publish)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.publish_support import commit_ids
from millstream.catalog import Catalog
from millstream.datastream import DatastreamSpec
from millstream.spark.runner import DatastreamRunner
from millstream.table import iceberg
from millstream.table.iceberg import current_location, publish


def test_a_publishing_runs_maintenance_does_not_publish_its_views_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = DatastreamSpec.parse(
        {
            "name": "orders",
            "source": {"kind": "files", "path": str(tmp_path / "in")},
            "schema": {"id": "long"},
        }
    )
    with Catalog.open(home=tmp_path / "home") as cat:
        runner = DatastreamRunner(spec, cat, None, publish_interval=3600.0)
        table = cat.create_table(runner.table_spec).name
        commit_ids(cat, table, 0, 5)
        publish(cat.store, cat.deep, table)  # the view exists: maintenance collects it
        where = current_location(cat.deep, cat.store, table)
        runner._start_publishing()
        assert runner.publishing is not None and runner.publisher is not None
        runner.publishing.stop()
        runner.publisher.close()

        published: list[str] = []
        real = iceberg.publish

        def counted(store: Any, deep: Any, name: str, **kw: Any) -> Any:
            published.append(name)
            return real(store, deep, name, **kw)

        monkeypatch.setattr(iceberg, "publish", counted)
        runner.maintainer.maintain([table])
        assert published == [], "the run's own publisher publishes its views"
        assert current_location(cat.deep, cat.store, table) == where
        assert runner.maintainer.view_gc_status() is not None  # the view's GC still ran
