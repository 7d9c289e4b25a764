"""The ``files`` source: a directory with one subdirectory per partition (named by its number)
holding JSON-lines files read in name order. Offset = line number across the partition."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader

from millstream.errors import InvalidSpecError
from millstream.ingest.sources.base import RAW_DDL, PartitionedStreamReader, records_batch
from millstream.options import Options

CHUNK = 65536


def _lines(path: Path) -> list[bytes]:
    data = path.read_bytes()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return lines


class FilesStreamReader(PartitionedStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.root = Path(options.get("path", ""))
        if not options.get("path") or not self.root.is_dir():
            raise InvalidSpecError("source.path", f"{str(self.root)!r} is not a directory")
        self._counts: dict[tuple[str, int, float], int] = {}

    def _files(self, partition: int) -> list[Path]:
        d = self.root / str(partition)
        return (
            sorted(f for f in d.iterdir() if f.is_file() and not f.name.startswith("."))
            if d.is_dir()
            else []
        )

    def _count(self, f: Path) -> int:
        st = f.stat()
        key = (str(f), st.st_size, st.st_mtime)
        if key not in self._counts:
            self._counts[key] = len(_lines(f))
        return self._counts[key]

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
            n = self._count(f)
            if base + n > lo:
                lines = _lines(f)
                start, stop = max(lo - base, 0), min(hi - base, n)
                for i in range(start, stop, CHUNK):
                    chunk = lines[i : min(stop, i + CHUNK)]
                    offsets = list(range(base + i, base + i + len(chunk)))
                    yield records_batch(partition, offsets, [None] * len(chunk), list(chunk))
            base += n


class FilesDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "millstream_files"

    def schema(self) -> str:
        return RAW_DDL

    def streamReader(self, schema: object) -> DataSourceStreamReader:
        return FilesStreamReader(Options(self.options))
