"""Reads, seals and compactions of a table whose schema evolved: segments written under an
older schema read under the newest (a column added since is null, a widened column cast), a
reader's cache does not hand back rows conformed to the older schema, and a seal or compaction
of a partition whose files mix schema versions writes the newest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from millstream.catalog import Catalog
from millstream.metastore.models import SegmentState
from millstream.reference.model import canonical, model_rows
from millstream.sealing.compaction import CompactionPolicy
from millstream.sealing.sealer import Sealer
from millstream.spec import TableSpec
from millstream.table.read import read_entries
from millstream.table.writer import commit_staged, stage_rows

V1: dict[str, Any] = {"name": "t", "schema": {"k": "long", "qty": "int", "note": "string"}}
V2: dict[str, Any] = {
    **V1,
    "schema": {"k": "long", "qty": "long", "note": "string", "discount": "double"},
}
UPSERT = {"mode": "upsert", "primary_key": ["k"], "partitioned_by_key": True}


class Writer:
    """Commits batches of one partition under whatever spec it is given, like a writer that
    picked a schema change up at a batch boundary."""

    def __init__(self, cat: Catalog) -> None:
        self.cat = cat
        self.pos: dict[int, int] = {}
        self.rows: list[dict[str, Any]] = []

    def batch(self, spec: TableSpec, partition: int, values: list[dict[str, Any]]) -> None:
        lo = self.pos.get(partition, 0)
        rows = [
            {**v, "_ms_partition": partition, "_ms_offset": lo + i, "_ms_tombstone": False}
            for i, v in enumerate(values)
        ]
        table = pa.Table.from_pylist(rows, schema=spec.arrow_schema(system_columns=True))
        staged = stage_rows(self.cat.deep, spec, table)
        commit_staged(
            self.cat.store, self.cat.deep, "t", staged, {partition: (lo, lo + len(rows))}, {}
        )
        self.rows += rows
        self.pos[partition] = lo + len(rows)

    def expected(self, spec: TableSpec) -> list[Any]:
        return canonical(model_rows(spec, self.rows))


@pytest.fixture
def cat(tmp_path: Path) -> Any:
    with Catalog.open(home=tmp_path, read_cache_mb=64) as c:
        yield c


def evolve(cat: Catalog, data: dict[str, Any]) -> TableSpec:
    info, changes = cat.store.evolve_table(TableSpec.parse(data))
    assert changes
    return info.spec


def test_old_segments_read_with_nulls_for_added_columns_and_widened_types(cat: Catalog) -> None:
    v1 = cat.create_table(V1).spec
    w = Writer(cat)
    w.batch(v1, 0, [{"k": 1, "qty": 5, "note": "a"}, {"k": 2, "qty": -3, "note": None}])
    before = cat.read_table("t")  # fills the reader's cache under v1
    assert before.schema == v1.arrow_schema()

    v2 = evolve(cat, V2)
    w.batch(v2, 0, [{"k": 3, "qty": 2**40, "note": "c", "discount": 0.5}])

    got = cat.read_table("t")
    assert got.schema == v2.arrow_schema()
    assert sorted(got.to_pylist(), key=lambda r: r["k"]) == [
        {"k": 1, "qty": 5, "note": "a", "discount": None},
        {"k": 2, "qty": -3, "note": None, "discount": None},
        {"k": 3, "qty": 2**40, "note": "c", "discount": 0.5},
    ]


def test_a_projected_read_of_an_old_file_gives_nulls_for_a_column_it_lacks(cat: Catalog) -> None:
    v1 = cat.create_table(V1).spec
    w = Writer(cat)
    w.batch(v1, 0, [{"k": 1, "qty": 5, "note": "a"}])
    v2 = evolve(cat, V2)
    entries = cat.manifest("t").entries
    rows = read_entries(cat.deep, v2, entries, columns=["k", "discount", "qty"])
    assert rows.column("discount").to_pylist() == [None]
    assert rows.schema.field("qty").type == pa.int64()


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_a_seal_and_a_compaction_of_mixed_schema_segments_write_the_newest_schema(
    cat: Catalog, mode: str
) -> None:
    extra = UPSERT if mode == "upsert" else {}
    v1 = cat.create_table({**V1, **extra}).spec
    w = Writer(cat)
    sealer = Sealer(cat, "t", compaction=CompactionPolicy(min_segments=2))
    w.batch(v1, 0, [{"k": 1, "qty": 1, "note": "a"}, {"k": 2, "qty": 2, "note": "b"}])
    assert sealer.seal_partition(0, force=True) is not None  # sealed under v1
    w.batch(v1, 0, [{"k": 1, "qty": 10, "note": "a2"}])
    v2 = evolve(cat, {**V2, **extra})
    w.batch(v2, 0, [{"k": 4, "qty": 2**33, "note": "d", "discount": 1.5}])
    assert sealer.seal_partition(0, force=True) is not None  # a v1 file and a v2 file

    sealed = [e for e in cat.manifest("t").entries if e.state is SegmentState.ONLINE]
    assert sealed
    newest = max(sealed, key=lambda e: e.seq)
    assert newest.file_path is not None
    with cat.deep.fs.open_input_file(cat.deep._abs(newest.file_path)) as f:
        written = pq.read_schema(f)
    assert written.field("discount").type == pa.float64()
    assert written.field("qty").type == pa.int64()
    assert canonical(cat.read_table("t").to_pylist()) == w.expected(v2)

    sealer.seal_due()  # compacts the two sealed segments (one of them written under v1)
    compacted = [e for e in cat.manifest("t").entries if e.state is SegmentState.ONLINE]
    assert len(compacted) == 1 < len(sealed)
    assert canonical(cat.read_table("t").to_pylist()) == w.expected(v2)
