"""The worker's Iceberg publisher (``ControlSettings.iceberg_publish_interval``): on the
maintenance thread, each written table's view is published every interval; a failing table is
supervised (counted, shown, retried with backoff) and never stops another's publishing."""

from __future__ import annotations

import time
from pathlib import Path

from harness.iceberg_readers import pyiceberg_rows
from harness.publish_support import commit_keys
from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.reference.model import canonical
from millstream.sealing.maintenance import Maintainer
from millstream.table.iceberg import current_location


def test_each_written_table_is_published_every_interval_and_a_failing_one_is_supervised(
    tmp_path: Path,
) -> None:
    clock = ManualClock(time.time())
    with Catalog.open(home=tmp_path) as cat:
        cat.create_table(
            {
                "name": "kv",
                "schema": {"k": "long", "v": "string"},
                "mode": "upsert",
                "primary_key": ["k"],
            }
        )
        commit_keys(cat, "kv", [1, 2, 1], 0)
        maintainer = Maintainer(cat, clock=clock, publish_interval=30.0)
        tables = {"orders": ["kv"], "broken": ["no_such_table"]}

        def view() -> list[object]:
            where = current_location(cat.deep, cat.store, "kv")
            assert where is not None
            return pyiceberg_rows(where)

        maintainer.run_due(tables)
        assert view() == canonical(cat.read_table("kv").to_pylist())
        assert maintainer.status()["kv"]["iceberg"]["manifest_version"] == 1
        commit_keys(cat, "kv", [2, 3], 3)
        clock.advance(10)
        maintainer.run_due(tables)  # not due yet: the view still shows version 1
        assert maintainer.status()["kv"]["iceberg"]["manifest_version"] == 1
        clock.advance(25)
        maintainer.run_due(tables)
        assert maintainer.status()["kv"]["iceberg"]["manifest_version"] == 2
        assert view() == canonical(cat.read_table("kv").to_pylist())
        statuses = {s.table: s for s in maintainer.loop_statuses(alive=True)}
        assert statuses["kv"].loop == "publisher" and statuses["kv"].errors == 0
        broken = statuses["no_such_table"]
        assert broken.loop == "publisher" and broken.errors >= 1
        assert broken.last_error is not None and "no_such_table" in broken.last_error
