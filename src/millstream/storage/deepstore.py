"""The deep store: where segment data files live (a local directory or an S3 bucket).

Paths recorded in the manifest are *relative* to the deep store root, so a deployment can move
its root without rewriting metadata. A data file is written once under a unique name; it is
"staged" until a manifest entry references it, and garbage once nothing does (see
:mod:`millstream.table.gc`). Both backends go through ``pyarrow.fs``.

A file written to a local store is fsynced, with its directory (its new name) and the
directories above it up to the root whose names this process has not made durable yet (any
directory created for it), before the write returns: the manifest commit that references it
comes after, in a metadata store that is durable, and a power loss must not leave it
referencing a file whose data was only in the page cache. A file system that cannot sync a
directory (EINVAL, ENOTSUP...) has it skipped, as PostgreSQL does. An S3 put is durable once
it returns.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from millstream.errors import InvalidSpecError


@dataclass(frozen=True, slots=True)
class StoredFile:
    path: str
    size: int
    mtime: datetime | None


def dictionary_columns(table: pa.Table) -> bool | list[str]:
    """The columns of ``table`` worth dictionary-encoding in Parquet: those where at most half
    the values are distinct. A dictionary cannot halve a column whose values are mostly
    distinct (ids, timestamps, offsets), and costs a lookup per value to decode; where such
    values are ordered (a sealed file's keys), zstd on the plain values is about half the size
    of the dictionary's. True (every column, pyarrow's default) for a table with a nested
    column: its leaves are named by paths, not by the column."""
    if any(pa.types.is_nested(f.type) for f in table.schema):
        return True
    n: int = table.num_rows

    def worth_it(column: pa.ChunkedArray) -> bool:
        try:
            return n == 0 or 2 * int(pc.count_distinct(column, mode="all").as_py()) <= n
        except pa.ArrowNotImplementedError:  # a type it cannot count: pyarrow's default
            return True

    return [
        name
        for name, column in zip(table.column_names, table.columns, strict=True)
        if worth_it(column)
    ]


#: A data file at most this large is read whole, in one request, and decoded on the reading
#: thread (:meth:`DeepStore.read_parquet_choosing`).
SMALL_FILE_BYTES = 1 << 20


class DeepStore:
    """A file system plus a root. All methods take paths relative to the root."""

    def __init__(self, fs: pafs.FileSystem, root: str, uri: str) -> None:
        self.fs = fs
        self.root = root.rstrip("/")
        self.uri = uri
        #: fsync each file written (and its directories) before the write returns: a local
        #: store's files (see the module's docstring)
        self.durable_writes = isinstance(fs, pafs.LocalFileSystem)
        #: the files are on this machine's file system: a read costs no request's latency
        self.local = isinstance(fs, pafs.LocalFileSystem)
        #: (directory, inode) whose name in its parent this process made durable (synced the
        #: parent since): :meth:`_make_durable` syncs such a parent no more
        self._named_dirs: set[tuple[str, int]] = set()

    @classmethod
    def from_uri(cls, uri: str, *, s3_endpoint: str | None = None) -> DeepStore:
        """``/abs/dir``, ``file:///abs/dir`` or ``s3://bucket/prefix``.

        For S3 the endpoint comes from ``s3_endpoint``, else ``MILLSTREAM_S3_ENDPOINT`` or
        ``AWS_ENDPOINT_URL`` (e.g. ``http://127.0.0.1:9000``); credentials and region come
        from the usual AWS environment variables.
        """
        parsed = urlparse(uri)
        if parsed.scheme in ("", "file"):
            root = Path(parsed.path if parsed.scheme else uri).resolve()
            root.mkdir(parents=True, exist_ok=True)
            return cls(pafs.LocalFileSystem(), str(root), uri)
        if parsed.scheme == "s3":
            if not parsed.netloc:
                raise InvalidSpecError("deep_store", f"{uri!r} names no bucket")
            endpoint = (
                s3_endpoint
                or os.environ.get("MILLSTREAM_S3_ENDPOINT")
                or os.environ.get("AWS_ENDPOINT_URL")
            )
            kwargs: dict[str, object] = {
                "region": os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
            }
            if endpoint:
                ep = urlparse(endpoint)
                kwargs["endpoint_override"] = ep.netloc or ep.path
                kwargs["scheme"] = ep.scheme or "https"
            if os.environ.get("AWS_ACCESS_KEY_ID"):
                kwargs["access_key"] = os.environ["AWS_ACCESS_KEY_ID"]
                kwargs["secret_key"] = os.environ.get("AWS_SECRET_ACCESS_KEY", "")
            fs = pafs.S3FileSystem(**kwargs)
            return cls(fs, f"{parsed.netloc}{parsed.path}".rstrip("/"), uri)
        raise InvalidSpecError("deep_store", f"unsupported scheme {parsed.scheme!r} in {uri!r}")

    def _abs(self, path: str) -> str:
        if path.startswith("/") or ".." in path.split("/"):
            raise InvalidSpecError("path", f"{path!r} must be relative to the deep store root")
        return f"{self.root}/{path}"

    def write_parquet(
        self,
        path: str,
        table: pa.Table,
        *,
        row_group_size: int | None = None,
        dictionary: bool | Sequence[str] = True,
        durable: bool = True,
    ) -> int:
        """Write ``table`` to ``path``; returns the file size in bytes. ``dictionary``: which
        columns are dictionary-encoded (all by default; see :func:`dictionary_columns`).
        ``durable=False``: not synced here; the caller syncs it (:meth:`sync_files`) before
        anything durable names it."""
        full = self._abs(path)
        parent = full.rsplit("/", 1)[0]
        self.fs.create_dir(parent, recursive=True)
        pq.write_table(
            table,
            full,
            filesystem=self.fs,
            row_group_size=row_group_size,
            compression="zstd",
            use_dictionary=dictionary if isinstance(dictionary, bool) else list(dictionary),
        )
        if durable:
            self._make_durable(full)
        return int(self.fs.get_file_info(full).size or 0)

    def parquet_writer(self, path: str, schema: pa.Schema) -> pq.ParquetWriter:
        """A Parquet writer of ``path`` (zstd, pyarrow's default dictionaries), for a file
        written a piece at a time; the caller closes it (then :meth:`size`)."""
        full = self._abs(path)
        self.fs.create_dir(full.rsplit("/", 1)[0], recursive=True)
        return pq.ParquetWriter(full, schema, filesystem=self.fs, compression="zstd")

    def sync(self, path: str) -> None:
        """Make the file at ``path``, written and closed through :meth:`parquet_writer`,
        durable before a commit references it (a local store's: see the module's docstring)."""
        self._make_durable(self._abs(path))

    def sync_files(self, paths: Iterable[str]) -> None:
        """Make the files at ``paths``, written and closed but not synced, durable: each
        file's data, then each of their directories once (the files' names in it) and the
        names above it as :meth:`sync` does, so files written into one directory together
        cost one directory sync, not one each."""
        if not self.durable_writes:
            return
        files = [self._abs(p) for p in paths]
        for each in files:
            _fsync(each)
        for directory in sorted({each.rsplit("/", 1)[0] for each in files}):
            self._name_durable(directory)

    def _make_durable(self, full: str) -> None:
        if not self.durable_writes:
            return
        _fsync(full)
        self._name_durable(full.rsplit("/", 1)[0])

    def _name_durable(self, directory: str) -> None:
        # the names in the directory always; then each directory's name in its parent, up to
        # the root, unless this process synced that parent since the directory (this very
        # one: same inode) was there: one may have been created for this file, by this
        # process or another. A batch's files share their directories: one sync each.
        parts = directory[len(self.root) + 1 :].split("/") if directory != self.root else []
        dirs = ["/".join([self.root, *parts[:i]]) for i in range(len(parts) + 1)]
        _fsync_dir(dirs[-1])
        named: list[tuple[str, int]] = []
        for i in range(len(dirs) - 1, 0, -1):
            entry = (dirs[i], os.stat(dirs[i]).st_ino)
            if entry in self._named_dirs:
                break  # and its parents' names were durable before it was counted
            _fsync_dir(dirs[i - 1])
            named.append(entry)
        self._named_dirs.update(named)  # only once all of them are

    def size(self, path: str) -> int:
        return int(self.fs.get_file_info(self._abs(path)).size or 0)

    def read_parquet(
        self, path: str, *, columns: list[str] | None = None, missing_ok: bool = False
    ) -> pa.Table:
        """The file's rows (``columns`` only, if given). ``missing_ok``: of ``columns``, read
        those the file has (one written before its table's schema gained a column) instead
        of failing on the others."""
        if columns is not None and missing_ok:
            with self.fs.open_input_file(self._abs(path)) as f:
                pf = pq.ParquetFile(f)
                have = set(pf.schema_arrow.names)
                return pf.read(columns=[c for c in columns if c in have])
        return pq.read_table(self._abs(path), filesystem=self.fs, columns=columns)

    def read_parquet_choosing(
        self,
        path: str,
        choose: Callable[[pq.FileMetaData], Sequence[str] | None],
        row_groups: Callable[[pq.FileMetaData], list[int] | None] | None = None,
    ) -> pa.Table:
        """The file's rows, of the columns ``choose`` picks once it has seen the file's footer
        (None: every column), with one open of the file (on S3 the footer costs no request of
        its own). Of the chosen columns, those the file lacks (written before its table gained
        them) are left out, as with ``missing_ok``. ``row_groups``, if given, picks the row
        groups to read from the same footer (None: all of them).

        A file of at most :data:`SMALL_FILE_BYTES` (a micro-batch's few rows) is read whole
        in one request and decoded from memory on this thread: for such a file pyarrow's
        pre-buffering (a read handed to its I/O pool per column chunk) and its decode threads
        cost more than the decode itself."""
        with self.fs.open_input_file(self._abs(path)) as f:
            small = f.size() <= SMALL_FILE_BYTES
            if small:
                return _read_choosing(pa.BufferReader(f.read()), choose, row_groups, False)
            return _read_choosing(f, choose, row_groups, True)

    def exists(self, path: str) -> bool:
        return bool(self.fs.get_file_info(self._abs(path)).type == pafs.FileType.File)

    def delete(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_file(self._abs(path))

    def list_files(self, prefix: str) -> list[StoredFile]:
        """Files under ``prefix`` (recursively), with their modification times."""
        sel = pafs.FileSelector(self._abs(prefix), recursive=True, allow_not_found=True)
        out: list[StoredFile] = []
        for info in self.fs.get_file_info(sel):
            if info.type != pafs.FileType.File:
                continue
            rel = info.path[len(self.root) + 1 :] if info.path.startswith(self.root) else info.path
            out.append(StoredFile(rel, int(info.size or 0), info.mtime))
        return out


def _read_choosing(
    source: pa.NativeFile,
    choose: Callable[[pq.FileMetaData], Sequence[str] | None],
    row_groups: Callable[[pq.FileMetaData], list[int] | None] | None,
    threads: bool,
) -> pa.Table:
    pf = pq.ParquetFile(source, pre_buffer=threads)
    chosen = choose(pf.metadata)
    groups = None if row_groups is None else row_groups(pf.metadata)
    if chosen is not None:
        have = set(pf.schema_arrow.names)
        chosen = [c for c in chosen if c in have]
    if groups is None:
        return pf.read(columns=chosen, use_threads=threads)
    return pf.read_row_groups(groups, columns=chosen, use_threads=threads)


def _fsync(path: str) -> None:
    """fsync the file or directory at ``path``."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: A directory's open or fsync failing with one of these means the file system cannot sync
#: directories (as PostgreSQL's ``fsync_fname`` takes them): ignored, else every commit on it
#: would fail forever.
DIR_SYNC_UNSUPPORTED = frozenset(
    {errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF, errno.EACCES, errno.EISDIR}
)


def _fsync_dir(path: str) -> None:
    """fsync the directory at ``path``, where the file system can."""
    try:
        _fsync(path)
    except OSError as exc:
        if exc.errno not in DIR_SYNC_UNSUPPORTED:
            raise


def table_data_prefix(table: str) -> str:
    return f"tables/{table}/data"
