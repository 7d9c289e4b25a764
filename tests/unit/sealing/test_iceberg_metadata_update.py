"""A publish builds the view's new table metadata by pyiceberg's own update steps without its
closing deep copy of the whole metadata (every snapshot the view lists: up to 240 a table, at
every publish). The metadata it writes is the one pyiceberg's ``update_table_metadata`` makes
of the same updates, across new snapshots, a schema change and snapshots dropped by the
view's bound, and every listed snapshot reads the rows of its version in DuckDB and
pyiceberg."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import TableUpdate, update_table_metadata

import millstream.table.iceberg as iceberg
from harness.iceberg_readers import duckdb_connection, duckdb_rows, pyiceberg_rows
from harness.publish_support import commit_keys
from millstream.catalog import Catalog
from millstream.reference.model import canonical
from millstream.spec import TableSpec
from millstream.table.iceberg import PublishCache, load_metadata, location, publish

KEPT = 4


def _comparable(metadata: TableMetadata) -> dict[str, Any]:
    """The metadata as written, but for its update time (the clock's, at each call)."""
    out: dict[str, Any] = json.loads(metadata.model_dump_json())
    out.pop("last-updated-ms")
    return out


def _kv(rows: list[Any]) -> list[Any]:
    """Rows (dicts, or a reader's canonical pairs) as their key and value, canonical."""
    return canonical({"k": dict(r)["k"], "v": dict(r)["v"]} for r in rows)


def test_a_publishs_metadata_is_pyicebergs_update_of_the_same_changes(
    tmp_path: Path, monkeypatch: Any
) -> None:
    built: list[tuple[dict[str, Any], dict[str, Any]]] = []
    ours = iceberg.updated_metadata

    def compared(
        base: TableMetadata, updates: Sequence[TableUpdate], *, metadata_location: str | None
    ) -> TableMetadata:
        theirs = update_table_metadata(base, tuple(updates), metadata_location=metadata_location)
        mine = ours(base, updates, metadata_location=metadata_location)
        built.append((_comparable(mine), _comparable(theirs)))
        return mine

    monkeypatch.setattr(iceberg, "updated_metadata", compared)
    with Catalog.open(home=tmp_path) as cat:
        raw: dict[str, Any] = {
            "name": "kv",
            "schema": {"k": "long", "v": "string"},
            "mode": "upsert",
            "primary_key": ["k"],
            "retention": {"time": "24h", "min_versions": 1, "iceberg_snapshots": KEPT},
        }
        cat.create_table(raw)
        cache = PublishCache()
        versions: dict[int, list[dict[str, Any]]] = {}
        for i in range(9):
            if i == 5:  # a schema change: the next metadata adds a schema
                raw["schema"] = {"k": "long", "v": "string", "w": "long"}
                cat.store.evolve_table(TableSpec.parse(raw))
            commit_keys(cat, "kv", [i % 3, 10 + i], 2 * i)
            assert publish(cat.store, cat.deep, "kv", cache=cache).published
            pointer = cat.store.read_pointer("kv")
            assert pointer is not None
            versions[pointer.manifest_version] = _kv(cat.read_table("kv").to_pylist())
        assert len(built) == 9
        for mine, theirs in built:
            assert mine == theirs
        metadata = load_metadata(cat.deep, pointer.metadata_location)
        listed = sorted(s.snapshot_id for s in metadata.snapshots)
        assert len(listed) == KEPT  # the bound dropped the older ones
        assert len(metadata.schemas) == 2
        uri = location(cat.deep, pointer.metadata_location)
        con = duckdb_connection()
        for v in listed:
            assert _kv(duckdb_rows(con, uri, v)) == versions[v]
            assert _kv(pyiceberg_rows(uri, v)) == versions[v]
