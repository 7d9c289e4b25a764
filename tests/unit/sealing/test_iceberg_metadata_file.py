"""A view's metadata file as pyiceberg writes and reads it. A publish writes the file's JSON
itself (``write_metadata``: it keeps the JSON it wrote, compressed, for the next publish) and
reads the pointer's file itself (``read_metadata``): the bytes it writes are those of
pyiceberg's serializer (a pyiceberg upgrade that changes them fails here, not silently in
the views), and a pointer naming a gzip'd ``.gz.metadata.json`` (another tool's, or another
version's) is read as pyiceberg reads it: the next publish builds on it."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.serializers import ToOutputFile

from harness.iceberg_readers import pyiceberg_rows
from harness.publish_support import commit_keys, create_kv_table
from millstream.catalog import Catalog
from millstream.reference.model import canonical
from millstream.table.iceberg import (
    PublishCache,
    load_metadata,
    location,
    publish,
    read_metadata,
    snapshot_ids,
    write_metadata,
)


def _published(cat: Catalog) -> str:
    """The ``kv`` view's metadata file after two publishes (its snapshots and metadata log,
    the first snapshot without a parent): the pointer's file, relative."""
    create_kv_table(cat, "kv")
    for i in range(2):
        commit_keys(cat, "kv", [i, 10 + i], 2 * i)
        assert publish(cat.store, cat.deep, "kv").published
    pointer = cat.store.read_pointer("kv")
    assert pointer is not None
    return pointer.metadata_location


def _read(uri: str) -> bytes:
    with PyArrowFileIO().new_input(uri).open() as f:
        return f.read()


@pytest.mark.parametrize("legacy", ["false", "true"])
def test_write_metadata_writes_the_bytes_pyicebergs_serializer_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, legacy: str
) -> None:
    """With and without pyiceberg's legacy option (None values written, a None current
    snapshot id as -1), which both writers read from pyiceberg's configuration."""
    monkeypatch.setenv("PYICEBERG_LEGACY_CURRENT_SNAPSHOT_ID", legacy)
    with Catalog.open(home=tmp_path / "home") as cat:
        metadata = load_metadata(cat.deep, _published(cat))
        # and a table's metadata before its first snapshot: no current snapshot id
        empty = metadata.model_copy(update={"current_snapshot_id": None, "refs": {}})
        for i, each in enumerate((metadata, empty)):
            unsynced: list[str] = []
            path = f"other/metadata/{i:05d}-ours.metadata.json"
            raw = write_metadata(cat.deep, path, each, unsynced)
            theirs = tmp_path / f"{i:05d}-pyiceberg.metadata.json"
            ToOutputFile.table_metadata(each, PyArrowFileIO().new_output(str(theirs)))
            assert _read(location(cat.deep, path)) == raw == theirs.read_bytes()
            assert unsynced == [path], "the caller syncs it before the pointer names it"
            doc = json.loads(raw)
            assert ("current-snapshot-id" in doc) is (i == 0 or legacy == "true")


def test_a_pointer_naming_a_gzipped_metadata_file_is_read_and_the_next_publish_builds_on_it(
    tmp_path: Path,
) -> None:
    with Catalog.open(home=tmp_path / "home") as cat:
        written = _published(cat)
        pointer = cat.store.read_pointer("kv")
        assert pointer is not None
        metadata = load_metadata(cat.deep, written)
        # The same metadata, gzip'd by pyiceberg as another tool would write it, named by
        # the pointer in its place.
        gz = written.removesuffix(".metadata.json") + ".gz.metadata.json"
        ToOutputFile.table_metadata(metadata, PyArrowFileIO().new_output(location(cat.deep, gz)))
        assert _read(location(cat.deep, gz))[:2] == b"\x1f\x8b", "gzip'd"
        moved = cat.store.swap_pointer(
            "kv",
            pointer,
            metadata_location=gz,
            manifest_version=pointer.manifest_version,
            now=cat.store.clock.now(),
        )
        assert moved is not None

        raw, read = read_metadata(cat.deep, gz)
        assert raw == gzip.decompress(_read(location(cat.deep, gz)))
        assert read == metadata

        # A publisher that holds nothing of it reads the pointer's file and builds on it.
        commit_keys(cat, "kv", [0, 20], 4)
        assert publish(cat.store, cat.deep, "kv", cache=PublishCache()).published
        after = cat.store.read_pointer("kv")
        assert after is not None and after.metadata_location != gz
        latest = load_metadata(cat.deep, after.metadata_location)
        assert [m.metadata_file for m in latest.metadata_log][-1] == location(cat.deep, gz)
        assert list(snapshot_ids(latest))[:-1] == list(snapshot_ids(metadata))
        rows = pyiceberg_rows(location(cat.deep, after.metadata_location))
        assert rows == canonical(cat.read_table("kv").to_pylist())
