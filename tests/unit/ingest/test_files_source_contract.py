"""The files source's contract (docs/sources.md, "The files source"): a line is a record once
its newline is written; only the last file of a partition grows, by appending; a file with a later file
after it is complete; a new file's name sorts after every file already there; nothing is
removed, renamed, truncated or rewritten. A reader refuses every listing that breaks it,
naming the file, instead of shifting offsets (offsets are line numbers across the files).

Before, a half-written last line (a producer mid-write) was planned: dead-lettered as invalid
JSON, and the frontier moved past it, so the completed line was never read; and a new file
sorting before a read one shifted every later offset (records read twice or never).

The stream source is driven as Spark's micro-batch loop drives it (``latestOffset`` from the
previous end, ``partitions`` between the two), each planned task's markers made by a second
:class:`StreamReader` (an executor's) and their ranges read as the sink reads them, without a
SparkSession."""

from __future__ import annotations

import collections
import json
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from millstream.errors import SourceReadError
from millstream.ingest.sources import reader_for
from millstream.ingest.sources.files import FilesConfig, FilesReader
from millstream.spark.options import SourceOptions
from millstream.spark.sources import RangeTask, StreamReader, marked_ranges


class Query:
    """Spark's micro-batch loop over a files source: what its tasks read."""

    def __init__(self, root: Path, max_records_per_batch: int | None = None, tasks: int = 2):
        options = SourceOptions(
            "files", {"path": str(root)}, tasks=tasks, max_records_per_batch=max_records_per_batch
        )
        self.planner = StreamReader(options)
        self.executor = StreamReader(options)
        # the sink's reader: of the source's kind and config (SinkOptions.source_reader)
        self.sink_reader = reader_for(options.kind, options.config)
        self.start: dict[str, Any] = self.planner.initialOffset()
        self.values: collections.Counter[bytes] = collections.Counter()
        self.offsets: dict[int, collections.Counter[int]] = collections.defaultdict(
            collections.Counter
        )

    def batch(self) -> bool:
        end = self.planner.latestOffset(self.start, self.planner.getDefaultReadLimit())
        if end == self.start:
            return False
        for task in self.planner.partitions(self.start, end):
            assert isinstance(task, RangeTask)
            # as the sink does: the task's markers name the ranges it reads from the source
            markers = pa.Table.from_batches(list(self.executor.read(task)))
            for batch in self.sink_reader.read_records(marked_ranges(markers)):
                rows = batch.to_pydict()
                for p, o, value in zip(
                    rows["partition"], rows["offset"], rows["value"], strict=True
                ):
                    self.values[value] += 1
                    self.offsets[p][o] += 1
        self.start = end
        return True

    def drain(self) -> None:
        for _ in range(1000):
            if not self.batch():
                return
        raise AssertionError("the query kept planning batches with nothing new")


def _reader(root: Path) -> FilesReader:
    return FilesReader(FilesConfig(str(root)))


def test_a_half_written_last_line_is_read_once_its_newline_is_written(tmp_path: Path) -> None:
    (tmp_path / "0").mkdir()
    f = tmp_path / "0" / "00000.jsonl"
    f.write_bytes(b'{"id": 1, "state": "new"}\n{"id": 2, "sta')  # the producer mid-write
    query = Query(tmp_path)
    query.batch()
    query.batch()
    assert query.values == {b'{"id": 1, "state": "new"}': 1}, "the partial line was read"
    with f.open("ab") as out:
        out.write(b'te": "new"}\n')
    query.drain()
    assert query.values == {b'{"id": 1, "state": "new"}': 1, b'{"id": 2, "state": "new"}': 1}
    assert query.offsets[0] == {0: 1, 1: 1}


def test_the_last_line_of_a_file_with_a_later_file_is_a_record(tmp_path: Path) -> None:
    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "a.jsonl").write_bytes(b'{"id": 1}\n{"id": 2}')  # no final newline
    reader = _reader(tmp_path)
    assert reader.latest_offsets() == {0: 1}
    (tmp_path / "0" / "b.jsonl").write_bytes(b'{"id": 3}\n')  # a is complete now
    assert reader.latest_offsets() == {0: 3}
    values = [v for b in reader.read_range(0, 0, 3) for v in b.column("value").to_pylist()]
    assert values == [b'{"id": 1}', b'{"id": 2}', b'{"id": 3}']


