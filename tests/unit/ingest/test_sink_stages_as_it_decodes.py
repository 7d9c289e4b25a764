"""A write task stages its rows as it decodes them (``RowStager``): it holds a row group's
worth at a time, not every record it read, and what it stages is what it would have staged
whole: every good row once, in (partition, offset) order, the bad ones dead-lettered. A task
that fails part way (``bad_records: fail``) leaves no staged file behind."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from millstream.catalog import Catalog
from millstream.datastream import dead_letter_spec
from millstream.errors import BadRecordError
from millstream.spark import sink as sink_module
from millstream.spark.options import SinkOptions
from millstream.spark.sink import SegmentSink
from millstream.spark.sources import markers_batch
from millstream.spec import OFFSET_COL, PARTITION_COL, TableSpec
from millstream.table import writer as writer_module

SPEC = TableSpec.parse(
    {"name": "t", "schema": {"id": "long", "v": "string"}, "mode": "upsert", "primary_key": ["id"]}
)
PARTITIONS = 6
PER_PARTITION = 250


@pytest.fixture
def cat(tmp_path: Path) -> Iterator[Catalog]:
    with Catalog.open(home=tmp_path / "home") as catalog:
        catalog.create_table(SPEC)
        catalog.create_table(dead_letter_spec(SPEC))
        yield catalog


def _sink(cat: Catalog, tmp_path: Path, bad_records: str = "dead_letter") -> SegmentSink:
    src = tmp_path / "src"
    for p in range(PARTITIONS):
        (src / str(p)).mkdir(parents=True)
        lines = [json.dumps({"id": p * 1000 + i, "v": f"r{i}"}) for i in range(PER_PARTITION)]
        if p == 3:
            lines[40] = "not json"  # one bad record, in the task's second range
        (src / str(p) / "a.json").write_text("".join(line + "\n" for line in lines))
    return SegmentSink(
        SinkOptions.from_options(
            {
                **cat.settings.as_options(),
                "table": "t",
                "tableSpec": json.dumps(SPEC.to_json_dict()),
                "sourceKind": "files",
                "sourceConfig": json.dumps({"path": str(src)}),
                "badRecords": bad_records,
            }
        )
    )


def test_a_task_stages_its_rows_a_row_group_at_a_time_in_position_order(
    cat: Catalog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sink_module, "DECODE_ROWS", 100)
    monkeypatch.setattr(writer_module, "STAGE_GROUP_ROWS", 300)
    held: list[int] = []
    flush = writer_module.RowStager._flush

    def watched(self: writer_module.RowStager) -> None:
        held.append(self._pending_rows)
        flush(self)

    monkeypatch.setattr(writer_module.RowStager, "_flush", watched)
    sink = _sink(cat, tmp_path)
    ranges = [(p, 0, PER_PARTITION) for p in (1, 3, 4)]

    staged = sink.write(iter([markers_batch(ranges)]))

    assert held and max(held) < 300 + 100, "at most a row group and a piece held at once"
    assert staged.data_path is not None
    rows = pq.read_table(Path(cat.deep.root) / staged.data_path)
    assert pq.ParquetFile(Path(cat.deep.root) / staged.data_path).num_row_groups > 1
    positions = list(
        zip(
            rows.column(PARTITION_COL).to_pylist(),
            rows.column(OFFSET_COL).to_pylist(),
            strict=True,
        )
    )
    expected = [(p, o) for p in (1, 3, 4) for o in range(PER_PARTITION) if (p, o) != (3, 40)]
    assert positions == expected
    assert staged.data_counts == {1: 250, 3: 249, 4: 250}
    assert staged.dead_counts == {3: 1}
    SegmentSink(sink.opts).commit([staged], 0)
    ids = sorted(r["id"] for r in cat.read_table("t").to_pylist())
    assert ids == sorted(p * 1000 + o for p, o in expected)


def test_a_task_that_fails_part_way_leaves_no_staged_file(
    cat: Catalog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sink_module, "DECODE_ROWS", 100)
    monkeypatch.setattr(writer_module, "STAGE_GROUP_ROWS", 100)
    sink = _sink(cat, tmp_path, bad_records="fail")
    with pytest.raises(BadRecordError, match="at partition 3 offset 40"):
        sink.write(iter([markers_batch([(p, 0, PER_PARTITION) for p in (1, 3, 4)])]))
    assert cat.deep.list_files("tables/t") == [], "the rows staged before the bad one are gone"


def test_pieces_out_of_position_order_are_refused_naming_both_positions(
    cat: Catalog,
) -> None:
    import pyarrow as pa

    def rows(p: int, lo: int, n: int) -> pa.Table:
        return pa.table(
            {
                "id": list(range(lo, lo + n)),
                "v": ["x"] * n,
                PARTITION_COL: pa.array([p] * n, pa.int32()),
                OFFSET_COL: list(range(lo, lo + n)),
                "_ms_tombstone": [False] * n,
            }
        )

    stager = writer_module.RowStager(cat.deep, SPEC)
    stager.add(rows(2, 0, 10))
    with pytest.raises(ValueError, match="partition 1 offset 0 after partition 2 offset 9"):
        stager.add(rows(1, 0, 10))
    stager.abort()
    assert cat.deep.list_files("tables/t") == []
