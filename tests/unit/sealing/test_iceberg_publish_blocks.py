"""A long-lived publisher holds each table's data files' merge columns in a few blocks (issue 38:
one Arrow table a micro-batch file grew the publisher process by ~6 KB a file, and its round
looked the touched keys up over a chunk a file). The blocks are rebuilt after each publish
to the files the published view lists: a rollback takes a file out of the middle of a block,
a seal takes them all, and the small blocks of many rounds are joined. Across all of it, every
view reads as the table, and what the cache holds is the table's live files only."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from harness.iceberg_readers import duckdb_connection, duckdb_rows, pyiceberg_rows
from millstream.catalog import Catalog
from millstream.reference.model import canonical
from millstream.sealing.keyindex import IndexCache
from millstream.sealing.sealer import Sealer
from millstream.table.iceberg import MAX_BLOCKS, PublishCache, live_files, location, publish
from millstream.table.writer import commit_staged, stage_rows


def _create(cat: Catalog, name: str) -> None:
    cat.create_table(
        {
            "name": name,
            "schema": {"k": "long", "v": "string"},
            "mode": "upsert",
            "primary_key": ["k"],
        }
    )


def _commit(cat: Catalog, table: str, rows: list[tuple[int, str]], lo: int, epoch: int = 0) -> int:
    spec = cat.table(table).spec
    batch = pa.Table.from_pylist(
        [
            {"k": k, "v": v, "_ms_partition": 0, "_ms_offset": lo + i, "_ms_tombstone": False}
            for i, (k, v) in enumerate(rows)
        ],
        schema=spec.arrow_schema(system_columns=True),
    )
    commit_staged(
        cat.store,
        cat.deep,
        table,
        stage_rows(cat.deep, spec, batch),
        {0: (lo, lo + len(rows))},
        {0: epoch} if epoch else {},
    )
    return lo + len(rows)


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
        _create(cat, "t")
        cache = PublishCache()
        lo = _commit(cat, "t", [(k, "a") for k in range(8)], 0)
        _check(cat, "t", cache)  # in full: reads no columns
        seqs = []
        for i in range(24):
            lo = _commit(cat, "t", [(i % 8, f"v{i}"), (100 + i, "new")], lo)
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
            lo = _commit(cat, "t", [(i, f"w{i}")], lo, epoch=1)  # the rollback's epoch
            _check(cat, "t", cache)
        Sealer(cat, "t", index_cache=IndexCache()).seal_partition(0, force=True)
        _check(cat, "t", cache)
        assert cache.held_files(cat.deep, "t") <= live_files(cat.manifest("t"))
        for i in range(3):
            lo = _commit(cat, "t", [(i + 3, f"x{i}"), (200 + i, "y")], lo, epoch=1)
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
        _create(cat, "t")
        _create(cat, "u")
        cache = PublishCache()
        lo = _commit(cat, "t", [(1, "old"), (2, "two")], 0)
        assert publish(cat.store, cat.deep, "t", cache=cache).published
        first = {e.seq for e in cat.manifest("t").entries}
        _commit(cat, "t", [(1, "new")], lo)  # hides key 1's first row
        assert publish(cat.store, cat.deep, "t", cache=cache).stats["incremental"] == 1
        batch = live_files(cat.manifest("t")) - live_files(cat.manifest("t", as_of=1))
        (later,) = [e.seq for e in cat.manifest("t").entries if e.seq not in first]
        cat.store.rollback_partition("t", 0, later, dry_run=False)  # key 1 is "old" again
        real = cat.store.swap_pointer

        def unreachable(*args: object, **kwargs: object) -> object:
            raise ConnectionError("metadata store unreachable")

        monkeypatch.setattr(cat.store, "swap_pointer", unreachable)
        with pytest.raises(ConnectionError):
            publish(cat.store, cat.deep, "t", cache=cache)
        monkeypatch.setattr(cat.store, "swap_pointer", real)

        ulo = _commit(cat, "u", [(k, "u") for k in range(50)], 0)
        assert publish(cat.store, cat.deep, "u", cache=cache).published
        _commit(cat, "u", [(k, "u2") for k in range(50)], ulo)
        cache.max_bytes = cache.merge_bytes + 1  # u's next columns push t's out
        assert publish(cat.store, cat.deep, "u", cache=cache).stats["incremental"] == 1
        assert not cache.held_files(cat.deep, "t")
        for path in batch:
            cat.deep.fs.delete_file(cat.deep._abs(path))

        stats = _check(cat, "t", cache)
        assert stats["read_in_full"] == 1
        assert (("k", 1), ("v", "old")) in canonical(cat.read_table("t").to_pylist())