def test_a_csv_files_half_written_row_or_header_is_no_record(tmp_path: Path) -> None:
    d = tmp_path / "0"
    d.mkdir()
    (d / "a.csv").write_bytes(b"id,status\n1,new\n2,new")  # no final newline (yet?)
    reader = FilesReader(FilesConfig(str(tmp_path), {"format": "csv"}))
    assert reader.latest_offsets() == {0: 1}
    (d / "b.csv").write_bytes(b"id,sta")  # a is complete now; b's header is half-written
    assert reader.latest_offsets() == {0: 2}
    rows = [
        (k, v)
        for b in reader.read_range(0, 0, 2)
        for k, v in zip(b.column("key").to_pylist(), b.column("value").to_pylist(), strict=True)
    ]
    assert rows == [(b"id,status", b"1,new"), (b"id,status", b"2,new")]
    with (d / "b.csv").open("ab") as out:
        out.write(b"tus\n3,old\n")
    assert reader.latest_offsets() == {0: 3}
    assert [v for b in reader.read_range(0, 2, 3) for v in b.column("value").to_pylist()] == [
        b"3,old"
    ]


def _broken(reader: FilesReader, match: str) -> str:
    with pytest.raises(SourceReadError, match=match) as raised:
        reader.latest_offsets()
    text = str(raised.value)
    assert "partition 0" in text and "docs/sources.md, 'The files source'" in text
    return text


def test_a_new_file_sorting_before_a_listed_one_is_refused_naming_it(tmp_path: Path) -> None:
    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "a.jsonl").write_bytes(b"{}\n" * 4)
    (tmp_path / "0" / "c.jsonl").write_bytes(b"{}\n" * 3)
    reader = _reader(tmp_path)
    assert reader.latest_offsets() == {0: 7}
    (tmp_path / "0" / "b.jsonl").write_bytes(b"{}\n" * 2)  # would shift c's offsets 4..6
    text = _broken(reader, r"file b\.jsonl is new and sorts before c\.jsonl")
    assert "offsets from 4 on" in text
    # A copy of the reader shipped to a task holds what was counted too.
    _broken(pickle.loads(pickle.dumps(reader)), r"file b\.jsonl is new")


def test_a_file_that_shrank_was_rewritten_or_removed_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "0"
    d.mkdir()
    (d / "a.jsonl").write_bytes(b'{"v": 1}\n' * 3)
    (d / "b.jsonl").write_bytes(b'{"v": 1}\n' * 3)
    reader = _reader(tmp_path)
    assert reader.latest_offsets() == {0: 6}

    (d / "b.jsonl").write_bytes(b'{"v": 1}\n' * 2)
    assert "offsets from 3 on" in _broken(reader, r"file b\.jsonl shrank from 27 to 18 bytes")

    (d / "b.jsonl").write_bytes(b'{"v": 1}\n' * 3)
    assert reader.latest_offsets() == {0: 6}  # restored: read on
    (d / "b.jsonl").write_bytes(b'{"v": 12}\n{"v": 1}\n' + b'{"v": 1}\n')
    _broken(reader, r"file b\.jsonl was rewritten: its first 3 lines no longer end at byte 27")

    (d / "b.jsonl").write_bytes(b'{"v": 1}\n' * 3)
    with (d / "a.jsonl").open("ab") as out:  # a has a later file: it is complete
        out.write(b'{"v": 2}\n')
    text = _broken(reader, r"file a\.jsonl changed \(27 then 36 bytes\) after a later file")
    assert "offsets from 3 on" in text

    (d / "a.jsonl").write_bytes(b'{"v": 1}\n' * 3)
    (d / "a.jsonl").rename(d / ".a.jsonl")
    _broken(reader, r"file a\.jsonl was removed or renamed")


