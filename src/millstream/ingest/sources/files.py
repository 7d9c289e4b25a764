"""The ``files`` source: a directory with one subdirectory per partition (named by its number)
holding JSON-lines files read in name order. Offset = line number across the partition.

With ``format: csv`` the first line of every file is its header: it is not a record (offsets
count data lines only) and every record of the file carries it as its key, so the decoder
matches columns by name even when files order them differently. A CSV record is one line: a
quoted value must not hold a newline.

Reading is vectorized: a file's line starts are found once with numpy (and kept in a
:class:`LineIndexCache`, keyed by path, size and modification time), and a range of lines
becomes one Arrow binary array built straight from the file's bytes, without a Python object
per line.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from millstream.errors import InvalidSpecError, SourceReadError
from millstream.ingest.sources.base import PartitionReader

CHUNK = 32768


@dataclass(frozen=True, slots=True)
class FilesConfig:
    path: str
    #: the record format (:func:`millstream.ingest.formats.format_config`)
    format: dict[str, Any] = field(default_factory=dict)

    @property
    def header_lines(self) -> int:
        return 1 if self.format.get("format") == "csv" else 0

    def __post_init__(self) -> None:
        if not self.path or not Path(self.path).is_dir():
            raise InvalidSpecError("source.path", f"{self.path!r} is not a directory")


def _line_index(data: np.ndarray) -> np.ndarray:
    """Start of every line plus one past the end of the last (with its newline, if any)."""
    nl = np.flatnonzero(data == 10)
    ends = nl + 1
    if len(data) and data[-1] != 10:
        ends = np.append(ends, len(data) + 1)  # as if the last line had a newline
    return np.concatenate(([0], ends)).astype(np.int64)


class LineIndexCache:
    """Line bounds of recently read files: ``(path, size, mtime_ns)`` -> bounds, where line i
    is bytes ``[bounds[i], bounds[i + 1] - 1)`` (the last one ending at the file's end when it
    has no trailing newline). Least recently used first out; safe to share between threads."""

    def __init__(self, capacity: int = 512) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        self._bounds: OrderedDict[tuple[str, int, int], np.ndarray] = OrderedDict()

    def bounds(self, path: Path) -> np.ndarray:
        st = path.stat()
        key = (str(path), st.st_size, st.st_mtime_ns)
        with self._lock:
            idx = self._bounds.get(key)
            if idx is not None:
                self._bounds.move_to_end(key)
                return idx
        idx = _line_index(np.frombuffer(path.read_bytes(), dtype=np.uint8))
        with self._lock:
            self._bounds[key] = idx
            while len(self._bounds) > self.capacity:
                self._bounds.popitem(last=False)
        return idx

    def clear(self) -> None:
        with self._lock:
            self._bounds.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._bounds)


#: The cache of this process; a reader uses it unless it is given its own.
LINE_INDEXES = LineIndexCache()


def _same_bytes(value: bytes, n: int) -> pa.Array:
    """``value`` ``n`` times, as one binary array (one copy, no Python object per row)."""
    offsets = np.arange(n + 1, dtype=np.int64) * len(value)
    if len(value) * n >= 2**31 - 1:
        return pa.array([value] * n, pa.binary())
    return pa.Array.from_buffers(
        pa.binary(), n, [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(value * n)]
    )


def _lines_batch(
    partition: int,
    first_offset: int,
    data: np.ndarray,
    bounds: np.ndarray,
    key: bytes | None = None,
) -> pa.RecordBatch:
    """Lines ``[bounds[i], bounds[i + 1] - 1)`` of ``data`` (``bounds`` relative to ``data``) as
    a records batch: the newlines are dropped and the values laid out back to back; every
    record's key is ``key``."""
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
            pa.nulls(n, pa.binary()) if key is None else _same_bytes(key, n),
            values,
        ],
        names=["partition", "offset", "key", "value"],
    )


class FilesReader(PartitionReader):
    kind = "files"
    Config = FilesConfig

    def __init__(
        self,
        config: FilesConfig,
        *,
        start_offsets: dict[int, int] | None = None,
        line_indexes: LineIndexCache | None = None,
    ) -> None:
        super().__init__(config, start_offsets=start_offsets)
        self.root = Path(config.path)
        self.line_indexes = line_indexes

    @classmethod
    def config_from_spec(cls, fields: dict[str, Any]) -> FilesConfig:
        # lazy: the decoders' libraries (fastavro, protobuf, pydantic) are not for the
        # query's source process, which plans offsets only
        from millstream.ingest.formats import format_config

        return FilesConfig(fields["path"], format_config(fields))

    def __getstate__(self) -> dict[str, Any]:
        # A reader shipped to another process uses that process's cache.
        return {**self.__dict__, "line_indexes": None}

    def _index(self, f: Path) -> np.ndarray:
        cache = self.line_indexes if self.line_indexes is not None else LINE_INDEXES
        return cache.bounds(f)

    def _files(self, partition: int) -> list[Path]:
        d = self.root / str(partition)
        return (
            sorted(f for f in d.iterdir() if f.is_file() and not f.name.startswith("."))
            if d.is_dir()
            else []
        )

    def _count(self, f: Path) -> int:
        return max(0, len(self._index(f)) - 1 - int(self.config.header_lines))

    def record_bytes(self) -> float | None:
        """Mean line length over the files (sizes from ``stat``, line counts from the cached
        line indexes that :meth:`latest_offsets` builds anyway)."""
        size = lines = 0
        for p in self.list_partitions():
            for f in self._files(p):
                size += f.stat().st_size
                lines += self._count(f)
        return size / lines if lines else None

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
            full = self._index(f)
            skip = min(self.config.header_lines, len(full) - 1)
            idx = full[skip:]  # the header line (csv) is no record
            n = len(idx) - 1
            if base + n > lo:
                start, stop = max(lo - base, 0), min(hi - base, n)
                with f.open("rb") as fh:
                    header = None
                    if skip:
                        header = fh.read(int(full[1]) - 1).rstrip(b"\r")
                    for i in range(start, stop, CHUNK):
                        j = min(stop, i + CHUNK)
                        first, last = int(idx[i]), int(idx[j])
                        fh.seek(first)
                        data = np.frombuffer(fh.read(last - first), dtype=np.uint8)
                        yield _lines_batch(
                            partition, base + i, data, idx[i : j + 1] - first, header
                        )
            base += n
