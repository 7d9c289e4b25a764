"""The per-partition key index: which live sealed rows each key has, so a seal can write delete
vectors for the rows its new data supersedes without reading the older segments.

A :class:`KeyIndex` holds, for one partition of one table, every sealed row that no delete
vector names: its key columns, its offset and (if the table has one) its comparison value,
sorted by a 64-bit hash of the key. Looking up a run's keys is a binary search per key
(``numpy.searchsorted``) followed by an exact comparison of the key values, so a hash collision
can cost a comparison but never a wrong delete. A seal's cost therefore grows with its run, not
with the table: lookups are ``O(run x log table)`` and the update is one ``take`` (a memory copy)
of the index.

**Which rows a seal may delete.** A delete vector must only name rows that cannot change any
read, so reads with and without delete vectors give the same table (``read_manifest(...,
use_delete_vectors=False)``). Within one partition the new run's rows all come after the
sealed rows in offset order. So (each engine's ``superseded``, :mod:`millstream.core.engines`,
decides):

* ``upsert`` without a comparison column: every sealed row of a key the run has a row for (the
  last row wins and the run's row is later).
* ``upsert`` with a comparison column: the sealed rows of a key that order before the run's
  winning row of that key, in (comparison value with nulls first, offset) order. Sealed rows
  hold materialized values (a sealed delete carries its effective comparison value, see
  the upsert engine's ``compact``), so this is the read-time order key.
* ``dedup`` and ``partial`` without a comparison column: every sealed row of a key the run has a
  delete for. A delete resets a key: nothing before it affects the result, and the run's sealed
  output keeps the key's last delete (the engine's ``compact``).
* Otherwise (``append``; ``dedup``/``partial`` ordered by a comparison column): nothing, and
  there is no index.

**Currency.** An index reflects an exact set of sealed entries and delete vectors of its
partition (their ids). The sealer uses it only if that set is the partition's current one;
otherwise it loads the local checkpoint (an Arrow IPC file under ``<home>/cache/keyindex``)
if that reflects the current set, or rebuilds the index from the sealed segments. The swap
re-checks the set inside its transaction, so an index that went stale during a build (a
rollback, a re-ingestion, another sealer) never produces a delete vector.

Ordering is what keeps this sound: a run is always the whole suffix after the partition's last
sealed segment (see :mod:`millstream.sealing.sealer`). If a newer run were sealed before an
older one, the older run's keys would look newer than the sealed rows and would delete them
(seed 003, tests/scenarios/test_seed_003_pauseless_ordering.py).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from millstream.core.engines import engine_for
from millstream.metastore.models import Manifest, SegmentState
from millstream.spec import OFFSET_COL, PARTITION_COL, TableSpec
from millstream.storage.deepstore import DeepStore
from millstream.table.read import drop_deleted, read_delete_vectors, read_entries

log = logging.getLogger(__name__)

HASH_COL = "__ms_key_hash"
_MIX = np.uint64(0x9E3779B97F4A7C15)


def indexed(spec: TableSpec) -> bool:
    """Whether the table's seals write delete vectors (and so keep a key index)."""
    return engine_for(spec).indexed


def key_hashes(rows: pa.Table, keys: Iterable[str]) -> np.ndarray:
    """A 64-bit hash of each row's key (nulls hash like a value of their own)."""
    # lazy: a seal needs pandas' hash, and an --available-now run's driver loads it only
    # once its JVM has ended (cli.query.hold_off_pandas): not beside the write tasks
    import pandas as pd  # type: ignore[import-untyped]

    out = np.zeros(rows.num_rows, dtype=np.uint64)
    for k in keys:
        col = rows.column(k).combine_chunks() if rows.num_rows else rows.column(k)
        if pa.types.is_integer(col.type):
            values = pc.fill_null(col.cast(pa.int64()), 0).to_numpy(zero_copy_only=False)
            h = pd.util.hash_array(values)
            h = np.where(pc.is_null(col).to_numpy(zero_copy_only=False), _MIX, h)
        else:
            text = col.cast(pa.string()) if not pa.types.is_string(col.type) else col
            h = pd.util.hash_array(
                np.asarray(text.to_numpy(zero_copy_only=False), dtype=object), categorize=False
            )
        out = out * _MIX + h.astype(np.uint64)
    return out


