"""Incremental publishing: a publisher that keeps a :class:`PublishCache` builds each snapshot
on the one it published last, reusing the data manifests, data-file entries and delete files
of what did not change, and every snapshot still equals Millstream's read of its version, read
by pyiceberg and DuckDB, across updates that hit old files, seals, compactions and rollbacks
between publishes."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from pyiceberg.manifest import ManifestContent
from pyiceberg.table import StaticTable
from test_contract_iceberg_view import SCHEMA, History, millstream_rows, step, table_specs

from harness.iceberg_readers import duckdb_connection, duckdb_rows, pyiceberg_rows, s3_properties
from millstream.catalog import Catalog
from millstream.sealing.compaction import CompactionPolicy
from millstream.sealing.keyindex import IndexCache
from millstream.sealing.sealer import Sealer
from millstream.table.iceberg import PublishCache, location, publish


class Checker:
    def __init__(self, catalog: Catalog, name: str) -> None:
        self.catalog = catalog
        self.name = name
        local = not catalog.settings.deep_store.startswith("s3://")
        self.con = duckdb_connection() if local else None
        self.props = s3_properties(catalog)
        self.published: dict[int, str] = {}

    def check(self, version: int, metadata: str, snapshot: int | None = None) -> None:
        expected = millstream_rows(self.catalog, self.name, version)
        assert pyiceberg_rows(metadata, snapshot, self.props) == expected, (
            f"pyiceberg at version {version}"
        )
        if self.con is not None and snapshot is None:
            assert duckdb_rows(self.con, metadata) == expected, f"DuckDB at version {version}"

    def publish(self, cache: PublishCache) -> dict[str, int]:
        result = publish(self.catalog.store, self.catalog.deep, self.name, cache=cache)
        assert result.pointer is not None
        assert result.pointer.manifest_version == self.catalog.manifest(self.name).version
        metadata = location(self.catalog.deep, result.pointer.metadata_location)
        self.published[result.pointer.manifest_version] = metadata
        self.check(result.pointer.manifest_version, metadata)
        return result.stats

    def time_travel(self) -> None:
        newest = self.published[max(self.published)]
        for version, metadata in sorted(self.published.items()):
            self.check(version, newest, snapshot=version)
            self.check(version, metadata)


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(spec=table_specs(), steps=st.lists(step, min_size=2, max_size=14))
def test_every_incremental_snapshot_reads_as_millstreams_read_of_its_version(
    catalog: Catalog, spec: dict[str, Any], steps: list[tuple[Any, ...]]
) -> None:
    """Every mode, batches, seals, compactions and rollbacks between publishes of one cache:
    each publish after the first builds on the previous snapshot and equals the read."""
    info = catalog.create_table(spec)
    name = info.name
    note(f"spec: {spec}")
    history = History(catalog, info.spec)
    sealer = Sealer(
        catalog, name, compaction=CompactionPolicy(min_segments=2), index_cache=IndexCache()
    )
    checker = Checker(catalog, name)
    cache = PublishCache()
    for s in [*steps, ("publish",)]:
        note(f"step {s}")
        if history.apply(sealer, s) or not catalog.manifest(name).version:
            continue
        version = catalog.manifest(name).version
        had = max(checker.published, default=0)
        stats = checker.publish(cache)
        if had and version > had:
            assert stats["incremental"] == 1
    if checker.published:
        checker.time_travel()


def _layout(catalog: Catalog, metadata: str) -> tuple[set[str], set[str]]:
    """The current snapshot's delete files and manifests (paths)."""
    table = StaticTable.from_metadata(metadata, properties=s3_properties(catalog))
    snapshot = table.current_snapshot()
    assert snapshot is not None
    manifests = snapshot.manifests(table.io)
    deletes = {
        e.data_file.file_path
        for m in manifests
        if m.content == ManifestContent.DELETES
        for e in m.fetch_manifest_entry(table.io)
    }
    return deletes, {m.manifest_path for m in manifests}


