"""A cached reader's poll of an upsert table: the previous read's winners, plus what is new.

A reader that reads a current table again and again (``Catalog.open(read_cache_mb=...)``)
keeps, per table, every key's winning row of its last read (:class:`PollState`): the live
rows first, then the keys whose winner is a delete (kept, so a late row that loses to the
delete stays out), each with its effective comparison value. The next read of a later version
merges only the rows that version adds onto them: it reads the new entries' files, takes the
previous winners of the keys they hold, and keeps each key's last row in the order key
((effective comparison value, nulls first) -> partition -> offset, :mod:`millstream.core.merge`).
Every other key keeps its winner. A poll after a small commit so costs in proportion to the
new rows, plus one lookup of their keys over the winners (an integer key reads an array of
flags over the new keys' range, :func:`_dense_lookup`; other keys are hashed) and a copy of
the winners' chunks that hold one of them (chunks of :data:`CHUNK_ROWS` rows, filtered column
by column; a chunk holding none is kept as it is, and the table returned is those chunks).

Why that is the same table a new read returns: an upsert's winner is the greatest row of its
key in the order key, and the greatest of a union is the greatest of one part's greatest and
the other part. Which rows a version holds changes only by commits (new offsets, above every
offset of their partition), seals and compactions (the same rows, less rows that lose to a row
they keep: a seal's run is compacted to its winners, a delete vector names sealed rows newer
ones supersede) and by rollbacks and re-ingestion (rows of old offsets gone or read again). So
between the previous read's version and this one:

* only commits (every entry the previous read merged is still there): the rows to merge are
  those of the new entries;
* seals and compactions too (the table's version log says so, :meth:`MetadataStore.operations_between`):
  a new sealed entry holds old rows, already merged, and perhaps rows committed since the last
  read (a run sealed right after its commit): the rows to merge are those of the new entries
  at offsets above the highest its partition had then; an entry wholly below is not read;
* anything else (a rollback, a re-ingestion, a version retention expired, a table dropped and
  made again, a schema change, an older version asked for): the table is read and merged
  whole, as a read without a cache does, and that read's winners are kept for the next.

A new row that is a delete without a comparison value (a Kafka tombstone, in a table with a
comparison column) takes its value from its key's earlier rows in its partition, which the
winners alone do not hold: such a poll merges in full too.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from millstream.core.engines import engine_for
from millstream.core.merge import EFF, IDX, deletes, effective_values, take_by_group
from millstream.metastore.models import Entry, Manifest
from millstream.spec import OFFSET_COL, PARTITION_COL, TableSpec
from millstream.storage.deepstore import DeepStore
from millstream.table.cache import ReadCache

#: What made each version of a table after one version up to another (the version log).
History = Callable[[int, int], Sequence[str]]
#: Operations that change which rows a version holds only as :mod:`this module <.poll>` says.
REORGANIZING = frozenset({"append", "seal", "compact"})
#: The winners are kept in chunks of at most this many rows: a poll copies only the chunks
#: that hold a key it brings.
CHUNK_ROWS = 1 << 17
#: Past this many chunks under half of :data:`CHUNK_ROWS` (a poll adds one or two), those are
#: made one chunk.
MAX_SMALL_CHUNKS = 8
#: The pool a poll's copies of the winners' chunks come from: the system allocator, not Arrow's
#: default (mimalloc). A poll copies most of the table and frees the previous copy; mimalloc
#: gives the freed copy back to the kernel while the reader waits between polls and the next
#: poll faults every page of it in again (the kernel's time and minor faults a poll,
#: docs/performance.md, "The 2,000,000-key poll's copies from the system allocator").
POOL = pa.system_memory_pool()

EntryKey = tuple[str | None, int, int, int]


@dataclass(frozen=True, slots=True)
class PollState:
    """What the winners kept for ``table`` were merged from: they are its read at ``version``
    only for a table made at ``created_at`` with the spec ``spec_key``. ``live`` is the number
    of winners that are not deletes (they come first)."""

    table: str
    created_at: float
    spec_key: str
    version: int
    entries: frozenset[EntryKey]
    live: int


def applies(spec: TableSpec) -> bool:
    """Whether a table's whole-table reads can be polled so: an upsert table (its winner is
    one row of the key, the greatest in the order key)."""
    return engine_for(spec).winner_is_greatest


def _entry_key(e: Entry) -> EntryKey:
    return (e.file_path, e.partition, e.start, e.end)


def _spec_key(spec: TableSpec) -> str:
    return spec.model_dump_json(by_alias=True, exclude={"retention"})


def _with_eff(spec: TableSpec, rows: pa.Table) -> pa.Table:
    """New rows with their effective comparison value: their own (no delete among them
    lacks one: :func:`_mergeable`)."""
    cmp_col = spec.comparison_column
    if cmp_col is None:
        return rows
    return rows.append_column(EFF, rows.column(cmp_col))


def _mergeable(spec: TableSpec, rows: pa.Table) -> bool:
    """Whether new rows can be merged onto the winners: no delete without a comparison value
    (its value comes from earlier rows of its partition), no null in a key of a table with
    several key columns (joins never match nulls)."""
    cmp_col = spec.comparison_column
    if cmp_col is not None and rows.num_rows:
        lacking = pc.and_(deletes(spec, rows), pc.is_null(rows.column(cmp_col)))
        if pc.any(lacking).as_py():
            return False
    if len(spec.primary_key) > 1:
        return not any(rows.column(k).null_count for k in spec.primary_key)
    return True


def _last_of_runs(key: pa.ChunkedArray, order: pa.Array) -> np.ndarray | None:
    """The positions, among ``order`` (rows sorted by one integer key column first), of each
    key's last row: where the sorted key changes. Only the key column is taken in that order
    (the rows are taken once, the winners only, instead of all of them, then a hash
    aggregation of the key). None when the key is not integers without nulls: a null key is a
    key of its own, which no comparison of neighbours tells (``group_by`` does)."""
    if not pa.types.is_integer(key.type) or key.null_count:
        return None
    sorted_keys: np.ndarray = key.take(order).to_numpy()
    positions: np.ndarray = order.to_numpy()
    if not len(positions):
        return positions
    last = np.empty(len(positions), dtype=bool)
    np.not_equal(sorted_keys[1:], sorted_keys[:-1], out=last[:-1])
    last[-1] = True
    picked: np.ndarray = positions[last]
    return picked


def _last_of_each_key(spec: TableSpec, rows: pa.Table) -> tuple[pa.Table, pa.Table]:
    """Each key's greatest row in the order key (``rows`` carry the effective value as
    :data:`EFF` when the table has a comparison column), as (live winners, delete winners)."""
    keys = list(spec.primary_key)
    sort = [(k, "ascending", "at_end") for k in keys]
    if spec.comparison_column is not None:
        sort.append((EFF, "ascending", "at_start"))
    sort += [(PARTITION_COL, "ascending", "at_end"), (OFFSET_COL, "ascending", "at_end")]
    order = pc.sort_indices(rows, sort_keys=sort)
    last = _last_of_runs(rows.column(keys[0]), order) if len(keys) == 1 else None
    if last is not None:
        won = rows.take(last)
    else:
        ordered = rows.take(order)
        ordered = ordered.append_column(IDX, pa.array(np.arange(ordered.num_rows, dtype=np.int64)))
        won = take_by_group(ordered, keys, "max").drop_columns([IDX])
    dead = deletes(spec, won)
    return won.filter(pc.invert(dead)), won.filter(dead)


def merge_all(spec: TableSpec, rows: pa.Table) -> tuple[pa.Table, pa.Table]:
    """The winners of every row of a version (its entries' rows less its delete vectors'),
    as :func:`_last_of_each_key` gives them, with the effective comparison values the
    engine's merge computes."""
    if spec.comparison_column is None or not rows.num_rows:
        return _last_of_each_key(spec, _with_eff(spec, rows))
    return _last_of_each_key(spec, rows.append_column(EFF, effective_values(spec, rows)))


