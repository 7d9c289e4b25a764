"""Snapshot reads: merge-on-read of one manifest version, returning Arrow (no Spark needed).

The rows of a version are its entries' rows minus the rows its delete vectors name, merged by
the table's engine. A delete vector only ever names rows that cannot change the merge result
(see :mod:`millstream.sealing.keyindex`), so it saves work but is never needed for
correctness: a delete vector whose file cannot be read is skipped with a warning.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from millstream.core.engines import engine_for
from millstream.core.final import keys_distinct, resolve_one_per_partition
from millstream.core.merge import deletes
from millstream.errors import SegmentUnavailableError
from millstream.metastore.models import DeleteVector, Entry, Manifest, SegmentState
from millstream.spec import OFFSET_COL, PARTITION_COL, SYSTEM_COLUMNS, TableSpec
from millstream.storage.deepstore import DeepStore
from millstream.table import merged, poll
from millstream.table.cache import ReadCache
from millstream.table.footer import rows_proven_valid

READ_THREADS = 8
#: A read of a local store's files of at most this many bytes in all (a seal's run of ~150
#: micro-batch files of a few rows each, ~0.5 MB) decodes them one after the other on the
#: reading thread: handed to the read pool, each file's ~0.4 ms decode cost about twice its CPU
#: in the threads' hand-offs and their contention for the GIL (issue 38).
SERIAL_READ_BYTES = 1 << 20
#: A cached reader's merged partition is made one piece again past this many (each poll adds
#: one: the rows of keys it changed).
MAX_MERGED_CHUNKS = 16

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

# Two pools that live as long as the process (starting a dozen threads per read cost more than
# a small read's merge): one for file reads, one for partitions, whose tasks read files
# themselves (one pool for both could fill with tasks waiting on the reads queued behind them).
_pools: dict[str, tuple[int, ThreadPoolExecutor]] = {}
_pools_lock = threading.Lock()


def _parallel_map(
    kind: str, fn: Callable[[T], R], items: Sequence[T], *, serial: bool = False
) -> list[R]:
    if serial or len(items) <= 1:
        return [fn(x) for x in items]
    with _pools_lock:
        found = _pools.get(kind)
        if found is None or found[0] != os.getpid():  # none yet, or inherited through fork
            found = (os.getpid(), ThreadPoolExecutor(READ_THREADS, f"millstream-read-{kind}"))
            _pools[kind] = found
    return list(found[1].map(fn, items))


def _all_valid(data: pa.Table, entries: list[Entry]) -> bool:
    """Whether every row of ``data`` lies in the range of the one entry of its partition (the
    usual case: a file holds its segments' rows and nothing else), from each partition's
    lowest and highest offset: one hash aggregation instead of a mask per entry."""
    ranges: dict[int, tuple[int, int]] = {}
    for e in entries:
        if e.partition in ranges:
            return False  # two entries of one partition in one file: filter row by row
        ranges[e.partition] = (e.start, e.end)
    if data.num_rows == 0:
        return True
    found: list[tuple[int, dict[str, int]]]
    if len(entries) == 1:  # a sealed segment's file, say: no grouping needed
        parts = pc.min_max(data.column(PARTITION_COL))
        if parts["min"].as_py() != parts["max"].as_py():
            return False
        offs = pc.min_max(data.column(OFFSET_COL))
        found = [(parts["min"].as_py(), {"min": offs["min"].as_py(), "max": offs["max"].as_py()})]
    else:
        spans = data.group_by([PARTITION_COL]).aggregate([(OFFSET_COL, "min_max")])
        found = list(
            zip(
                spans.column(PARTITION_COL).to_pylist(),
                spans.column(f"{OFFSET_COL}_min_max").to_pylist(),
                strict=True,
            )
        )
    for partition, span in found:
        bounds = ranges.get(partition)
        if bounds is None or span["min"] < bounds[0] or span["max"] >= bounds[1]:
            return False
    return True


def _valid_rows(data: pa.Table, entries: list[Entry]) -> pa.Table:
    """Keep only rows some entry declares valid: its partition and offset range."""
    if _all_valid(data, entries):
        return data
    part = data.column(PARTITION_COL)
    off = data.column(OFFSET_COL)
    mask = None
    for e in entries:
        m = pc.and_(
            pc.equal(part, e.partition),
            pc.and_(pc.greater_equal(off, e.start), pc.less(off, e.end)),
        )
        mask = m if mask is None else pc.or_(mask, m)
    assert mask is not None
    return data.filter(mask)


def schema_key(schema: pa.Schema) -> tuple[tuple[str, str], ...]:
    """A hashable fingerprint of ``schema`` (names and types), for cache keys."""
    return tuple((f.name, str(f.type)) for f in schema)


def conform(data: pa.Table, schema: pa.Schema) -> pa.Table:
    """A data file's rows in ``schema``: the table's current schema, which may be newer than
    the one the file was written under (schema evolution). A column the file lacks (added
    since) is all null; a column of a narrower type (widened since: int -> long, a decimal's
    precision) is cast, which is lossless for every widening
    :mod:`millstream.core.evolution` allows."""
    if data.schema.equals(schema, check_metadata=True):
        return data  # already in it (a cast to it would copy nothing, but costs a call a column)
    if data.schema.names == schema.names:
        return data.cast(schema)
    have = set(data.schema.names)
    arrays = [
        data.column(f.name).cast(f.type) if f.name in have else pa.nulls(data.num_rows, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


def row_groups_holding(entries: Sequence[Entry]) -> Callable[[pq.FileMetaData], list[int] | None]:
    """Of a data file's row groups, those that may hold a row of ``entries``: every group but
    one whose footer statistics prove it holds none (its partitions' range misses every
    entry's partition, or its offsets' range misses the offsets of every entry whose partition
    it may hold). A group without both statistics is read. A micro-batch file holds its
    task's partitions one after another, so the seal of one partition reads its own groups
    (and one it shares with the next partition), not the whole file. None (read every group)
    when the file has no such statistics at all, or one row group (a small file: the read
    of its rows filters them by their entries' ranges all the same)."""

    def choose(metadata: pq.FileMetaData) -> list[int] | None:
        if metadata.num_row_groups <= 1:
            return None
        names = metadata.schema.names
        if PARTITION_COL not in names or OFFSET_COL not in names:
            return None
        pi, oi = names.index(PARTITION_COL), names.index(OFFSET_COL)
        groups = []
        for g in range(metadata.num_row_groups):
            group = metadata.row_group(g)
            parts, offs = group.column(pi).statistics, group.column(oi).statistics
            if (
                parts is None
                or offs is None
                or not parts.has_min_max
                or not offs.has_min_max
                or any(
                    parts.min <= e.partition <= parts.max
                    and offs.min < e.end
                    and offs.max >= e.start
                    for e in entries
                )
            ):
                groups.append(g)
        return groups

    return choose


def _decode(
    deep: DeepStore,
    spec: TableSpec,
    path: str,
    entry: Entry,
    choose: Callable[[pq.FileMetaData], Sequence[str] | None],
    row_groups: Callable[[pq.FileMetaData], list[int] | None] | None = None,
) -> pa.Table:
    """``entry``'s data file, of the columns ``choose`` picks from its footer (see
    :func:`conform`), of the row groups ``row_groups`` picks (all if None); a file that
    cannot be read raises :class:`SegmentUnavailableError` naming the segment."""
    try:
        # A file written under an older schema may lack some of the columns.
        data = deep.read_parquet_choosing(path, choose, row_groups)
    except (OSError, pa.ArrowInvalid) as exc:
        raise SegmentUnavailableError(
            spec.name, entry.name, path, str(exc).splitlines()[0]
        ) from exc
    return data


def read_entries(
    deep: DeepStore,
    spec: TableSpec,
    entries: Iterable[Entry],
    *,
    columns: list[str] | None = None,
    cache: ReadCache | None = None,
) -> pa.Table:
    """The raw rows (with system columns) of ``entries``, before merging. Each data file is
    read once even when it holds several partitions' segments. ``columns`` reads only those
    (the partition and offset columns are always read, to select the valid rows). A file in
    ``cache`` is not read again (:mod:`millstream.table.cache`)."""
    by_file: dict[str, list[Entry]] = defaultdict(list)
    for e in entries:
        if e.file_path is not None:
            by_file[e.file_path].append(e)
    schema = spec.arrow_schema(system_columns=True)
    if columns is not None:
        wanted = {*columns, PARTITION_COL, OFFSET_COL}
        schema = pa.schema([f for f in schema if f.name in wanted])
    if not by_file:
        return schema.empty_table()

    wanted_columns = None if columns is None else schema.names
    # The schema is part of every cache key: a file read before the table's schema evolved
    # was conformed to the older schema.
    shape = schema_key(schema)

    def decode(path: str, file_entries: list[Entry]) -> pa.Table:
        # Only the row groups that may hold the entries' rows: a seal of one partition of a
        # micro-batch file shared by several decodes little more than its own rows.
        rows = _decode(
            deep,
            spec,
            path,
            file_entries[0],
            lambda _: wanted_columns,
            row_groups_holding(file_entries),
        )
        return conform(rows, schema)

    def load(item: tuple[str, list[Entry]]) -> pa.Table:
        path, file_entries = item
        if cache is None:
            return _valid_rows(decode(path, file_entries), file_entries)
        # Keyed by the ranges too: when a partition's segment leaves a shared micro-batch
        # file (sealed), the file's other rows are read again, once.
        key = (
            "rows",
            path,
            shape,
            tuple(sorted((e.partition, e.start, e.end) for e in file_entries)),
        )
        return cache.get(key, lambda: _valid_rows(decode(path, file_entries), file_entries))

    serial = _small_local_read(deep, by_file)
    return pa.concat_tables(_parallel_map("files", load, sorted(by_file.items()), serial=serial))


def _small_local_read(deep: DeepStore, by_file: dict[str, list[Entry]]) -> bool:
    """Whether the files of ``by_file`` are few bytes in all on a local store, so that
    decoding them on the reading thread costs less than the read pool (see
    :data:`SERIAL_READ_BYTES`); their size is their entries' (a shared file's other partitions'
    rows are not counted: at most a micro-batch's)."""
    if not deep.local:
        return False  # a remote store's reads wait on requests: the pool overlaps them
    total = 0
    for file_entries in by_file.values():
        total += sum(e.size_bytes for e in file_entries)
        if total > SERIAL_READ_BYTES:
            return False
    return True


def read_sealed_rows(
    deep: DeepStore,
    spec: TableSpec,
    entries: Iterable[Entry],
    deleted: dict[int, pa.Array],
    *,
    offsets: bool,
) -> pa.Table:
    """The valid rows of ``entries`` minus the (partition, offset) rows in ``deleted``, with
    the table's columns, ``_ms_partition`` and ``_ms_tombstone``, and ``_ms_offset`` only if
    ``offsets``. Without it, a file holding one entry whose footer proves its rows valid and
    untouched by ``deleted`` (:func:`~millstream.table.footer.rows_proven_valid`) is read
    without its ``_ms_offset`` column, and needs neither mask nor vector; any other file is
    read whole, checked and filtered row by row, and loses the column after."""
    by_file: dict[str, list[Entry]] = defaultdict(list)
    for e in entries:
        if e.file_path is not None:
            by_file[e.file_path].append(e)
    full = spec.arrow_schema(system_columns=True)
    schema = full if offsets else pa.schema([f for f in full if f.name != OFFSET_COL])
    if not by_file:
        return schema.empty_table()
    names: list[str] = schema.names

    def load(item: tuple[str, list[Entry]]) -> pa.Table:
        path, file_entries = item
        entry = file_entries[0]
        proven: list[bool] = []

        def choose(metadata: pq.FileMetaData) -> Sequence[str] | None:
            if offsets or len(file_entries) != 1:
                return None
            if not rows_proven_valid(metadata, entry, deleted.get(entry.partition)):
                return None
            proven.append(True)
            return names

        data = _decode(deep, spec, path, entry, choose)
        if proven:
            return conform(data, schema)
        data = _valid_rows(conform(data, full), file_entries)
        mine = {p: deleted[p] for p in {e.partition for e in file_entries} if p in deleted}
        return drop_deleted(data, mine).select(names)

    return pa.concat_tables(_parallel_map("files", load, sorted(by_file.items())))


def read_delete_vectors(
    deep: DeepStore,
    dvs: Iterable[DeleteVector],
    *,
    unreadable: list[int] | None = None,
    cache: ReadCache | None = None,
) -> dict[int, pa.Array]:
    """The superseded offsets of each partition named by ``dvs``. A vector that cannot be read
    is skipped (the read stays exact, only slower), logged, and its partition appended to
    ``unreadable``."""
    by_partition: dict[int, list[pa.Array]] = defaultdict(list)
    for dv in dvs:
        path = dv.file_path
        try:
            if cache is None:
                offsets = deep.read_parquet(path, columns=[OFFSET_COL]).column(OFFSET_COL)
            else:
                offsets = cache.get(
                    ("vector", path), partial(deep.read_parquet, path, columns=[OFFSET_COL])
                ).column(OFFSET_COL)
        except (OSError, pa.ArrowInvalid, KeyError) as exc:
            if unreadable is not None:
                unreadable.append(dv.partition)
            log.warning(
                "delete vector %s of %s partition %d (from segment %d) is unreadable, reading "
                "without it: %s",
                dv.file_path,
                dv.table,
                dv.partition,
                dv.source_seq,
                str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
            )
            continue
        by_partition[dv.partition].extend(offsets.chunks)
    return {
        p: pa.chunked_array(chunks, pa.int64()).combine_chunks()
        for p, chunks in by_partition.items()
    }


def drop_deleted(rows: pa.Table, deleted: dict[int, pa.Array]) -> pa.Table:
    """``rows`` without the (partition, offset) rows in ``deleted``."""
    drop = None
    for p, offsets in deleted.items():
        if not len(offsets):
            continue
        m = pc.and_(
            pc.equal(rows.column(PARTITION_COL), p),
            pc.is_in(rows.column(OFFSET_COL), value_set=offsets),
        )
        drop = m if drop is None else pc.or_(drop, m)
    if drop is None:
        return rows
    return rows.filter(pc.invert(pc.fill_null(drop, False)))


#: A condition :func:`read_manifest` can apply before the merge: (column, operator, value),
#: operator one of ``==``, ``<``, ``<=``, ``>``, ``>=``, ``in`` (value a tuple), ``is_null``,
#: ``not_null`` (value ignored).
Condition = tuple[str, str, Any]
OPERATORS = ("==", "<", "<=", ">", ">=", "in", "is_null", "not_null")


def _term(column: str, op: str, value: Any) -> pc.Expression:
    f = pc.field(column)
    if op == "==":
        return f == value
    if op == "<":
        return f < value
    if op == "<=":
        return f <= value
    if op == ">":
        return f > value
    if op == ">=":
        return f >= value
    if op == "in":
        return f.isin(list(value))
    return f.is_null() if op == "is_null" else f.is_valid()


def _expression(conditions: Iterable[Condition]) -> pc.Expression:
    expr = pc.scalar(True)
    for column, op, value in conditions:
        expr = expr & _term(column, op, value)
    return expr


def check_conditions(spec: TableSpec, conditions: Iterable[Condition]) -> None:
    """Refuse a condition :func:`read_manifest` cannot apply before the merge without changing
    its answer: on a keyed table only key columns qualify (every row of a key has the key's
    value, so a condition on it keeps or drops whole keys; one on another column could drop a
    key's newest row and bring back an older one)."""
    for column, op, _ in conditions:
        if op not in OPERATORS:
            raise ValueError(f"unknown operator {op!r}; use one of {OPERATORS}")
        if column not in spec.columns:
            raise ValueError(f"column {column!r} is not in table {spec.name!r}")
        if spec.keyed and column not in spec.primary_key:
            raise ValueError(
                f"a condition on {column!r} cannot be applied before merging table "
                f"{spec.name!r}: only its key columns {list(spec.primary_key)} can"
            )


def read_manifest(
    deep: DeepStore,
    manifest: Manifest,
    *,
    include_system_columns: bool = False,
    use_delete_vectors: bool = True,
    partitions: Collection[int] | None = None,
    conditions: Sequence[Condition] = (),
    cache: ReadCache | None = None,
    history: poll.History | None = None,
) -> pa.Table:
    """The table's current rows at ``manifest``'s version, merged by its engine.
    ``use_delete_vectors=False`` reads every row of every entry (the answer is the same).

    ``partitions`` reads only those partitions' rows: an append table's rows do not interact
    across partitions, nor do a ``partitioned_by_key`` table's, so readers split them that way
    (another keyed table's merge may pick a key's row across partitions: ValueError). A
    ``partitioned_by_key`` table is merged partition by partition, in parallel, and its rows
    come partition by partition. ``conditions`` (see :data:`Condition`) drop rows
    before the merge; on a keyed table only conditions on key columns are allowed
    (:func:`check_conditions`): the merge then does the work of the matching keys only.
    Files in ``cache`` are not read again (:mod:`millstream.table.cache`). A sealed table's
    merged copy (:mod:`millstream.table.merged`), if its manifest has one, is the answer of a
    read of the whole table without system columns (filtered by ``conditions``).

    With ``cache``, a whole-table read of an upsert table (other than a ``partitioned_by_key``
    one without a comparison column, merged partition by partition as above) merges only the
    rows added since the previous read onto that read's winners (:mod:`millstream.table.poll`;
    ``history(after, upto)`` gives what made the versions between, so a poll after a seal or
    a compaction stays incremental too). Its rows come in no particular order."""
    spec = manifest.table.spec
    check_conditions(spec, conditions)
    if partitions is None and not include_system_columns and use_delete_vectors:
        copy = merged.read_copy(deep, manifest, cache)
        if copy is not None:
            return copy.filter(_expression(conditions)) if conditions else copy
    if (
        cache is not None
        and partitions is None
        and not conditions
        and use_delete_vectors
        and poll.applies(spec)
        and not (spec.partitioned_by_key and engine_for(spec).sealed_final)
    ):
        polled = poll.read_polled(
            deep,
            manifest,
            cache,
            history,
            read=lambda entries: read_entries(deep, spec, entries),
            read_all=lambda: _all_rows(deep, spec, manifest, cache),
        )
        if polled is not None:
            if include_system_columns:
                return polled
            return polled.drop_columns([c for c in SYSTEM_COLUMNS if c in polled.column_names])
    entries, vectors = manifest.entries, manifest.delete_vectors
    if partitions is not None:
        if spec.keyed and not spec.partitioned_by_key:
            raise ValueError(
                f"table {spec.name!r} is {spec.mode}: a key's rows may span partitions, read "
                "them together (or declare the table partitioned_by_key)"
            )
        wanted = set(partitions)
        entries = tuple(e for e in entries if e.partition in wanted)
        vectors = tuple(dv for dv in vectors if dv.partition in wanted)
    read = _by_partition if spec.keyed and spec.partitioned_by_key else _merged
    rows = read(
        deep, spec, entries, vectors, use_delete_vectors, conditions, cache, include_system_columns
    )
    if include_system_columns:
        return rows
    return rows.drop_columns([c for c in SYSTEM_COLUMNS if c in rows.column_names])


def _all_rows(deep: DeepStore, spec: TableSpec, manifest: Manifest, cache: ReadCache) -> pa.Table:
    """Every row of ``manifest``'s entries (with system columns) less its delete vectors'."""
    raw = read_entries(deep, spec, manifest.entries, cache=cache)
    if manifest.delete_vectors and raw.num_rows:
        raw = drop_deleted(raw, read_delete_vectors(deep, manifest.delete_vectors, cache=cache))
    return raw


def _merged(
    deep: DeepStore,
    spec: TableSpec,
    entries: Sequence[Entry],
    vectors: Sequence[DeleteVector],
    use_delete_vectors: bool,
    conditions: Sequence[Condition],
    cache: ReadCache | None,
    system_columns: bool,
) -> pa.Table:
    """The rows of ``entries`` minus ``vectors``' rows, filtered, merged by the engine. An
    upsert table (without a comparison column) whose entries are all sealed is first read as
    one row per key and partition (:mod:`millstream.core.final`), without the offsets the
    footers prove unneeded unless ``system_columns``; only if that does not hold (a key twice in
    a partition) is it merged by offset."""
    engine = engine_for(spec)
    if (
        cache is None
        and engine.sealed_final
        and entries
        and all(e.state is SegmentState.ONLINE for e in entries)
    ):
        deleted = read_delete_vectors(deep, vectors) if use_delete_vectors and vectors else {}
        sealed = read_sealed_rows(deep, spec, entries, deleted, offsets=system_columns)
        if conditions:
            sealed = sealed.filter(_expression(conditions))
        merged = resolve_one_per_partition(spec, sealed)
        if merged is not None:
            return merged
        if OFFSET_COL in sealed.column_names:
            return engine.resolve(sealed)
    raw = read_entries(deep, spec, entries, cache=cache)
    if use_delete_vectors and vectors:
        raw = drop_deleted(raw, read_delete_vectors(deep, vectors, cache=cache))
    if conditions:
        raw = raw.filter(_expression(conditions))
    return engine.resolve(raw)


def _final_split(
    spec: TableSpec, entries: Sequence[Entry]
) -> tuple[list[Entry], list[Entry]] | None:
    """One partition's entries as (sealed, newer) when its sealed rows, minus its delete
    vectors, are already merged, else None. They are for an upsert table without a comparison
    column: a seal keeps one row per key of its run, and its delete vector names every older
    sealed row of those keys (:mod:`millstream.sealing.keyindex`), so each key has one sealed
    row left, its latest; compaction and re-ingestion keep that true. Every newer (not yet
    sealed) entry lies above the sealed ones, so a key's newer rows beat its sealed row."""
    if not engine_for(spec).sealed_final:
        return None
    sealed = [e for e in entries if e.state is SegmentState.ONLINE]
    newer = [e for e in entries if e.state is not SegmentState.ONLINE]
    if sealed and newer and max(e.end for e in sealed) > min(e.start for e in newer):
        return None  # not the sealed prefix it always is: merge everything
    return sealed, newer


def _without_deletes(spec: TableSpec, rows: pa.Table) -> pa.Table:
    deleted = deletes(spec, rows)
    if not pc.any(deleted).as_py():
        return rows  # nothing to drop: no copy
    return rows.filter(pc.invert(deleted))


def _by_partition(
    deep: DeepStore,
    spec: TableSpec,
    entries: Sequence[Entry],
    vectors: Sequence[DeleteVector],
    use_delete_vectors: bool,
    conditions: Sequence[Condition],
    cache: ReadCache | None,
    system_columns: bool,
) -> pa.Table:
    """A ``partitioned_by_key`` table: each partition merged alone (its keys occur in no other
    partition), the partitions in parallel. Where a partition's sealed rows are final
    (:func:`_final_split`, every delete vector read), only its newer rows are merged, and the
    sealed rows of the keys they hold are dropped (one hash set of a single key column, else
    a hash anti-join); the rest are kept as they are. Without ``system_columns`` (and without ``cache``) such sealed rows are read
    without the offsets their footers prove unneeded (:func:`read_sealed_rows`), and every
    partition comes without system columns."""
    sealed_of: dict[int, list[Entry]] = defaultdict(list)
    newer_entries: list[Entry] = []
    for e in entries:
        if e.state is SegmentState.ONLINE:
            sealed_of[e.partition].append(e)
        else:
            newer_entries.append(e)
    vectors_of: dict[int, list[DeleteVector]] = defaultdict(list)
    for dv in vectors:
        vectors_of[dv.partition].append(dv)
    keys = list(spec.primary_key)
    newer_in_file: dict[str, list[Entry]] = defaultdict(list)
    for e in newer_entries:
        if e.file_path is not None:
            newer_in_file[e.file_path].append(e)
    lock = threading.Lock()
    newer_all: list[pa.Table] = []
    of_files: dict[tuple[str, ...], pa.Table] = {}

    def all_newer() -> pa.Table:
        """Every partition's unsealed rows: they share the micro-batches' files, so each file
        is read once, for all partitions (on first use: a cached reader's poll rarely needs
        it, see :func:`newer_since`)."""
        with lock:
            if not newer_all:
                rows = read_entries(deep, spec, newer_entries, cache=cache)
                newer_all.append(rows.filter(_expression(conditions)) if conditions else rows)
            return newer_all[0]

    def newer_of(partition: int) -> pa.Table:
        rows = all_newer()
        return rows.filter(pc.equal(rows.column(PARTITION_COL), partition))

    def newer_since(partition: int, since: Sequence[Entry]) -> pa.Table:
        """The rows of ``partition``'s newer entries ``since`` (from its lowest start up), from
        their files alone, each read as :func:`all_newer` reads it (so from ``cache``)."""
        files = tuple(sorted({e.file_path for e in since if e.file_path is not None}))
        with lock:  # the partitions' threads ask for the same new files at once: read them once
            rows = of_files.get(files)
            if rows is None:
                chosen = [e for f in files for e in newer_in_file[f]]
                rows = read_entries(deep, spec, chosen, cache=cache)
                if conditions:
                    rows = rows.filter(_expression(conditions))
                of_files[files] = rows
        mask = pc.and_(
            pc.equal(rows.column(PARTITION_COL), partition),
            pc.greater_equal(rows.column(OFFSET_COL), min(e.start for e in since)),
        )
        return rows.filter(mask)

    def sealed_key(partition: int) -> tuple[Any, ...] | None:
        """What a partition's sealed rows are computed from, for ``cache``: between two seals
        of a partition they stay the same, and a reader that reads again reuses them. The key
        names the partition: with no sealed segment yet its files name nothing, and the merged
        result kept under it (:func:`incremental`) must not be another partition's. A filtered
        read keeps nothing (its rows are not the partition's)."""
        if cache is None or not use_delete_vectors or conditions:
            return None
        return (
            "sealed",
            partition,
            schema_key(spec.arrow_schema()),
            tuple(sorted((e.file_path, e.partition, e.start, e.end) for e in sealed_of[partition])),
            tuple(sorted(dv.file_path for dv in vectors_of[partition])),
        )

    def sealed_rows(partition: int, unreadable: list[int]) -> pa.Table:
        """The partition's sealed rows, minus what its delete vectors name, filtered."""
        key = sealed_key(partition)
        if cache is not None and key is not None:
            found = cache.lookup(key)
            if found is not None:
                return found
        raw = read_entries(deep, spec, sealed_of[partition], cache=cache)
        if use_delete_vectors and vectors_of[partition] and raw.num_rows:
            raw = drop_deleted(
                raw,
                read_delete_vectors(
                    deep, vectors_of[partition], unreadable=unreadable, cache=cache
                ),
            )
        if conditions:
            raw = raw.filter(_expression(conditions))
        if cache is not None and key is not None and not unreadable:
            cache.put(key, raw)  # never without a vector: that read is merged in full
        return raw

    def final_rows(partition: int, sealed: pa.Table) -> pa.Table:
        """The sealed rows of a partition whose sealed rows are final, deletes dropped."""
        key = sealed_key(partition)
        if cache is None or key is None:
            return _without_deletes(spec, sealed)
        return cache.get(("final", *key), lambda: _without_deletes(spec, sealed))

    def over_final(final: pa.Table, newer: pa.Table) -> pa.Table:
        """``newer`` rows (all above ``final``'s) merged onto ``final``, rows one per key: a
        key with newer rows is decided by them (deletes among them too). A final row that is
        a delete is dropped either way, so ``final`` comes without deletes."""
        if not newer.num_rows:
            return final
        if len(keys) == 1:  # one hash set of the newer keys, no join (the poll's main cost)
            key = keys[0]
            found = pc.is_in(final.column(key), value_set=newer.column(key).combine_chunks())
            kept = final.filter(pc.invert(found))  # newer keys hold no null (callers check)
        else:
            newer_keys = newer.select(keys).group_by(keys).aggregate([])
            kept = final.join(newer_keys, keys=keys, join_type="left anti", use_threads=False)
            kept = kept.select(final.column_names).cast(final.schema)
        # A poll's few newer rows mostly hold each key once: each is then its key's winner.
        latest = (
            _without_deletes(spec, newer)
            if keys_distinct(spec, newer)
            else engine_for(spec).resolve(newer)
        )
        winners = latest.select(final.column_names).cast(final.schema)
        return pa.concat_tables([kept, winners])

    def incremental(partition: int, sealed: pa.Table, mine: list[Entry]) -> pa.Table | None:
        """A cached reader's read of a partition whose sealed rows are final: the merge of its
        previous read, if that read's newer entries are the first of this one's (file names
        are unique, so the same entries are the same rows), plus the newer entries since; a
        poll merges only the micro-batches committed since the last. None: merge in full."""
        skey = sealed_key(partition)
        if cache is None or skey is None:
            return None
        mine = sorted(mine, key=lambda e: e.start)
        tag = tuple((e.file_path, e.start, e.end) for e in mine)
        base, since = None, 0
        found = cache.lookup_tagged(("merged", skey))
        if found is not None:
            prev_tag, prev = found
            assert isinstance(prev_tag, tuple)
            if tag[: len(prev_tag)] == prev_tag:
                base, since = prev, len(prev_tag)
                if since == len(tag):
                    return prev
        delta = newer_since(partition, mine[since:]) if since else newer_of(partition)
        if any(delta.column(k).null_count for k in keys):
            return None
        if base is None:
            base = final_rows(partition, sealed)
        merged = over_final(base, delta)
        if merged.num_columns and merged.column(0).num_chunks > MAX_MERGED_CHUNKS:
            merged = merged.combine_chunks()  # each poll adds a piece; filters slow with many
        cache.put(("merged", skey), merged, tag=tag)
        return merged

    def lean(partition: int) -> pa.Table | None:
        """A final partition read by a new reader that wants no system columns: its sealed
        rows without the offsets their footers prove unneeded. None if a delete vector is
        unreadable or a newer row has a null key (the partition is merged in full then)."""
        newer = newer_of(partition)
        if any(newer.column(k).null_count for k in keys):
            return None
        unreadable: list[int] = []
        deleted = read_delete_vectors(deep, vectors_of[partition], unreadable=unreadable)
        if unreadable:
            return None
        sealed = read_sealed_rows(deep, spec, sealed_of[partition], deleted, offsets=False)
        if conditions:
            sealed = sealed.filter(_expression(conditions))
        return over_final(_without_deletes(spec, sealed), newer)

    user_columns = spec.arrow_schema().names

    def one(partition: int) -> pa.Table:
        rows = merged_partition(partition)
        return rows if system_columns else rows.select(user_columns)

    def merged_partition(partition: int) -> pa.Table:
        mine_newer = [e for e in newer_entries if e.partition == partition]
        mine = [*sealed_of[partition], *mine_newer]
        split = _final_split(spec, mine) if use_delete_vectors else None
        if split is not None and cache is None and not system_columns:
            got = lean(partition)
            if got is not None:
                return got
        unreadable: list[int] = []
        sealed = sealed_rows(partition, unreadable)
        if split is not None and not unreadable:
            got = incremental(partition, sealed, mine_newer)
            if got is not None:
                return got
            newer = newer_of(partition)
            if not any(newer.column(k).null_count for k in keys):
                return over_final(final_rows(partition, sealed), newer)
        newer = newer_of(partition)
        return engine_for(spec).resolve(pa.concat_tables([sealed, newer.cast(sealed.schema)]))

    by_partition = {e.partition for e in entries}
    order = sorted(by_partition)
    if not order:
        return engine_for(spec).resolve(read_entries(deep, spec, ()))
    return pa.concat_tables(_parallel_map("partitions", one, order))
