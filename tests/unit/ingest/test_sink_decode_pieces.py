"""A write task decodes its records in pieces of up to ``DECODE_ROWS`` whatever the number of
ranges it read: a decode call has a fixed cost, and one per range made a task reading 256
small partition ranges spend more time decoding than one reading 4 large ones
(bench/scale.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from millstream.catalog import Catalog
from millstream.datastream import dead_letter_spec
from millstream.spark import sink as sink_module
from millstream.spark.options import SinkOptions
from millstream.spark.sink import SegmentSink
from millstream.spark.sources import markers_batch
from millstream.spec import TableSpec

SPEC = TableSpec.parse({"name": "t", "schema": {"id": "long"}, "mode": "append"})
PARTITIONS = 64
PER_PARTITION = 10


@pytest.fixture
def cat(tmp_path: Path) -> Iterator[Catalog]:
    with Catalog.open(home=tmp_path / "home") as catalog:
        catalog.create_table(SPEC)
        catalog.create_table(dead_letter_spec(SPEC))
        yield catalog


def _sink(cat: Catalog, tmp_path: Path) -> SegmentSink:
    src = tmp_path / "src"
    for p in range(PARTITIONS):
        (src / str(p)).mkdir(parents=True)
        lines = [json.dumps({"id": p * 1000 + i}) for i in range(PER_PARTITION)]
        lines[3] = "not json" if p == 5 else lines[3]  # one bad record
        (src / str(p) / "a.json").write_text("".join(line + "\n" for line in lines))
    return SegmentSink(
        SinkOptions.from_options(
            {
                **cat.settings.as_options(),
                "table": "t",
                "tableSpec": json.dumps(SPEC.to_json_dict()),
                "sourceKind": "files",
                "sourceConfig": json.dumps({"path": str(src)}),
            }
        )
    )


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    sizes: list[int] = []
    decode = sink_module.decode_records

    def counted(spec: Any, raw: Any, *args: Any, **kwargs: Any) -> Any:
        sizes.append(raw.num_rows)
        return decode(spec, raw, *args, **kwargs)

    monkeypatch.setattr(sink_module, "decode_records", counted)
    return sizes


@pytest.mark.parametrize("decode_rows", [32_768, 100])
def test_a_task_reading_many_small_ranges_decodes_them_in_full_pieces(
    cat: Catalog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, decode_rows: int
) -> None:
    monkeypatch.setattr(sink_module, "DECODE_ROWS", decode_rows)
    sink = _sink(cat, tmp_path)
    sizes = _counting(monkeypatch)
    ranges = [(p, 0, PER_PARTITION) for p in range(PARTITIONS)]

    staged = sink.write(iter([markers_batch(ranges)]))

    total = PARTITIONS * PER_PARTITION
    assert sum(sizes) == total
    assert max(sizes) <= decode_rows
    assert len(sizes) == -(-total // decode_rows), sizes  # full pieces, not one per range
    assert staged.ranges == {p: (0, PER_PARTITION) for p in range(PARTITIONS)}
    assert staged.data_counts == {
        p: PER_PARTITION - (1 if p == 5 else 0) for p in range(PARTITIONS)
    }
    assert staged.dead_counts == {5: 1}

    SegmentSink(sink.opts).commit([staged], 0)
    ids = sorted(r["id"] for r in cat.read_table("t").to_pylist())
    assert ids == sorted(
        p * 1000 + i for p in range(PARTITIONS) for i in range(PER_PARTITION) if (p, i) != (5, 3)
    )
    (dead,) = cat.read_table("t__dead_letter").to_pylist()
    assert (dead["partition"], dead["offset"]) == (5, 3)
