"""A long-lived publisher holds each table's data files' merge columns in a few blocks (issue 38:
one Arrow table a micro-batch file grew the publisher process by ~6 KB a file, and its round
looked the touched keys up over a chunk a file). The blocks are rebuilt after each publish
to the files the published view lists: a rollback takes a file out of the middle of a block,
a seal takes them all, and the small blocks of many rounds are joined. Across all of it, every
view reads as the table, and what the cache holds is the table's live files only."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.iceberg_readers import duckdb_connection, duckdb_rows, pyiceberg_rows
from harness.publish_support import (
    commit_rows,
    create_kv_table,
    roll_back_a_published_batch_and_fail_its_publish,
)
from millstream.catalog import Catalog
from millstream.reference.model import canonical
from millstream.sealing.keyindex import IndexCache
from millstream.sealing.sealer import Sealer
from millstream.table.iceberg import MAX_BLOCKS, PublishCache, live_files, location, publish


def _check(cat: Catalog, table: str, cache: PublishCache) -> dict[str, int]:
    """Publish ``table`` and compare its view, as pyiceberg and DuckDB read it, with the read."""
    result = publish(cat.store, cat.deep, table, cache=cache)
    assert result.published and result.pointer is not None
    metadata = location(cat.deep, result.pointer.metadata_location)
    expected = canonical(cat.read_table(table).to_pylist())
    assert pyiceberg_rows(metadata) == expected
    assert duckdb_rows(duckdb_connection(), metadata) == expected
    return result.stats


def test_views_stay_exact_as_the_blocks_are_rebuilt_joined_and_emptied(tmp_path: Path) -> None:
    """A publish after each of 24 micro-batches (each updating keys of earlier batches), a
    rollback of the last 14 (a block kept in part), a seal of everything, then more batches:
    every view equals the read, each publish reads only the files new since the last one, the
    cache holds the live files only, in at most ``MAX_BLOCKS`` blocks."""
    with Catalog.open(home=tmp_path) as cat:
        create_kv_table(cat, "t")
        cache = PublishCache()
        lo = commit_rows(cat, "t", [(k, "a") for k in range(8)], 0)
        _check(cat, "t", cache)  # in full: reads no columns
        seqs = []
        for i in range(24):
            lo = commit_rows(cat, "t", [(i % 8, f"v{i}"), (100 + i, "new")], lo)
            seqs.append(max(e.seq for e in cat.manifest("t").entries))
            stats = _check(cat, "t", cache)
            assert stats["incremental"] == 1
            # the first incremental publish reads the version's files; later ones the new one
            assert stats["files_read"] == (2 if i == 0 else 1)
            assert cache.held_files(cat.deep, "t") == live_files(cat.manifest("t"))
            assert cache.describe()["blocks"] <= MAX_BLOCKS
        # Take batches 10-23 out (their updates undone, their new keys gone): a block of the
        # joined batches is rebuilt with its first files only.
        cat.store.rollback_partition("t", 0, seqs[10], dry_run=False)
        assert _check(cat, "t", cache)["files_read"] == 0
        assert cache.held_files(cat.deep, "t") == live_files(cat.manifest("t"))
        lo = max(e.end for e in cat.manifest("t").entries)
        for i in range(3):
            lo = commit_rows(cat, "t", [(i, f"w{i}")], lo, epoch=1)  # the rollback's epoch
            _check(cat, "t", cache)
        Sealer(cat, "t", index_cache=IndexCache()).seal_partition(0, force=True)
        _check(cat, "t", cache)
        assert cache.held_files(cat.deep, "t") <= live_files(cat.manifest("t"))
        for i in range(3):
            lo = commit_rows(cat, "t", [(i + 3, f"x{i}"), (200 + i, "y")], lo, epoch=1)
            _check(cat, "t", cache)
        assert cache.held_files(cat.deep, "t") == live_files(cat.manifest("t"))


def test_a_table_whose_columns_were_evicted_publishes_in_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the cache's bytes, the least recently published table's columns go, and with them
    the view it built on: its next publish reads in full. A rollback took a batch out of table
    ``t`` (its publish failed, so the view the cache holds still lists the batch), then another
    table's publish evicted ``t``'s columns, then garbage collection deleted the batch's file.
    Built on the old view, the retry would find the key that batch had updated untouched (its
    columns are neither held nor readable) and keep the key's earlier row hidden."""
    with Catalog.open(home=tmp_path) as cat:
        create_kv_table(cat, "t")
        create_kv_table(cat, "u")
        cache = PublishCache()
        batch = roll_back_a_published_batch_and_fail_its_publish(cat, "t", cache, monkeypatch)

        ulo = commit_rows(cat, "u", [(k, "u") for k in range(50)], 0)
        assert publish(cat.store, cat.deep, "u", cache=cache).published
        commit_rows(cat, "u", [(k, "u2") for k in range(50)], ulo)
        cache.max_bytes = cache.merge_bytes + 1  # u's next columns push t's out
        assert publish(cat.store, cat.deep, "u", cache=cache).stats["incremental"] == 1
        assert not cache.held_files(cat.deep, "t")
        for path in batch:
            cat.deep.fs.delete_file(cat.deep._abs(path))

        stats = _check(cat, "t", cache)
        assert stats["read_in_full"] == 1
        assert (("k", 1), ("v", "old")) in canonical(cat.read_table("t").to_pylist())
