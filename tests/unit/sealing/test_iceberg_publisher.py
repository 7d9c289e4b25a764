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
from millstream.sealing.maintenance import Maintainer, Publisher
from millstream.sealing.sealer import Sealer
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


def test_a_publish_builds_on_the_final_seals_read_only_for_the_manifest_it_was_read_from(
    tmp_path: Path,
) -> None:
    """An ``--available-now`` run hands its final seal pass's read of the table to the publish
    after it (no second merge). A read of an older manifest is not used: the view shows the
    table as it is, as a reader of the Iceberg view sees it and Millstream reads it."""
    with Catalog.open(home=tmp_path) as cat:
        cat.create_table(
            {
                "name": "kv",
                "schema": {"k": "long", "v": "string"},
                "mode": "upsert",
                "primary_key": ["k"],
            }
        )
        commit_keys(cat, "kv", [1, 2, 3, 1], 0)
        sealer = Sealer(cat, "kv")
        sealer.seal_what_is_due(everything=True)
        older = sealer.final_read
        assert older is not None and older[0].version == cat.manifest("kv").version
        commit_keys(cat, "kv", [2, 4], 4)  # the table changes after that read
        sealer.seal_what_is_due(everything=True)
        current = sealer.final_read
        assert current is not None and current[0].version > older[0].version

        def view() -> list[object]:
            where = current_location(cat.deep, cat.store, "kv")
            assert where is not None
            return pyiceberg_rows(where)

        publisher = Publisher(cat, interval=60.0)
        publisher.cache.offer_read(cat.deep, *older)
        publisher.publish(["kv"])
        assert view() == canonical(cat.read_table("kv").to_pylist())
        assert publisher.cache.take_read(cat.deep, cat.manifest("kv")) is None  # used once

        commit_keys(cat, "kv", [3, 5], 6)
        sealer.seal_what_is_due(everything=True)
        assert sealer.final_read is not None
        again = Publisher(cat, interval=60.0)  # a fresh one: a full view, as a run's publish
        again.cache.offer_read(cat.deep, *sealer.final_read)
        again.publish(["kv"])
        assert again.cache.take_read(cat.deep, cat.manifest("kv")) is None  # it was taken
        assert view() == canonical(cat.read_table("kv").to_pylist())