def _same(a: pa.Array, b: pa.Array) -> np.ndarray:
    """Element-wise equality with null equal to null."""
    eq = pc.fill_null(pc.equal(a, b), False)
    both_null = pc.and_(pc.is_null(a), pc.is_null(b))
    return np.asarray(pc.or_(eq, both_null).to_numpy(zero_copy_only=False), dtype=bool)


@dataclass(frozen=True, slots=True)
class Reflects:
    """The sealed entries and delete vectors of a partition an index was built from."""

    entries: tuple[int, ...]
    delete_vectors: tuple[int, ...]

    @classmethod
    def of(cls, manifest: Manifest, partition: int) -> Reflects:
        return cls(
            tuple(
                sorted(
                    e.id
                    for e in manifest.entries
                    if e.partition == partition and e.state is SegmentState.ONLINE
                )
            ),
            tuple(sorted(d.id for d in manifest.delete_vectors if d.partition == partition)),
        )

    def to_json(self) -> str:
        return json.dumps({"entries": self.entries, "delete_vectors": self.delete_vectors})

    @classmethod
    def from_json(cls, text: str) -> Reflects:
        d = json.loads(text)
        return cls(tuple(d["entries"]), tuple(d["delete_vectors"]))


class _Run:
    """One sorted run of the index: rows sorted by key hash, and which of them are live."""

    __slots__ = ("data", "hashes", "live", "n_live")

    def __init__(self, data: pa.Table, live: np.ndarray | None = None) -> None:
        self.data = data.combine_chunks()
        self.hashes = np.asarray(self.data.column(HASH_COL).to_numpy(), dtype=np.uint64)
        self.live = np.ones(len(self.hashes), dtype=bool) if live is None else live
        self.n_live = int(self.live.sum())

    @classmethod
    def of(cls, spec: TableSpec, rows: pa.Table) -> _Run:
        rows = rows.select(KeyIndex.columns(spec))
        h = key_hashes(rows, spec.primary_key)
        order = np.argsort(h, kind="stable")
        return cls(rows.take(pa.array(order)).append_column(HASH_COL, pa.array(h[order])))

    def live_data(self) -> pa.Table:
        if self.n_live == len(self.live):
            return self.data
        return self.data.filter(pa.array(self.live))


def _merge(a: _Run, b: _Run) -> _Run:
    """The live rows of two runs as one sorted run: a merge of two sorted sequences."""
    old, new = a.live_data(), b.live_data()
    h_old = a.hashes[a.live] if a.n_live < len(a.live) else a.hashes
    h_new = b.hashes[b.live] if b.n_live < len(b.live) else b.hashes
    n, m = len(h_old), len(h_new)
    pos_new = np.searchsorted(h_old, h_new, side="right") + np.arange(m)
    perm = np.empty(n + m, dtype=np.int64)
    is_new = np.zeros(n + m, dtype=bool)
    is_new[pos_new] = True
    perm[pos_new] = n + np.arange(m)
    perm[~is_new] = np.arange(n)
    # One contiguous chunk first: ``take`` on a chunked column resolves the chunk of every
    # index, which costs several times the copy.
    both = pa.concat_tables([old, new.cast(old.schema)]).combine_chunks()
    return _Run(both.take(pa.array(perm)))