#: A single integer key's new keys are looked up in an array of flags over their range (one
#: array read a winner, several times cheaper than hashing each winner's key) when that range
#: spans at most :data:`DENSE_SPAN_PER_ROW` values a winner, or :data:`DENSE_MIN_SPAN` values.
DENSE_SPAN_PER_ROW = 8
DENSE_MIN_SPAN = 1 << 16

#: Which rows of a chunk of winners have a key among the new rows' (a bool per row).
Lookup = Callable[[pa.RecordBatch], np.ndarray]


def _dense_lookup(name: str, keys: pa.Array, rows: int) -> Lookup | None:
    """The lookup of ``keys`` (distinct values of the one key column ``name``) by an array of
    flags over their range, for ``rows`` winners; None if they are not integers without nulls
    or their range is too wide for the flags to pay (:data:`DENSE_SPAN_PER_ROW`). A chunk
    whose key column holds a null is hashed (a null is no new key: ``keys`` hold none)."""
    if keys.type not in (pa.int64(), pa.int32()) or keys.null_count:  # long, int
        return None
    new = keys.to_numpy().astype(np.int64, copy=False)
    lo, hi = int(new.min()), int(new.max())
    span = hi - lo + 1
    if span > max(DENSE_MIN_SPAN, DENSE_SPAN_PER_ROW * rows):
        return None
    flags = np.zeros(span + 1, dtype=bool)  # the last flag: any key outside [lo, hi]
    flags[new - lo] = True

    def hits(batch: pa.RecordBatch) -> np.ndarray:
        column = batch.column(name)
        if column.null_count:
            return np.asarray(
                pc.is_in(column, value_set=keys).to_numpy(zero_copy_only=False), dtype=bool
            )
        found = column.to_numpy().astype(np.int64, copy=False)
        outside = (found < lo) | (found > hi)
        return flags[np.where(outside, span, found - lo)]

    return hits