def test_a_publish_reuses_the_delete_files_and_manifests_of_what_did_not_change(
    catalog: Catalog,
) -> None:
    """An upsert table partitioned by key, published after each change with one cache: an
    update of keys in one partition writes only that partition's new positions (every
    delete file is listed again, the same file); a seal, a compaction and a rollback each
    change only what they touch; every snapshot equals the read."""
    spec = {
        "name": "kv",
        "schema": SCHEMA,
        "mode": "upsert",
        "primary_key": ["k"],
        "partitioned_by_key": True,
    }
    history = History(catalog, catalog.create_table(spec).spec)
    sealer = Sealer(
        catalog, "kv", compaction=CompactionPolicy(min_segments=2), index_cache=IndexCache()
    )
    checker = Checker(catalog, "kv")
    cache = PublishCache()

    def rec(k: int, qty: int) -> tuple[Any, ...]:
        return (k, False, 0, qty, "x")

    # Keys 0, 2, 4 live in partition 0; 1, 3, 5 in partition 1 (k % 2).
    history.batch(0, [rec(0, 1), rec(2, 1), rec(0, 2), rec(1, 1), rec(3, 1), rec(1, 2)])
    first = checker.publish(cache)
    assert first["incremental"] == 0  # nothing to build on yet

    # Seal partition 1 (its rows leave the shared micro-batch file for a sealed segment),
    # then update one of its keys: the sealed file hides that key's old row.
    sealer.seal_partition(1, force=True)
    assert checker.publish(cache)["incremental"] == 1
    history.batch(1, [rec(1, 3), rec(5, 1)])
    assert checker.publish(cache)["incremental"] == 1
    deletes, manifests = _layout(catalog, checker.published[max(checker.published)])
    # An update of partition-0 keys only, one of them in the first (old) file.
    history.batch(0, [rec(4, 6), rec(2, 7)])
    again = checker.publish(cache)
    assert again["incremental"] == 1
    assert again["data_manifests_reused"] >= 1 and again["delete_files_written"] == 1
    deletes_after, manifests_after = _layout(catalog, checker.published[max(checker.published)])
    # Every delete file is listed again (the same files: partition 1's were not touched, and
    # partition 0's old file only hides one more row), beside one new file of partition 0
    # that holds only the new position.
    assert {d for d in deletes if d.endswith("-p1.parquet")}
    assert deletes <= deletes_after and again["delete_files_reused"] == len(deletes)
    (new,) = deletes_after - deletes
    assert new.endswith("-p0.parquet")
    assert manifests & manifests_after  # the unchanged files' data manifest, listed again

    # Seal partition 0 (the update hits its old rows), compact, roll back: each published.
    sealer.seal_partition(0, force=True)
    assert checker.publish(cache)["incremental"] == 1
    history.batch(0, [rec(0, 9), rec(2, 9)])
    sealer.seal_partition(0, force=True)
    sealer.compact_partition(0)
    assert checker.publish(cache)["incremental"] == 1
    seqs = sorted(e.seq for e in catalog.manifest("kv").entries if e.partition == 0)
    catalog.store.rollback_partition("kv", 0, seqs[-1], dry_run=False)
    assert checker.publish(cache)["incremental"] == 1
    history.batch(1, [rec(1, 4), rec(3, 4)])
    assert checker.publish(cache)["incremental"] == 1
    checker.time_travel()


def test_a_cache_whose_snapshot_another_publisher_replaced_publishes_in_full(
    catalog: Catalog,
) -> None:
    """Two publishers (two caches) take turns: each finds the pointer moved by the other and
    reads the version in full; both keep the view equal to the read."""
    history = History(
        catalog,
        catalog.create_table(
            {"name": "kv", "schema": SCHEMA, "mode": "upsert", "primary_key": ["k"]}
        ).spec,
    )
    checker = Checker(catalog, "kv")
    a, b = PublishCache(), PublishCache()
    history.batch(0, [(1, False, 0, 1, "a"), (2, False, 0, 1, "a")])
    assert checker.publish(a)["incremental"] == 0
    history.batch(0, [(1, False, 0, 2, "b")])
    assert checker.publish(b)["incremental"] == 0
    history.batch(0, [(2, True, 0, None, None)])
    assert checker.publish(a)["incremental"] == 0
    history.batch(0, [(3, False, 0, 3, "c")])
    assert checker.publish(a)["incremental"] == 1
    checker.time_travel()


def test_a_publisher_never_builds_on_a_snapshot_garbage_collection_removed(
    catalog: Catalog,
) -> None:
    """Publisher A publishes version 1 (its delete file hides key 1's old row); publisher B
    publishes versions 2-4; retention expires 1 and 2 and GC removes their files. A's next
    publish finds the pointer moved and reads the version in full: its snapshot references
    only files that exist and reads as Millstream's read."""
    import time

    from millstream.clock import ManualClock
    from millstream.table.iceberg import DeepStoreIO, load_metadata, relative
    from millstream.table.maintain import maintain

    clock = ManualClock(time.time())
    catalog.store.clock = clock
    spec = {
        "name": "kv",
        "schema": SCHEMA,
        "mode": "upsert",
        "primary_key": ["k"],
        "retention": {"time": "1s", "min_versions": 2},
    }
    history = History(catalog, catalog.create_table(spec).spec)
    checker = Checker(catalog, "kv")
    a = PublishCache()
    history.batch(0, [(1, False, 0, 1, "a"), (1, False, 0, 2, "b")])
    assert checker.publish(a)["incremental"] == 0
    for k in (10, 11, 12):
        history.batch(0, [(k, False, 0, k, "c")])
        clock.advance(10)
        checker.publish(PublishCache())
    clock.advance(3600)
    maintain(catalog.store, catalog.deep, "kv", grace_seconds=0, clock=clock)
    assert catalog.store.oldest_kept_version("kv") == 3
    history.batch(0, [(13, False, 0, 13, "d")])
    stats = checker.publish(a)  # equals the read (checked inside)
    assert stats["incremental"] == 0
    metadata = checker.published[max(checker.published)]
    rel = relative(catalog.deep, metadata)
    assert rel is not None
    io = DeepStoreIO(catalog.deep)
    snap = load_metadata(catalog.deep, rel).current_snapshot()
    assert snap is not None
    for m in snap.manifests(io):
        for e in m.fetch_manifest_entry(io):
            path = relative(catalog.deep, e.data_file.file_path)
            assert path is not None and catalog.deep.exists(path), path


