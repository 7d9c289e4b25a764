"""The ingest path without Spark: the files source's ranges, vectorized decode, and a sink write
task that reads its ranges itself (the source sends only range markers)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from millstream.catalog import Catalog
from millstream.datastream import dead_letter_spec
from millstream.errors import MillstreamError, StagedFileExpiredError
from millstream.ingest.decode import decode_records
from millstream.ingest.sources import files
from millstream.ingest.sources.files import FilesConfig, FilesReader
from millstream.spark.options import SinkOptions
from millstream.spark.sink import SegmentSink
from millstream.spark.sources import markers_batch
from millstream.spec import OFFSET_COL, PARTITION_COL, TOMBSTONE_COL, TableSpec

SCHEMA = {"id": "long", "name": "string", "at": "timestamp"}


def _spec(mode: str = "upsert") -> TableSpec:
    raw: dict[str, object] = {"name": "t", "schema": SCHEMA, "mode": mode}
    if mode != "append":
        raw["primary_key"] = ["id"]
    return TableSpec.parse(raw)


def _raw(records: list[tuple[int, int, bytes | None, bytes | None]]) -> pa.Table:
    return pa.table(
        {
            "partition": pa.array([r[0] for r in records], pa.int32()),
            "offset": pa.array([r[1] for r in records], pa.int64()),
            "key": pa.array([r[2] for r in records], pa.binary()),
            "value": pa.array([r[3] for r in records], pa.binary()),
        }
    )


def _value(i: int, **extra: object) -> bytes:
    return json.dumps({"id": i, "name": f"n{i}", "at": "2026-01-01T00:00:00Z", **extra}).encode()


# -- files source ---------------------------------------------------------------------------


def _lines_of(path: Path) -> list[bytes]:
    lines = path.read_bytes().split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return lines


@pytest.fixture
def source_dir(tmp_path: Path) -> Path:
    d = tmp_path / "src" / "0"
    d.mkdir(parents=True)
    (d / "a.json").write_bytes(b"".join(_value(i) + b"\n" for i in range(files.CHUNK + 7)))
    (d / "b.json").write_bytes(b"")  # an empty file holds no line
    (d / "c.json").write_bytes(b"\n" + _value(-1) + b"\n\n" + _value(-2))  # no final newline
    return tmp_path / "src"


def _read(reader: FilesReader, lo: int, hi: int) -> list[tuple[int, bytes | None]]:
    out: list[tuple[int, bytes | None]] = []
    for b in reader.read_range(0, lo, hi):
        assert b.schema.names == ["partition", "offset", "key", "value"]
        assert b.column("partition").to_pylist() == [0] * b.num_rows
        assert b.column("key").null_count == b.num_rows
        out += zip(b.column("offset").to_pylist(), b.column("value").to_pylist(), strict=True)
    return out


def test_files_source_offsets_are_line_numbers_across_files(source_dir: Path) -> None:
    lines = [line for f in sorted((source_dir / "0").iterdir()) for line in _lines_of(f)]
    lines.pop()  # the last file's last line has no newline yet: not a record yet
    reader = FilesReader(FilesConfig(str(source_dir)))

    assert reader.latest_offsets() == {0: len(lines)}
    assert _read(reader, 0, len(lines)) == list(enumerate(lines))
    # Ranges across a chunk boundary, across files, and ending at the last complete line.
    for lo, hi in [(files.CHUNK - 3, files.CHUNK + 2), (files.CHUNK + 5, files.CHUNK + 8)]:
        assert _read(reader, lo, hi) == [(o, lines[o]) for o in range(lo, hi)]
    assert _read(reader, len(lines) - 1, len(lines)) == [(len(lines) - 1, lines[-1])]


def test_files_source_sees_a_file_grow(source_dir: Path) -> None:
    reader = FilesReader(FilesConfig(str(source_dir)))
    before = reader.latest_offsets()[0]
    with (source_dir / "0" / "c.json").open("ab") as f:
        f.write(b"\n" + _value(-3) + b"\n")  # ends the partial line, then one more

    assert reader.latest_offsets() == {0: before + 2}
    assert _read(reader, before, before + 2) == [(before, _value(-2)), (before + 1, _value(-3))]


# -- decode ---------------------------------------------------------------------------------


def test_decode_pretty_printed_values_missing_keys_and_bad_records() -> None:
    pretty = json.dumps({"id": 5, "name": "p", "at": "2026-01-01T00:00:00Z"}, indent=2).encode()
    records = [
        (1, 10, None, _value(1)),
        (1, 11, None, pretty),  # newlines inside one JSON value
        (1, 12, b"7", json.dumps({"name": "k", "at": "2026-01-01T00:00:00Z"}).encode()),
        (2, 3, None, b"not json"),
        (2, 4, b"8", None),  # a tombstone of key 8
        (2, 5, None, json.dumps({"name": "no key"}).encode()),
    ]

    decoded = decode_records(_spec(), _raw(records))

    rows = decoded.rows.sort_by([(OFFSET_COL, "ascending")]).to_pylist()
    assert [(r[PARTITION_COL], r[OFFSET_COL], r["id"], r[TOMBSTONE_COL]) for r in rows] == [
        (2, 4, 8, True),
        (1, 10, 1, False),
        (1, 11, 5, False),
        (1, 12, 7, False),
    ]
    assert sorted((d[0], d[1]) for d in decoded.dead) == [(2, 3), (2, 5)]
    assert (
        "primary key column 'id' is null" in dict(((d[0], d[1]), d[4]) for d in decoded.dead)[2, 5]
    )


def test_decode_dead_letters_a_non_delete_record_without_the_comparison_value() -> None:
    """Only deletes may lack the comparison value: the merge order derives one for a delete
    (the highest of its key before it), never for an insert or update."""
    spec = TableSpec.parse(
        {
            "name": "t",
            "schema": {**SCHEMA, "gone": "boolean"},
            "primary_key": ["id"],
            "mode": "upsert",
            "comparison_column": "at",
            "delete_column": "gone",
        }
    )
    records = [
        (0, 0, None, _value(1)),
        (0, 1, None, json.dumps({"id": 2, "name": "no at"}).encode()),
        (0, 2, None, json.dumps({"id": 3, "at": None, "gone": False}).encode()),
        (0, 3, None, json.dumps({"id": 4, "gone": True}).encode()),  # a delete: fine
        (0, 4, b"5", None),  # a tombstone: fine
    ]

    decoded = decode_records(spec, _raw(records))

    assert sorted(r[OFFSET_COL] for r in decoded.rows.to_pylist()) == [0, 3, 4]
    errors = {(d[0], d[1]): d[4] for d in decoded.dead}
    assert sorted(errors) == [(0, 1), (0, 2)]
    assert errors[0, 1] == (
        "comparison column 'at' is null (a record that is not a delete must carry it)"
    )
    # Without a comparison column nothing changes.
    plain = decode_records(_spec(), _raw(records[:2]))
    assert (plain.rows.num_rows, plain.dead) == (2, [])


# -- the sink reads its ranges itself ---------------------------------------------------------


@pytest.fixture
def cat(tmp_path: Path) -> Iterator[Catalog]:
    with Catalog.open(home=tmp_path / "home") as catalog:
        yield catalog


def _sink(cat: Catalog, spec: TableSpec, source_dir: Path | None) -> SegmentSink:
    options = {
        **cat.settings.as_options(),
        "table": spec.name,
        "tableSpec": json.dumps(spec.to_json_dict()),
    }
    if source_dir is not None:
        options["sourceKind"] = "files"
        options["sourceConfig"] = json.dumps({"path": str(source_dir)})
    return SegmentSink(SinkOptions.from_options(options))


def test_a_write_task_reads_exactly_its_marked_ranges(cat: Catalog, tmp_path: Path) -> None:
    d = tmp_path / "src"
    for p in (0, 1):
        (d / str(p)).mkdir(parents=True)
        (d / str(p) / "a.json").write_bytes(
            b"".join(_value(i * 2 + p) + b"\n" for i in range(100)) + b"bad line\n"
        )
    spec = _spec()
    ranges = [(0, 10, 40), (1, 95, 101), (1, 101, 101)]  # the last one is empty

    msg = _sink(cat, spec, d).write(iter([markers_batch(ranges)]))

    assert msg.ranges == {0: (10, 40), 1: (95, 101)}
    assert msg.data_counts == {0: 30, 1: 5} and msg.dead_counts == {1: 1}
    assert msg.data_path is not None and msg.dead_path is not None
    rows = cat.deep.read_parquet(msg.data_path)
    assert list(zip(rows[PARTITION_COL].to_pylist(), rows["id"].to_pylist(), strict=True)) == [
        (0, i * 2) for i in range(10, 40)
    ] + [(1, i * 2 + 1) for i in range(95, 100)]
    dead = cat.deep.read_parquet(msg.dead_path).to_pylist()
    assert [(r["partition"], r["offset"], r["raw"]) for r in dead] == [(1, 100, b"bad line")]


def test_a_sink_without_the_source_settings_refuses_range_markers(
    cat: Catalog, tmp_path: Path
) -> None:
    with pytest.raises(MillstreamError, match="range markers"):
        _sink(cat, _spec(), None).write(iter([markers_batch([(0, 0, 10)])]))


def test_the_sink_refuses_files_staged_longer_ago_than_its_max_staged_age(
    cat: Catalog, tmp_path: Path
) -> None:
    """A deployment whose GC runs with a shorter grace period lowers the limit with it (the
    commit-path campaign runs GC with a 1.6 s grace, so its sinks accept 0.8 s)."""
    d = tmp_path / "src"
    (d / "0").mkdir(parents=True)
    (d / "0" / "a.json").write_bytes(b"".join(_value(i) + b"\n" for i in range(5)))
    spec = _spec()
    cat.create_table(spec)
    cat.create_table(dead_letter_spec(spec.name))
    options = SinkOptions.from_options(
        {**_sink(cat, spec, d).opts.to_options(), "maxStagedAge": "0.5"}
    )
    assert options.max_staged_age == 0.5
    assert SinkOptions.from_options(options.to_options()) == options
    sink = SegmentSink(options)
    msg = sink.write(iter([markers_batch([(0, 0, 5)])]))
    assert msg.staged_at is not None
    stale = dataclasses.replace(msg, staged_at=msg.staged_at - 1.0)
    with pytest.raises(StagedFileExpiredError):
        SegmentSink(options).commit([stale], 0)
    assert cat.store.list_shards(spec.name) == [], "nothing was committed"
    SegmentSink(options).commit([SegmentSink(options).write(iter([markers_batch([(0, 0, 5)])]))], 0)
    assert cat.read_table(spec.name).num_rows == 5
