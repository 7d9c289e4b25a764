"""A read of sealed rows skips the ``_ms_offset`` column (and the range mask and delete vectors
it serves) only where the file's Parquet footer proves that skipping changes nothing; a table
not partitioned by key takes each key's row in its highest partition without merging by
offset only while every (key, partition) holds one row. A file with a row outside its entry's
range, a row a delete vector names, a tombstone, or two rows of a key in one partition still
reads as the sequential model says."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from millstream.catalog import Catalog
from millstream.metastore.models import Entry, Manifest, SegmentState
from millstream.reference.model import canonical, model_rows
from millstream.sealing.compaction import CompactionPolicy
from millstream.sealing.keyindex import IndexCache
from millstream.sealing.sealer import Sealer
from millstream.spec import TableSpec
from millstream.storage.deepstore import DeepStore
from millstream.table.read import read_manifest
from millstream.table.writer import commit_staged, stage_rows

BY_KEY = [pytest.param(True, id="partitioned_by_key"), pytest.param(False, id="shared_keys")]


def _open(tmp_path: Path, by_key: bool) -> tuple[Catalog, TableSpec]:
    cat = Catalog.open(home=tmp_path)
    spec = TableSpec.parse(
        {
            "name": "t",
            "schema": {"k": "long", "v": "long"},
            "primary_key": ["k"],
            "mode": "upsert",
            "partitioned_by_key": by_key,
        }
    )
    return cat, cat.create_table(spec).spec


def _rows(partition: int, start: int, kvt: list[tuple[int, int, bool]]) -> list[dict[str, Any]]:
    return [
        {"k": k, "v": v, "_ms_partition": partition, "_ms_offset": start + i, "_ms_tombstone": t}
        for i, (k, v, t) in enumerate(kvt)
    ]


def _commit(cat: Catalog, spec: TableSpec, rows: list[dict[str, Any]]) -> None:
    partition, lo = rows[0]["_ms_partition"], rows[0]["_ms_offset"]
    table = pa.Table.from_pylist(rows, schema=spec.arrow_schema(system_columns=True))
    staged = stage_rows(cat.deep, spec, table)
    commit_staged(cat.store, cat.deep, "t", staged, {partition: (lo, lo + len(rows))}, {})


def _read(deep: DeepStore, manifest: Manifest) -> list[Any]:
    return canonical(read_manifest(deep, manifest).to_pylist())


@pytest.mark.parametrize("by_key", BY_KEY)
def test_a_sealed_file_with_rows_below_its_entrys_start_still_shows_only_the_entrys_rows(
    tmp_path: Path, by_key: bool
) -> None:
    """An entry's file may hold rows outside its range (a trimmed entry's file holds rows
    below its start); its footer then shows offsets below the start, so the rows are masked
    even where the file is sealed and the read would otherwise skip the offsets."""
    cat, spec = _open(tmp_path, by_key)
    below = [(100 + i, i, False) for i in range(5)]  # keys found nowhere else
    inside = [(i, 10 + i, False) for i in range(5)]
    rows = _rows(0, 0, below + inside)
    _commit(cat, spec, rows)
    m = cat.manifest("t")
    (e,) = m.entries
    online = dataclasses.replace(e, state=SegmentState.ONLINE, start=5)
    trimmed = dataclasses.replace(m, entries=(online,))
    expected = canonical(model_rows(spec, rows[5:]))
    assert _read(cat.deep, trimmed) == expected
    assert sorted(read_manifest(cat.deep, trimmed).column("k").to_pylist()) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("by_key", BY_KEY)
def test_a_sealed_entrys_file_holding_another_partitions_rows_shows_only_its_own(
    tmp_path: Path, by_key: bool
) -> None:
    """A micro-batch file holds several partitions' rows; an entry of one of them whose file
    is read without offsets must still leave the other partitions' rows out (its footer shows
    two partitions)."""
    cat, spec = _open(tmp_path, by_key)
    mine = _rows(0, 0, [(k, 1, False) for k in range(4)])
    other = _rows(1, 0, [(100 + k, 1, False) for k in range(4)])
    table = pa.Table.from_pylist([*mine, *other], schema=spec.arrow_schema(system_columns=True))
    staged = stage_rows(cat.deep, spec, table)
    commit_staged(cat.store, cat.deep, "t", staged, {0: (0, 4), 1: (0, 4)}, {})
    m = cat.manifest("t")
    (e,) = [e for e in m.entries if e.partition == 0]
    only = dataclasses.replace(m, entries=(dataclasses.replace(e, state=SegmentState.ONLINE),))
    assert _read(cat.deep, only) == canonical(model_rows(spec, mine))


@pytest.mark.parametrize("by_key", BY_KEY)
def test_rows_a_delete_vector_names_and_tombstones_are_dropped_from_sealed_rows(
    tmp_path: Path, by_key: bool
) -> None:
    """Two seals of one partition, not compacted: the second seal's delete vector names the
    first segment's rows of the keys it updates, so that segment's footer cannot prove its
    rows untouched and it is read with offsets and filtered. A sealed tombstone removes its
    key. Every read equals the model; partition 1 holds newer rows of the same keys."""
    cat, spec = _open(tmp_path, by_key)
    sealer = Sealer(cat, "t", index_cache=IndexCache(), compaction=CompactionPolicy(enabled=False))
    first = _rows(0, 0, [(k, 1, False) for k in range(8)])
    second = _rows(0, 8, [(0, 2, False), (1, 2, True), (2, 2, False), (9, 2, False)])
    everything = [*first, *second]
    for rows in (first, second):
        _commit(cat, spec, rows)
        assert sealer.seal_partition(0, force=True) is not None
    if not by_key:  # a key in two partitions: the higher partition's row wins
        shared = _rows(1, 0, [(3, 7, False), (4, 7, True)])
        _commit(cat, spec, shared)
        assert sealer.seal_partition(1, force=True) is not None
        everything += shared
    m = cat.manifest("t")
    assert m.delete_vectors and all(e.state is SegmentState.ONLINE for e in m.entries)
    expected = canonical(model_rows(spec, everything))
    assert _read(cat.deep, m) == expected
    assert canonical(read_manifest(cat.deep, m, use_delete_vectors=False).to_pylist()) == (expected)
    system = read_manifest(cat.deep, m, include_system_columns=True)
    user = system.drop_columns(["_ms_partition", "_ms_offset", "_ms_tombstone"])
    assert canonical(user.to_pylist()) == expected


def test_two_rows_of_a_key_in_one_partition_are_ordered_by_offset_not_by_file(
    tmp_path: Path,
) -> None:
    """Rows of a table not partitioned by key are taken per (key, partition) only while each
    holds one row: two sealed entries of one partition that both hold a key (written here
    with the newer file's name first, so file order is not offset order) are merged by
    offset, and the newer row wins."""
    cat, spec = _open(tmp_path, False)
    old = _rows(0, 0, [(k, 1, False) for k in range(4)])
    new = _rows(0, 4, [(k, 2, False) for k in range(4)])
    entries = []
    for seq, (name, rows) in enumerate((("b-old", old), ("a-new", new))):
        path = f"tables/t/data/{name}.parquet"
        table = pa.Table.from_pylist(rows, schema=spec.arrow_schema(system_columns=True))
        cat.deep.write_parquet(path, table)
        lo = rows[0]["_ms_offset"]
        entries.append(
            Entry(
                id=seq + 1,
                table="t",
                partition=0,
                seq=seq,
                file_path=path,
                start=lo,
                end=lo + len(rows),
                state=SegmentState.ONLINE,
                row_count=len(rows),
                size_bytes=0,
                added_version=1,
                removed_version=None,
                writer_id=None,
                batch_id=None,
                created_at=0.0,
            )
        )
    m = dataclasses.replace(cat.manifest("t"), entries=tuple(entries))
    assert _read(cat.deep, m) == canonical(model_rows(spec, [*old, *new]))
    assert {r["v"] for r in read_manifest(cat.deep, m).to_pylist()} == {2}


@pytest.mark.parametrize("by_key", BY_KEY)
def test_a_sealed_read_decodes_no_offsets_its_footers_prove_unneeded(
    tmp_path: Path, by_key: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What makes the read fast: a compacted sealed table is read without ``_ms_offset``
    (and still equals the model); asked for system columns, it reads them."""
    cat, spec = _open(tmp_path, by_key)
    sealer = Sealer(cat, "t", index_cache=IndexCache())
    everything: list[dict[str, Any]] = []
    for p in (0, 1):
        rows = _rows(p, 0, [(k * 2 + p, k, k == 3) for k in range(6)])
        _commit(cat, spec, rows)
        assert sealer.seal_partition(p, force=True) is not None
        everything += rows
    read: list[list[str]] = []
    original = DeepStore.read_parquet_choosing

    def recording(self: DeepStore, path: str, choose: Any, *a: Any) -> pa.Table:
        table = original(self, path, choose, *a)
        read.append(table.column_names)
        return table

    monkeypatch.setattr(DeepStore, "read_parquet_choosing", recording)
    assert canonical(cat.read_table("t").to_pylist()) == canonical(model_rows(spec, everything))
    assert len(read) == 2 and all("_ms_offset" not in names for names in read)
    read.clear()
    assert cat.read_table("t", include_system_columns=True).num_rows == 10
    assert read and all("_ms_offset" in names for names in read)
