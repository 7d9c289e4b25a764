"""A long-lived publisher's cache follows its tables' live files: the merge columns of the
micro-batch files a seal (or a rollback) takes out of a table are dropped once a view without
them is published, so the publisher's memory stays flat over hours of batches and seals
instead of holding every file a table ever had (issue 38: the publisher process grew with
every batch of 100 busy tables). They are dropped only then: the next incremental publish
reads the files that left the table since the view it builds on, and a publish that failed
leaves that view in place."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.iceberg_readers import pyiceberg_rows
from harness.publish_support import (
    commit_rows,
    create_kv_table,
    roll_back_a_published_batch_and_fail_its_publish,
)
from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.reference.model import canonical
from millstream.sealing.keyindex import IndexCache
from millstream.sealing.maintenance import Publisher
from millstream.sealing.sealer import Sealer
from millstream.storage.deepstore import DeepStore
from millstream.table.iceberg import PublishCache, live_files, location, publish


def _cached_files(cache: PublishCache, deep: DeepStore) -> set[str]:
    """The files whose columns the cache holds for table ``t``."""
    return cache.held_files(deep, "t")


def _view_rows(cat: Catalog, table: str) -> list[object]:
    pointer = cat.store.read_pointer(table)
    assert pointer is not None
    return pyiceberg_rows(location(cat.deep, pointer.metadata_location), None, {})


def test_a_seal_frees_the_columns_of_the_files_it_replaced(tmp_path: Path) -> None:
    """The worker's publisher (``Publisher.publish``) over a table that gets micro-batches,
    then a seal of all of them: after the next publish the cache holds the columns of the
    table's live files only (the sealed segment's), not those of the 12 files the seal
    replaced; the view still reads as the table."""
    with Catalog.open(home=tmp_path) as cat:
        create_kv_table(cat, "t")
        publisher = Publisher(cat, interval=15.0)
        lo = commit_rows(cat, "t", [(1, "a"), (2, "b")], 0)
        publisher.publish(["t"])  # the first publish reads in full
        for i in range(12):
            lo = commit_rows(cat, "t", [(i % 4, f"v{i}"), (10 + i, "x")], lo)
            publisher.publish(["t"])  # incremental: each new file's columns cached
        before = live_files(cat.manifest("t"))
        assert _cached_files(publisher.cache, cat.deep) == before  # 13 micro-batch files
        Sealer(cat, "t", index_cache=IndexCache()).seal_partition(0, force=True)
        publisher.publish(["t"])
        after = live_files(cat.manifest("t"))
        assert not (after & before), "the seal replaced every micro-batch file"
        cached = _cached_files(publisher.cache, cat.deep)
        assert not (cached & before), f"columns of replaced files still cached: {cached & before}"
        assert cached <= after
        assert _view_rows(cat, "t") == canonical(cat.read_table("t").to_pylist())


def test_a_failed_publish_keeps_the_columns_its_retry_needs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rollback takes a batch out of the table; the publish after it fails at the pointer's
    compare-and-set (the metadata store is unreachable), so the view the cache builds on still
    lists that batch; then the batch's file is deleted from the deep store (garbage collection
    does, once retention expired the versions that named it). The retry builds on that view:
    the key the batch had updated is touched (its earlier row visible again) only because the
    cache still holds the batch's columns. The view equals the read."""
    with Catalog.open(home=tmp_path) as cat:
        create_kv_table(cat, "t")
        cache = PublishCache()
        batch = roll_back_a_published_batch_and_fail_its_publish(cat, "t", cache, monkeypatch)
        for path in batch:
            cat.deep.fs.delete_file(cat.deep._abs(path))

        assert publish(cat.store, cat.deep, "t", cache=cache).published
        expected = canonical(cat.read_table("t").to_pylist())
        assert (("k", 1), ("v", "old")) in expected
        assert _view_rows(cat, "t") == expected


def test_the_segment_masks_stay_within_their_bound_and_the_view_stays_exact(
    tmp_path: Path,
) -> None:
    """Which rows of each data file lie in its segments (a byte a row, kept per file to spare
    an incremental publish recomputing it) is bounded by bytes, not only by the table's live
    files, which a table with many unsealed files holds plenty of: past the bound the least
    recently used masks go, and a publish needing one computes it again. Every view still
    reads as the table."""
    with Catalog.open(home=tmp_path) as cat:
        create_kv_table(cat, "t")
        cache = PublishCache(max_mask_bytes=200)  # five 40-row files' masks
        lo = commit_rows(cat, "t", [(k, "a") for k in range(40)], 0)
        assert publish(cat.store, cat.deep, "t", cache=cache).published
        for i in range(12):
            # a key of the first file updated, 39 new: a publish with touched keys asks the
            # mask of every file of the version
            rows = [(i, f"v{i}")] + [(1000 * (i + 1) + k, "new") for k in range(39)]
            lo = commit_rows(cat, "t", rows, lo)
            assert publish(cat.store, cat.deep, "t", cache=cache).stats["incremental"] == 1
            assert _view_rows(cat, "t") == canonical(cat.read_table("t").to_pylist())
            held = sum(mask.nbytes for _, mask in cache._masks.values())
            assert held == cache.mask_bytes <= 200, f"masks hold {held} bytes after batch {i}"
        assert len(live_files(cat.manifest("t"))) == 13


def test_a_publish_round_gives_back_the_memory_it_freed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a round that published, the publisher returns to the system what the round freed
    and glibc kept (``malloc_trim``: 20 MB of a 20-table publisher's growth, issue 38); a call
    with nothing due trims nothing."""
    import millstream.core.memory as memory

    trims: list[int] = []
    monkeypatch.setattr(memory, "_MALLOC_TRIM", trims.append)
    with Catalog.open(home=tmp_path) as cat:
        create_kv_table(cat, "t")
        commit_rows(cat, "t", [(1, "a")], 0)
        clock = ManualClock(1000.0)
        publisher = Publisher(cat, interval=15.0, clock=clock)
        publisher.run_due({"ds": ["t"]})
        assert publisher.status()["t"]["publishes"] == 1
        assert trims == [0]
        clock.advance(5)
        publisher.run_due({"ds": ["t"]})  # not due yet
        assert trims == [0]