def test_a_range_the_files_no_longer_hold_is_an_error_not_a_short_read(tmp_path: Path) -> None:
    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "a.jsonl").write_bytes(b"{}\n" * 3)
    # a task's reader that never listed the partition before: offsets 3..4 were planned from
    # lines that are gone; a short read would let the range pass as read, records missing
    with pytest.raises(SourceReadError, match=r"offsets \[0, 5\) were planned .* hold 3"):
        list(_reader(tmp_path).read_range(0, 0, 5))


class Producer:
    """Writes JSON lines into a files source as the contract allows, in pieces: a line may be
    left half-written (no newline yet) while batches are planned; a new file (written under a
    hidden name, then renamed) sorts after every other, and the file before it is finished
    first, with or without a final newline."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files: dict[int, int] = {}  # partition -> files made
        self.written = 0
        self.complete: list[bytes] = []  # every line that is a record
        self.partial: dict[int, bytes] = {}  # partition -> the line being written (all of it)
        self.done: dict[int, int] = {}  # partition -> bytes of the partial line written

    def _line(self, p: int) -> bytes:
        self.written += 1
        return json.dumps({"p": p, "i": self.written, "pad": "x" * (self.written % 13)}).encode()

    def _last(self, p: int) -> Path:
        return self.root / str(p) / f"{self.files[p] - 1:05d}.jsonl"

    def _new_file(self, p: int, body: bytes) -> None:
        d = self.root / str(p)
        d.mkdir(exist_ok=True)
        tmp = d / f".{self.files.get(p, 0):05d}.tmp"
        tmp.write_bytes(body)
        self.files[p] = self.files.get(p, 0) + 1
        os.replace(tmp, self._last(p))

    def _finish(self, p: int, newline: bool) -> bytes:
        line = self.partial.pop(p, None)
        if line is None:
            return b""
        rest = line[self.done.pop(p) :]
        self.complete.append(line)
        return rest + (b"\n" if newline else b"")

    def write(self, p: int, lines: int, cut: int) -> None:
        """Finish the partial line, append ``lines`` lines and start one (``cut`` bytes of it)."""
        body = self._finish(p, newline=True)
        for _ in range(lines):
            line = self._line(p)
            self.complete.append(line)
            body += line + b"\n"
        if cut:
            line = self._line(p)
            self.partial[p], self.done[p] = line, min(cut, len(line) - 1)
            body += line[: self.done[p]]
        if p not in self.files:
            self._new_file(p, body)
        else:
            with self._last(p).open("ab") as out:
                out.write(body)

    def rotate(self, p: int, newline: bool, lines: int) -> None:
        """Finish the last file (its last line with or without a newline), then a new file."""
        if p in self.files:
            with self._last(p).open("ab") as out:
                out.write(self._finish(p, newline))
        body = b""
        for _ in range(lines):
            line = self._line(p)
            self.complete.append(line)
            body += line + b"\n"
        self._new_file(p, body)


@settings(max_examples=80, deadline=None, print_blob=True)
@given(
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("write"), st.integers(0, 2), st.integers(0, 6), st.integers(0, 30)),
            st.tuples(st.just("rotate"), st.integers(0, 2), st.booleans(), st.integers(0, 4)),
            st.tuples(st.just("batch"), st.just(0), st.just(0), st.just(0)),
        ),
        max_size=40,
    ),
    max_records_per_batch=st.sampled_from([None, 1, 4, 50]),
    tasks=st.integers(1, 3),
)
def test_every_complete_line_is_read_once_and_no_partial_line_ever(
    steps: list[tuple[str, int, Any, int]], max_records_per_batch: int | None, tasks: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        producer = Producer(root)
        query = Query(root, max_records_per_batch, tasks)
        for kind, p, a, b in steps:
            if kind == "write":
                producer.write(p, a, b)
            elif kind == "rotate":
                producer.rotate(p, bool(a), b)
            else:
                query.batch()
            partial = [v for v in query.values if v not in set(producer.complete)]
            assert not partial, f"a line read before it was complete: {partial[:3]}"
        query.drain()
        assert query.values == collections.Counter(producer.complete), "a line lost or doubled"
        for p, offsets in query.offsets.items():
            assert offsets == collections.Counter(range(len(offsets))), f"partition {p}"
