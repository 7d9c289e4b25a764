"""The ``files`` source: a directory with one subdirectory per partition (named by its number)
holding JSON-lines files read in name order. Offset = line number across the partition.

Offsets are line numbers, so they hold only while a partition's files keep their lines. The
contract (docs/sources.md, "The files source"): a line is a record once its newline is written (a
partial last line, a producer mid-write, is not read yet); only the last file (in name order)
may grow, by appending; a file with a later file after it is complete (its last line is a
record even without a newline) and never changes again; a new file's name sorts after every
file already there; no file is removed, renamed, truncated or rewritten. Temporary files
(names starting with ``.``) are not read. A reader remembers what it counted of every file
(:class:`_Counted`) and refuses, with :class:`~millstream.errors.SourceReadError` naming the
file, the first offset it would shift, and the fix, every listing that breaks the contract:
offsets never shift silently.

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


@dataclass(frozen=True, slots=True)
class LineIndex:
    """A file's line bounds as read: line i is bytes ``[bounds[i], bounds[i + 1] - 1)``; the
    last line has no newline (yet) when ``bounds[-1] > size``."""

    bounds: np.ndarray
    #: the bytes the bounds were found in
    size: int

    @property
    def unterminated(self) -> bool:
        """The last line has no newline: a producer may be writing it."""
        return int(self.bounds[-1]) > self.size

    def lines(self, *, complete: bool) -> int:
        """Lines of the file; a last line without its newline counts only if ``complete``
        (a later file exists, so this one is done)."""
        n = len(self.bounds) - 1
        return n if complete or not self.unterminated else n - 1


class LineIndexCache:
    """Line indexes of recently read files: ``(path, size, mtime_ns)`` -> :class:`LineIndex`.
    Least recently used first out; safe to share between threads."""

    def __init__(self, capacity: int = 512) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        self._bounds: OrderedDict[tuple[str, int, int], LineIndex] = OrderedDict()

    def index(self, path: Path) -> LineIndex:
        st = path.stat()
        key = (str(path), st.st_size, st.st_mtime_ns)
        with self._lock:
            idx = self._bounds.get(key)
            if idx is not None:
                self._bounds.move_to_end(key)
                return idx
        data = np.frombuffer(path.read_bytes(), dtype=np.uint8)
        idx = LineIndex(_line_index(data), len(data))
        if len(data) != st.st_size:
            return idx  # it grew while read: not what the key says, not kept
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


@dataclass(frozen=True, slots=True)
class _Counted:
    """What a reader counted of one file: its size then, its lines counted (a CSV header
    included), the byte after the last of them, whether a later file existed (so the file
    was complete and may no longer change), and the partition offset of its first record."""

    size: int
    lines: int
    end: int
    complete: bool
    first: int


@dataclass(frozen=True, slots=True)
class _Listed:
    """A partition's file as counted: its path and the bounds of its counted lines."""

    path: Path
    bounds: np.ndarray


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
        self._lock = threading.Lock()
        #: per partition, every file name listed so far with what was counted of it (None:
        #: listed, not counted yet), to hold the partition to the files contract
        self._counted: dict[int, dict[str, _Counted | None]] = {}

    @classmethod
    def config_from_spec(cls, fields: dict[str, Any]) -> FilesConfig:
        # lazy: the decoders' libraries (fastavro, protobuf, pydantic) are not for the
        # query's source process, which plans offsets only
        from millstream.ingest.formats import format_config

        return FilesConfig(fields["path"], format_config(fields))

    def __getstate__(self) -> dict[str, Any]:
        # A reader shipped to another process uses that process's cache; it keeps what was
        # counted (a snapshot), so it too refuses a listing that breaks the contract.
        with self._lock:
            counted = {p: dict(files) for p, files in self._counted.items()}
        state = {**self.__dict__, "line_indexes": None, "_counted": counted}
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _index(self, f: Path) -> LineIndex:
        cache = self.line_indexes if self.line_indexes is not None else LINE_INDEXES
        return cache.index(f)

    def _files(self, partition: int) -> list[Path]:
        d = self.root / str(partition)
        return (
            sorted(f for f in d.iterdir() if f.is_file() and not f.name.startswith("."))
            if d.is_dir()
            else []
        )

    def _broken(self, partition: int, f: Path, what: str, first: int | None) -> SourceReadError:
        shift = "later offsets" if first is None else f"offsets from {first} on"
        return SourceReadError(
            f"the files source {self.root}",
            f"file {f.name} {what}. Offsets are line numbers across the partition's files in "
            f"name order, so this would shift {shift} (records read twice or never): only "
            "the last file may grow, by appending lines, and a new file's name must sort "
            "after every file already there (docs/sources.md, 'The files source'). Restore the "
            "files, or roll the table back to before the shifted offsets and restart the "
            "writer",
            partition=partition,
            file=str(f),
        )

    def _scan(self, partition: int, upto: int | None = None) -> list[_Listed]:
        """The partition's files in name order with the bounds of the lines counted of each,
        held to what this reader counted before (the files contract, in the module's
        docstring); with ``upto``, only as far as the file that holds offset ``upto - 1``.

        A file's last line without its newline is not counted unless a later file exists
        (then this one is complete): a producer may still be writing it. One scan of a reader
        at a time: scans racing would hold each other's later counts against older ones."""
        header = int(self.config.header_lines)
        with self._lock:
            files = self._files(partition)
            known = self._counted.setdefault(partition, {})
            names = {f.name for f in files}
            for name, c in known.items():
                if name not in names:
                    gone = self.root / str(partition) / name
                    first = None if c is None else c.first
                    raise self._broken(partition, gone, "was removed or renamed", first)
            last = max(known, default=None)
            for f in files:
                if f.name not in known and last is not None and f.name < last:
                    after = [c.first for n, c in known.items() if n > f.name and c is not None]
                    raise self._broken(
                        partition,
                        f,
                        f"is new and sorts before {last}, which was already listed",
                        min(after, default=None),
                    )
                known.setdefault(f.name, None)
            out: list[_Listed] = []
            base = 0
            for i, f in enumerate(files):
                if upto is not None and base >= upto:
                    break
                idx = self._index(f)
                complete = i < len(files) - 1
                n = idx.lines(complete=complete)
                self._check(partition, f, idx, n, complete, base)
                out.append(_Listed(f, idx.bounds[: n + 1]))
                base += max(0, n - header)
            return out

    def _check(
        self, partition: int, f: Path, idx: LineIndex, lines: int, complete: bool, first: int
    ) -> None:
        """Hold ``f``, counted now (``lines`` from offset ``first``), to what was counted of it
        before, and remember it. The caller holds the lock."""
        known = self._counted.setdefault(partition, {})
        prev = known.get(f.name)
        if prev is not None:
            if idx.size < prev.size:
                raise self._broken(
                    partition, f, f"shrank from {prev.size} to {idx.size} bytes", prev.first
                )
            if prev.complete and idx.size != prev.size:
                raise self._broken(
                    partition,
                    f,
                    f"changed ({prev.size} then {idx.size} bytes) after a later file appeared",
                    prev.first + prev.lines,
                )
            if lines < prev.lines or int(idx.bounds[prev.lines]) != prev.end:
                raise self._broken(
                    partition,
                    f,
                    f"was rewritten: its first {prev.lines} lines no longer end at byte {prev.end}",
                    prev.first,
                )
        known[f.name] = _Counted(idx.size, lines, int(idx.bounds[lines]), complete, first)

    @staticmethod
    def _records(listed: _Listed, header: int) -> int:
        return max(0, len(listed.bounds) - 1 - header)

    def record_bytes(self) -> float | None:
        """Mean line length over the files (from the cached line indexes that
        :meth:`latest_offsets` builds anyway)."""
        size = lines = 0
        header = int(self.config.header_lines)
        for p in self.list_partitions():
            for listed in self._scan(p):
                size += int(listed.bounds[-1])
                lines += self._records(listed, header)
        return size / lines if lines else None

    def list_partitions(self) -> list[int]:
        return sorted(int(d.name) for d in self.root.iterdir() if d.is_dir() and d.name.isdigit())

    def earliest_offsets(self) -> dict[int, int]:
        return dict.fromkeys(self.list_partitions(), 0)

    def latest_offsets(self) -> dict[int, int]:
        header = int(self.config.header_lines)
        return {
            p: sum(self._records(listed, header) for listed in self._scan(p))
            for p in self.list_partitions()
        }

    def read_range(self, partition: int, lo: int, hi: int) -> Iterator[pa.RecordBatch]:
        base = 0
        for listed in self._scan(partition, upto=hi):
            f, full = listed.path, listed.bounds
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
        if base < hi:
            # A planned range the files no longer hold (a file shrank or was removed before
            # this reader listed it): its missing records must not pass as read.
            raise SourceReadError(
                f"the files source {self.root}",
                f"offsets [{lo}, {hi}) were planned but its files hold {base} complete lines "
                "now: a file shrank or was removed (docs/sources.md, 'The files source')",
                partition=partition,
            )