class KeyIndex:
    """The live sealed rows of one partition by key hash (see the module docstring).

    Stored as a few sorted runs, like an LSM tree: a seal marks the rows it supersedes dead in
    place and adds its rows as a new run; runs are merged (dropping dead rows) only while the
    newest run holds at least half as many live rows as the one before it. So there are
    ``O(log n)`` runs and a seal costs ``O(run x log table)`` amortized, never a copy of the
    whole index. A position is global: the run's base (the sizes of the runs before it) plus
    the row's place in the run.
    """

    def __init__(
        self, spec: TableSpec, partition: int, runs: list[_Run], reflects: Reflects
    ) -> None:
        self.spec = spec
        self.partition = partition
        self.runs = [r for r in runs if len(r.live)]
        self.reflects = reflects
        self._bases = np.cumsum([0] + [len(r.live) for r in self.runs])

    @property
    def num_rows(self) -> int:
        """Live rows."""
        return sum(r.n_live for r in self.runs)

    @property
    def data(self) -> pa.Table:
        """Every live row (key columns, offset, comparison value, hash), run by run."""
        if not self.runs:
            return _Run.of(self.spec, _empty(self.spec)).data
        return pa.concat_tables([r.live_data() for r in self.runs])

    # -- construction ----------------------------------------------------------------------

    @classmethod
    def columns(cls, spec: TableSpec) -> list[str]:
        return engine_for(spec).index_columns()

    @classmethod
    def from_rows(
        cls, spec: TableSpec, partition: int, rows: pa.Table, reflects: Reflects
    ) -> KeyIndex:
        """An index of ``rows`` (which have at least :meth:`columns`)."""
        return cls(spec, partition, [_Run.of(spec, rows)], reflects)

    @classmethod
    def build(
        cls,
        spec: TableSpec,
        partition: int,
        deep: DeepStore,
        manifest: Manifest,
    ) -> KeyIndex:
        """Rebuild from the partition's sealed segments minus its delete vectors (reads only
        the key, offset and comparison columns)."""
        reflects = Reflects.of(manifest, partition)
        sealed = [
            e
            for e in manifest.entries
            if e.partition == partition and e.state is SegmentState.ONLINE
        ]
        rows = read_entries(deep, spec, sealed, columns=cls.columns(spec))
        dvs = [d for d in manifest.delete_vectors if d.partition == partition]
        if dvs:
            rows = drop_deleted(rows, read_delete_vectors(deep, dvs))
        return cls.from_rows(spec, partition, rows, reflects)

    # -- lookups ---------------------------------------------------------------------------

    def matches(self, rows: pa.Table) -> tuple[np.ndarray, np.ndarray]:
        """Pairs (row position in ``rows``, live index position) whose keys are equal."""
        empty = np.zeros(0, dtype=np.int64)
        if not self.num_rows or not rows.num_rows:
            return empty, empty
        h = key_hashes(rows, self.spec.primary_key)
        # Searching in key-hash order turns the binary searches' random reads of the (large)
        # index into one forward sweep: numpy narrows each search with the previous result.
        order = np.argsort(h, kind="stable")
        sorted_h = h[order]
        found_new, found_idx = [], []
        for base, run in zip(self._bases, self.runs, strict=False):
            lo = np.searchsorted(run.hashes, sorted_h, side="left")
            hi = np.searchsorted(run.hashes, sorted_h, side="right")
            counts = hi - lo
            total = int(counts.sum())
            if total == 0:
                continue
            first = np.cumsum(counts) - counts
            pos = np.repeat(lo, counts) + (np.arange(total) - np.repeat(first, counts))
            new = order[np.repeat(np.arange(len(order)), counts)]
            alive = run.live[pos]
            pos, new = pos[alive], new[alive]
            if not len(pos):
                continue
            same = np.ones(len(pos), dtype=bool)
            take_new, take_old = pa.array(new), pa.array(pos)
            for k in self.spec.primary_key:
                same &= _same(rows.column(k).take(take_new), run.data.column(k).take(take_old))
            found_new.append(new[same])
            found_idx.append(pos[same] + base)
        if not found_new:
            return empty, empty
        return np.concatenate(found_new), np.concatenate(found_idx)

    def _column(self, name: str, positions: np.ndarray) -> pa.Array:
        """Column ``name`` of the rows at global ``positions``, in that order."""
        run_of = np.searchsorted(self._bases, positions, side="right") - 1
        pieces, where = [], []
        for i, run in enumerate(self.runs):
            sel = np.flatnonzero(run_of == i)
            if len(sel):
                local = pa.array(positions[sel] - self._bases[i])
                pieces.append(run.data.column(name).take(local).combine_chunks())
                where.append(sel)
        if not pieces:
            return pa.array([], self.data.schema.field(name).type)
        values = pa.concat_arrays(pieces)
        order = np.concatenate(where)  # values[j] belongs at output position order[j]
        inverse = np.empty(len(order), dtype=np.int64)
        inverse[order] = np.arange(len(order))
        return values.take(pa.array(inverse))

    def superseded(self, rows: pa.Table) -> np.ndarray:
        """Index positions of the sealed rows that ``rows`` (a compacted run of this partition,
        newer than every indexed row) supersede, per the rules in the module docstring."""
        new_pos, idx_pos = self.matches(rows)
        total = int(self._bases[-1])
        if not len(new_pos):
            return idx_pos
        which = engine_for(self.spec).superseded(rows, new_pos, idx_pos, self._column)
        return _distinct(idx_pos[which], total)

    def offsets(self, positions: np.ndarray) -> pa.Array:
        return self._column(OFFSET_COL, positions)

    def comparison_floor(self, rows: pa.Table) -> pa.Table | None:
        """The floor the upsert engine's ``compact`` needs to seal ``rows`` (a run of this
        partition, newer than every indexed row): per key of ``rows`` whose live sealed rows
        hold a comparison value, the key columns and the highest such value. None if the table
        has no comparison column.

        Why the live sealed rows are enough: a delete's effective value is the highest
        comparison value of *every* earlier row of its key in the partition, and sealing never
        removes a key's highest value. Compaction keeps each key's winner, the last of the run
        in (effective value, offset) order, so its stored (materialized) value is at least every
        value in the run. A delete vector names only sealed rows that order before a kept
        winner of the same key, so rows whose value is at most the winner's. Either way a
        removed row leaves a kept row of its key, below the next run, whose value is at least
        its own; if a later seal removes that row, the same holds for it, and the chain ends at
        a live row. No row holds more than the highest earlier value either (a materialized
        value is itself that highest value). So per key, the highest value of the live sealed
        rows equals the highest value of every row written to the partition before the run.
        """
        column = self.spec.comparison_column
        if column is None:
            return None
        keys = list(self.spec.primary_key)
        distinct = rows.select(keys).group_by(keys, use_threads=False).aggregate([])
        new_pos, idx_pos = self.matches(distinct)
        values = (
            self._column(column, idx_pos)
            if len(idx_pos)
            else pa.array([], self.spec.arrow_schema().field(column).type)
        )
        found = pa.table({"pos": pa.array(new_pos, pa.int64()), "v": values})
        found = found.filter(pc.is_valid(found.column("v")))
        highest = found.group_by(["pos"], use_threads=False).aggregate([("v", "max")])
        return _with_highest(self.spec, distinct.take(highest.column("pos")), highest)

    # -- update ----------------------------------------------------------------------------

    def updated(self, dropped: np.ndarray, rows: pa.Table, reflects: Reflects) -> KeyIndex:
        """The index after a seal: ``dropped`` positions dead, ``rows`` added as a new run.
        ``O(run)``: runs are merged later, by :meth:`compacted`. Only call it once the seal is
        swapped: it changes this index in place."""
        for i, run in enumerate(self.runs):
            lo, hi = self._bases[i], self._bases[i + 1]
            mine = dropped[(dropped >= lo) & (dropped < hi)] - lo
            if len(mine):
                run.live[mine] = False
                run.n_live = int(run.live.sum())
        runs = [r for r in self.runs if r.n_live]
        runs.append(_Run.of(self.spec, rows))
        return KeyIndex(self.spec, self.partition, runs, reflects)

    def compacted(self) -> KeyIndex:
        """The same rows with runs merged (dropping dead rows) while the newest run holds at
        least half as many live rows as the one before it: ``O(log n)`` runs, each row merged
        ``O(log n)`` times over its life. The sealer calls it after a seal's swap, off the
        seal's critical path."""
        runs = list(self.runs)
        while len(runs) >= 2 and runs[-2].n_live <= 2 * runs[-1].n_live:
            b = runs.pop()
            runs[-1] = _merge(runs[-1], b)
        if len(runs) == len(self.runs):
            return self
        return KeyIndex(self.spec, self.partition, runs, self.reflects)

    # -- checkpoint ------------------------------------------------------------------------

    def save(self, path: Path, *, owner: str) -> None:
        """Write the checkpoint (the live rows, one sorted run) atomically: a temporary file
        renamed into place."""
        path.parent.mkdir(parents=True, exist_ok=True)
        runs = list(self.runs)
        while len(runs) >= 2:
            b = runs.pop()
            runs[-1] = _merge(runs[-1], b)
        data = runs[0].live_data() if runs else self.data
        meta = {
            b"millstream.reflects": self.reflects.to_json().encode(),
            b"millstream.owner": owner.encode(),
        }
        tmp = path.with_suffix(f".tmp{os.getpid()}.{threading.get_ident()}")
        data = data.replace_schema_metadata(meta)
        with pa.OSFile(str(tmp), "wb") as sink, ipc.new_file(sink, data.schema) as writer:
            writer.write_table(data)
        os.replace(tmp, path)

    @classmethod
    def load(cls, spec: TableSpec, partition: int, path: Path, *, owner: str) -> KeyIndex | None:
        """The checkpoint at ``path``, or None if there is none, it cannot be read, or it was
        written for another ``owner`` (deployment and table incarnation: entry ids restart at 1
        in a new metadata store, so ids alone cannot tell two tables apart)."""
        try:
            with pa.memory_map(str(path), "r") as source:
                data = ipc.open_file(source).read_all()
        except (OSError, pa.ArrowInvalid):
            return None
        meta = data.schema.metadata or {}
        raw = meta.get(b"millstream.reflects")
        if raw is None or data.column_names != [*cls.columns(spec), HASH_COL]:
            return None
        if meta.get(b"millstream.owner") != owner.encode():
            return None
        run = _Run(data.replace_schema_metadata(None))
        return cls(spec, partition, [run], Reflects.from_json(raw))


