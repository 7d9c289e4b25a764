"""The ``files`` source: a directory with one subdirectory per partition (named by its number)
holding JSON-lines files read in name order. Offset = line number across the partition.

Reading is vectorized: a file's line starts are found once with numpy (and cached per process,
keyed by path, size and modification time), and a range of lines becomes one Arrow binary
array built straight from the file's bytes, without a Python object per line.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader

from millstream.errors import InvalidSpecError, SourceReadError
from millstream.ingest.sources.base import RAW_DDL, PartitionedStreamReader
from millstream.options import Options

CHUNK = 32768
_INDEX_CACHE = 512  # files whose line index a process keeps

#: (path, size, mtime_ns) -> line bounds: line i is bytes [bounds[i], bounds[i + 1] - 1), the
#: last one ending at the file's end when it has no trailing newline.
_INDEXES: OrderedDict[tuple[str, int, int], np.ndarray] = OrderedDict()


def _line_index(data: np.ndarray) -> np.ndarray:
    """Start of every line plus one past the end of the last (with its newline, if any)."""
    nl = np.flatnonzero(data == 10)
    ends = nl + 1
    if len(data) and data[-1] != 10:
        ends = np.append(ends, len(data) + 1)  # as if the last line had a newline
    return np.concatenate(([0], ends)).astype(np.int64)


def _index(path: Path) -> np.ndarray:
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    idx = _INDEXES.get(key)
    if idx is None:
        idx = _line_index(np.frombuffer(path.read_bytes(), dtype=np.uint8))
        _INDEXES[key] = idx
        while len(_INDEXES) > _INDEX_CACHE:
            _INDEXES.popitem(last=False)
    else:
        _INDEXES.move_to_end(key)
    return idx


def _lines_batch(
    partition: int, first_offset: int, data: np.ndarray, bounds: np.ndarray
) -> pa.RecordBatch:
    """Lines ``[bounds[i], bounds[i + 1] - 1)`` of ``data`` (``bounds`` relative to ``data``) as
    a records batch: the newlines are dropped and the values laid out back to back."""
    n = len(bounds) - 1
    ends = bounds[1:] - 1
    if len(data) < int(ends[-1]):
        raise SourceReadError(
            "the source files", "a source file changed while it was read", partition=partition
        )
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(ends - bounds[:-1], out=offsets[1:])
    keep = np.ones(int(ends[-1]), dtype=bool)
    keep[ends[ends < len(keep)]] = False  # the newline after each line
    body = data[: len(keep)][keep]
    if offsets[-1] < 2**31 - 1:
        values = pa.Array.from_buffers(
            pa.binary(), n, [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(body)]
        )
    else:
        values = pa.Array.from_buffers(
            pa.large_binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(body)]
        ).cast(pa.binary())
    return pa.RecordBatch.from_arrays(
        [
            pa.array(np.full(n, partition, dtype=np.int32)),
            pa.array(np.arange(first_offset, first_offset + n, dtype=np.int64)),
            pa.nulls(n, pa.binary()),
            values,
        ],
        names=["partition", "offset", "key", "value"],
    )


class FilesStreamReader(PartitionedStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.root = Path(options.get("path", ""))
        if not options.get("path") or not self.root.is_dir():
            raise InvalidSpecError("source.path", f"{str(self.root)!r} is not a directory")

    def _files(self, partition: int) -> list[Path]:
        d = self.root / str(partition)
        return (
            sorted(f for f in d.iterdir() if f.is_file() and not f.name.startswith("."))
            if d.is_dir()
            else []
        )

    @staticmethod
    def _count(f: Path) -> int:
        return len(_index(f)) - 1

    def list_partitions(self) -> list[int]:
        return sorted(int(d.name) for d in self.root.iterdir() if d.is_dir() and d.name.isdigit())

    def earliest_offsets(self) -> dict[int, int]:
        return dict.fromkeys(self.list_partitions(), 0)

    def latest_offsets(self) -> dict[int, int]:
        return {p: sum(self._count(f) for f in self._files(p)) for p in self.list_partitions()}

    def read_range(self, partition: int, lo: int, hi: int) -> Iterator[pa.RecordBatch]:
        base = 0
        for f in self._files(partition):
            if base >= hi:
                break
            idx = _index(f)
            n = len(idx) - 1
            if base + n > lo:
                start, stop = max(lo - base, 0), min(hi - base, n)
                with f.open("rb") as fh:
                    for i in range(start, stop, CHUNK):
                        j = min(stop, i + CHUNK)
                        first, last = int(idx[i]), int(idx[j])
                        fh.seek(first)
                        data = np.frombuffer(fh.read(last - first), dtype=np.uint8)
                        yield _lines_batch(partition, base + i, data, idx[i : j + 1] - first)
            base += n


class FilesDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "millstream_files"

    def schema(self) -> str:
        return RAW_DDL

    def streamReader(self, schema: object) -> DataSourceStreamReader:
        return FilesStreamReader(Options(self.options))