def _lookup(spec: TableSpec, new_keys: pa.Table, rows: int) -> Lookup:
    """Which winners (a chunk at a time) have a key among ``new_keys`` (distinct, no null in
    a multi-column key), for ``rows`` winners."""
    keys = list(spec.primary_key)
    if len(keys) == 1:
        wanted = new_keys.column(keys[0]).combine_chunks()
        dense = _dense_lookup(keys[0], wanted, rows)
        if dense is not None:
            return dense

        def hashed(batch: pa.RecordBatch) -> np.ndarray:
            found = pc.is_in(batch.column(keys[0]), value_set=wanted)
            return np.asarray(found.to_numpy(zero_copy_only=False), dtype=bool)

        return hashed

    def joined(batch: pa.RecordBatch) -> np.ndarray:
        numbered = pa.Table.from_batches([batch.select(keys)]).append_column(
            IDX, pa.array(np.arange(batch.num_rows, dtype=np.int64))
        )
        found = numbered.join(new_keys, keys=keys, join_type="left semi", use_threads=False)
        mask = np.zeros(batch.num_rows, dtype=bool)
        mask[found.column(IDX).to_numpy()] = True
        return mask

    return joined


def _filtered(batch: pa.RecordBatch, keep: np.ndarray) -> pa.RecordBatch:
    """``batch``'s rows where ``keep``, column by column (a record batch's own filter turns
    the mask into indices and takes them: 1.5x slower on the winners' string columns)."""
    mask = pa.array(keep, memory_pool=POOL)
    return pa.RecordBatch.from_arrays(
        [pc.filter(c, mask, memory_pool=POOL) for c in batch.columns], schema=batch.schema
    )


def _take_out(
    winners: pa.Table, lookup: Lookup
) -> tuple[list[pa.RecordBatch], list[pa.RecordBatch]]:
    """``winners``' chunks less the rows ``lookup`` finds, and those rows. A chunk holding
    none of them is kept as it is (no copy); the others are filtered. (Filtering the chunks
    on a thread pool measured no faster on two busy cores.)"""
    batches = winners.to_batches(max_chunksize=CHUNK_ROWS)  # slices of larger chunks: no copy
    kept: list[pa.RecordBatch] = []
    taken: list[pa.RecordBatch] = []
    for batch in batches:
        hit = lookup(batch)
        if not hit.any():
            kept.append(batch)
            continue
        kept.append(_filtered(batch, ~hit))
        taken.append(batch.filter(pa.array(hit)))  # a few rows: as indices, taken
    return [b for b in kept if b.num_rows], taken