def comparison_floor_below(
    spec: TableSpec, deep: DeepStore, manifest: Manifest, partition: int, offset: int
) -> pa.Table | None:
    """The floor for compacting a partition's rows from ``offset`` on once more (re-ingesting a
    sealed segment that starts there): per key, the highest comparison value of the partition's
    stored rows below ``offset``. None unless the table is ``upsert`` with a comparison column
    (only its compaction materializes values).

    Delete vectors are deliberately not applied: the key index answers for the end of the
    sealed prefix, not for a point inside it, and a later seal's delete vector may name the
    very rows the segment's deletes derived their value from. Every stored row of a sealed run
    is that run's winner of its key, whose materialized value is the run's highest, so the
    highest stored value below ``offset`` is the highest value of every row ever written there.
    Reads only the key, offset and comparison columns of the segments below ``offset`` (a lost
    one fails the re-ingestion naming it: re-ingest that one first).
    """
    column = spec.comparison_column
    if not engine_for(spec).needs_floor or column is None:
        return None
    keys = list(spec.primary_key)
    earlier = [e for e in manifest.entries if e.partition == partition and e.start < offset]
    rows = read_entries(deep, spec, earlier, columns=[*keys, column])
    rows = rows.filter(
        pc.and_(pc.less(rows.column(OFFSET_COL), offset), pc.is_valid(rows.column(column)))
    )
    highest = rows.group_by(keys, use_threads=False).aggregate([(column, "max")])
    return _with_highest(spec, highest.select(keys), highest.rename_columns([*keys, "v_max"]))