def _delete_rows(catalog: Catalog, metadata: str) -> dict[str, int]:
    """The current snapshot's delete files (paths) and the positions each holds."""
    table = StaticTable.from_metadata(metadata, properties=s3_properties(catalog))
    snapshot = table.current_snapshot()
    assert snapshot is not None
    return {
        e.data_file.file_path: e.data_file.record_count
        for m in snapshot.manifests(table.io)
        if m.content == ManifestContent.DELETES
        for e in m.fetch_manifest_entry(table.io)
    }


# The delete-file layout does not depend on where the files live (every test above reads its
# snapshots from S3 too); on S3 this test took a minute per metadata store.
@pytest.mark.parametrize(
    "backend",
    [
        pytest.param(("sqlite", "local"), id="sqlite-local"),
        pytest.param(("postgres", "local"), id="postgres-local", marks=pytest.mark.postgres),
    ],
    indirect=True,
)
def test_an_update_writes_only_its_new_positions_beside_the_old_delete_files(
    catalog: Catalog,
) -> None:
    """Unsealed upserts of a few keys at a time over one big file: each publish keeps every
    delete file it published (a data file that only hides more rows keeps them) and writes one
    new delete file holding only the positions the update hid; past the limit per partition
    the smaller delete files are merged into the new one, their positions kept; and a
    rollback, which shows rows again, writes the affected files' positions anew. Every
    snapshot equals the read."""
    from millstream.table.iceberg import MAX_DELETE_FILES_PER_PARTITION

    history = History(
        catalog,
        catalog.create_table(
            {"name": "kv", "schema": SCHEMA, "mode": "upsert", "primary_key": ["k"]}
        ).spec,
    )
    checker = Checker(catalog, "kv")
    cache = PublishCache()
    history.batch(0, [(k, False, 0, 0, "a") for k in range(200)])
    assert checker.publish(cache)["incremental"] == 0
    before: dict[str, int] = {}
    merged = False
    for i in range(1, 2 * MAX_DELETE_FILES_PER_PARTITION + 2):
        # Three keys never updated before (their rows in the first file get hidden) and key 0
        # again (its row in the first file, then in the last update's file, gets hidden):
        # four new positions each time.
        keys = [0, 3 * i, 3 * i + 1, 3 * i + 2]
        history.batch(0, [(k, False, 0, i, "b") for k in keys])
        stats = checker.publish(cache)  # equals the read (checked inside)
        assert stats["incremental"] == 1 and stats["delete_files_written"] == 1
        after = _delete_rows(catalog, checker.published[max(checker.published)])
        assert len(after) <= MAX_DELETE_FILES_PER_PARTITION
        new = {p: n for p, n in after.items() if p not in before}
        assert len(new) == 1
        if set(before) <= set(after):
            assert sum(new.values()) == 4  # only the new positions
        else:  # the smaller ones were merged into the new file, their positions kept
            merged = True
            gone = set(before) - set(after)
            assert sum(new.values()) == sum(before[p] for p in gone) + 4
        before = after
    assert merged
    seqs = sorted(e.seq for e in catalog.manifest("kv").entries)
    catalog.store.rollback_partition("kv", 0, seqs[-3], dry_run=False)  # shows rows again
    assert checker.publish(cache)["incremental"] == 1
    history.batch(0, [(1, False, 0, 99, "c")])
    assert checker.publish(cache)["incremental"] == 1
    checker.time_travel()


def test_a_rollback_that_shows_a_hidden_row_again_writes_that_files_positions_anew(
    catalog: Catalog,
) -> None:
    """A file whose hidden row shows again drops its old delete files. An update of key 2
    (partition 0) shares its micro-batch file with a row of partition 1, so rolling back
    partition 0's segment leaves that file in the view: the first file's delete file then
    covers only files that remain, but its position of key 2 must go (key 2's old row is
    Millstream's read again)."""
    spec = {
        "name": "kv",
        "schema": SCHEMA,
        "mode": "upsert",
        "primary_key": ["k"],
        "partitioned_by_key": True,
    }
    history = History(catalog, catalog.create_table(spec).spec)
    checker = Checker(catalog, "kv")
    cache = PublishCache()
    history.batch(0, [(0, False, 0, 1, "a"), (2, False, 0, 1, "a"), (4, False, 0, 1, "a")])
    assert checker.publish(cache)["incremental"] == 0
    history.batch(0, [(2, False, 0, 2, "b"), (1, False, 0, 2, "b")])  # one file, both partitions
    assert checker.publish(cache)["incremental"] == 1
    newest = max(e.seq for e in catalog.manifest("kv").entries if e.partition == 0)
    catalog.store.rollback_partition("kv", 0, newest, dry_run=False)
    assert checker.publish(cache)["incremental"] == 1  # equals the read: key 2 at qty 1
    checker.time_travel()