def _chunked(schema: pa.Schema, batches: list[pa.RecordBatch]) -> pa.Table:
    """``batches`` as one table; past :data:`MAX_SMALL_CHUNKS` chunks under half of
    :data:`CHUNK_ROWS`, those small ones (each poll adds one) are made one chunk (a copy of
    them alone)."""
    batches = [b for b in batches if b.num_rows]
    small = [b for b in batches if b.num_rows < CHUNK_ROWS // 2]
    if len(small) > MAX_SMALL_CHUNKS:
        joined = pa.Table.from_batches(small, schema).combine_chunks().to_batches()
        batches = [b for b in batches if b.num_rows >= CHUNK_ROWS // 2] + joined
    return pa.Table.from_batches(batches, schema)


def _in_pool(table: pa.Table) -> pa.Table:
    """``table`` copied into :data:`POOL`'s buffers, in chunks of at most :data:`CHUNK_ROWS`."""
    return pa.Table.from_batches(
        [
            pa.RecordBatch.from_arrays(
                [pa.concat_arrays([c], memory_pool=POOL) for c in b.columns], schema=b.schema
            )
            for b in table.to_batches(max_chunksize=CHUNK_ROWS)
        ],
        table.schema,
    )


def _pooled(winners: tuple[pa.Table, pa.Table]) -> tuple[pa.Table, pa.Table]:
    """A full merge's winners as polls keep theirs: in :data:`POOL`'s buffers, in chunks of
    :data:`CHUNK_ROWS` rows, and with one spare copy's worth of those buffers freed into the
    pool. A poll copies most of the winners while the previous copy lives: without the spare,
    the next two polls after a full merge would each fault a table's worth of fresh pages in
    (at 10,000,000 keys 0.3-0.5 CPU-s more a poll, right when a reader starts to poll); with
    it, the full merge, already a read of the whole table, pays those faults once."""
    spare = [_in_pool(t) for t in winners]
    del winners  # the merge's own buffers (Arrow's default pool) go before the second copy
    return _in_pool(spare[0]), _in_pool(spare[1])


def merge_onto(
    spec: TableSpec, live: pa.Table, dead: pa.Table, new: pa.Table
) -> tuple[pa.Table, pa.Table]:
    """The winners of (previous winners + ``new`` rows): the previous winners of the keys
    ``new`` holds are merged with it; every other key keeps its winner. The winners stay in
    chunks of at most :data:`CHUNK_ROWS` rows; only the chunks that hold one of ``new``'s
    keys are copied."""
    if not new.num_rows:
        return live, dead
    new = _with_eff(spec, new).select(live.column_names).cast(live.schema)
    keys = list(spec.primary_key)
    new_keys = new.select(keys).group_by(keys).aggregate([])
    lookup = _lookup(spec, new_keys, live.num_rows + dead.num_rows)
    kept_live, hit_live = _take_out(live, lookup)
    kept_dead, hit_dead = _take_out(dead, lookup)
    candidates = pa.Table.from_batches([*hit_live, *hit_dead, *new.to_batches()], live.schema)
    won_live, won_dead = _last_of_each_key(spec, candidates)
    live = _chunked(live.schema, kept_live + won_live.combine_chunks().to_batches())
    dead = _chunked(live.schema, kept_dead + won_dead.combine_chunks().to_batches())
    return live, dead


def _new_rows(
    deep: DeepStore,
    spec: TableSpec,
    manifest: Manifest,
    state: PollState,
    history: History | None,
    read: Callable[[Sequence[Entry]], pa.Table],
) -> pa.Table | None:
    """The rows of ``manifest`` that ``state``'s winners were not merged from (see the
    module's docstring), or None when that cannot be told: merge in full."""
    now = {_entry_key(e): e for e in manifest.entries}
    removed = state.entries - now.keys()
    added = [e for k, e in now.items() if k not in state.entries]
    reach: dict[int, int] = defaultdict(lambda: -1)  # each partition's highest merged offset
    for _, partition, _, end in state.entries:
        reach[partition] = max(reach[partition], end - 1)
    if removed:
        if history is None:
            return None
        ops = history(state.version, manifest.version)
        if len(ops) != manifest.version - state.version or not set(ops) <= REORGANIZING:
            return None
    wanted = [e for e in added if e.end - 1 > reach[e.partition]]
    rows = read(wanted)
    if not removed or not rows.num_rows:
        return rows
    parts = rows.column(PARTITION_COL).to_numpy()
    offs = rows.column(OFFSET_COL).to_numpy()
    keep = np.zeros(rows.num_rows, dtype=bool)
    for p in np.unique(parts).tolist():
        keep |= (parts == p) & (offs > reach[p])
    return rows.filter(pa.array(keep))


def read_polled(
    deep: DeepStore,
    manifest: Manifest,
    cache: ReadCache,
    history: History | None,
    read: Callable[[Sequence[Entry]], pa.Table],
    read_all: Callable[[], pa.Table],
) -> pa.Table | None:
    """``manifest``'s winners (live ones only, with system columns and nothing else), from the
    previous read's kept in ``cache`` plus the rows since when that is exact, else from
    ``read_all()`` (every row of the version less its delete vectors); kept in ``cache`` for
    the next poll. ``read(entries)`` reads entries' rows (system columns included). None
    when an older version than the kept one is asked for (read it without this)."""
    spec = manifest.table.spec
    info = manifest.table
    key = ("poll", spec.name)
    found = cache.lookup_tagged(key)
    live = dead = None
    if found is not None:
        tag, winners = found
        assert isinstance(tag, PollState)
        if (
            tag.table == spec.name
            and tag.created_at == info.created_at
            and tag.spec_key == _spec_key(spec)
        ):
            if manifest.version < tag.version:
                return None
            new = _new_rows(deep, spec, manifest, tag, history, read)
            if new is not None and _mergeable(spec, new):
                live, dead = merge_onto(
                    spec, winners.slice(0, tag.live), winners.slice(tag.live), new
                )
    if live is None or dead is None:
        live, dead = _pooled(merge_all(spec, read_all()))
    state = PollState(
        spec.name,
        info.created_at,
        _spec_key(spec),
        manifest.version,
        frozenset(_entry_key(e) for e in manifest.entries),
        live.num_rows,
    )
    cache.put(key, pa.concat_tables([live, dead.cast(live.schema)]), tag=state)
    return live.drop_columns([EFF]) if EFF in live.column_names else live
