"""The view's garbage collection through a long-lived :class:`ViewReferences` keeps exactly
what a collection that reads every file again keeps.

A maintainer keeps what the view's immutable files (earlier metadata files, manifest lists,
manifests) reference between two collections, so a table's second collection reads only what
was published since the first. What it decides with that (which earlier metadata files count,
which snapshots are retained) is decided again at every collection: across publishes, seals, a
compaction and expiry, each collection with the references warm keeps the same files as a
cold one, deletes every other view file, and every retained snapshot still reads in DuckDB
and pyiceberg as Millstream's read of its version."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from harness.iceberg_readers import duckdb_connection, duckdb_rows, pyiceberg_rows, s3_properties
from harness.publish_support import commit_rows
from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.reference.model import canonical
from millstream.sealing.compaction import CompactionPolicy
from millstream.sealing.keyindex import IndexCache
from millstream.sealing.sealer import Sealer
from millstream.storage.deepstore import DeepStore
from millstream.table.iceberg import (
    ENTRY_REFS,
    ViewReferences,
    load_metadata,
    location,
    publish,
    referenced_view_files,
    view_prefix,
)
from millstream.table.maintain import maintain

#: Snapshots the view lists: fewer than the versions kept, so earlier metadata files list
#: retained snapshots the current one no longer does.
LISTED = 2


def _create(cat: Catalog, min_versions: int) -> None:
    cat.create_table(
        {
            "name": "kv",
            "schema": {"k": "long", "v": "string"},
            "mode": "upsert",
            "primary_key": ["k"],
            "retention": {
                "time": "1s",
                "min_versions": min_versions,
                "iceberg_snapshots": LISTED,
            },
        }
    )


def _view_files(cat: Catalog) -> set[str]:
    return {f.path for f in cat.deep.list_files(view_prefix("kv"))}


def _retained_snapshots(cat: Catalog) -> dict[int, str]:
    """Every retained snapshot the view's kept metadata files list, with a kept metadata file
    (relative) that lists it."""
    pointer = cat.store.read_pointer("kv")
    assert pointer is not None
    oldest = cat.store.oldest_kept_version("kv")
    kept = _view_files(cat)
    found: dict[int, str] = {}
    current = load_metadata(cat.deep, pointer.metadata_location)
    paths = [pointer.metadata_location] + [
        e.metadata_file.removeprefix(location(cat.deep, "")) for e in current.metadata_log
    ]
    for path in paths:
        if path not in kept:
            continue
        for s in load_metadata(cat.deep, path).snapshots:
            if s.snapshot_id >= oldest:
                found.setdefault(s.snapshot_id, path)
    return found


def _check(cat: Catalog, con: Any, props: dict[str, str]) -> int:
    """After a collection with no grace period: the view holds exactly what a cold collection
    references, and every retained snapshot reads as Millstream's read of its version.
    The snapshots read."""
    cold = referenced_view_files(cat.store, cat.deep, "kv")
    left = _view_files(cat)
    assert cold - left == set(), "a file a retained snapshot needs was deleted"
    assert left - cold == set(), "an unreferenced view file was left"
    oldest = cat.store.oldest_kept_version("kv")
    expired = sorted(
        p for p in left if "/snap-" in p and int(p.rsplit("/snap-", 1)[1][:12]) < oldest
    )
    assert not expired, f"the manifest lists of expired snapshots were left: {expired}"
    snapshots = _retained_snapshots(cat)
    for version, path in sorted(snapshots.items()):
        expected = canonical(cat.read_table("kv", as_of=version).to_pylist())
        where = location(cat.deep, path)
        assert pyiceberg_rows(where, version, props) == expected, version
        assert duckdb_rows(con, where, version) == expected, version
    return len(snapshots)


def test_collections_with_the_references_warm_keep_what_a_cold_collection_keeps(
    catalog: Catalog,
) -> None:
    clock = ManualClock(time.time())
    catalog.store.clock = clock
    _create(catalog, min_versions=5)
    sealer = Sealer(
        catalog, "kv", compaction=CompactionPolicy(min_segments=2), index_cache=IndexCache()
    )
    warm = ViewReferences()
    con = duckdb_connection(catalog)
    props = s3_properties(catalog)
    lo = 0
    read = 0
    for round_ in range(5):
        for i in range(3):  # upserts over 4 keys: each publish hides superseded rows
            lo = commit_rows(catalog, "kv", [(i % 4, f"r{round_}"), (4 + round_, "n")], lo)
            clock.advance(10)
            publish(catalog.store, catalog.deep, "kv")
        if round_ in (1, 3):
            sealer.seal_partition(0, force=True)
            clock.advance(10)
            publish(catalog.store, catalog.deep, "kv")
        if round_ == 3:
            sealer.compact_partition(0)
            clock.advance(10)
            publish(catalog.store, catalog.deep, "kv")
        # What the warm references answer is what reading every file again answers.
        assert referenced_view_files(
            catalog.store, catalog.deep, "kv", warm
        ) == referenced_view_files(catalog.store, catalog.deep, "kv")
        clock.advance(60)
        before = _view_files(catalog)
        # Expiry (5 versions kept), the publish that drops the expired snapshots, then the
        # view's collection through the warm references.
        report = maintain(
            catalog.store, catalog.deep, "kv", grace_seconds=0, clock=clock, view_references=warm
        )
        removed = {p for p in report.files_removed if p.startswith(view_prefix("kv"))}
        assert removed <= before
        if round_:  # from the second round on, versions expire and their files go
            assert report.expiry.versions > 0 and removed
        read += _check(catalog, con, props)
    assert warm.hits > warm.misses, "the later collections found the earlier files kept"
    assert read >= 5 * LISTED


def test_a_copy_of_the_deep_store_does_not_answer_for_the_original(tmp_path: Path) -> None:
    """The same relative paths in a copy of the deep store (a backup restored elsewhere) name
    files whose references point into the original (outside the copy): what the copy's files
    answer, looked up in the same references, is kept apart from the original's, whose
    collection keeps what a cold one keeps."""
    clock = ManualClock(time.time())
    with Catalog.open(home=tmp_path / "home") as cat:
        cat.store.clock = clock
        _create(cat, min_versions=50)
        lo = 0
        for i in range(5):
            lo = commit_rows(cat, "kv", [(i % 2, f"v{i}"), (9, "x")], lo)
            clock.advance(10)
            publish(cat.store, cat.deep, "kv")
        copy = DeepStore.from_uri(str(tmp_path / "copy"))
        shutil.copytree(cat.deep.root, copy.root, dirs_exist_ok=True)
        pointer = cat.store.read_pointer("kv")
        assert pointer is not None
        base = location(cat.deep, "")
        earlier = [
            e.metadata_file.removeprefix(base)
            for e in load_metadata(cat.deep, pointer.metadata_location).metadata_log
        ]
        references = ViewReferences()
        for path in earlier:  # in the copy, every manifest list lies outside it
            assert set(references.snapshots(copy, path).lists) == {None}
        cold = referenced_view_files(cat.store, cat.deep, "kv")
        assert referenced_view_files(cat.store, cat.deep, "kv", references) == cold
        clock.advance(60)
        maintain(
            cat.store, cat.deep, "kv", grace_seconds=0, clock=clock, view_references=references
        )
        assert _view_files(cat) == cold
        con = duckdb_connection(cat)
        snapshots = _retained_snapshots(cat)
        assert len(snapshots) == 5
        for version, path in sorted(snapshots.items()):
            expected = canonical(cat.read_table("kv", as_of=version).to_pylist())
            assert duckdb_rows(con, location(cat.deep, path), version) == expected


def test_a_hundred_tables_stay_warm_across_passes_and_keep_what_a_cold_pass_keeps(
    tmp_path: Path,
) -> None:
    """One maintainer's references over 100 tables, each view's metadata log listing its
    snapshots again in every earlier file: at the default bound nothing is evicted, a pass
    after one more publish of every table reads only the files published since (one earlier
    metadata file a table), and every pass keeps and deletes what a cold one does."""
    clock = ManualClock(time.time())
    with Catalog.open(home=tmp_path / "home") as cat:
        cat.store.clock = clock
        names = [f"t{i:03d}" for i in range(100)]
        for n in names:
            cat.create_table(
                {
                    "name": n,
                    "schema": {"k": "long", "v": "string"},
                    "mode": "upsert",
                    "primary_key": ["k"],
                    "retention": {"time": "1s", "min_versions": 6, "iceberg_snapshots": 4},
                }
            )
        los = dict.fromkeys(names, 0)

        def publish_every_table() -> None:
            for n in names:
                los[n] = commit_rows(cat, n, [(los[n] % 3, f"v{los[n]}"), (9, "x")], los[n])
                clock.advance(1)
                publish(cat.store, cat.deep, n)

        for _ in range(4):
            publish_every_table()
        references = ViewReferences()
        for pass_ in range(3):
            if pass_:
                publish_every_table()
            clock.advance(60)
            read = dict(references.read)
            for n in names:  # expiry, its publish, then the collection through the references
                maintain(
                    cat.store,
                    cat.deep,
                    n,
                    grace_seconds=0,
                    clock=clock,
                    view_references=references,
                )
                assert _view_files_of(cat, n) == referenced_view_files(cat.store, cat.deep, n), n
            assert references.evicted == 0
            if pass_:  # warm: of each table the metadata file its pointer named the pass before
                assert references.read["metadata"] - read["metadata"] == len(names)


def _view_files_of(cat: Catalog, table: str) -> set[str]:
    return {f.path for f in cat.deep.list_files(view_prefix(table))}


def test_metadata_files_listing_the_same_ids_with_other_manifest_lists_keep_their_own(
    tmp_path: Path,
) -> None:
    """The references hold a view's snapshots once, each earlier metadata file the stretch of
    them it lists, but only where its list is exactly that stretch: after the metadata store
    is restored from a backup, versions are published again, and a later metadata file lists
    the ids an earlier one listed with other manifest lists, which it must be answered with
    (else the new manifest lists go to garbage collection)."""
    deep = DeepStore.from_uri(str(tmp_path / "deep"))
    meta = "tables/kv/iceberg/metadata"

    def write(name: str, snapshots: list[tuple[int, str]]) -> str:
        path = f"{meta}/{name}.metadata.json"
        listed = [
            {"snapshot-id": i, "manifest-list": location(deep, f"{meta}/snap-{i}-{tag}.avro")}
            for i, tag in snapshots
        ]
        target = Path(deep.root) / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps({"format-version": 2, "snapshots": listed}))
        return path

    first = write("01", [(1, "a"), (2, "a"), (3, "a")])
    second = write("02", [(2, "a"), (3, "a"), (4, "a")])
    again = write("03", [(2, "b"), (3, "b"), (4, "b")])
    references = ViewReferences()
    assert list(references.snapshots(deep, first)) == [
        (i, f"{meta}/snap-{i}-a.avro") for i in (1, 2, 3)
    ]
    before = references.refs
    assert list(references.snapshots(deep, second)) == [
        (i, f"{meta}/snap-{i}-a.avro") for i in (2, 3, 4)
    ]
    # held once: the second file adds its one new snapshot (and its own entry), not three
    assert references.refs - before == ENTRY_REFS + 1
    assert list(references.snapshots(deep, again)) == [
        (i, f"{meta}/snap-{i}-b.avro") for i in (2, 3, 4)
    ]
    assert next(iter(references.snapshots(deep, second))) == (2, f"{meta}/snap-2-a.avro")