def _with_highest(spec: TableSpec, keys: pa.Table, highest: pa.Table) -> pa.Table:
    """``keys`` plus the comparison column, filled from ``highest``'s ``v_max``."""
    column = spec.comparison_column
    assert column is not None
    field = spec.arrow_schema().field(column)
    return keys.append_column(field, highest.column("v_max").cast(field.type))


def _empty(spec: TableSpec) -> pa.Table:
    schema = spec.arrow_schema(system_columns=True)
    return pa.schema(
        [schema.field(c) for c in [*KeyIndex.columns(spec), PARTITION_COL]]
    ).empty_table()


def _distinct(positions: np.ndarray, n: int) -> np.ndarray:
    """The distinct ``positions`` (< n), ascending: one linear pass, no sort."""
    seen = np.zeros(n, dtype=bool)
    seen[positions] = True
    return np.flatnonzero(seen)


class IndexCache:
    """Key indexes kept in memory per (deployment, table, partition), shared by every sealer
    of the process, with a local checkpoint per partition."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._indexes: dict[tuple[str, str, int], KeyIndex] = {}

    def get(self, where: str, table: str, partition: int) -> KeyIndex | None:
        with self._lock:
            return self._indexes.get((where, table, partition))

    def put(self, where: str, table: str, index: KeyIndex) -> None:
        with self._lock:
            self._indexes[(where, table, index.partition)] = index

    def drop(self, where: str, table: str, partition: int) -> None:
        with self._lock:
            self._indexes.pop((where, table, partition), None)

    def clear(self) -> None:
        """Forget every index (as a process restart would): the next seal loads the
        partition's checkpoint or rebuilds the index."""
        with self._lock:
            self._indexes.clear()


#: The cache of this process; a :class:`~millstream.sealing.sealer.Sealer` uses it unless it
#: is given its own.
CACHE = IndexCache()
