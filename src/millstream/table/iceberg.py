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
(``TableMetadataV2`` through ``update_table_metadata``), the manifest list, the data manifest
and the delete manifest (:class:`DeleteManifestWriter`, pyiceberg's V2 writer whose content is
DELETES). Millstream's Parquet files carry no Iceberg field ids, so the table property
``schema.name-mapping.default`` maps column names to ids; ids stay stable across schema
changes (pyiceberg's ``union_by_name`` against the previous schema).

A publish writes only new files under ``tables/<table>/iceberg/`` and then moves the table's
pointer (:func:`millstream.metastore.iceberg.swap_pointer`, a compare-and-set): a publisher
that loses the race leaves its files unreferenced (garbage collection removes them).
"""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from pyiceberg.io import FileIO, InputFile, OutputFile
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
from pyiceberg.serializers import FromInputFile, ToOutputFile
from pyiceberg.table.metadata import TableMetadata, new_table_metadata
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
    update_table_metadata,
)
from pyiceberg.table.update.schema import UpdateSchema
from pyiceberg.typedef import Record

from millstream.errors import CommitStateUnknownError
from millstream.metastore.iceberg import (
    IcebergPointer,
    read_pointer,
    swap_pointer,
    version_committed_at,
)
from millstream.metastore.models import Entry, Manifest
from millstream.metastore.store import MetadataStore
from millstream.spec import OFFSET_COL, PARTITION_COL, SYSTEM_COLUMNS, TableSpec
from millstream.storage.deepstore import DeepStore, StoredFile
from millstream.table.read import conform, read_manifest

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


def _file(deep: DeepStore, path: str, *, create: bool = False) -> PyArrowFile:
    full = deep._abs(path)
    if create:
        deep.fs.create_dir(full.rsplit("/", 1)[0], recursive=True)
    return PyArrowFile(location(deep, path), full, deep.fs)


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


def version_view(deep: DeepStore, manifest: Manifest) -> VersionView:
    """The Iceberg view of ``manifest``: per data file, the positions of the rows Millstream's
    read of that version does not return, and the merged rows no physical row holds."""
    spec: TableSpec = manifest.table.spec
    winners = read_manifest(deep, manifest, include_system_columns=True)
    user = spec.arrow_schema()
    full = spec.arrow_schema(system_columns=True)
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
    for i, (path, entries) in enumerate(sorted(by_file.items())):
        data = conform(deep.read_parquet(path), full)
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
    p_idx = pc.sort_indices(physical, sort_keys=order)
    w_sorted = winners.take(pc.sort_indices(winners, sort_keys=order))
    p_sorted = physical.take(p_idx)
    if p_sorted.num_rows != w_sorted.num_rows or not (
        p_sorted.column(PARTITION_COL).equals(w_sorted.column(PARTITION_COL))
        and p_sorted.column(OFFSET_COL).equals(w_sorted.column(OFFSET_COL))
    ):
        raise RuntimeError(
            f"table {spec.name!r} version {manifest.version}: the rows of its read are not "
            "rows of its data files"
        )
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
    #: Snapshots removed because their versions expired.
    expired: tuple[int, ...] = ()


def load_metadata(deep: DeepStore, path: str) -> TableMetadata:
    return FromInputFile.table_metadata(_file(deep, path))


def current_location(deep: DeepStore, store: MetadataStore, table: str) -> str | None:
    """The URI of ``table``'s current Iceberg metadata file (None: never published)."""
    pointer = read_pointer(store, table)
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
    files: Iterable[DataFile],
) -> ManifestFile:
    writer = writer_cls(
        UNPARTITIONED_PARTITION_SPEC,
        schema,
        _file(deep, path, create=True),
        snapshot_id,
        AVRO_CODEC,
    )
    with writer:
        for f in files:
            writer.add_entry(
                ManifestEntry.from_args(
                    status=ManifestEntryStatus.ADDED,
                    snapshot_id=snapshot_id,
                    sequence_number=snapshot_id,
                    file_sequence_number=snapshot_id,
                    data_file=f,
                )
            )
    return writer.to_manifest_file()


