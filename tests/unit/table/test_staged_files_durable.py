"""A local deep store's files are on disk before a manifest commit references them.

The metadata store (SQLite here, PostgreSQL in production) is durable at its COMMIT; a data
file it references must be too, or a power loss after the commit leaves the manifest naming a
file whose data was only in the page cache (empty or missing after the reboot: every read of
the table fails). Here every ``os.fsync`` of this process is recorded beside the metadata
store's commits (its ``before_metadata_commit`` fault point), through the production paths: a
write task's staging (:class:`RowStager`, the sink's; :func:`stage_rows`, its dead letters'),
the commit (:func:`commit_staged`, the sink's commit path) and a seal (its segment, before its
manifest swap: the seal's ``before_swap`` point). An Iceberg publish's files (its manifests,
manifest list and ``metadata.json``, written through pyiceberg) are likewise on disk before
the pointer's compare-and-set names them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from millstream import faults
from millstream.catalog import Catalog
from millstream.sealing.compaction import CompactionPolicy
from millstream.sealing.keyindex import IndexCache
from millstream.sealing.sealer import Sealer
from millstream.spec import OFFSET_COL, PARTITION_COL, TOMBSTONE_COL, TableSpec
from millstream.table.iceberg import load_metadata, publish, view_prefix
from millstream.table.writer import RowStager, commit_staged, stage_rows


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """("fsync", the path synced) for every os.fsync of this process, in order."""
    out: list[tuple[str, str]] = []
    real = os.fsync

    def recorded(fd: Any) -> None:
        real(fd)
        out.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))

    monkeypatch.setattr(os, "fsync", recorded)
    return out


def _upsert_table(tmp_path: Path) -> tuple[Catalog, TableSpec]:
    """A local home's catalog and its upsert table ``t`` (k long, v string)."""
    cat = Catalog.open(home=tmp_path / "home")
    spec = cat.create_table(
        TableSpec.parse(
            {
                "name": "t",
                "schema": {"k": "long", "v": "string"},
                "primary_key": ["k"],
                "mode": "upsert",
            }
        )
    ).spec
    return cat, spec


def _rows(spec: TableSpec, lo: int, hi: int) -> pa.Table:
    return pa.Table.from_pylist(
        [
            {"k": o, "v": f"v{o}", PARTITION_COL: 0, OFFSET_COL: o, TOMBSTONE_COL: False}
            for o in range(lo, hi)
        ],
        schema=spec.arrow_schema(system_columns=True),
    )


def _synced_before(
    events: list[tuple[str, str]], deep_root: Path, path: str, point: str = "commit"
) -> tuple[bool, bool]:
    """Whether the file at ``path`` (relative to the deep store) and its directory were
    fsynced before the first ``point`` recorded (the first metadata commit since the events
    were cleared; ``before_swap``: a seal's manifest swap)."""
    full = str(deep_root / path)
    until = events.index((point, ""))
    synced = {p for kind, p in events[:until] if kind == "fsync"}
    return full in synced, os.path.dirname(full) in synced


def test_a_staged_file_and_its_directory_are_fsynced_before_the_commit_referencing_it(
    tmp_path: Path, events: list[tuple[str, str]]
) -> None:
    cat, spec = _upsert_table(tmp_path)
    root = Path(cat.deep.root)

    def mark(point: str, key: Any) -> None:
        events.append(("commit" if point == "before_metadata_commit" else point, ""))

    with faults.installed(faults.call(("before_metadata_commit", "before_swap"), mark)):
        # a write task's staged file, written a row group at a time (the sink's path)
        stager = RowStager(cat.deep, spec)
        stager.add(_rows(spec, 0, 10))
        staged = stager.finish()
        assert staged.path is not None
        commit_staged(cat.store, cat.deep, "t", staged, {0: (0, 10)}, {})
        assert _synced_before(events, root, staged.path) == (True, True), events

        # a file written at once (a task's dead letters, a seal's segment)
        events.clear()
        staged = stage_rows(cat.deep, spec, _rows(spec, 10, 20))
        assert staged.path is not None
        commit_staged(cat.store, cat.deep, "t", staged, {0: (10, 20)}, {})
        assert _synced_before(events, root, staged.path) == (True, True), events

        events.clear()
        sealer = Sealer(
            cat, "t", index_cache=IndexCache(), compaction=CompactionPolicy(enabled=False)
        )
        assert sealer.seal_partition(0, force=True) is not None
    sealed = [e.file_path for e in cat.store.manifest("t").entries]
    assert len(sealed) == 1 and sealed[0] is not None
    assert _synced_before(events, root, sealed[0], "before_swap") == (True, True), events
    assert cat.read_table("t").num_rows == 20


def test_an_iceberg_publishs_files_are_fsynced_before_its_pointer_names_them(
    tmp_path: Path, events: list[tuple[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A power loss after the pointer moved must not leave it naming a torn ``metadata.json``
    (every later publish loads it, and would fail: the view stuck) or manifests that are not
    on disk."""
    cat, spec = _upsert_table(tmp_path)
    root = Path(cat.deep.root)
    staged = stage_rows(cat.deep, spec, _rows(spec, 0, 10))
    commit_staged(cat.store, cat.deep, "t", staged, {0: (0, 10)}, {})
    swap = cat.store.swap_pointer

    def recorded_swap(*args: Any, **kwargs: Any) -> Any:
        events.append(("commit", ""))
        return swap(*args, **kwargs)

    monkeypatch.setattr(cat.store, "swap_pointer", recorded_swap)
    events.clear()
    result = publish(cat.store, cat.deep, "t")
    assert result.published and result.pointer is not None

    written = [f.path for f in cat.deep.list_files(view_prefix("t"))]
    assert result.pointer.metadata_location in written
    assert any(p.endswith(".avro") for p in written), written  # manifests, manifest list
    for path in written:
        assert _synced_before(events, root, path) == (True, True), (path, events)
    # the view's directories are new: each one's name is on disk too (its parent synced), up
    # to the table's directory, which already had its name
    synced = {p for kind, p in events[: events.index(("commit", ""))] if kind == "fsync"}
    for path in written:
        parent = (root / path).parent
        while parent != root / "tables":
            assert str(parent) in synced, (parent, events)
            parent = parent.parent
    assert load_metadata(cat.deep, result.pointer.metadata_location).current_snapshot_id
