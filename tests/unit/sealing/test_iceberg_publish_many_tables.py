"""A publisher of many tables (a multi-table datastream's, each with its dead-letter table):
a round costs what changed. A table with nothing new since its last publish costs one read of
the metadata store: no manifest read, no Iceberg metadata file read, nothing written; and a
table whose snapshots retention expired still gets them dropped."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from harness.iceberg_readers import pyiceberg_rows
from harness.publish_support import commit_keys
from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.datastream import dead_letter_spec
from millstream.reference.model import canonical
from millstream.sealing.maintenance import Publisher
from millstream.table import iceberg
from millstream.table.iceberg import current_location, load_metadata, read_metadata, view_prefix

TABLES = 50


def _view_files(cat: Catalog, names: list[str]) -> dict[str, set[str]]:
    return {n: {f.path for f in cat.deep.list_files(view_prefix(n))} for n in names}


def test_a_round_where_one_of_fifty_tables_changed_reads_and_writes_that_table_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = ManualClock(time.time())
    with Catalog.open(home=tmp_path) as cat:
        names = [f"t{i:02d}" for i in range(TABLES)]
        for n in names:
            cat.create_table(
                {
                    "name": n,
                    "schema": {"k": "long", "v": "string"},
                    "mode": "upsert",
                    "primary_key": ["k"],
                    "retention": {"time": "1s", "min_versions": 1},
                }
            )
            cat.create_table(dead_letter_spec(cat.table(n).spec))
            commit_keys(cat, n, [1, 2, 1], 0)
        # As a worker hands them over: a datastream per table, with its dead-letter table.
        tables = {n: [n, dead_letter_spec(n).name] for n in names}
        publisher = Publisher(cat, interval=15.0, clock=clock)
        publisher.run_due(tables)
        assert {n: publisher.status()[n]["manifest_version"] for n in names} == dict.fromkeys(
            names, 1
        )

        # One table gets a commit; the next round reads and writes that table's view only.
        commit_keys(cat, "t07", [2, 3], 3)
        manifests: list[str] = []
        metadata_reads: list[str] = []
        read_manifest = cat.store.manifest

        def counted_manifest(table: str, **kw: Any) -> Any:
            manifests.append(table)
            return read_manifest(table, **kw)

        def counted_load(deep: Any, path: str) -> Any:
            metadata_reads.append(path)
            return load_metadata(deep, path)

        def counted_read(deep: Any, path: str) -> Any:
            metadata_reads.append(path)
            return read_metadata(deep, path)

        monkeypatch.setattr(cat.store, "manifest", counted_manifest)
        monkeypatch.setattr(iceberg, "load_metadata", counted_load)
        monkeypatch.setattr(iceberg, "read_metadata", counted_read)
        before = _view_files(cat, names)
        clock.advance(20)
        publisher.run_due(tables)
        after = _view_files(cat, names)
        assert [n for n in names if after[n] != before[n]] == ["t07"]
        assert manifests == ["t07"], "only the changed table's manifest is read"
        assert metadata_reads == [], "the publisher knows the metadata files it wrote"
        assert publisher.status()["t07"]["manifest_version"] == 2
        where = current_location(cat.deep, cat.store, "t07")
        assert where is not None
        assert pyiceberg_rows(where) == canonical(cat.read_table("t07").to_pylist())

        # Retention expires t03's first version (t03 has nothing new): the next round still
        # drops its snapshot, and publishes nothing else.
        commit_keys(cat, "t03", [4], 3)
        clock.advance(20)
        publisher.run_due(tables)
        clock.advance(3600)
        cat.store.expire_versions("t03", now=clock.now())
        assert cat.store.oldest_kept_version("t03") == 2
        clock.advance(20)
        publisher.run_due(tables)
        where = current_location(cat.deep, cat.store, "t03")
        assert where is not None
        pointer = cat.store.read_pointer("t03")
        assert pointer is not None
        assert [
            s.snapshot_id for s in load_metadata(cat.deep, pointer.metadata_location).snapshots
        ] == [2]
        assert pyiceberg_rows(where) == canonical(cat.read_table("t03").to_pylist())
