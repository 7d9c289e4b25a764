"""A running writer picks a schema change up at its next batch, without a restart: the sink's
write task decodes and stages under the table's current spec. A batch staged under the older
schema and committed after the change is kept and reads under the newest (nulls, casts)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from millstream.catalog import Catalog
from millstream.datastream import dead_letter_spec
from millstream.spark.options import SinkOptions
from millstream.spark.sink import SegmentSink
from millstream.spark.sources import markers_batch
from millstream.spec import TableSpec

V1 = TableSpec.parse({"name": "t", "schema": {"id": "long", "qty": "int"}})
V2 = TableSpec.parse({"name": "t", "schema": {"id": "long", "qty": "long", "discount": "double"}})


@pytest.fixture
def cat(tmp_path: Path) -> Iterator[Catalog]:
    with Catalog.open(home=tmp_path / "home") as catalog:
        yield catalog


def _source(tmp_path: Path, records: list[dict[str, object]]) -> Path:
    d = tmp_path / "src"
    (d / "0").mkdir(parents=True)
    (d / "0" / "a.json").write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in records))
    return d


def test_a_running_sink_writes_the_next_batch_under_the_new_schema(
    cat: Catalog, tmp_path: Path
) -> None:
    # Every record carries `discount` and a qty above 2**31: the producer changed first.
    records = [{"id": i, "qty": 2**31 + i, "discount": i / 2} for i in range(6)]
    d = _source(tmp_path, records)
    cat.create_table(V1)
    cat.create_table(dead_letter_spec(V1))
    options = SinkOptions.from_options(
        {
            **cat.settings.as_options(),
            "table": "t",
            "tableSpec": json.dumps(V1.to_json_dict()),
            "sourceKind": "files",
            "sourceConfig": json.dumps({"path": str(d)}),
        }
    )
    sink = SegmentSink(options)  # Spark reuses one writer object for every batch

    staged_v1 = sink.write(iter([markers_batch([(0, 0, 2)])]))
    cat.store.evolve_table(V2)
    staged_v2 = sink.write(iter([markers_batch([(0, 2, 6)])]))
    assert sink.current_spec() == V2

    # Batch 0 was staged under v1 and commits after the change: kept, read under v2.
    SegmentSink(options).commit([staged_v1], 0)
    SegmentSink(options).commit([staged_v2], 1)

    rows = sorted(cat.read_table("t").to_pylist(), key=lambda r: r["id"])
    dead = cat.read_table("t__dead_letter").to_pylist()
    # Under v1 the two records' qty did not fit an int: dead-lettered.
    assert [(r["offset"], r["error"].startswith("column 'qty': ")) for r in dead] == [
        (0, True),
        (1, True),
    ]
    assert all("int32" in r["error"] for r in dead)
    assert rows == [{"id": i, "qty": 2**31 + i, "discount": i / 2} for i in range(2, 6)], (
        "the next batch carries the new column and the widened type"
    )
    assert cat.store.get_shard("t", 0).upper == 6  # type: ignore[union-attr]


def test_a_batch_staged_under_the_old_schema_reads_with_nulls_for_the_new_column(
    cat: Catalog, tmp_path: Path
) -> None:
    d = _source(tmp_path, [{"id": i, "qty": i} for i in range(4)])
    cat.create_table(V1)
    cat.create_table(dead_letter_spec(V1))
    options = SinkOptions.from_options(
        {
            **cat.settings.as_options(),
            "table": "t",
            "tableSpec": json.dumps(V1.to_json_dict()),
            "sourceKind": "files",
            "sourceConfig": json.dumps({"path": str(d)}),
        }
    )
    staged = SegmentSink(options).write(iter([markers_batch([(0, 0, 4)])]))
    cat.store.evolve_table(V2)
    SegmentSink(options).commit([staged], 0)
    assert sorted(cat.read_table("t").to_pylist(), key=lambda r: r["id"]) == [
        {"id": i, "qty": i, "discount": None} for i in range(4)
    ]
