"""A table's Iceberg view lists at most ``table.retention.iceberg_snapshots`` snapshots.

Every publish rewrites the view's whole metadata (and a long-lived publisher keeps a copy), so a
view that listed a snapshot per publish for the whole retention window (a day: 5,760 at the 15 s
interval) grew the publisher's memory and every metadata file it wrote for a day. The bound
shortens only the view's list: the newest snapshots stay readable by DuckDB and pyiceberg, and a
reader holding an earlier publish's metadata location still reads it after maintenance, since
its version is still kept."""

from __future__ import annotations

import time
from pathlib import Path

from harness.iceberg_readers import duckdb_connection, duckdb_rows, pyiceberg_rows
from harness.publish_support import commit_keys, create_kv_table
from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.reference.model import canonical
from millstream.sealing.maintenance import Publisher
from millstream.table.iceberg import current_location, load_metadata, location, publish
from millstream.table.maintain import maintain

KEPT = 3


def _create(cat: Catalog) -> None:
    create_kv_table(cat, "kv", iceberg_snapshots=KEPT)


def _snapshot_ids(cat: Catalog) -> list[int]:
    pointer = cat.store.read_pointer("kv")
    assert pointer is not None
    return sorted(
        s.snapshot_id for s in load_metadata(cat.deep, pointer.metadata_location).snapshots
    )


def test_a_publisher_lists_the_newest_snapshots_only_and_every_listed_one_reads(
    tmp_path: Path,
) -> None:
    clock = ManualClock(time.time())
    with Catalog.open(home=tmp_path) as cat:
        cat.store.clock = clock
        _create(cat)
        publisher = Publisher(cat, interval=15.0, clock=clock)
        published: dict[int, str] = {}
        for i in range(8):
            commit_keys(cat, "kv", [i % 3, 10 + i], 2 * i)
            clock.advance(20)
            publisher.run_due({"kv": ["kv"]})
            pointer = cat.store.read_pointer("kv")
            assert pointer is not None
            published[pointer.manifest_version] = location(cat.deep, pointer.metadata_location)
            assert len(_snapshot_ids(cat)) == min(i + 1, KEPT)
        assert _snapshot_ids(cat) == [6, 7, 8]
        where = current_location(cat.deep, cat.store, "kv")
        assert where is not None
        con = duckdb_connection(cat)
        for version in (6, 7, 8):
            expected = canonical(cat.read_table("kv", as_of=version).to_pylist())
            assert pyiceberg_rows(where, version) == expected
            assert duckdb_rows(con, where, version) == expected
        # Maintenance keeps what a reader of an earlier publish's metadata still needs: every
        # version is kept (24 h), so the first publish's metadata file still reads.
        clock.advance(60)
        maintain(cat.store, cat.deep, "kv", grace_seconds=0, clock=clock)
        assert pyiceberg_rows(published[1]) == canonical(cat.read_table("kv", as_of=1).to_pylist())
        assert duckdb_rows(con, published[2]) == canonical(
            cat.read_table("kv", as_of=2).to_pylist()
        )


def test_a_publish_without_a_cache_keeps_the_same_bound(tmp_path: Path) -> None:
    with Catalog.open(home=tmp_path) as cat:
        _create(cat)
        for i in range(5):
            commit_keys(cat, "kv", [i], i)
            publish(cat.store, cat.deep, "kv")
        assert _snapshot_ids(cat) == [3, 4, 5]
        where = current_location(cat.deep, cat.store, "kv")
        assert where is not None
        assert pyiceberg_rows(where) == canonical(cat.read_table("kv").to_pylist())