def write_snapshot(
    deep: DeepStore,
    spec: TableSpec,
    view: VersionView | None,
    previous: TableMetadata | None,
    *,
    previous_location: str | None,
    created_at: float,
    committed_at: float,
    oldest_kept: int,
) -> tuple[str, tuple[int, ...]]:
    """Write the files of a snapshot of ``view`` and the table metadata that adds it to
    ``previous`` (dropping the snapshots of versions below ``oldest_kept``); returns the new
    metadata file's path (relative) and the expired snapshot ids. Without ``view``, the new
    metadata only drops the expired snapshots."""
    table = spec.name
    prefix = view_prefix(table)
    if view is None:
        assert previous is not None and previous.current_snapshot_id is not None
        expired = tuple(s.snapshot_id for s in previous.snapshots if s.snapshot_id < oldest_kept)
        metadata = update_table_metadata(
            previous,
            (RemoveSnapshotsUpdate(snapshot_ids=list(expired)),),
            metadata_location=previous_location,
        )
        tag = f"{previous.current_snapshot_id:012d}-{uuid.uuid4().hex}"
        metadata_path = f"{prefix}/metadata/{tag}.metadata.json"
        ToOutputFile.table_metadata(metadata, _file(deep, metadata_path, create=True))
        return metadata_path, expired
    v = view.version
    tag = f"{v:012d}-{uuid.uuid4().hex}"
    schema = iceberg_schema(spec.arrow_schema(), previous)

    data_files = [
        _data_file(deep, f.path, DataFileContent.DATA, f.rows, f.size) for f in view.files
    ]
    if view.merged.num_rows:
        merged_path = f"{prefix}/merged/{tag}.parquet"
        size = deep.write_parquet(merged_path, view.merged)
        data_files.append(
            _data_file(deep, merged_path, DataFileContent.DATA, view.merged.num_rows, size)
        )
    # Each file's location once, repeated by its deleted positions (files come sorted).
    which = np.repeat(
        np.arange(len(view.files), dtype=np.int64), [len(f.deleted) for f in view.files]
    )
    paths = pa.array([location(deep, f.path) for f in view.files], pa.string()).take(which)
    deletes = pa.table(
        {
            "file_path": paths,
            "pos": pa.array(
                np.concatenate([f.deleted for f in view.files] or [np.zeros(0, np.int64)]),
                pa.int64(),
            ),
        },
        schema=DELETE_SCHEMA,
    )
    manifests: list[ManifestFile] = []
    if data_files:
        manifests.append(
            _write_manifest(
                deep, f"{prefix}/metadata/{tag}-m0.avro", ManifestWriterV2, schema, v, data_files
            )
        )
    if deletes.num_rows:
        # Sorted by file, then position, as the spec asks of a position delete file.
        delete_path = f"{prefix}/deletes/{tag}.parquet"
        size = deep.write_parquet(delete_path, deletes)
        manifests.append(
            _write_manifest(
                deep,
                f"{prefix}/metadata/{tag}-m1.avro",
                DeleteManifestWriter,
                schema,
                v,
                [
                    _data_file(
                        deep, delete_path, DataFileContent.POSITION_DELETES, deletes.num_rows, size
                    )
                ],
            )
        )
    list_path = f"{prefix}/metadata/snap-{tag}.avro"
    parent = previous.current_snapshot_id if previous is not None else None
    with write_manifest_list(
        2, _file(deep, list_path, create=True), v, parent, v, AVRO_CODEC
    ) as writer:
        writer.add_manifests(manifests)
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
    updates += [
        SetPropertiesUpdate(updates={NAME_MAPPING: name_mapping(schema).model_dump_json()}),
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
    metadata = update_table_metadata(base, tuple(updates), metadata_location=previous_location)
    metadata_path = f"{prefix}/metadata/{tag}.metadata.json"
    ToOutputFile.table_metadata(metadata, _file(deep, metadata_path, create=True))
    return metadata_path, expired


def publish(store: MetadataStore, deep: DeepStore, table: str) -> PublishResult:
    """Publish ``table``'s current manifest version as an Iceberg snapshot (nothing to do if
    the pointer shows it already). A publisher that loses the pointer's compare-and-set to
    another returns ``published=False`` with the winner's pointer."""
    pointer = read_pointer(store, table)
    manifest = store.manifest(table)
    v = manifest.version
    if v == 0:
        return PublishResult(table, pointer, False)
    previous = load_metadata(deep, pointer.metadata_location) if pointer is not None else None
    oldest = store.oldest_kept_version(table)
    view: VersionView | None = None
    if pointer is not None and pointer.manifest_version >= v:
        # Nothing new; still drop the snapshots of versions retention expired.
        assert previous is not None
        if not any(s.snapshot_id < oldest for s in previous.snapshots):
            return PublishResult(table, pointer, False)
        v = pointer.manifest_version
    else:
        view = version_view(deep, manifest)
    committed_at = version_committed_at(store, table, v)
    metadata_path, expired = write_snapshot(
        deep,
        manifest.table.spec,
        view,
        previous,
        previous_location=location(deep, pointer.metadata_location) if pointer else None,
        created_at=manifest.table.created_at,
        committed_at=committed_at,
        oldest_kept=oldest,
    )
    now = store.clock.now()
    try:
        moved = swap_pointer(
            store, table, pointer, metadata_location=metadata_path, manifest_version=v, now=now
        )
    except CommitStateUnknownError:
        again = read_pointer(store, table)
        landed = again is not None and again.metadata_location == metadata_path
        return PublishResult(table, again, landed and view is not None, expired if landed else ())
    if moved is None:
        log.info("iceberg view of %s: another publisher moved the pointer first", table)
        return PublishResult(table, read_pointer(store, table), False)
    return PublishResult(table, moved, view is not None, expired)


# -- garbage collection -----------------------------------------------------------------------


def referenced_view_files(store: MetadataStore, deep: DeepStore, table: str) -> set[str]:
    """Every file of ``table``'s view (relative paths under :func:`view_prefix`) that a
    retained snapshot needs: the current metadata file and the earlier ones its log lists
    whose snapshot is retained, and of every retained snapshot (manifest version at or above
    the oldest kept one) they list, its manifest list, manifests, delete files and merged-row
    files."""
    pointer = read_pointer(store, table)
    if pointer is None:
        return set()
    oldest = store.oldest_kept_version(table)
    io = DeepStoreIO(deep)
    current = load_metadata(deep, pointer.metadata_location)
    keep = {pointer.metadata_location}
    metadata = [current]
    for entry in current.metadata_log:
        rel = relative(deep, entry.metadata_file)
        if rel is None or _version_of(rel) < oldest or not deep.exists(rel):
            continue
        keep.add(rel)
        metadata.append(load_metadata(deep, rel))
    prefix = view_prefix(table) + "/"
    seen: set[int] = set()
    for md in metadata:
        for snap in md.snapshots:
            if snap.snapshot_id < oldest or snap.snapshot_id in seen:
                continue
            seen.add(snap.snapshot_id)
            keep.add(io._path(snap.manifest_list))
            for m in snap.manifests(io):
                keep.add(io._path(m.manifest_path))
                for e in m.fetch_manifest_entry(io, discard_deleted=False):
                    rel = relative(deep, e.data_file.file_path)
                    if rel is not None and rel.startswith(prefix):
                        keep.add(rel)
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
) -> list[StoredFile]:
    """Delete the files of ``table``'s view that no retained snapshot needs
    (:func:`referenced_view_files`) and that are older than the grace period (a publish in
    progress writes its files before it moves the pointer). Lists before it reads the
    references, as :func:`millstream.table.gc.collect_garbage` does."""
    files = deep.list_files(view_prefix(table))
    if not files:
        return []
    referenced = referenced_view_files(store, deep, table)
    cutoff = now - grace_seconds
    doomed = [
        f
        for f in files
        if f.path not in referenced and f.mtime is not None and f.mtime.timestamp() < cutoff
    ]
    if not dry_run:
        for f in doomed:
            deep.delete(f.path)
    return doomed
