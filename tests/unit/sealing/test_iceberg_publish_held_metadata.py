"""A long-lived publisher holds each table's last metadata file compactly between two publishes
(its snapshots' ids and its JSON compressed, not pyiceberg's model of every listed snapshot)
and builds the model again only when it writes the next file. Over many publishes of a table
past its snapshot bound, every publish builds on exactly the metadata the pointer's file
holds, the view keeps its snapshot log and metadata log as pyiceberg keeps them, lists the
bound's newest snapshots, and its newest snapshots read in DuckDB and pyiceberg."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import TableUpdate

import millstream.table.iceberg as iceberg
from harness.iceberg_readers import duckdb_connection, duckdb_rows, pyiceberg_rows
from harness.publish_support import commit_keys, create_kv_table
from millstream.catalog import Catalog
from millstream.reference.model import canonical
from millstream.table.iceberg import PublishCache, load_metadata, location, publish

KEPT = 6
PUBLISHES = 30


def test_many_publishes_build_on_the_pointers_metadata_and_keep_its_logs_and_bound(
    tmp_path: Path, monkeypatch: Any
) -> None:
    bases: list[TableMetadata] = []
    ours = iceberg.updated_metadata

    def recorded(
        base: TableMetadata, updates: Sequence[TableUpdate], *, metadata_location: str | None
    ) -> TableMetadata:
        bases.append(base)
        return ours(base, updates, metadata_location=metadata_location)

    monkeypatch.setattr(iceberg, "updated_metadata", recorded)
    with Catalog.open(home=tmp_path) as cat:
        create_kv_table(cat, "kv", iceberg_snapshots=KEPT)
        cache = PublishCache()
        files: list[str] = []  # each publish's metadata file, as the pointer named it
        for i in range(PUBLISHES):
            commit_keys(cat, "kv", [i % 4, 100 + i], 2 * i)
            assert publish(cat.store, cat.deep, "kv", cache=cache).published
            pointer = cat.store.read_pointer("kv")
            assert pointer is not None
            files.append(pointer.metadata_location)
        # Every publish after the first built on the metadata its pointer's file holds (the
        # first on a new table's).
        assert len(bases) == PUBLISHES
        assert not bases[0].snapshots
        for base, path in zip(bases[1:], files[:-1], strict=True):
            assert base == load_metadata(cat.deep, path)

        newest = load_metadata(cat.deep, files[-1])
        listed = [s.snapshot_id for s in newest.snapshots]
        assert listed == list(range(PUBLISHES - KEPT + 1, PUBLISHES + 1))  # the bound
        assert [(e.snapshot_id, e.timestamp_ms) for e in newest.snapshot_log] == [
            (s.snapshot_id, s.timestamp_ms) for s in newest.snapshots
        ]
        assert [e.metadata_file for e in newest.metadata_log] == [
            location(cat.deep, p) for p in files[:-1]
        ]
        # What the publisher holds of it: less than the file itself, not a model of it.
        size = os.path.getsize(cat.deep._abs(files[-1]))
        assert 0 < cache.describe()["metadata_bytes"] < size
        # The file is pyiceberg's serialization of its model, and its newest snapshots read.
        with open(cat.deep._abs(files[-1]), "rb") as f:
            assert json.loads(f.read()) == json.loads(newest.model_dump_json(exclude_none=True))
        uri = location(cat.deep, files[-1])
        con = duckdb_connection()
        for version in listed[-2:]:
            expected = canonical(cat.read_table("kv", as_of=version).to_pylist())
            assert duckdb_rows(con, uri, version) == expected
            assert pyiceberg_rows(uri, version) == expected
