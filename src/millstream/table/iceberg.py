"""The Iceberg view of a table: Iceberg v2 metadata over Millstream's own Parquet files.

:func:`publish` makes the table's current manifest version readable by any Iceberg reader
(DuckDB's ``iceberg_scan``, pyiceberg, Trino, Spark): one snapshot per published version,
whose snapshot id and sequence number are the manifest version itself. Its data files are the
version's data files, referenced in place; every row of them that Millstream's read of that
version does not return (superseded, deleted, duplicate, trimmed or another partition's rows,
tombstones) is hidden by a **position delete** (``file_path``, ``pos``). The rows Millstream's
read returns are computed by that read (:func:`~millstream.table.read.read_manifest`): each
keeps the ``(partition, offset)`` of the physical row that represents its key, so the view
keeps exactly that row. A ``partial`` table's merged row differs from its last physical row
while the key's updates are not yet sealed into one row; such rows are written to a small
Parquet file of the view (``merged/``) and their physical rows deleted, so every published
version equals Millstream's read, unsealed partial updates included.

Everything is written with pyiceberg's own models and writers: the table metadata
(``TableMetadataV2``, by the steps of pyiceberg's ``update_table_metadata``), the manifest
list, the data manifest and the delete manifest (:class:`DeleteManifestWriter`, pyiceberg's
V2 writer whose content is DELETES). Millstream's Parquet files carry no Iceberg field ids, so the table property
``schema.name-mapping.default`` maps column names to ids; ids stay stable across schema
changes (pyiceberg's ``union_by_name`` against the previous schema).

A publish is incremental when it builds on the snapshot the same publisher published last
(:class:`PublishCache`, while the table's pointer still names that snapshot): only the keys of
files that are new, gone or whose segments changed are merged again (in every file of the
version, from columns cached per file), and the data manifests, data-file entries and delete
files of what did not change are listed again as they are (:func:`incremental_view`,
:func:`write_snapshot`), so its cost grows with what changed, not with the table. Otherwise
(the first publish of a process, another publisher's snapshot, a schema change) it reads
every data file of the version.

A publish writes only new files under ``tables/<table>/iceberg/`` and then moves the table's
pointer (:func:`millstream.metastore.iceberg.swap_pointer`, a compare-and-set): a publisher
that loses the race leaves its files unreferenced (garbage collection removes them), and so
does one whose swap comes too long after its writes (:data:`MAX_PUBLISH_AGE_SECONDS`, checked
right before the swap's COMMIT: the view's garbage collection may have deleted them).
"""

from __future__ import annotations

import bisect
import gzip
import io
import itertools
import json
import logging
import sys
import threading
import uuid
import weakref
import zlib
from array import array
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from copy import copy
from dataclasses import dataclass, field
from datetime import datetime
from types import TracebackType
from typing import Any, Final, cast

import fastavro
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from pyiceberg.io import FileIO, InputFile, OutputFile, OutputStream
from pyiceberg.io.pyarrow import PyArrowFile, _pyarrow_to_schema_without_ids
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriterV2,
    write_manifest_list,
)
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.serializers import Compressor
from pyiceberg.table.metadata import TableMetadata, TableMetadataUtil, new_table_metadata
from pyiceberg.table.name_mapping import MappedField, NameMapping, create_mapping_from_schema
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.table.update import (
    AddSchemaUpdate,
    AddSnapshotUpdate,
    RemoveSnapshotsUpdate,
    SetCurrentSchemaUpdate,
    SetPropertiesUpdate,
    SetSnapshotRefUpdate,
    TableUpdate,
    _apply_table_update,
    _TableMetadataUpdateContext,
    _update_table_metadata_log,
)
from pyiceberg.table.update.schema import UpdateSchema
from pyiceberg.typedef import Record
from pyiceberg.utils.config import Config
from pyiceberg.utils.datetime import datetime_to_millis

from millstream.core.engines import engine_for
from millstream.errors import CommitStateUnknownError, PublishExpiredError, VersionExpiredError
from millstream.metastore.iceberg import (
    IcebergPointer,
    read_pointer,
)
from millstream.metastore.models import Entry, Manifest
from millstream.metastore.reads import oldest_kept_version
from millstream.metastore.store import MetadataStore
from millstream.metastore.tables import find_table
from millstream.spec import OFFSET_COL, PARTITION_COL, SYSTEM_COLUMNS, TableSpec
from millstream.storage.deepstore import DeepStore, StoredFile
from millstream.table.cache import ReadCache
from millstream.table.limits import MAX_PUBLISH_AGE_SECONDS
from millstream.table.merged import copy_path
from millstream.table.read import (
    conform,
    drop_deleted,
    read_delete_vectors,
    read_entries,
    read_manifest,
    schema_key,
)

log = logging.getLogger(__name__)

NAME_MAPPING = "schema.name-mapping.default"
#: The snapshot summary property naming the manifest version a snapshot shows.
VERSION_PROPERTY = "millstream.manifest-version"
#: Iceberg's reserved field ids of a position delete file's columns.
DELETE_FILE_PATH_ID = 2147483546
DELETE_POS_ID = 2147483545
DELETE_SCHEMA = pa.schema(
    [
        pa.field(
            "file_path",
            pa.string(),
            nullable=False,
            metadata={b"PARQUET:field_id": str(DELETE_FILE_PATH_ID).encode()},
        ),
        pa.field(
            "pos",
            pa.int64(),
            nullable=False,
            metadata={b"PARQUET:field_id": str(DELETE_POS_ID).encode()},
        ),
    ]
)
AVRO_CODEC: Final = "deflate"
#: Field ids of the system columns in the name mapping: far above any column's id, and below
#: the ids Iceberg reserves for its metadata columns.
SYSTEM_FIELD_IDS = 1_000_000_000


def view_prefix(table: str) -> str:
    """Where a table's Iceberg view keeps its files, relative to the deep store root."""
    return f"tables/{table}/iceberg"


def location(deep: DeepStore, path: str) -> str:
    """The URI an Iceberg reader opens for ``path`` (relative to the deep store root)."""
    if isinstance(deep.fs, pafs.S3FileSystem):
        return f"s3://{deep.root}/{path}"
    return f"{deep.root}/{path}"


def relative(deep: DeepStore, uri: str) -> str | None:
    """``uri`` relative to the deep store root, or None if it lies outside it."""
    base = location(deep, "")
    return uri[len(base) :] if uri.startswith(base) else None


def _file(
    deep: DeepStore, path: str, *, create: bool = False, unsynced: list[str] | None = None
) -> PyArrowFile:
    """``path`` to read, or with ``create`` to write: durable once closed, or with
    ``unsynced`` named there once closed, for the caller to sync (:meth:`DeepStore.sync_files`)
    before the pointer's compare-and-set can name it."""
    full = deep._abs(path)
    if not create:
        return PyArrowFile(location(deep, path), full, deep.fs)
    deep.fs.create_dir(full.rsplit("/", 1)[0], recursive=True)
    return (
        _DurableFile(deep, path, unsynced)
        if deep.durable_writes
        else PyArrowFile(location(deep, path), full, deep.fs)
    )


class _DurableFile(PyArrowFile):
    """A file of a local deep store written through pyiceberg (a manifest, a manifest list,
    a ``metadata.json``): made durable when its stream closes (:meth:`DeepStore.sync`), before
    the pointer's compare-and-set can name it. Else a power loss after a publish could leave
    the pointer naming a torn ``metadata.json``, and every later publish, which loads it,
    would fail: the view would be stuck."""

    def __init__(self, deep: DeepStore, path: str, unsynced: list[str] | None = None) -> None:
        super().__init__(location(deep, path), deep._abs(path), deep.fs)
        self._deep = deep
        self._relative = path
        self._unsynced = unsynced

    def create(self, overwrite: bool = False) -> OutputStream:
        return _SyncedOnClose(super().create(overwrite), self._deep, self._relative, self._unsynced)


class _SyncedOnClose:
    """An output stream that syncs its file once closed after a complete write (or, given
    ``unsynced``, adds it there, for its writer to sync with the others it wrote)."""

    def __init__(
        self, stream: OutputStream, deep: DeepStore, path: str, unsynced: list[str] | None
    ) -> None:
        self._stream = stream
        self._deep = deep
        self._path = path
        self._unsynced = unsynced
        self._synced = False

    def write(self, b: bytes) -> int:
        return self._stream.write(b)

    def tell(self) -> int:
        return self._stream.tell()

    def close(self) -> None:
        self._stream.close()
        if not self._synced:
            self._synced = True
            if self._unsynced is not None:
                self._unsynced.append(self._path)  # synced by its writer, with the others
            else:
                self._deep.sync(self._path)  # before the pointer names it

    def __enter__(self) -> _SyncedOnClose:
        return self

    def __exit__(
        self,
        exctype: type[BaseException] | None,
        excinst: BaseException | None,
        exctb: TracebackType | None,
    ) -> None:
        if exctype is None:
            self.close()
        else:
            self._stream.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class DeepStoreIO(FileIO):
    """pyiceberg's file access through the deep store's own file system (its S3 endpoint and
    credentials included), for locations under its root."""

    def __init__(self, deep: DeepStore) -> None:
        super().__init__()
        self.deep = deep

    def _path(self, uri: str) -> str:
        rel = relative(self.deep, uri)
        if rel is None:
            raise ValueError(f"{uri!r} is not in the deep store {self.deep.uri!r}")
        return rel

    def new_input(self, location: str) -> PyArrowFile:
        return _file(self.deep, self._path(location))

    def new_output(self, location: str) -> PyArrowFile:
        return _file(self.deep, self._path(location), create=True)

    def delete(self, location: str | InputFile | OutputFile) -> None:
        uri = location if isinstance(location, str) else location.location
        self.deep.delete(self._path(uri))


class DeleteManifestWriter(ManifestWriterV2):
    """pyiceberg's V2 manifest writer for delete files: the same Avro, content DELETES."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


# -- the view of one version ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DataFileView:
    #: Relative to the deep store root.
    path: str
    rows: int
    size: int
    #: Positions (row numbers in the file) the view hides, ascending.
    deleted: np.ndarray


@dataclass(frozen=True, slots=True)
class VersionView:
    """What an Iceberg snapshot of one manifest version holds."""

    version: int
    files: tuple[DataFileView, ...]
    #: Rows Millstream's read returns that no physical row holds (unsealed partial merges),
    #: in the table's columns.
    merged: pa.Table

    @property
    def live_rows(self) -> int:
        return sum(f.rows - len(f.deleted) for f in self.files) + int(self.merged.num_rows)


def _valid_mask(data: pa.Table, entries: list[Entry]) -> pa.ChunkedArray | pa.Array:
    part, off = data.column(PARTITION_COL), data.column(OFFSET_COL)
    mask: Any = pa.array(np.zeros(data.num_rows, dtype=bool))
    for e in entries:
        m = pc.and_(
            pc.equal(part, e.partition),
            pc.and_(pc.greater_equal(off, e.start), pc.less(off, e.end)),
        )
        mask = pc.or_(mask, m)
    return mask


def _rows_equal(a: pa.Table, b: pa.Table) -> np.ndarray:
    """Row by row, whether ``a`` and ``b`` (same schema, same length) hold the same values."""
    same = np.ones(a.num_rows, dtype=bool)
    for name in a.column_names:
        x, y = a.column(name), b.column(name)
        try:
            eq = pc.fill_null(pc.equal(x, y), False)
            both_null = pc.and_(pc.is_null(x), pc.is_null(y))
            same &= pc.or_(eq, both_null).to_numpy(zero_copy_only=False)
        except pa.ArrowNotImplementedError:  # nested values: compare them as Python values
            same &= np.array(
                [u == v for u, v in zip(x.to_pylist(), y.to_pylist(), strict=True)], dtype=bool
            )
    return same


#: Where a row lies: the columns that name a row of a data file.
PLACE: Final = [PARTITION_COL, OFFSET_COL]


def winner_places(deep: DeepStore, manifest: Manifest) -> pa.Table:
    """(partition, offset) of every row Millstream's read of ``manifest`` returns, for a table
    whose engine does not merge columns: the version's rows of the merge columns only
    (:func:`merge_columns`, what decides which row of a key the read returns), less its
    delete vectors' rows, merged by the engine as the read merges them. A tenth of the read's
    memory for the peers' 150-byte rows: the read of every column held the table's rows
    several times over (the publisher of a 10,000,000-key table held 5.35 GB)."""
    spec: TableSpec = manifest.table.spec
    engine = engine_for(spec)
    raw = read_entries(deep, spec, manifest.entries, columns=merge_columns(spec).names)
    if manifest.delete_vectors and raw.num_rows:
        raw = drop_deleted(raw, read_delete_vectors(deep, manifest.delete_vectors))
    if spec.keyed and spec.partitioned_by_key:
        parts = raw.column(PARTITION_COL)
        winners = pa.concat_tables(
            [raw.schema.empty_table().select(PLACE)]
            + [
                engine.resolve(raw.filter(pc.equal(parts, p))).select(PLACE)
                for p in pc.unique(parts).to_pylist()
            ]
        )
    else:
        winners = engine.resolve(raw).select(PLACE)
    return winners


def version_view(
    deep: DeepStore, manifest: Manifest, winners: pa.Table | None = None
) -> VersionView:
    """The Iceberg view of ``manifest``: per data file, the positions of the rows Millstream's
    read of that version does not return, and the merged rows no physical row holds.
    ``winners``: that read (with system columns), if the caller has it already."""
    spec: TableSpec = manifest.table.spec
    # Only a merging engine's (``partial``) returned row can differ from its physical row;
    # every other engine returns rows of the data files as they are, so the view needs only
    # where each winner lies: (partition, offset), not the table's rows (guard 830).
    rows_kept = engine_for(spec).merges_columns
    if winners is None:
        winners = (
            read_manifest(deep, manifest, include_system_columns=True)
            if rows_kept
            else winner_places(deep, manifest)
        )
    elif not rows_kept:
        winners = winners.select([PARTITION_COL, OFFSET_COL])
    user = spec.arrow_schema()
    full = (
        spec.arrow_schema(system_columns=True)
        if rows_kept
        else pa.schema([spec.arrow_schema(system_columns=True).field(c) for c in PLACE])
    )
    won: dict[int, pa.Array] = {}
    parts = winners.column(PARTITION_COL)
    for p in pc.unique(parts).to_pylist():
        offs = winners.filter(pc.equal(parts, p)).column(OFFSET_COL)
        won[p] = offs.combine_chunks()

    by_file: dict[str, list[Entry]] = defaultdict(list)
    for e in manifest.entries:
        if e.file_path is not None:
            by_file[e.file_path].append(e)

    files: list[DataFileView] = []
    kept_rows: list[pa.Table] = []
    kept_where: list[tuple[int, np.ndarray]] = []  # (file index, positions)
    data = full.empty_table()
    for i, (path, entries) in enumerate(sorted(by_file.items())):
        data = conform(deep.read_parquet(path, columns=None if rows_kept else PLACE), full)
        size = int(deep.fs.get_file_info(deep._abs(path)).size or 0)
        keep: Any = _valid_mask(data, entries)
        part, off = data.column(PARTITION_COL), data.column(OFFSET_COL)
        member: Any = pa.array(np.zeros(data.num_rows, dtype=bool))
        for p in {e.partition for e in entries}:
            if p in won:
                member = pc.or_(member, pc.and_(pc.equal(part, p), pc.is_in(off, value_set=won[p])))
        keep = pc.fill_null(pc.and_(keep, member), False).to_numpy(zero_copy_only=False)
        positions = np.flatnonzero(keep)
        kept_rows.append(data.take(pa.array(positions)))
        kept_where.append((i, positions))
        files.append(
            DataFileView(path, data.num_rows, size, np.flatnonzero(~keep).astype(np.int64))
        )

    # Align the kept physical rows with the read's rows by (partition, offset).
    order = [(PARTITION_COL, "ascending"), (OFFSET_COL, "ascending")]
    physical = pa.concat_tables(kept_rows) if kept_rows else full.empty_table()
    where_file = np.concatenate(
        [np.full(len(pos), i, dtype=np.int64) for i, pos in kept_where] or [np.zeros(0, np.int64)]
    )
    where_pos = np.concatenate([pos for _, pos in kept_where] or [np.zeros(0, np.int64)])
    # Each of these is a copy of the whole table: what is no longer needed goes before the
    # next is made (a 2M-key table's view peaked at 4.5 copies of its rows).
    del kept_rows, data
    p_idx = pc.sort_indices(physical, sort_keys=order)
    w_sorted = winners.take(pc.sort_indices(winners, sort_keys=order))
    del winners
    p_sorted = physical.take(p_idx)
    del physical
    if p_sorted.num_rows != w_sorted.num_rows or not (
        p_sorted.column(PARTITION_COL).equals(w_sorted.column(PARTITION_COL))
        and p_sorted.column(OFFSET_COL).equals(w_sorted.column(OFFSET_COL))
    ):
        raise RuntimeError(
            f"table {spec.name!r} version {manifest.version}: the rows of its read are not "
            "rows of its data files"
        )
    if not rows_kept:
        return VersionView(manifest.version, tuple(files), user.empty_table())
    same = _rows_equal(
        p_sorted.select(user.names).cast(user), w_sorted.select(user.names).cast(user)
    )
    merged = w_sorted.select(user.names).cast(user).filter(pa.array(~same))
    if not same.all():
        # The physical rows a merged row stands for are hidden; the merged row is written.
        idx = p_idx.to_numpy()[~same]
        extra: dict[int, list[int]] = defaultdict(list)
        for f, pos in zip(where_file[idx].tolist(), where_pos[idx].tolist(), strict=True):
            extra[f].append(pos)
        for f, more in extra.items():
            fv = files[f]
            files[f] = DataFileView(
                fv.path, fv.rows, fv.size, np.union1d(fv.deleted, np.array(more, np.int64))
            )
    return VersionView(manifest.version, tuple(files), merged)


# -- incremental views ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FileFacts:
    """One data file of a computed view."""

    rows: int
    size: int
    #: The file's segments at the view's version: (partition, start, end).
    ranges: frozenset[tuple[int, int, int]]
    #: Positions the view hides, ascending.
    deleted: np.ndarray


@dataclass(frozen=True, slots=True)
class ComputedView:
    """A version's view as :func:`publish` writes it: per data file (relative path) its facts;
    the merged rows; and, for an incremental view, which files' hidden rows may differ from
    the previous published view's (every other file's are the same) and whether the merged
    rows may."""

    version: int
    files: dict[str, FileFacts]
    merged: pa.Table
    changed: frozenset[str] | None = None  # None: computed in full, compare everything
    merged_changed: bool = True
    incremental: bool = False

    @property
    def live_rows(self) -> int:
        return sum(f.rows - len(f.deleted) for f in self.files.values()) + int(self.merged.num_rows)


def _ranges_of(manifest: Manifest) -> dict[str, list[Entry]]:
    by_file: dict[str, list[Entry]] = defaultdict(list)
    for e in manifest.entries:
        if e.file_path is not None:
            by_file[e.file_path].append(e)
    return by_file


def _ranges(entries: list[Entry]) -> frozenset[tuple[int, int, int]]:
    return frozenset((e.partition, e.start, e.end) for e in entries)


def full_view(deep: DeepStore, manifest: Manifest, winners: pa.Table | None = None) -> ComputedView:
    """:func:`version_view` as a :class:`ComputedView` (every file read)."""
    view = version_view(deep, manifest, winners)
    by_file = _ranges_of(manifest)
    files = {
        f.path: FileFacts(f.rows, f.size, _ranges(by_file[f.path]), f.deleted) for f in view.files
    }
    return ComputedView(view.version, files, view.merged)


def merge_columns(spec: TableSpec) -> pa.Schema:
    """The columns that decide which row of a key Millstream's read returns (system columns
    included): the key, comparison, delete and time columns; every column of a ``partial``
    table (its merged row is built from them all)."""
    full = spec.arrow_schema(system_columns=True)
    if engine_for(spec).merges_columns:
        return full
    wanted = {*spec.primary_key, *SYSTEM_COLUMNS}
    for c in (spec.comparison_column, spec.delete_column, spec.time_column):
        if c is not None:
            wanted.add(c)
    return pa.schema([f for f in full if f.name in wanted])


#: A table's merge columns are held in at most this many blocks: past it, the blocks of fewer
#: than :data:`SMALL_BLOCK_ROWS` rows are joined into one (every few rounds of a busy table).
MAX_BLOCKS = 8
SMALL_BLOCK_ROWS = 1 << 16


@dataclass(frozen=True, slots=True)
class _Block:
    """The merge columns of some data files of one table, one file after another in one Arrow
    table (a chunk a column). A table's files held as a few blocks cost a few Arrow tables,
    not one each (a 26-row file's own table took ~6 KB of memory for ~0.4 KB of buffers), and
    an incremental publish looks its touched keys up over a few chunks, not one a file."""

    paths: tuple[str, ...]
    table: pa.Table
    lengths: tuple[int, ...]
    starts: tuple[int, ...]

    @staticmethod
    def of(paths: Sequence[str], tables: Sequence[pa.Table]) -> _Block:
        lengths = tuple(t.num_rows for t in tables)
        starts = tuple(int(x) for x in np.cumsum((0, *lengths[:-1]))) if lengths else ()
        return _Block(tuple(paths), pa.concat_tables(tables).combine_chunks(), lengths, starts)

    @staticmethod
    def join(blocks: Sequence[_Block]) -> _Block:
        return _Block.of(
            [p for b in blocks for p in b.paths],
            [b.rows(i) for b in blocks for i in range(len(b.paths))],
        )

    def rows(self, i: int) -> pa.Table:
        """The merge columns of its ``i``-th file (a slice: no copy)."""
        return self.table.slice(self.starts[i], self.lengths[i])


@dataclass(slots=True)
class _TableColumns:
    """The merge columns a publisher holds of one table's data files: those of every file its
    last remembered view lists, in blocks (rebuilt by :meth:`PublishCache.retain`), and those
    read since (``fresh``: the new files of a publish not yet remembered)."""

    fingerprint: Hashable
    blocks: list[_Block] = field(default_factory=list)
    #: Each file of :attr:`blocks`: (its block's index, its index in the block).
    where: dict[str, tuple[int, int]] = field(default_factory=dict)
    fresh: dict[str, pa.Table] = field(default_factory=dict)
    nbytes: int = 0

    def lookup(self, path: str) -> pa.Table | None:
        at = self.where.get(path)
        if at is not None:
            return self.blocks[at[0]].rows(at[1])
        return self.fresh.get(path)

    def files(self) -> set[str]:
        return set(self.where) | set(self.fresh)


@dataclass(frozen=True, slots=True)
class HeldMetadata:
    """A table's last metadata file as a publisher holds it between two publishes: its
    snapshots' ids and its JSON, compressed. pyiceberg's model of a view's 240 snapshots
    (``retention.iceberg_snapshots``' default: each ``Snapshot`` with its ``Summary``, its
    ``SnapshotLogEntry``, the 100 ``MetadataLogEntry``) took some 756 KiB a table, ~74 MiB at
    100 tables, held for nothing between publishes 15 s apart; this holds ~18 KiB
    (``bench/publisher_metadata.py``). The model is built again (:meth:`parse`: the file's own bytes, as pyiceberg reads
    them) only when a publish writes the next metadata file; a publish with nothing new
    checks the ids only."""

    path: str
    snapshot_ids: array[int]
    packed: bytes

    @staticmethod
    def of(path: str, metadata: TableMetadata, raw: bytes) -> HeldMetadata:
        return HeldMetadata(path, snapshot_ids(metadata), zlib.compress(raw, 1))

    def parse(self) -> TableMetadata:
        return parse_metadata(zlib.decompress(self.packed))

    @property
    def nbytes(self) -> int:
        return len(self.packed) + self.snapshot_ids.itemsize * len(self.snapshot_ids)


class PublishCache:
    """What a long-lived publisher keeps between two publishes of a table: the view it last
    published (:class:`ViewState`, used only while the table's pointer still names it) and
    the merge columns of its data files and delete vectors (every file has a new name and
    never changes, so they never go stale). A table's data files' columns are held in a few
    blocks (:class:`_Block`), rebuilt after each publish to the files the view just published
    lists (:meth:`retain`): a seal or compaction that replaces a table's micro-batch files
    frees their columns, so what the cache holds follows the tables' live files, not every
    file they ever had, and costs a few Arrow tables a table, not one a file. Past
    ``max_bytes`` of held columns, the least recently published tables' columns go, and with
    them the view each built on (their next publish reads in full). The per-file masks of
    :meth:`in_segments` (a byte a row of each live file) are bounded by ``max_mask_bytes``.
    :attr:`hits` and :attr:`misses` count the data files' columns found held and read from the
    deep store."""

    def __init__(
        self, max_bytes: int = 512 * 1024 * 1024, max_mask_bytes: int = 64 * 1024 * 1024
    ) -> None:
        #: Delete vectors' offsets, by file.
        self.columns = ReadCache(max_bytes)
        self.max_bytes = max_bytes
        self.max_mask_bytes = max_mask_bytes
        #: Bytes of the masks :attr:`_masks` holds.
        self.mask_bytes = 0
        #: Bytes of the blocks :attr:`_merge` holds, and the data files' columns found held
        #: and read.
        self.merge_bytes = 0
        self.hits = 0
        self.misses = 0
        self._views: dict[tuple[str, str], ViewState] = {}
        #: Per table, the last metadata file it read or wrote, held compactly (a metadata
        #: file never changes: a publish writes a new one under a new name).
        self._metadata: dict[tuple[str, str], HeldMetadata] = {}
        #: Per table, its data files' merge columns; least recently used first.
        self._merge: OrderedDict[tuple[str, str], _TableColumns] = OrderedDict()
        #: Per table, the file each cached entry of :attr:`columns` was read from, by key.
        self._keys: dict[tuple[str, str], dict[Hashable, str]] = {}
        #: Per (deep store, table, data file): which of its rows lie in its segments, and the
        #: segments (partition, start, end) that mask was computed for (:meth:`in_segments`),
        #: least recently used first.
        self._masks: OrderedDict[tuple[str, str, str], tuple[frozenset[Any], np.ndarray]] = (
            OrderedDict()
        )
        #: Per table, the data files :attr:`_masks` holds a mask of (for :meth:`retain`).
        self._masked: dict[tuple[str, str], set[str]] = {}
        #: Per table, a read offered for one full view (:meth:`offer_read`).
        self._reads: dict[tuple[str, str], tuple[str, pa.Table]] = {}
        self._lock = threading.Lock()

    def view(self, deep: DeepStore, table: str) -> ViewState | None:
        with self._lock:
            return self._views.get((deep.uri, table))

    def remember(self, deep: DeepStore, table: str, state: ViewState | None) -> None:
        with self._lock:
            if state is None:
                self._views.pop((deep.uri, table), None)
            else:
                self._views[(deep.uri, table)] = state

    def held_metadata(self, deep: DeepStore, table: str, path: str) -> HeldMetadata | None:
        """What this cache holds of ``table``'s metadata file ``path`` (None: it holds
        another file's, the one it last read or wrote)."""
        with self._lock:
            known = self._metadata.get((deep.uri, table))
        if known is not None and known.path == path:
            return known
        return None

    def metadata(self, deep: DeepStore, table: str, path: str) -> TableMetadata:
        """The table metadata in the file at ``path`` (relative): built from what this
        cache holds of the file it last read or wrote for ``table`` if that is the file,
        else read (and remembered)."""
        held = self.held_metadata(deep, table, path)
        if held is not None:
            return held.parse()
        raw, metadata = read_metadata(deep, path)
        self.remember_metadata(deep, table, path, metadata, raw)
        return metadata

    def offer_read(self, deep: DeepStore, manifest: Manifest, rows: pa.Table) -> None:
        """``rows``: ``manifest``'s read with system columns, which a caller has at hand (an
        ``--available-now`` run's final seal pass merged the table for its merged copy): the
        next full view of that manifest (:func:`publish`) is built on it instead of merging
        the table again. Kept for a manifest that has a merged copy only, under its copy's
        digest (the same entries, delete vectors and definition give the same read)."""
        digest = copy_path(manifest)
        if digest is not None:
            with self._lock:
                self._reads[(deep.uri, manifest.table.name)] = (digest, rows)

    def take_read(self, deep: DeepStore, manifest: Manifest) -> pa.Table | None:
        """The read :meth:`offer_read` was given for ``manifest`` (once), or None when it was
        given none or the read of another manifest (the table changed since)."""
        with self._lock:
            offered = self._reads.pop((deep.uri, manifest.table.name), None)
        if offered is None:
            return None
        digest, rows = offered
        return rows if digest == copy_path(manifest) else None

    def remember_metadata(
        self, deep: DeepStore, table: str, path: str, metadata: TableMetadata, raw: bytes
    ) -> None:
        """Hold ``table``'s metadata file ``path``: its content ``raw`` (its JSON, as written),
        whose model is ``metadata``."""
        held = HeldMetadata.of(path, metadata, raw)
        with self._lock:
            self._metadata[(deep.uri, table)] = held

    def _table_columns(self, deep: DeepStore, table: str, schema: pa.Schema) -> _TableColumns:
        """``table``'s held columns in ``schema`` (none held if they were of another schema);
        the caller holds the lock."""
        key = (deep.uri, table)
        fingerprint = schema_key(schema)
        held = self._merge.get(key)
        if held is None or held.fingerprint != fingerprint:
            if held is not None:
                self.merge_bytes -= held.nbytes
            held = self._merge[key] = _TableColumns(fingerprint)
        self._merge.move_to_end(key)
        return held

    def file_columns(self, deep: DeepStore, path: str, schema: pa.Schema, table: str) -> pa.Table:
        """The merge columns ``schema`` of ``table``'s data file ``path``: held, or read from
        the deep store (and held until :meth:`retain` says the table no longer has it)."""
        with self._lock:
            found = self._table_columns(deep, table, schema).lookup(path)
            if found is not None:
                self.hits += 1
                return found
            self.misses += 1
        # Read as the seal reads its run (a micro-batch file of a few rows whole, decoded on
        # this thread): pyarrow's pre-buffering and decode threads cost more than the decode
        # of a few rows, and a publish round reads each busy table's new micro-batch files.
        names = schema.names
        data = conform(deep.read_parquet_choosing(path, lambda _: names), schema)
        with self._lock:
            self._table_columns(deep, table, schema).fresh[path] = data
        return data

    def merge_layout(
        self, deep: DeepStore, table: str, schema: pa.Schema, paths: Iterable[str]
    ) -> tuple[list[str], pa.Table, np.ndarray]:
        """The merge columns of every data file of ``paths`` (read if not held) and of every
        other file held for ``table`` (the files that left it since its remembered view), as
        one table of a few chunks; the files in the order their rows come in it, and each
        one's rows."""
        want = set(paths)
        with self._lock:
            held = self._table_columns(deep, table, schema)
            missing = sorted(want - held.files())
        for path in missing:
            self.file_columns(deep, path, schema, table)
        with self._lock:
            held = self._table_columns(deep, table, schema)
            order = [p for b in held.blocks for p in b.paths]
            lengths = [n for b in held.blocks for n in b.lengths]
            tables = [b.table for b in held.blocks]
            fresh = sorted(p for p in held.fresh if p in want)
            order += fresh
            lengths += [held.fresh[p].num_rows for p in fresh]
            tables += [held.fresh[p] for p in fresh]
            self.hits += len(want) - len(missing)
        every = pa.concat_tables(tables) if tables else schema.empty_table()
        return order, every, np.array(lengths, dtype=np.int64)

    def held_files(self, deep: DeepStore, table: str) -> set[str]:
        """The data files and delete vectors whose columns are held for ``table``."""
        with self._lock:
            held = self._merge.get((deep.uri, table))
            files = held.files() if held is not None else set()
            return files | set(self._keys.get((deep.uri, table), {}).values())

    def describe(self) -> dict[str, int]:
        """What it holds and how often it found it (``debugInfo``, the bench)."""
        with self._lock:
            return {
                "tables": len(self._merge),
                "files": sum(len(h.where) + len(h.fresh) for h in self._merge.values()),
                "blocks": sum(len(h.blocks) for h in self._merge.values()),
                # the Arrow tables it holds: blocks, files read since a retain, vectors
                "arrays": sum(len(h.blocks) + len(h.fresh) for h in self._merge.values())
                + len(self.columns),
                "bytes": self.merge_bytes + self.columns.bytes,
                "hits": self.hits,
                "misses": self.misses,
                "mask_bytes": self.mask_bytes,
                # the tables' last metadata files, held compactly (HeldMetadata)
                "metadata_bytes": sum(h.nbytes for h in self._metadata.values()),
            }

    def in_segments(
        self,
        deep: DeepStore,
        table: str,
        path: str,
        entries: list[Entry],
        data: Callable[[], pa.Table],
    ) -> np.ndarray:
        """Which rows of the data file ``path`` (its merge columns ``data()``) lie in its
        segments ``entries``: computed once per file and segments, and computed again when
        its segments change (a seal of one partition of a shared file, a trim)."""
        ranges = _ranges(entries)
        key = (deep.uri, table, path)
        with self._lock:
            known = self._masks.get(key)
            if known is not None and known[0] == ranges:
                self._masks.move_to_end(key)
                return known[1]
        mask = _in_entries(data(), entries)
        with self._lock:
            self._drop_mask(key)
            if mask.nbytes <= self.max_mask_bytes:
                self._masks[key] = (ranges, mask)
                self._masked.setdefault(key[:2], set()).add(path)
                self.mask_bytes += mask.nbytes
            while self.mask_bytes > self.max_mask_bytes:  # least recently used out first
                self._drop_mask(next(iter(self._masks)))
        return mask

    def _drop_mask(self, key: tuple[str, str, str]) -> None:
        """Forget the mask under ``key`` (if held); the caller holds the lock."""
        old = self._masks.pop(key, None)
        if old is not None:
            self.mask_bytes -= old[1].nbytes
            self._masked[key[:2]].discard(key[2])

    def delete_vector(self, deep: DeepStore, path: str, table: str) -> pa.Table:
        key = ("iceberg-vector", deep.uri, path)
        with self._lock:
            self._keys.setdefault((deep.uri, table), {})[key] = path
        found: pa.Table = self.columns.get(
            key, lambda: deep.read_parquet(path, columns=[OFFSET_COL])
        )
        return found

    def retain(self, deep: DeepStore, table: str, files: Iterable[str]) -> int:
        """Drop the columns held for ``table`` of every file not in ``files`` (the data files
        and delete vectors its last published view builds on: the only ones its next
        incremental publish reads again) and hold the rest in a few blocks; returns how many
        files' columns were dropped. Called only once that view is remembered: an incremental
        publish reads the files that LEFT the table since the view it builds on (their keys
        are the touched keys), so a file's columns must stay until a view without it is the
        one the next publish starts from. Past ``max_bytes``, the least recently published
        tables' columns go with their views."""
        keep = set(files)
        key = (deep.uri, table)
        with self._lock:
            known = self._keys.get(key, {})
            gone = [k for k, path in known.items() if path not in keep]
            for k in gone:
                del known[k]
            masked = self._masked.get(key, set())
            for path in [p for p in masked if p not in keep]:
                self._drop_mask((deep.uri, table, path))
            dropped = self.columns.discard(gone)
            held = self._merge.get(key)
            if held is None:
                return dropped
            blocks: list[_Block] = []
            for b in held.blocks:
                kept = [i for i, p in enumerate(b.paths) if p in keep]
                if len(kept) == len(b.paths):
                    blocks.append(b)
                elif kept:
                    blocks.append(_Block.of([b.paths[i] for i in kept], [b.rows(i) for i in kept]))
                dropped += len(b.paths) - len(kept)
            fresh = sorted(p for p in held.fresh if p in keep)
            dropped += len(held.fresh) - len(fresh)
            if fresh:
                blocks.append(_Block.of(fresh, [held.fresh[p] for p in fresh]))
            if len(blocks) > MAX_BLOCKS:
                small = [b for b in blocks if b.table.num_rows < SMALL_BLOCK_ROWS]
                if len(small) > 1:
                    blocks = [b for b in blocks if b.table.num_rows >= SMALL_BLOCK_ROWS]
                    blocks.append(_Block.join(small))
            self.merge_bytes -= held.nbytes
            held.blocks, held.fresh = blocks, {}
            held.where = {p: (i, j) for i, b in enumerate(blocks) for j, p in enumerate(b.paths)}
            held.nbytes = sum(b.table.nbytes for b in blocks)
            self.merge_bytes += held.nbytes
            self._merge.move_to_end(key)
            while self.merge_bytes > self.max_bytes and self._merge:
                # Its view goes too: the next incremental publish would need the columns of
                # the files that left the table since, which may be gone from the deep store.
                evicted, old = self._merge.popitem(last=False)
                self.merge_bytes -= old.nbytes
                self._views.pop(evicted, None)
        return dropped


def _key_member(rows: pa.Table, keys: list[str], touched: pa.Table) -> np.ndarray:
    """Which of ``rows`` have, in every key column, a value some touched row has there: a
    superset of the rows of the touched keys (null matches null: a null key is a key too)."""
    hit = np.ones(rows.num_rows, dtype=bool)
    for k in keys:
        found = pc.is_in(rows.column(k), value_set=touched.column(k), skip_nulls=False)
        hit &= np.asarray(found.to_numpy(zero_copy_only=False), dtype=bool)
    return hit


def _in_entries(data: pa.Table, entries: Iterable[Entry]) -> np.ndarray:
    mask = _valid_mask(data, list(entries))
    return np.asarray(pc.fill_null(mask, False).to_numpy(zero_copy_only=False), dtype=bool)


#: An incremental publish whose new, gone and changed files hold more rows than this and than
#: the unchanged files reads the version in full instead (:func:`full_view`).
FULL_VIEW_ROWS = 50_000
FILE_COL = "__ms_file"
POS_COL = "__ms_pos"


def incremental_view(
    deep: DeepStore, manifest: Manifest, previous: ViewState, cache: PublishCache
) -> ComputedView:
    """The view of ``manifest`` from ``previous`` (the view of an earlier version of the same
    table and schema), recomputing only what the versions between can have changed.

    A key's rows in Millstream's read depend on that key's rows alone (the merge is per key,
    per partition for a table partitioned by key). So the touched keys are the keys of every
    row of a file that is new, gone, or whose segments changed (a new micro-batch, a seal, a
    compaction, a rollback, a re-ingestion); every row of any other key keeps its place in
    the view. Only the touched keys' rows, in every file of the version, are merged again
    (:meth:`millstream.core.engines.MergeEngine.resolve`, after the version's delete vectors, as
    the read does); a file none of whose rows belong to a touched key keeps its hidden rows as they
    were. The merge columns of files come from ``cache`` (a file is read once, ever)."""
    spec: TableSpec = manifest.table.spec
    engine = engine_for(spec)
    schema = merge_columns(spec)
    by_file = _ranges_of(manifest)
    before = previous.facts
    moved = {
        p
        for p, entries in by_file.items()
        if p not in before or before[p].ranges != _ranges(entries)
    }
    gone = set(before) - set(by_file)
    files: dict[str, FileFacts] = {}
    changed: set[str] = set()

    def facts(path: str, deleted: np.ndarray) -> FileFacts:
        old = before.get(path)
        if (
            old is not None
            and path not in moved
            and (deleted is old.deleted or np.array_equal(old.deleted, deleted))
        ):
            return old
        changed.add(path)
        if old is not None:
            rows, size = old.rows, old.size
        else:
            rows = cache.file_columns(deep, path, schema, spec.name).num_rows
            size = int(deep.fs.get_file_info(deep._abs(path)).size or 0)
        return FileFacts(rows, size, _ranges(by_file[path]), deleted)

    if not spec.keyed:
        # Every row in its segments' ranges is read: only a moved file's hidden rows change.
        for path, entries in sorted(by_file.items()):
            if path in moved:
                data = cache.file_columns(deep, path, schema, spec.name)
                files[path] = facts(path, np.flatnonzero(~_in_entries(data, entries)))
            else:
                files[path] = facts(path, before[path].deleted)
        return ComputedView(
            manifest.version,
            files,
            previous.merged,
            frozenset(changed),
            merged_changed=False,
            incremental=True,
        )

    keys = list(spec.primary_key)
    changing = sum(before[p].rows for p in gone) + sum(
        cache.file_columns(deep, p, schema, spec.name).num_rows for p in moved
    )
    unchanged = sum(before[p].rows for p in by_file if p in before and p not in moved)
    if changing >= max(FULL_VIEW_ROWS, unchanged):
        # Most of the table changed (a seal or compaction of most of it): merging the touched
        # keys again costs more than reading the version's files.
        return full_view(deep, manifest)
    touched_parts = [
        cache.file_columns(deep, p, schema, spec.name).select(keys) for p in sorted(moved | gone)
    ]
    touched = (
        pa.concat_tables(touched_parts).group_by(keys).aggregate([])
        if touched_parts
        else schema.empty_table().select(keys)
    )
    # Every row of the version of a touched key (a superset: see _key_member), with its place:
    # the merge columns of all files as one table (no copy), one hash lookup per key column.
    order = sorted(by_file)
    empty = schema.append(pa.field(FILE_COL, pa.int64())).append(pa.field(POS_COL, pa.int64()))
    candidates = empty.empty_table()
    lengths = np.zeros(len(order), np.int64)
    starts = np.zeros(len(order), np.int64)
    found_rows = np.zeros(0, np.int64)  # the candidates' rows, numbered over all files
    found_file = np.zeros(0, np.int64)
    if touched.num_rows and order:
        # The merge columns of every file held for the table (a few blocks, no copy): the
        # version's files and those that left it since ``previous`` (their rows are in no
        # segment of this version, so none is a candidate).
        order, every, lengths = cache.merge_layout(deep, spec.name, schema, by_file)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)

        def rows_of_file(at: int, n: int, every: pa.Table = every) -> Callable[[], pa.Table]:
            return lambda: every.slice(at, n)

        # Which rows of every file lie in its segments at this version (one mask per file
        # and segments, kept by the cache: a file's rows never change).
        in_segments = np.concatenate(
            [
                cache.in_segments(deep, spec.name, p, by_file[p], rows_of_file(int(a), int(n)))
                if p in by_file
                else np.zeros(n, dtype=bool)
                for p, a, n in zip(order, starts, lengths, strict=True)
            ]
            or [np.zeros(0, dtype=bool)]
        )
        file_of = np.repeat(np.arange(len(order), dtype=np.int64), lengths)
        hit = np.repeat(np.array([p in moved for p in order]), lengths)  # all its keys
        hit |= _key_member(every, keys, touched)
        rows_at = np.flatnonzero(hit)
        found = every.filter(pa.array(hit))
        found_file = file_of[rows_at]
        found_pos = rows_at - starts[found_file]
        # Of those, the rows in their file's segments at this version.
        valid = in_segments[rows_at]
        found_file, found_pos, rows_at = found_file[valid], found_pos[valid], rows_at[valid]
        candidates = (
            found.filter(pa.array(valid))
            .append_column(FILE_COL, pa.array(found_file, pa.int64()))
            .append_column(POS_COL, pa.array(found_pos, pa.int64()))
        )
        found_rows = rows_at
    if manifest.delete_vectors and candidates.num_rows:
        offsets: dict[int, list[pa.Array]] = defaultdict(list)
        for dv in manifest.delete_vectors:
            try:
                offsets[dv.partition].extend(
                    cache.delete_vector(deep, dv.file_path, spec.name).column(OFFSET_COL).chunks
                )
            except (OSError, pa.ArrowInvalid, KeyError):
                # The read skips an unreadable vector too (a vector never changes the merge).
                log.warning("iceberg view of %s: delete vector %s unreadable", spec.name, dv)
        candidates = drop_deleted(
            candidates,
            {p: pa.chunked_array(c, pa.int64()).combine_chunks() for p, c in offsets.items()},
        )
    rows_of = candidates.drop_columns([FILE_COL, POS_COL])
    if spec.partitioned_by_key:
        parts = rows_of.column(PARTITION_COL)
        winners = pa.concat_tables(
            [rows_of.schema.empty_table()]
            + [
                engine.resolve(rows_of.filter(pc.equal(parts, p)))
                for p in pc.unique(parts).to_pylist()
            ]
        )
    else:
        winners = engine.resolve(rows_of)
    # Each winner's physical row: its (partition, offset) among the candidates.
    placed = candidates.select([PARTITION_COL, OFFSET_COL, FILE_COL, POS_COL]).join(
        winners.select([PARTITION_COL, OFFSET_COL]).append_column(
            "__ms_w", pa.array(np.arange(winners.num_rows, dtype=np.int64))
        ),
        keys=[PARTITION_COL, OFFSET_COL],
        join_type="inner",
        use_threads=False,
    )
    if placed.num_rows != winners.num_rows:
        raise RuntimeError(
            f"table {spec.name!r} version {manifest.version}: the rows of its read are not "
            "rows of its data files"
        )
    placed = placed.sort_by("__ms_w")
    win_file = placed.column(FILE_COL).to_numpy()
    win_pos = placed.column(POS_COL).to_numpy()
    user = spec.arrow_schema()
    new_merged = user.empty_table()
    if engine.merges_columns and winners.num_rows:
        # A merged row that differs from its physical row is written; that row is hidden.
        by_place = candidates.select([FILE_COL, POS_COL, *user.names])
        physical = by_place.join(
            placed.select([FILE_COL, POS_COL, "__ms_w"]),
            keys=[FILE_COL, POS_COL],
            join_type="inner",
            use_threads=False,
        ).sort_by("__ms_w")
        same = _rows_equal(
            physical.select(user.names).cast(user), winners.select(user.names).cast(user)
        )
        new_merged = winners.select(user.names).cast(user).filter(pa.array(~same))
        win_file, win_pos = win_file[same], win_pos[same]
    # The winners' rows, numbered over all files (ascending): the rows the view shows of the
    # touched keys.
    shown = np.sort(starts[win_file] + win_pos).astype(np.int64)
    is_moved = np.array([p in moved for p in order], dtype=bool)
    # A file that is not moved keeps its hidden rows but for its candidates' (the rows of
    # touched keys in its segments): of those, every row not shown is hidden. All such files
    # at once, in row numbers over all files: (old hidden - candidates) | (candidates - shown).
    counts = np.bincount(found_file, minlength=len(order)) if len(order) else lengths
    again = np.flatnonzero((counts > 0) & ~is_moved)
    recomputed: dict[int, np.ndarray] = {}
    if len(again):
        old_hidden = np.concatenate(
            [before[order[i]].deleted.astype(np.int64) + starts[i] for i in again]
        )
        candidates_at = found_rows[~is_moved[found_file]]
        # Two ascending runs, disjoint (the second is of the candidates, the first has none
        # of them): a stable sort merges them in linear time (``union1d`` hashes them again).
        hidden = np.sort(
            np.concatenate(
                [
                    np.setdiff1d(old_hidden, candidates_at, assume_unique=True),
                    np.setdiff1d(candidates_at, shown, assume_unique=True),
                ]
            ),
            kind="stable",
        )
        lo = np.searchsorted(hidden, starts[again])
        hi = np.searchsorted(hidden, starts[again] + lengths[again])
        for i, a, b in zip(again.tolist(), lo.tolist(), hi.tolist(), strict=True):
            recomputed[i] = hidden[a:b] - starts[i]
    for i, path in enumerate(order):
        if path not in by_file:
            continue  # it left the table since ``previous``
        if path in moved:
            a, b = np.searchsorted(shown, [starts[i], starts[i] + lengths[i]])
            kept = shown[a:b] - starts[i]
            rows = (
                int(lengths[i])
                if touched.num_rows
                else len(cache.file_columns(deep, path, schema, spec.name))
            )
            deleted = np.setdiff1d(np.arange(rows, dtype=np.int64), kept, assume_unique=True)
            files[path] = facts(path, deleted)
        elif i in recomputed:
            files[path] = facts(path, recomputed[i])
        else:
            files[path] = before[path]  # none of its rows is of a touched key

    files = {p: files[p] for p in sorted(files)}
    merged = previous.merged
    merged_changed = False
    if merged.num_rows and touched.num_rows:
        again = _key_member(merged, keys, touched)  # their merged rows were computed again
        if again.any():
            merged = merged.filter(pa.array(~again))
            merged_changed = True
    if new_merged.num_rows:
        merged = pa.concat_tables([merged.cast(user), new_merged])
        merged_changed = True
    return ComputedView(
        manifest.version,
        files,
        merged,
        frozenset(changed),
        merged_changed=merged_changed,
        incremental=True,
    )


# -- schema -----------------------------------------------------------------------------------


class _Base:
    """What pyiceberg's ``UpdateSchema`` reads of a transaction: its table metadata."""

    def __init__(self, metadata: TableMetadata) -> None:
        self.table_metadata = metadata


def iceberg_schema(arrow: pa.Schema, previous: TableMetadata | None) -> Schema:
    """``arrow`` as an Iceberg schema whose field ids stay those of ``previous``'s current
    schema for the columns it has (added columns get new ids, widened types keep theirs)."""
    if previous is None:
        return assign_fresh_schema_ids(_pyarrow_to_schema_without_ids(arrow))
    update = UpdateSchema(cast(Any, _Base(previous)), schema=previous.schema())
    update.union_by_name(arrow)
    evolved = update._apply()
    for known in previous.schemas:
        if known.as_struct() == evolved.as_struct():
            return known
    return evolved


def name_mapping(schema: Schema) -> NameMapping:
    """The name mapping of ``schema`` plus Millstream's system columns, which every data file
    holds and no snapshot's schema shows (a reader must find every file column mapped)."""
    mapping = create_mapping_from_schema(schema)
    system = [
        MappedField(field_id=SYSTEM_FIELD_IDS + i, names=[name])
        for i, name in enumerate(SYSTEM_COLUMNS)
    ]
    return NameMapping([*mapping.root, *system])


# -- publishing -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PublishResult:
    table: str
    #: The pointer after this call (None: nothing published yet).
    pointer: IcebergPointer | None
    #: Whether this call published a new snapshot.
    published: bool
    #: Snapshots removed: their versions expired, or the view lists at most the newest
    #: ``retention.iceberg_snapshots``.
    expired: tuple[int, ...] = ()
    #: What the publish reused and wrote (see :class:`ViewState`): ``incremental`` (1 when it
    #: built on the previous snapshot), ``read_in_full`` (1 when it read every data file of
    #: the version: not incremental, or most of the table changed), ``data_files_changed``,
    #: ``delete_files_reused``, ``delete_files_written``, ``data_manifests_reused``,
    #: ``data_entries_written`` (the data-file entries of its new manifest); with a cache,
    #: ``files_read`` (the data files whose merge columns it read from the deep store: the
    #: cache's misses).
    stats: dict[str, int] = field(default_factory=dict)


def updated_metadata(
    base: TableMetadata, updates: Sequence[TableUpdate], *, metadata_location: str | None
) -> TableMetadata:
    """``base`` with ``updates`` applied: pyiceberg's ``update_table_metadata`` (0.12: the same
    steps, its own functions) without its closing deep copy of the whole result. Each update
    builds a new model around the lists it changes (``model_copy(update=...)``) and no model is
    changed in place afterwards, so the result shares the snapshots, schemas and log entries
    it kept with ``base``. The deep copy cost a publish time and memory in proportion to the
    snapshots a view lists (up to ``retention.iceberg_snapshots``, 240 by default), at every
    publish; the file written is the same (``test_iceberg_metadata_update.py``)."""
    context = _TableMetadataUpdateContext()
    new = base
    for update in updates:
        new = _apply_table_update(update, new, context)
    if context.has_changes():
        if metadata_location:
            new = _update_table_metadata_log(new, metadata_location, base.last_updated_ms)
        if base.last_updated_ms == new.last_updated_ms:
            now = datetime_to_millis(datetime.now().astimezone())
            new = new.model_copy(update={"last_updated_ms": now})
    new.spec().check_compatible(new.schema())
    new.sort_order().check_compatible(new.schema())
    return new


def load_metadata(deep: DeepStore, path: str) -> TableMetadata:
    """The table metadata in the metadata file at ``path`` (:func:`read_metadata`)."""
    return read_metadata(deep, path)[1]


def parse_metadata(raw: bytes) -> TableMetadata:
    """The table metadata of a metadata file's JSON ``raw``: pyiceberg's parse of it
    (``TableMetadataUtil.parse_raw``, as its ``FromInputFile`` reads a file)."""
    return TableMetadataUtil.parse_raw(raw.decode())


def read_metadata(deep: DeepStore, path: str) -> tuple[bytes, TableMetadata]:
    """The metadata file at ``path``: its JSON and its table metadata. Decompressed by its
    name as pyiceberg's ``FromInputFile`` reads it: a publish writes no compressed file, but
    the pointer may name a ``.gz.metadata.json`` another tool or version wrote."""
    file = _file(deep, path)
    with file.open() as f, Compressor.get_compressor(file.location).stream_decompressor(f) as s:
        raw = s.read()
    return raw, parse_metadata(raw)


def snapshot_ids(metadata: TableMetadata) -> array[int]:
    """The ids of the snapshots ``metadata`` lists, in its order."""
    return array("q", (s.snapshot_id for s in metadata.snapshots))


def write_metadata(
    deep: DeepStore, path: str, metadata: TableMetadata, unsynced: list[str]
) -> bytes:
    """Write ``metadata`` to the new file ``path`` (named in ``unsynced`` for the caller to
    sync) as pyiceberg's ``ToOutputFile.table_metadata`` writes it; returns the JSON written
    (a publisher holds it compressed, :class:`HeldMetadata`)."""
    out = _file(deep, path, create=True, unsynced=unsynced)
    # pyiceberg's own choice: None values left out, but with its legacy option (a None
    # current snapshot id written as -1)
    exclude_none = not Config().get_bool("legacy-current-snapshot-id")
    raw = metadata.model_dump_json(exclude_none=exclude_none).encode()
    with out.create(overwrite=False) as stream:
        stream.write(Compressor.get_compressor(out.location).bytes_compressor()(raw))
    return raw


def current_location(deep: DeepStore, store: MetadataStore, table: str) -> str | None:
    """The URI of ``table``'s current Iceberg metadata file (None: never published)."""
    pointer = store.read_pointer(table)
    return None if pointer is None else location(deep, pointer.metadata_location)


def _data_file(
    deep: DeepStore, path: str, content: DataFileContent, rows: int, size: int
) -> DataFile:
    return DataFile.from_args(
        content=content,
        file_path=location(deep, path),
        file_format=FileFormat.PARQUET,
        partition=Record(),
        record_count=rows,
        file_size_in_bytes=size,
        sort_order_id=None,
        spec_id=0,
        equality_ids=None,
        key_metadata=None,
    )


def _write_manifest(
    deep: DeepStore,
    path: str,
    writer_cls: type[ManifestWriterV2],
    schema: Schema,
    snapshot_id: int,
    files: Iterable[tuple[DataFile, int]],
    unsynced: list[str],
) -> ManifestFile:
    """A manifest of ``files`` (each with the sequence number of the snapshot that added it:
    ADDED if that is ``snapshot_id``, else EXISTING, keeping its number), its own sequence
    number set to ``snapshot_id`` (so a later snapshot can list it again as it is)."""
    writer = writer_cls(
        UNPARTITIONED_PARTITION_SPEC,
        schema,
        _file(deep, path, create=True, unsynced=unsynced),
        snapshot_id,
        AVRO_CODEC,
    )
    with writer:
        for f, seq in files:
            writer.add_entry(
                ManifestEntry.from_args(
                    status=ManifestEntryStatus.ADDED
                    if seq == snapshot_id
                    else ManifestEntryStatus.EXISTING,
                    snapshot_id=seq,
                    sequence_number=seq,
                    file_sequence_number=seq,
                    data_file=f,
                )
            )
    manifest = copy(writer.to_manifest_file())
    manifest.sequence_number = snapshot_id
    return manifest


#: A snapshot's data manifests are merged by tiers (a manifest of n files is of tier
#: ``floor(log4(n))``): a publish's new manifest takes in the listed manifests of its tier once
#: this many share it (itself included), and the bigger manifest that makes may take in those
#: of its own tier in turn. So a file's entry is written again about once a tier (log4 of
#: the table's files) rather than with the whole table every 16 publishes, and a snapshot
#: lists at most 3 manifests a tier plus its new one, or up to ``MANIFESTS_UNMERGED``, below
#: which nothing is merged (a small table's manifests are all listed again). Past
#: ``MAX_DELETE_FILES_PER_PARTITION`` delete files in a partition, the smaller ones are merged
#: into the new one (the largest stays as it is).
MANIFEST_MERGE_FANOUT = 4
MANIFESTS_UNMERGED = 8
MAX_DELETE_FILES_PER_PARTITION = 8


def manifest_tier(files: int) -> int:
    """The tier of a data manifest of ``files`` files: ``floor(log4(files))``."""
    tier = 0
    while files >= MANIFEST_MERGE_FANOUT:
        files //= MANIFEST_MERGE_FANOUT
        tier += 1
    return tier


@dataclass(frozen=True, slots=True)
class PublishedFile:
    """A data file of a published view."""

    data_file: DataFile
    #: The sequence number (= snapshot id = manifest version) of the snapshot that added it.
    seq: int
    facts: FileFacts
    #: The delete files (relative paths) holding its hidden positions, each with the
    #: positions it holds of this file (ascending; together, disjointly, ``facts.deleted``).
    deletes: tuple[tuple[str, np.ndarray], ...] = ()


@dataclass(frozen=True, slots=True)
class PublishedDeletes:
    """A position delete file of a published view, and its manifest (one each)."""

    manifest: ManifestFile
    #: The data files (relative paths) it holds positions of.
    covers: frozenset[str]
    #: Its partition group (the lowest partition of the files it covers; -1: none) and rows.
    group: int = -1
    rows: int = 0


@dataclass(frozen=True, slots=True)
class ViewState:
    """The layout of a published snapshot, as a publisher keeps it to build the next one."""

    metadata_location: str
    version: int
    spec: TableSpec
    files: dict[str, PublishedFile]
    deletes: dict[str, PublishedDeletes]
    data_manifests: tuple[tuple[ManifestFile, frozenset[str]], ...]
    merged: pa.Table
    #: The merged rows' data file (relative path; None: none), and the facts of each
    #: published data file under :attr:`files`.
    merged_path: str | None = None
    stats: dict[str, int] = field(default_factory=dict)

    @property
    def facts(self) -> dict[str, FileFacts]:
        """The facts of each of its Millstream data files (not the merged rows' file)."""
        return {p: f.facts for p, f in self.files.items() if p != self.merged_path}


def still_hidden(old: PublishedFile | None, facts: FileFacts, changed: bool) -> bool:
    """Whether every position the previous view hid in a data file, the new view hides too,
    so its old delete files stay right (the new positions go to a new file beside them): the
    file was published before (a file that left and came back is new: its old positions are
    not its new ones), and its hidden rows did not change or only grew."""
    if old is None:
        return False
    if not changed:
        return True
    return bool(np.isin(old.facts.deleted, facts.deleted, assume_unique=True).all())


def reusable_delete_files(
    deletes: dict[str, PublishedDeletes],
    files: dict[str, FileFacts],
    changed: frozenset[str],
    before: dict[str, PublishedFile],
) -> set[str]:
    """The previous snapshot's delete files that can be listed again as they are: every data
    file one holds positions of is still in the new view and still hides them
    (:func:`still_hidden`), and every other delete file of those data files is listed again
    too (a data file whose positions are written again in full drops all its old ones:
    readers would read them twice). A delete file some of whose files left is written again
    without them (readers would read their positions for nothing)."""
    hides: dict[str, bool] = {}  # per data file, its still_hidden (once, not per delete file)

    def still_hides(covered: str) -> bool:
        known = hides.get(covered)
        if known is None:
            known = covered in files and still_hidden(
                before.get(covered), files[covered], covered in changed
            )
            hides[covered] = known
        return known

    kept = set()
    for path, d in deletes.items():
        if all(
            still_hides(covered) and any(held == path for held, _ in before[covered].deletes)
            for covered in d.covers
        ):
            kept.add(path)
    while True:  # a file with a dropped delete file is written in full: drop its others
        dropped = {
            held
            for p, f in before.items()
            if any(h not in kept for h, _ in f.deletes)
            for held, _ in f.deletes
            if held in kept
        }
        if not dropped:
            return kept
        kept -= dropped


def write_snapshot(
    deep: DeepStore,
    spec: TableSpec,
    view: ComputedView | None,
    previous: TableMetadata | None,
    *,
    previous_location: str | None,
    created_at: float,
    committed_at: float,
    oldest_kept: int,
    state: ViewState | None = None,
) -> tuple[str, tuple[int, ...], ViewState | None, TableMetadata, bytes]:
    """Write the files of a snapshot of ``view`` and the table metadata that adds it to
    ``previous`` (dropping the snapshots of versions below ``oldest_kept``); returns the new
    metadata file's path (relative), the expired snapshot ids, the new view's layout, the
    new table metadata and its file's JSON.
    Without ``view``, the new metadata only drops the expired snapshots.

    With ``state`` (the layout of ``previous``'s current snapshot), what did not change is
    listed again rather than written: a data manifest whose files all remain (merged by tiers:
    :data:`MANIFEST_MERGE_FANOUT`), a data file's
    entry (with the sequence number it was added at), a delete file and its manifest when
    :func:`reusable_delete_files` says so, the merged rows' file when they did not change. New
    delete files, one per partition (of a file's lowest partition), hold the positions no
    listed delete file holds: every hidden position of a new data file (or of one whose old
    delete files are dropped), and only the new ones of a data file that hides more rows than
    before (a snapshot lists several delete files of a data file; readers apply them all), so
    an update's cost grows with the positions it hides, not with the table."""
    table = spec.name
    prefix = view_prefix(table)
    if view is None:
        assert previous is not None and previous.current_snapshot_id is not None
        expired = tuple(s.snapshot_id for s in previous.snapshots if s.snapshot_id < oldest_kept)
        metadata = updated_metadata(
            previous,
            (RemoveSnapshotsUpdate(snapshot_ids=list(expired)),),
            metadata_location=previous_location,
        )
        tag = f"{previous.current_snapshot_id:012d}-{uuid.uuid4().hex}"
        metadata_path = f"{prefix}/metadata/{tag}.metadata.json"
        written: list[str] = []
        raw = write_metadata(deep, metadata_path, metadata, written)
        deep.sync_files(written)  # before the pointer names it
        return metadata_path, expired, None, metadata, raw
    v = view.version
    tag = f"{v:012d}-{uuid.uuid4().hex}"
    unsynced: list[str] = []  # the files written, synced together before returning
    if state is not None and previous is not None and state.spec == spec:
        # ``previous`` is ``state``'s snapshot's metadata, written from this same spec: its
        # current schema is the one iceberg_schema would find again (at some ms a table).
        schema = previous.schema()
    else:
        schema = iceberg_schema(spec.arrow_schema(), previous)
    before = state.files if state is not None else {}
    changed = view.changed if view.changed is not None else frozenset(view.files)

    # The data files: an entry each (a file already published keeps its entry and number).
    entries: dict[str, tuple[DataFile, int]] = {}
    for path, f in view.files.items():
        old = before.get(path)
        if old is not None:
            entries[path] = (old.data_file, old.seq)
        else:
            entries[path] = (_data_file(deep, path, DataFileContent.DATA, f.rows, f.size), v)
    merged_path: str | None = None
    if view.merged.num_rows:
        if (
            state is not None
            and not view.merged_changed
            and state.merged_path is not None
            and state.merged_path in before
        ):
            merged_path = state.merged_path
            entries[merged_path] = (before[merged_path].data_file, before[merged_path].seq)
        else:
            merged_path = f"{prefix}/merged/{tag}.parquet"
            size = deep.write_parquet(merged_path, view.merged, durable=False)
            unsynced.append(merged_path)
            entries[merged_path] = (
                _data_file(deep, merged_path, DataFileContent.DATA, view.merged.num_rows, size),
                v,
            )
    # The data manifests: a previous one listed again while every file it lists is still in
    # the view; the new files (and those of a manifest some of whose files left) in one new
    # manifest, which takes in the previous ones of its tier once that tier holds
    # MANIFEST_MERGE_FANOUT of them with it and the snapshot would list more than
    # MANIFESTS_UNMERGED.
    data_manifests = [
        (m, paths)
        for m, paths in (state.data_manifests if state is not None else ())
        if paths <= entries.keys()
    ]
    rest = set(entries.keys()).difference(*(paths for _, paths in data_manifests))
    while rest and len(data_manifests) >= MANIFESTS_UNMERGED:
        tier = manifest_tier(len(rest))
        same = [(m, p) for m, p in data_manifests if manifest_tier(len(p)) == tier]
        if len(same) + 1 < MANIFEST_MERGE_FANOUT:
            break
        data_manifests = [(m, p) for m, p in data_manifests if manifest_tier(len(p)) != tier]
        for _, paths in same:
            rest |= paths
    reused_manifests = len(data_manifests)
    if rest:
        m = _write_manifest(
            deep,
            f"{prefix}/metadata/{tag}-m0.avro",
            ManifestWriterV2,
            schema,
            v,
            [entries[p] for p in sorted(rest)],
            unsynced,
        )
        data_manifests.append((m, frozenset(rest)))

    # The delete files: a previous one listed again if it may be; the positions no listed file
    # holds (all of a new file's, or a file's new ones) in new files, one per partition.
    published_deletes = state.deletes if state is not None else {}
    kept = reusable_delete_files(published_deletes, view.files, changed, before)
    holds: dict[str, list[tuple[str, np.ndarray]]] = {}
    extra: dict[str, list[np.ndarray]] = {}
    for path, f in sorted(view.files.items()):
        old = before.get(path)
        if old is not None and all(h in kept for h, _ in old.deletes):
            holds[path] = list(old.deletes)
            new = (
                np.setdiff1d(f.deleted, old.facts.deleted, assume_unique=True)
                if path in changed
                else f.deleted[:0]
            )
        else:
            holds[path], new = [], f.deleted
        if len(new):
            extra[path] = [new]
    groups: dict[int, list[str]] = defaultdict(list)
    for path in extra:  # one new delete file per partition: an untouched partition's stays
        groups[min((r[0] for r in view.files[path].ranges), default=-1)].append(path)
    for group in list(groups):
        mine = sorted(
            (h for h in kept if published_deletes[h].group == group),
            key=lambda h: (-published_deletes[h].rows, h),
        )
        if len(mine) < MAX_DELETE_FILES_PER_PARTITION:
            continue
        # Too many in this partition: the smaller ones' positions go to the new file too.
        merged = set(mine[1:])
        kept -= merged
        for path, held in holds.items():
            moving = [pos for h, pos in held if h in merged]
            if moving:
                holds[path] = [(h, pos) for h, pos in held if h not in merged]
                if path not in extra:
                    extra[path] = []
                    groups[group].append(path)
                extra[path].extend(moving)
    new_deletes: dict[str, PublishedDeletes] = {}
    for group, members in sorted(groups.items()):
        members.sort()
        positions = [np.sort(np.concatenate(extra[p])) for p in members]
        # Each file's location once, repeated by its positions, sorted by file then position
        # as the spec asks of a position delete file.
        which = np.repeat(np.arange(len(members), dtype=np.int64), [len(x) for x in positions])
        deletes = pa.table(
            {
                "file_path": pa.array([location(deep, p) for p in members], pa.string()).take(
                    which
                ),
                "pos": pa.array(np.concatenate(positions), pa.int64()),
            },
            schema=DELETE_SCHEMA,
        )
        name = f"{tag}-p{group}" if group >= 0 else tag
        delete_path = f"{prefix}/deletes/{name}.parquet"
        size = deep.write_parquet(delete_path, deletes, durable=False)
        unsynced.append(delete_path)
        m = _write_manifest(
            deep,
            f"{prefix}/metadata/{name}-m1.avro",
            DeleteManifestWriter,
            schema,
            v,
            [
                (
                    _data_file(
                        deep, delete_path, DataFileContent.POSITION_DELETES, deletes.num_rows, size
                    ),
                    v,
                )
            ],
            unsynced,
        )
        new_deletes[delete_path] = PublishedDeletes(m, frozenset(members), group, deletes.num_rows)
        for p, pos in zip(members, positions, strict=True):
            holds[p].append((delete_path, pos))
    all_deletes = {**{h: published_deletes[h] for h in kept}, **new_deletes}

    list_path = f"{prefix}/metadata/snap-{tag}.avro"
    parent = previous.current_snapshot_id if previous is not None else None
    with write_manifest_list(
        2, _file(deep, list_path, create=True, unsynced=unsynced), v, parent, v, AVRO_CODEC
    ) as writer:
        writer.add_manifests(
            [m for m, _ in data_manifests] + [d.manifest for _, d in sorted(all_deletes.items())]
        )
    snapshot = Snapshot(
        snapshot_id=v,
        parent_snapshot_id=parent,
        sequence_number=v,
        timestamp_ms=int(committed_at * 1000),
        manifest_list=location(deep, list_path),
        summary=Summary(
            Operation.OVERWRITE,
            **{VERSION_PROPERTY: str(v), "total-records": str(view.live_rows)},
        ),
        schema_id=schema.schema_id,
    )
    if previous is not None:
        base = previous
    else:
        base = new_table_metadata(
            schema,
            UNPARTITIONED_PARTITION_SPEC,
            UNSORTED_SORT_ORDER,
            location(deep, f"tables/{table}"),
            properties={"format-version": "2"},
            table_uuid=uuid.uuid5(uuid.NAMESPACE_URL, f"millstream:{table}:{created_at!r}"),
        )
    updates: list[TableUpdate] = []
    if not any(s.schema_id == schema.schema_id for s in base.schemas):
        updates += [AddSchemaUpdate(schema_=schema), SetCurrentSchemaUpdate(schema_id=-1)]
    elif base.current_schema_id != schema.schema_id:
        updates.append(SetCurrentSchemaUpdate(schema_id=schema.schema_id))
    if (
        previous is None
        or previous.current_schema_id != schema.schema_id
        or NAME_MAPPING not in previous.properties
    ):  # the mapping is the schema's: written again only when the schema changes
        updates.append(
            SetPropertiesUpdate(updates={NAME_MAPPING: name_mapping(schema).model_dump_json()})
        )
    updates += [
        AddSnapshotUpdate(snapshot=snapshot),
        SetSnapshotRefUpdate(
            ref_name="main",
            type=SnapshotRefType.BRANCH,
            snapshot_id=v,
            max_ref_age_ms=None,
            max_snapshot_age_ms=None,
            min_snapshots_to_keep=None,
        ),
    ]
    expired = tuple(s.snapshot_id for s in base.snapshots if s.snapshot_id < oldest_kept)
    if expired:
        updates.append(RemoveSnapshotsUpdate(snapshot_ids=list(expired)))
    metadata = updated_metadata(base, updates, metadata_location=previous_location)
    metadata_path = f"{prefix}/metadata/{tag}.metadata.json"
    raw = write_metadata(deep, metadata_path, metadata, unsynced)
    # Every file of the snapshot on disk, with its name, before the caller's compare-and-set
    # of the pointer can name the metadata: each file once, each directory once.
    deep.sync_files(unsynced)
    published: dict[str, PublishedFile] = {
        p: PublishedFile(entries[p][0], entries[p][1], f, tuple(holds[p]))
        for p, f in view.files.items()
    }
    if merged_path is not None:
        empty = np.zeros(0, np.int64)
        published[merged_path] = PublishedFile(
            entries[merged_path][0],
            entries[merged_path][1],
            FileFacts(view.merged.num_rows, 0, frozenset(), empty),
        )
    new_state = ViewState(
        metadata_path,
        v,
        spec,
        published,
        all_deletes,
        tuple(data_manifests),
        view.merged,
        merged_path,
        {
            "incremental": int(state is not None),
            "read_in_full": int(not view.incremental),
            "data_files_changed": len(changed),
            "data_manifests_reused": reused_manifests,
            "data_entries_written": len(rest),
            "delete_files_reused": len(kept),
            "delete_files_written": len(new_deletes),
        },
    )
    return metadata_path, expired, new_state, metadata, raw


def view_floor(previous: TableMetadata, kept: int) -> int:
    """The oldest snapshot a new snapshot's metadata lists beside it when ``previous`` lists
    its earlier ones and the view lists at most ``kept`` (``table.retention.iceberg_snapshots``):
    the newest ``kept - 1`` of ``previous``'s. Every publish rewrites the whole metadata (and a
    long-lived publisher copies it), so a view listing a snapshot per publish for a day's
    retention (5,760 at 15 s) grew a publisher's memory and each metadata file without bound
    within that day. Only the view's list is shortened: GC keeps every file of a kept
    version's snapshot and metadata file, so a reader holding an older metadata location
    still reads it."""
    ids = sorted(s.snapshot_id for s in previous.snapshots)
    drop = len(ids) - (kept - 1)  # how many of the earlier ones go
    if not ids or drop <= 0:
        return 0
    return ids[drop] if drop < len(ids) else ids[-1] + 1


def publish(
    store: MetadataStore, deep: DeepStore, table: str, *, cache: PublishCache | None = None
) -> PublishResult:
    """Publish ``table``'s current manifest version as an Iceberg snapshot (nothing to do if
    the pointer shows it already). A publisher that loses the pointer's compare-and-set to
    another returns ``published=False`` with the winner's pointer. One whose swap would land
    more than :data:`~millstream.table.limits.MAX_PUBLISH_AGE_SECONDS` after it began writing
    the snapshot's files raises :class:`~millstream.errors.PublishExpiredError` and moves
    nothing (garbage collection may have deleted those unreferenced files meanwhile); its
    caller's next turn publishes again.

    With ``cache`` (a long-lived publisher's), a publish builds on the snapshot this cache
    saw published last, if the pointer still names it and the table's spec is the same
    (:func:`incremental_view`, :func:`write_snapshot`): its cost grows with what changed since,
    not with the table. Otherwise it reads every data file of the version.

    A table with nothing new costs one read transaction (its pointer, its current version,
    its oldest kept version) and, with ``cache``, no file read: the cache keeps the metadata
    file it last read or wrote, which tells whether retention expired a snapshot."""
    with store.read() as conn:
        pointer = read_pointer(conn, table)
        info = find_table(conn, table)
        oldest = oldest_kept_version(conn, table)
    assert info is not None
    if info.manifest_version == 0:
        return PublishResult(table, pointer, False)

    previous: TableMetadata | None = None
    listed: Sequence[int] = ()  # the snapshot ids the pointer's metadata file lists
    if pointer is not None:
        held = (
            cache.held_metadata(deep, table, pointer.metadata_location)
            if cache is not None
            else None
        )
        if held is not None:  # the model is built only if this publish writes a file
            listed = held.snapshot_ids
        elif cache is not None:  # read (and held) once: not parsed again below
            previous = cache.metadata(deep, table, pointer.metadata_location)
            listed = snapshot_ids(previous)
        else:
            previous = load_metadata(deep, pointer.metadata_location)
            listed = snapshot_ids(previous)
        if pointer.manifest_version >= info.manifest_version and not any(
            i < oldest for i in listed
        ):  # nothing new, nothing expired: no manifest read
            return PublishResult(table, pointer, False)
    manifest = store.manifest(table)
    v = manifest.version
    view: ComputedView | None = None
    misses = cache.misses if cache is not None else 0
    state = cache.view(deep, table) if cache is not None else None
    if state is not None and (
        pointer is None
        or state.metadata_location != pointer.metadata_location
        or state.spec != manifest.table.spec
    ):
        state = None  # another publisher moved the pointer, or the schema changed
    if pointer is not None and pointer.manifest_version >= v:
        # Nothing new; still drop the snapshots of versions retention expired.
        if not any(i < oldest for i in listed):
            return PublishResult(table, pointer, False)
        v = pointer.manifest_version
    elif state is not None and cache is not None and state.version < v:
        view = incremental_view(deep, manifest, state, cache)
    else:
        view = full_view(deep, manifest, cache.take_read(deep, manifest) if cache else None)
    if pointer is not None and previous is None:
        assert cache is not None
        previous = cache.metadata(deep, table, pointer.metadata_location)
    committed_at = store.version_committed_at(table, v)
    floor = oldest
    if view is not None and previous is not None:
        floor = max(floor, view_floor(previous, manifest.table.spec.retention.iceberg_snapshots))
    # Before the first file is written: none of the snapshot's files is older than this.
    written_at = store.clock.now()

    def young_enough() -> None:
        # Inside the pointer's transaction, right before COMMIT: until the pointer names them
        # the snapshot's files are unreferenced, and the view's garbage collection deletes
        # unreferenced files older than its grace period. A publisher stalled between its
        # writes and this swap (a paused VM, SIGSTOP, a long GC pause) past the grace would
        # otherwise point every reader at files a collection deleted meanwhile.
        age = store.clock.now() - written_at
        if age > MAX_PUBLISH_AGE_SECONDS:
            raise PublishExpiredError(table, age, MAX_PUBLISH_AGE_SECONDS)

    metadata_path, expired, new_state, metadata, raw = write_snapshot(
        deep,
        manifest.table.spec,
        view,
        previous,
        previous_location=location(deep, pointer.metadata_location) if pointer else None,
        created_at=manifest.table.created_at,
        committed_at=committed_at,
        oldest_kept=floor,
        state=state,
    )
    if new_state is not None and cache is not None:
        new_state.stats["files_read"] = cache.misses - misses  # data files' columns read
    now = store.clock.now()
    try:
        moved = store.swap_pointer(
            table,
            pointer,
            metadata_location=metadata_path,
            manifest_version=v,
            now=now,
            precondition=young_enough,
        )
    except VersionExpiredError as exc:
        # Retention expired the version while this publish wrote its snapshot (GC may have
        # deleted its files): nothing moved; the next publish shows a kept version.
        if cache is not None:
            cache.remember(deep, table, None)
        log.info("iceberg view of %s: not published: %s", table, exc)
        return PublishResult(table, store.read_pointer(table), False)
    except CommitStateUnknownError:
        if cache is not None:
            cache.remember(deep, table, None)
        again = store.read_pointer(table)
        landed = again is not None and again.metadata_location == metadata_path
        return PublishResult(table, again, landed and view is not None, expired if landed else ())
    if moved is None:
        if cache is not None:
            cache.remember(deep, table, None)
        log.info("iceberg view of %s: another publisher moved the pointer first", table)
        return PublishResult(table, store.read_pointer(table), False)
    if cache is not None:
        cache.remember_metadata(deep, table, metadata_path, metadata, raw)
        if new_state is None and state is not None:  # only snapshots expired: same layout
            new_state = ViewState(
                metadata_path,
                state.version,
                state.spec,
                state.files,
                state.deletes,
                state.data_manifests,
                state.merged,
                state.merged_path,
                state.stats,
            )
        cache.remember(deep, table, new_state)
        # Only now, with the view that no longer lists them remembered, are the columns of
        # the files that left the table (a seal's, a compaction's) never needed again.
        if view is not None:
            cache.retain(deep, table, live_files(manifest))
    return PublishResult(
        table, moved, view is not None, expired, new_state.stats if new_state else {}
    )


def live_files(manifest: Manifest) -> set[str]:
    """The data files and delete vectors (relative paths) of ``manifest``."""
    files = {e.file_path for e in manifest.entries if e.file_path is not None}
    return files | {dv.file_path for dv in manifest.delete_vectors}


# -- garbage collection -----------------------------------------------------------------------


#: References :class:`ViewReferences` holds at most by default (paths, snapshot ids, and
#: :data:`ENTRY_REFS` for each file kept): some 35 MB, the view files of about 100 tables that
#: list 240 snapshots each, their metadata logs at 100 files (see its docstring).
DEFAULT_VIEW_REFERENCES = 680_000


class ViewReferences:
    """What the immutable files of Iceberg views reference, for :func:`referenced_view_files`.

    Every file a publish writes under a view's directory (a ``metadata.json``, a manifest
    list, a manifest) has a new name and never changes, so what it references can be kept by
    its path: an earlier metadata file's snapshots (each one's id and manifest list), a
    manifest list's manifests, a manifest's files under the view's directory (delete files,
    merged-row files; every entry, deleted ones too). Kept by the deep store (its URI and
    root: the paths held are relative to it) and the file's path; nothing else is kept here
    (not the pointer's current metadata, whose log tells which earlier files count, not
    which snapshots are retained, not whether a file exists): the collection applies those to
    the answers every time. A table's second collection then reads only its current metadata
    and the files published since the first, not every retained snapshot's.

    A view's metadata files list nearly the same snapshots one after the other (each publish
    adds one and drops the oldest), so a snapshot's id and manifest list are held once per
    view (a :class:`_History`, in the order its metadata files list them), and an earlier
    metadata file holds the stretch of it that is exactly its list (:class:`_Snapshots`),
    checked against the file when it is read; a file whose list is not such a stretch holds
    its own. Before, each of the 100 earlier metadata files held its ~240 snapshots again:
    85% of the references, and a bound that held about 37 such tables.

    Bounded by :attr:`max_refs` references (paths and snapshot ids held, :data:`ENTRY_REFS`
    for each entry; 51 bytes each measured on one table of 240 snapshots: 680,000 is some
    35 MB, the view files of about 100 tables that list 240 snapshots each, their metadata
    logs at 100 files, ~6,300 references a table; ``bench/view_gc.py``); past it the least
    recently used entries go, and a collection reads those files again. A file the
    collection deletes is forgotten (:meth:`forget`), so the entries follow the views' live
    files. :attr:`hits` and :attr:`misses` count the files found kept and read
    (:attr:`read` by kind), :attr:`evicted` the entries that went past the bound."""

    def __init__(self, max_refs: int = DEFAULT_VIEW_REFERENCES) -> None:
        self.max_refs = max_refs
        #: References the entries hold (each entry counts :data:`ENTRY_REFS` for itself).
        self.refs = 0
        self.hits = 0
        self.misses = 0
        self.evicted = 0
        #: Files read, by kind: ``metadata``, ``manifest_list``, ``manifest``.
        self.read: dict[str, int] = {"metadata": 0, "manifest_list": 0, "manifest": 0}
        #: Per deep store (its URI and root: the paths held are relative to it), each file's
        #: entry by its path, least recently used first.
        self._stores: dict[tuple[str, str], OrderedDict[str, _Referenced]] = {}
        #: Per view directory, the history its next metadata file's snapshots extend (held
        #: by the entries that slice it: gone with the last of them).
        self._histories: weakref.WeakValueDictionary[tuple[str, str, str], _History] = (
            weakref.WeakValueDictionary()
        )
        self._lock = threading.Lock()

    def _entries(self, deep: DeepStore) -> OrderedDict[str, _Referenced]:
        """The entries of ``deep``'s files (a copy of a deep store, whose files name the
        original's, never answers for the original)."""
        return self._stores.setdefault((deep.uri, location(deep, "")), OrderedDict())

    def _get(self, deep: DeepStore, path: str) -> _Referenced | None:
        with self._lock:
            entries = self._entries(deep)
            held = entries.get(path)
            if held is None:
                self.misses += 1
                return None
            self.hits += 1
            entries.move_to_end(path)
            return held

    def _put(self, deep: DeepStore, path: str, value: _Referenced, kind: str) -> None:
        with self._lock:
            self.read[kind] += 1
            entries = self._entries(deep)
            old = entries.pop(path, None)
            if old is not None:
                self.refs -= _weight(old)
            entries[path] = value
            self.refs += _weight(value)
            while self.refs > self.max_refs:
                victims = entries if len(entries) > 1 else None
                for other in self._stores.values():
                    if victims is None and other and other is not entries:
                        victims = other
                if victims is None:
                    break
                _, gone = victims.popitem(last=False)
                self.refs -= _weight(gone)
                self.evicted += 1

    def forget(self, deep: DeepStore, path: str) -> None:
        """Drop what is kept of ``path`` (deleted: never asked again)."""
        with self._lock:
            gone = self._entries(deep).pop(path, None)
            if gone is not None:
                self.refs -= _weight(gone)

    def __len__(self) -> int:
        return sum(len(e) for e in self._stores.values())

    def status(self) -> dict[str, Any]:
        """What is held and how it was used (for a worker's ``debugInfo``)."""
        with self._lock:
            return {
                "entries": sum(len(e) for e in self._stores.values()),
                "references": self.refs,
                "max_references": self.max_refs,
                "hits": self.hits,
                "misses": self.misses,
                "evicted": self.evicted,
                "read": dict(self.read),
            }

    def snapshots(self, deep: DeepStore, path: str) -> _Snapshots:
        """The snapshots the metadata file ``path`` lists, every one: their ids and their
        manifest lists (relative; None for one outside the deep store)."""
        held = self._get(deep, path)
        if isinstance(held, _Snapshots):
            return held
        ids, lists = _listed_snapshots(deep, _metadata_json(deep, path))
        view = (deep.uri, location(deep, ""), path.rsplit("/metadata/", 1)[0])
        with self._lock:
            found = self._stretch(view, ids, lists)
        self._put(deep, path, found, "metadata")
        return found

    def _stretch(
        self, view: tuple[str, str, str], ids: array[int], lists: list[str | None]
    ) -> _Snapshots:
        """``ids`` and ``lists`` (a metadata file's snapshots, in its order) as a stretch of
        the view's history: the same snapshots in the same order, checked here (a history
        only grows at its end, so a stretch of it never changes); the snapshots past its end
        are added. Else, or when the history's head that no file of it lists any more is
        longer than this file's list, a history of its own (the view's next one, when its
        ids rise)."""
        n = len(ids)
        history = self._histories.get(view)
        if history is not None and n:
            start = bisect.bisect_left(history.ids, ids[0])
            shared = min(len(history.ids) - start, n)
            if (
                shared > 0
                and start <= n
                and history.ids[start : start + shared] == ids[:shared]
                and history.lists[start : start + shared] == lists[:shared]
                and _rising(ids[shared - 1 :])
            ):
                history.ids.extend(ids[shared:])
                history.lists.extend(lists[shared:])
                return _Snapshots(history, start, start + n, n - shared)
        history = _History(ids, lists)
        if _rising(ids):
            self._histories[view] = history
        return _Snapshots(history, 0, n, n)

    def manifests(self, deep: DeepStore, path: str) -> tuple[str, ...]:
        """The manifests (relative paths) the manifest list ``path`` lists."""
        held = self._get(deep, path)
        if isinstance(held, tuple):
            return held
        found = tuple(
            sys.intern(_inside(deep, r["manifest_path"])) for r in _avro_records(deep, path)
        )
        self._put(deep, path, found, "manifest_list")
        return found

    def files(self, deep: DeepStore, path: str) -> tuple[str, ...]:
        """The files (relative paths) under the view's directory (the manifest's own, the
        part of ``path`` before ``/metadata/``) that the manifest ``path``'s entries name,
        deleted entries too."""
        held = self._get(deep, path)
        if isinstance(held, _Files):
            return held.paths
        prefix = path.rsplit("/metadata/", 1)[0] + "/"
        paths = tuple(
            sys.intern(rel)
            for e in _avro_records(deep, path)
            if (rel := relative(deep, e["data_file"]["file_path"])) is not None
            and rel.startswith(prefix)
        )
        found = _Files(paths) if paths else _NO_FILES  # most manifests: data files only
        self._put(deep, path, found, "manifest")
        return found.paths


def _rising(ids: array[int]) -> bool:
    return all(a < b for a, b in itertools.pairwise(ids))


def _inside(deep: DeepStore, uri: str) -> str:
    rel = relative(deep, uri)
    if rel is None:
        raise ValueError(f"{uri!r} is not in the deep store {deep.uri!r}")
    return rel


def _metadata_json(deep: DeepStore, path: str) -> dict[str, Any]:
    """The metadata file ``path`` as JSON (gzip'd or not): the collection needs its
    snapshots' ids and manifest lists and its log, not pyiceberg's model of it (its
    validation was a quarter of a warm collection's CPU)."""
    with _file(deep, path).open() as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    doc = json.loads(data)
    if not isinstance(doc, dict):
        raise ValueError(f"{path!r} is not an Iceberg metadata file")
    return doc


def _listed_snapshots(deep: DeepStore, doc: dict[str, Any]) -> tuple[array[int], list[str | None]]:
    """The snapshots of a metadata file's JSON: ids and manifest lists (relative, interned:
    every earlier metadata file lists the same ones again; None outside the deep store)."""
    listed = doc.get("snapshots") or []
    return (
        array("q", (int(s["snapshot-id"]) for s in listed)),
        [_interned(relative(deep, s["manifest-list"])) for s in listed],
    )


def _avro_records(deep: DeepStore, path: str) -> Iterable[dict[str, Any]]:
    """The records of the Avro file ``path`` (a manifest list, a manifest), decoded by
    fastavro: pyiceberg's reader resolves each file's schema into a reader tree again,
    most of a warm collection's CPU."""
    with _file(deep, path).open() as f:
        data = f.read()
    return cast(Iterable[dict[str, Any]], fastavro.reader(io.BytesIO(data)))


def _interned(path: str | None) -> str | None:
    """``path``, one string for all equal ones: manifest lists are named again by every
    earlier metadata file, manifests by every manifest list that lists them."""
    return None if path is None else sys.intern(path)


@dataclass(slots=True, weakref_slot=True, eq=False)
class _History:
    """A view's snapshots, in the order its metadata files list them: ``ids[i]``'s
    manifest list is ``lists[i]``. Only grows at its end."""

    ids: array[int]
    lists: list[str | None]


@dataclass(frozen=True, slots=True)
class _Snapshots:
    """An earlier metadata file's snapshots: the stretch ``start:stop`` of ``history``;
    ``own`` of them were added to the history for it (its weight)."""

    history: _History
    start: int
    stop: int
    own: int

    @property
    def ids(self) -> array[int]:
        return self.history.ids[self.start : self.stop]

    @property
    def lists(self) -> list[str | None]:
        return self.history.lists[self.start : self.stop]

    def __iter__(self) -> Iterator[tuple[int, str | None]]:
        h = self.history
        return zip(h.ids[self.start : self.stop], h.lists[self.start : self.stop], strict=True)


@dataclass(frozen=True, slots=True)
class _Files:
    """The view's files a manifest's entries name."""

    paths: tuple[str, ...]


_NO_FILES: Final = _Files(())

_Referenced = _Snapshots | tuple[str, ...] | _Files

#: What an entry counts in :attr:`ViewReferences.refs` for itself (its path, its place in
#: the least-recently-used order: about as many bytes as 4 references held).
ENTRY_REFS: Final = 4


def _weight(value: _Referenced) -> int:
    if isinstance(value, _Snapshots):
        return ENTRY_REFS + value.own
    if isinstance(value, _Files):
        return ENTRY_REFS + len(value.paths)
    return ENTRY_REFS + len(value)


#: The process's :class:`ViewReferences`: every table maintenance in the process
#: (:func:`millstream.table.maintain.maintain`) collects through it.
VIEW_REFERENCES: Final = ViewReferences()


def referenced_view_files(
    store: MetadataStore,
    deep: DeepStore,
    table: str,
    references: ViewReferences | None = None,
) -> set[str]:
    """Every file of ``table``'s view (relative paths under :func:`view_prefix`) that a
    retained snapshot needs: the current metadata file and the earlier ones its log lists
    whose snapshot is retained, and of every retained snapshot (manifest version at or above
    the oldest kept one) they list, its manifest list, manifests, delete files and merged-row
    files.

    The current metadata file is read every time (the pointer names it); what the immutable
    files reference comes from ``references`` (a fresh :class:`ViewReferences` if None: each
    manifest is still read once, not once per snapshot that lists it). Which earlier metadata
    files count (their version, whether they exist) and which snapshots are retained are
    decided here, every time, after the lookup."""
    pointer = store.read_pointer(table)
    if pointer is None:
        return set()
    oldest = store.oldest_kept_version(table)
    refs = references if references is not None else ViewReferences()
    current = _metadata_json(deep, pointer.metadata_location)
    keep = {pointer.metadata_location}
    ids, lists = _listed_snapshots(deep, current)
    listed: list[Iterable[tuple[int, str | None]]] = [zip(ids, lists, strict=True)]
    for entry in current.get("metadata-log") or []:
        rel = relative(deep, entry["metadata-file"])
        if rel is None or _version_of(rel) < oldest or not deep.exists(rel):
            continue
        keep.add(rel)
        listed.append(refs.snapshots(deep, rel))
    prefix = view_prefix(table) + "/"
    seen: set[int] = set()
    for snapshot_id, manifest_list in itertools.chain.from_iterable(listed):
        if snapshot_id < oldest or snapshot_id in seen:
            continue
        seen.add(snapshot_id)
        if manifest_list is None:
            raise ValueError(f"a manifest list of {table} is not in the deep store {deep.uri!r}")
        keep.add(manifest_list)
        for m in refs.manifests(deep, manifest_list):
            if m in keep:
                continue  # listed by an earlier snapshot: its files are kept already
            keep.add(m)
            keep.update(rel for rel in refs.files(deep, m) if rel.startswith(prefix))
    return keep


def _version_of(path: str) -> int:
    """The manifest version in a view file's name (``<version>-<uuid>...``)."""
    name = path.rsplit("/", 1)[-1].removeprefix("snap-")
    head = name.split("-", 1)[0]
    return int(head) if head.isdigit() else -1


def collect_view_garbage(
    store: MetadataStore,
    deep: DeepStore,
    table: str,
    *,
    grace_seconds: float,
    now: float,
    dry_run: bool = False,
    references: ViewReferences | None = None,
) -> list[StoredFile]:
    """Delete the files of ``table``'s view that no retained snapshot needs
    (:func:`referenced_view_files`, through ``references``: a long-lived maintainer's, so its
    next collection reads only what was published since) and that are older than the grace
    period (a publish in progress writes its files before it moves the pointer). Lists before
    it reads the references, as :func:`millstream.table.gc.collect_garbage` does."""
    files = deep.list_files(view_prefix(table))
    if not files:
        return []
    referenced = referenced_view_files(store, deep, table, references)
    cutoff = now - grace_seconds
    doomed = [
        f
        for f in files
        if f.path not in referenced and f.mtime is not None and f.mtime.timestamp() < cutoff
    ]
    if not dry_run:
        for f in doomed:
            deep.delete(f.path)
            if references is not None:
                references.forget(deep, f.path)
    return doomed
