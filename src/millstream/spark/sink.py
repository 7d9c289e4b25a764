"""The segment sink: a Spark streaming Arrow writer that commits through compare_and_append.

* ``write()`` runs on executors: read the task's source ranges (the source sends one range
  marker per range, no records; the sink reads them with the source's options), decode +
  validate the records, stage one Parquet data file (several partitions per file) and one
  dead-letter file, named with batch id, Spark partition and attempt, and return the
  per-partition offset ranges.
* ``commit()`` runs in a separate process on the driver with a fresh writer object, so
  everything it needs travels in the commit messages and the options. It calls
  compare_and_append for every touched shard of the table AND its dead-letter table in ONE
  metadata transaction. A replayed batch id is a harmless DROP.
* ``abort()`` deletes the staged files.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage

from millstream import faults
from millstream.datastream import dead_letter_spec
from millstream.errors import (
    BadRecordError,
    CommitStateUnknownError,
    InvalidSpecError,
    TableNotFoundError,
)
from millstream.ingest.decode import Decoded, dead_letter_rows, decode_records
from millstream.ingest.formats import absorber, decoder_for
from millstream.ingest.sources.base import RAW_SCHEMA
from millstream.spark.membership import Member, Membership
from millstream.spark.options import GroupSinkOptions, SinkOptions
from millstream.spark.sources import (
    ENTRY,
    GROUP_SCHEMA,
    each_member,
    marked_ranges,
    member_errors,
    release_after_task,
    settle_worker,
)
from millstream.spec import TableSpec
from millstream.storage.deepstore import DeepStore
from millstream.table.commit import (
    BatchCommit,
    StagedFile,
    StagedWrite,
    TableBatch,
    commit_many,
    commit_writes,
)
from millstream.table.read import conform
from millstream.table.writer import RowStager, stage_rows

# Annotations only: a write task (it stages files; the driver commits) loads no metadata
# store, SQLAlchemy included (~35 MiB a Python worker).
if TYPE_CHECKING:
    from millstream.metastore.store import MetadataStore, StoreRegistry

log = logging.getLogger(__name__)


@dataclass
class SinkMessage(WriterCommitMessage):
    ranges: dict[int, tuple[int, int]] = field(default_factory=dict)
    data_path: str | None = None
    data_size: int = 0
    data_counts: dict[int, int] = field(default_factory=dict)
    dead_path: str | None = None
    dead_size: int = 0
    dead_counts: dict[int, int] = field(default_factory=dict)
    #: wall-clock time taken before the files were written (the commit refuses old ones)
    staged_at: float | None = None
    #: per partition with records: the last record's timestamp (epoch ms; its ingestion
    #: time if the source gives none)
    last_record_ms: dict[int, int] = field(default_factory=dict)
    #: ``(partition, first, end)`` of offsets the source no longer held, skipped by its read
    #: (a kafka source with ``on_data_loss: accept``); recorded when the range commits
    lost: list[tuple[int, int, int]] = field(default_factory=list)

    def staged_write(self) -> StagedWrite:
        return StagedWrite(
            self.ranges,
            StagedFile(self.data_path, self.data_size, self.data_counts),
            StagedFile(self.dead_path, self.dead_size, self.dead_counts),
            self.staged_at,
            self.last_record_ms,
        )


def _ranges(raw: pa.Table) -> dict[int, tuple[int, int]]:
    """Per partition of a task's rows (its range markers, a few per member): the lowest
    ``range_lo`` and the highest ``range_hi``. A loop over the markers, not an Arrow
    ``group_by``: that starts an execution plan on Arrow's thread pool (about 0.1 ms alone,
    far more with a shared query's members writing on eight threads at once), once per
    member per task."""
    out: dict[int, tuple[int, int]] = {}
    for p, lo, hi in zip(
        raw.column("partition").to_pylist(),
        raw.column("range_lo").to_pylist(),
        raw.column("range_hi").to_pylist(),
        strict=True,
    ):
        if lo is None or hi is None:
            continue
        was = out.get(p)
        out[p] = (lo, hi) if was is None else (min(was[0], lo), max(was[1], hi))
    return out


def _batch_id() -> str | None:
    """The micro-batch id of the Spark task running this (None outside a task)."""
    ctx = TaskContext.get()
    return ctx.getLocalProperty("streaming.sql.batchId") if ctx else None


#: Records decoded at a time by a write task.
DECODE_ROWS = 32_768


def _slices(table: pa.Table) -> Iterator[pa.Table]:
    for i in range(0, table.num_rows, DECODE_ROWS):
        yield table.slice(i, DECODE_ROWS)


def _coalesced(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.Table]:
    """Pieces of at most :data:`DECODE_ROWS` records made of consecutive ``batches`` of one
    schema. A reader yields a batch per range at least, and a decode call costs ~1.4 ms
    whatever its size: decoding each range on its own made a task's decode time grow with
    the partitions it read (256 ranges of 400 records: 0.36 s) instead of with its records."""
    pending: list[pa.RecordBatch] = []
    rows = 0
    for batch in batches:
        if pending and batch.schema != pending[0].schema:
            yield from _slices(pa.Table.from_batches(pending))
            pending, rows = [], 0
        pending.append(batch)
        rows += batch.num_rows
        if rows >= DECODE_ROWS:
            yield from _slices(pa.Table.from_batches(pending))
            pending, rows = [], 0
    if pending:
        yield from _slices(pa.Table.from_batches(pending))


@functools.lru_cache(maxsize=16)
def _deep_store(uri: str, s3_endpoint: str | None) -> DeepStore:
    """The deep store at ``uri``, one per process: a file system object holds no state of a
    batch, and making one (a path resolved and created, or an S3 client) for each table of
    each write task was 7% of a shared query's write task over 100 small tables."""
    return DeepStore.from_uri(uri, s3_endpoint=s3_endpoint)


class SegmentSink(DataSourceStreamArrowWriter):
    """A streaming writer configured by :class:`millstream.spark.options.SinkOptions`."""

    def __init__(self, options: SinkOptions, stores: StoreRegistry | None = None) -> None:
        self.opts = options
        self.stores = stores
        self.settings = options.settings
        self.spec = options.table_spec
        self.dl_spec = dead_letter_spec(self.spec)
        self.epochs = options.epochs
        self.dl_epochs = options.dead_letter_epochs
        self.writer_id = options.writer_id
        self.bad_records = options.bad_records
        self.stats_file = options.stats_file
        # Set when a worker runs this writer as one replica of several (standby mode).
        self.gate = options.gate

    def _record_pieces(
        self,
        raw: pa.Table,
        stamps: dict[int, int],
        lost: list[tuple[int, int, int]] | None = None,
    ) -> Iterator[pa.Table]:
        """The records of the task's ranges (its markers, :func:`marked_ranges`), read from
        the source in pieces of at most :data:`DECODE_ROWS`, one chunk at a time. ``stamps``
        receives the source's timestamp of each partition's last record, where the source
        has one."""
        ranges = marked_ranges(raw)
        if not ranges:
            return
        # with the reader's optional columns (timestamp, headers) for metadata columns
        reader = self.opts.source_reader()
        yield from _coalesced(reader.read_records(ranges, last_record_ms=stamps))
        if lost is not None:
            lost.extend(getattr(reader, "losses", ()))

    def current_spec(self) -> TableSpec:
        """The table's spec as it is now (one read of its row), which a write task decodes
        and stages under: a schema change (``millstream datastream update``) reaches a
        running writer at its next batch, without a restart. The ranges of a batch are
        planned before its tasks start, so every record produced after the change was
        acknowledged is decoded under it. Before the table exists (tests that stage without
        one), the spec the sink was started with."""
        try:
            return self._store().get_table(self.spec.name).spec
        except TableNotFoundError:
            return self.spec

    def _decode(
        self,
        spec: TableSpec,
        raw: pa.Table,
        stamps: dict[int, int],
        lost: list[tuple[int, int, int]] | None = None,
    ) -> tuple[TableSpec, Decoded]:
        """Decode the task's records piece by piece: a small working set that the allocator
        reuses, instead of fresh memory for the whole task (which costs kernel time).

        With ``schema_evolution: auto``, each piece's writer schemas are looked at BEFORE it
        is decoded: if the table must grow to hold them, it grows (:meth:`_absorb`) and the
        piece, and every later one, decodes under the grown spec; the rows of earlier pieces
        (whose writer schemas needed nothing new) are conformed to it (nulls for the added
        columns, lossless casts for widened ones). Returns the spec the rows are in."""
        rows: list[pa.Table] = []
        dead: list[tuple[int, int, bytes | None, bytes | None, str]] = []
        fmt = decoder_for(self.opts.source_config)  # the source's format; None: JSON
        auto = absorber(self.opts.source_config)
        for piece in self._record_pieces(raw, stamps, lost):
            if auto is not None:
                values = piece.column("value").combine_chunks()
                if auto.absorbing(spec, values) != spec:
                    spec = self._absorb(partial(auto.absorbing, values=values))
                    schema = spec.arrow_schema(system_columns=True)
                    rows = [conform(r, schema) for r in rows]
            d = decode_records(spec, piece, fmt)
            rows.append(d.rows)
            dead.extend(d.dead)
        if not rows:
            return spec, decode_records(spec, raw.select(RAW_SCHEMA.names[:4]).slice(0, 0))
        return spec, Decoded(pa.concat_tables(rows) if len(rows) > 1 else rows[0], dead)

    def _refuse_bad(self, dead: list[tuple[int, int, bytes | None, bytes | None, str]]) -> None:
        """With ``bad_records: fail``, a bad record fails the task, naming the first."""
        if dead and self.bad_records == "fail":
            p, o, _, _, err = min(dead, key=lambda d: (d[0], d[1]))
            raise BadRecordError(self.spec.name, p, o, err)

    def _stage_as_decoded(
        self,
        deep: DeepStore,
        spec: TableSpec,
        raw: pa.Table,
        stamps: dict[int, int],
        lost: list[tuple[int, int, int]],
        hint: str,
    ) -> tuple[StagedFile, list[tuple[int, int, bytes | None, bytes | None, str]]]:
        """Decode the task's records piece by piece and stage each piece's rows as it is
        decoded (:class:`~millstream.table.writer.RowStager`): the task holds a row group's
        worth of rows at a time, not all it read (a 500,000-record task held ~0.3 GB more).
        Returns the staged file and the bad records; a failure deletes what was staged."""
        dead: list[tuple[int, int, bytes | None, bytes | None, str]] = []
        fmt = decoder_for(self.opts.source_config)  # the source's format; None: JSON
        stager = RowStager(deep, spec, name_hint=hint)
        try:
            for piece in self._record_pieces(raw, stamps, lost):
                decoded = decode_records(spec, piece, fmt)
                dead.extend(decoded.dead)
                self._refuse_bad(dead)
                stager.add(decoded.rows)
            return stager.finish(), dead
        except BaseException:
            stager.abort()
            raise

    def _absorb(self, propose: Callable[[TableSpec], TableSpec]) -> TableSpec:
        """Grow the table to ``propose(its spec)`` through the one schema-change path
        (:func:`millstream.metastore.evolve.absorb`: the rules, a compare-and-set on the
        table row, its dead-letter table and datastream row in the same transaction) and
        return its spec as it now is. Idempotent: a task that lost the race to another finds
        the columns there. An unknown COMMIT outcome is reconciled by re-reading the table:
        if the spec read holds what was proposed the change landed (here or elsewhere) and
        the task goes on; if not, the error is raised (the task fails, nothing is staged, and
        its retry looks again) instead of trying the change again blindly."""
        store = self._store()
        try:
            info, changes = store.absorb(self.spec.name, propose)
        except CommitStateUnknownError:
            current = self.current_spec()
            if propose(current) != current:
                raise
            log.info(
                "schema_evolution auto: table %r: unknown commit outcome, re-read: landed",
                self.spec.name,
            )
            return current
        if changes:
            log.info(
                "schema_evolution auto: table %r is now schema version %d: %s",
                self.spec.name,
                info.schema_version,
                "; ".join(c.describe() for c in changes),
            )
        return info.spec

    def _store(self) -> MetadataStore:
        # lazy: the driver's; a write task's worker commits nothing and loads no store
        from millstream.metastore.store import STORES

        return (self.stores if self.stores is not None else STORES).get(self.settings.metadata_url)

    def _deep(self) -> DeepStore:
        return _deep_store(self.settings.deep_store, self.settings.s3_endpoint)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkMessage:
        settle_worker()
        try:
            return self.write_batch(iterator, _batch_id())
        finally:
            release_after_task()

    def write_batch(
        self,
        iterator: Iterator[pa.RecordBatch],
        batch_id: int | str | None,
        *,
        current: TableSpec | None = None,
    ) -> SinkMessage:
        """One write task of batch ``batch_id``: of a streaming query (:meth:`write`) or of
        an ``available_now`` run's Spark job (:mod:`millstream.spark.catch_up`). ``current``:
        the table's spec as the task read it already (a shared query's task reads every
        member's at once), else it is read here (:meth:`current_spec`)."""
        ctx = TaskContext.get()
        hint = (
            f"b{batch_id}-t{ctx.partitionId() if ctx else 0}-a{ctx.attemptNumber() if ctx else 0}"
        )
        raw = pa.Table.from_batches(list(iterator), schema=RAW_SCHEMA)
        ranges = _ranges(raw)
        staged_at = time.time()  # before reading: no file of this task is older
        stamps: dict[int, int] = {}
        spec = (current or self.current_spec()) if ranges else self.spec
        lost: list[tuple[int, int, int]] = []
        deep = self._deep()
        if absorber(self.opts.source_config) is None:
            data, bad = self._stage_as_decoded(deep, spec, raw, stamps, lost, hint)
        else:  # the spec may grow mid-task: earlier pieces are conformed to it, then staged
            spec, decoded = self._decode(spec, raw, stamps, lost)
            self._refuse_bad(decoded.dead)
            data, bad = stage_rows(deep, spec, decoded.rows, name_hint=hint), decoded.dead
        read_ms = round(time.time() * 1000)  # the ingestion time of records without a stamp
        # no dead-letter rows built for a clean task (6% of a shared query's write task over
        # 100 small tables, profiled; docs/performance.md, "(c) What a batch of small busy
        # tables costs")
        dead = (
            stage_rows(deep, self.dl_spec, dead_letter_rows(bad), name_hint=hint)
            if bad
            else StagedFile(None, 0, {})
        )
        faults.hit("after_stage", batch_id)
        with_records = set(data.row_counts) | set(dead.row_counts)
        return SinkMessage(
            ranges=ranges,
            data_path=data.path,
            data_size=data.size_bytes,
            data_counts=dict(data.row_counts),
            dead_path=dead.path,
            dead_size=dead.size_bytes,
            dead_counts=dict(dead.row_counts),
            staged_at=staged_at,
            last_record_ms={p: stamps.get(p, read_ms) for p in sorted(with_records)},
            lost=lost,
        )

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Commit the batch through :func:`millstream.table.commit.commit_writes` (the one
        commit path): the table and its dead-letter table in one transaction."""
        batch = self.prepare(messages, batchId)
        if batch is None:
            return
        # CommitStateUnknownError propagates only when a re-read did not show the batch
        # persisted; the staged files are then kept (only GC, which checks references, may
        # delete them) and the query fails and restarts from the shard uppers.
        started = time.perf_counter()
        result = commit_writes(
            self._store(),
            self._deep(),
            batch.table,
            batch.writes,
            dead_letter_table=batch.dead_letter_table,
            epochs=batch.epochs,
            dead_letter_epochs=batch.dead_letter_epochs,
            writer_id=batch.writer_id,
            batch_id=batchId,
            max_staged_age=batch.max_staged_age,
            raise_for_gaps=False,
        )
        self.finish(messages, batchId, result, time.perf_counter() - started)

    def prepare(
        self, messages: list[WriterCommitMessage | None], batchId: int
    ) -> TableBatch | None:
        """What this table commits of the batch (:class:`TableBatch`), or None: no range, or
        a warm standby that may not commit (its staged files are deleted and the batch is
        logged as skipped)."""
        faults.hit("before_commit", batchId)
        writes = [m.staged_write() for m in messages if isinstance(m, SinkMessage)]
        if not any(w.ranges for w in writes):
            return None
        if not self._may_commit(self._store()):
            # A warm standby: it reads and stages like the active but does not commit while
            # the active is alive. When it takes over, its first commit finds a gap and the
            # runner restarts it from the shard upper.
            self._delete(self._deep(), set().union(*(w.paths for w in writes)))
            self._record(batchId, None)
            return None
        return TableBatch(
            self.spec.name,
            writes,
            dead_letter_table=self.dl_spec.name,
            epochs=self.epochs,
            dead_letter_epochs=self.dl_epochs,
            writer_id=self.writer_id,
            batch_id=batchId,
            max_staged_age=self.opts.max_staged_age,
        )

    def finish(
        self,
        messages: list[WriterCommitMessage | None],
        batchId: int,
        result: BatchCommit,
        commit_s: float,
    ) -> None:
        """After the batch's commit: its line in the commit log, then its gaps raised."""
        self._record(
            batchId,
            result,
            commit_s=commit_s,
            lost=[m for m in messages if isinstance(m, SinkMessage) and m.lost],
        )
        faults.hit("after_commit", batchId)
        result.raise_for_gaps()

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Delete staged files after a write task failed (some message is missing): the
        commit never ran, so nothing can reference them, but the check is cheap. When every
        task succeeded, ``commit`` ran and disposed of the files itself (and kept them on an
        unknown outcome, deliberately): nothing to do."""
        if all(isinstance(m, SinkMessage) for m in messages):
            return
        staged = {
            p
            for m in messages
            if isinstance(m, SinkMessage)
            for p in (m.data_path, m.dead_path)
            if p
        }
        if not staged:
            return
        store = self._store()
        referenced = store.referenced_files(self.spec.name) | store.referenced_files(
            self.dl_spec.name
        )
        self._delete(self._deep(), staged - referenced)

    @staticmethod
    def _delete(deep: DeepStore, paths: set[str]) -> None:
        for p in paths:
            deep.delete(p)

    def _may_commit(self, store: MetadataStore) -> bool:
        if self.gate is None:
            return True
        return store.may_commit(
            self.gate.datastream,
            self.gate.worker,
            takeover_ttl=self.gate.takeover_ttl,
            now=time.time(),
        )

    def _record(
        self,
        batch_id: int,
        result: BatchCommit | None,
        *,
        commit_s: float | None = None,
        lost: list[SinkMessage] | None = None,
    ) -> None:
        """Append the batch's line to the commit log; ``commit_s`` is how long the metadata
        commit took (:func:`commit_writes`: the transaction and deleting unreferenced files)."""
        if not self.stats_file:
            return
        if result is None:
            entry: dict[str, Any] = {
                "batch_id": batch_id,
                "at": time.time(),
                "skipped": True,
                "rows": 0,
            }
        else:
            table = result.table
            entry = {
                "batch_id": batch_id,
                "at": time.time(),
                "version": table.version,
                "rows": result.rows,
                "lost_race": table.lost_race,
                "retries": table.retries,
                "reconciled": result.reconciled,
                "commit_s": None if commit_s is None else round(commit_s, 4),
                "outcomes": {str(s.partition): s.decision.outcome.value for s in table.shards},
                "uppers": {str(s.partition): s.decision.new_upper for s in table.shards},
                **_row_counts(result),
            }
            if lost:
                entry.update(_lost_offsets(result, lost))
        append_commit_log(Path(self.stats_file), entry)


@dataclass
class GroupMessage(WriterCommitMessage):
    """A shared query's write task: the :class:`SinkMessage` of each member it wrote, and the
    error of each member whose part failed (``TypeName: message``, as a traceback ends)."""

    messages: dict[str, SinkMessage] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    #: Each member's incarnation the task wrote for (the membership generation it joined at).
    since: dict[str, int] = field(default_factory=dict)
    #: The entry of each member that joined the running query (the commit's sink was made at
    #: the query's start and knows only the members it started with).
    joined: dict[str, Member] = field(default_factory=dict)


class MemberWriteError(Exception):
    """A shared query's member whose part of a write task failed: raised by the commit once
    the other members have committed the batch. Its text is the member's own error
    (``BadRecordError: ...``), so the worker treats it as that member's error alone."""


def _member_failure(exc: BaseException) -> str:
    text = (str(exc).splitlines() or [""])[0][:2000]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class GroupSink(DataSourceStreamArrowWriter):
    """The sink of a shared query (several datastreams in one query): a :class:`SegmentSink`
    per member datastream, each writing and committing exactly as it would alone (its table,
    its epochs, its standby gate, its commit log). The members' commits share ONE metadata
    transaction, each in a savepoint of its own (:func:`~millstream.table.commit.commit_many`):
    one member fenced, gapped or failing does not keep the others from committing the batch;
    its error is raised after they have committed, carrying :data:`MEMBER_NOTE`. A member
    whose part of a write task fails does not fail the task either (the task holds the
    others' parts): it commits nothing of the batch, and its error is raised likewise."""

    def __init__(self, options: GroupSinkOptions, stores: StoreRegistry | None = None) -> None:
        self.members = {n: SegmentSink(o, stores) for n, o in sorted(options.members.items())}
        self.stores = stores
        self.since = dict(options.since)
        self.membership = Membership(options.membership) if options.membership else None
        #: The query's options as text when this sink was made by :func:`group_sink`: it
        #: then travels to the write tasks as that text (:meth:`__getstate__`).
        self.options_text: str | None = None

    def __getstate__(self) -> dict[str, Any]:
        """A sink made by :func:`group_sink` is pickled as its options' text, and a process
        that unpickles it takes this process's sink of that text (:meth:`__setstate__`):
        unpickling every member's options (its spec, settings and dead-letter spec) in every
        write task was ~10% of a shared query's write task over 100 small tables."""
        if self.options_text is not None:
            return {"options_text": self.options_text}
        return dict(self.__dict__)

    def __setstate__(self, state: dict[str, Any]) -> None:
        text = state.get("options_text")
        if text is not None and len(state) == 1:
            state = dict(_group_sink_of(text).__dict__)
        self.__dict__.update(state)

    def _sink_of(self, name: str, joined: Member | None) -> SegmentSink:
        """The member's sink: the query's own for a member it started with, one of its entry
        for a member that joined the running query (this process's sink of that entry's
        options, :func:`_member_sink`, unless this sink has stores of its own)."""
        if joined is None:
            return self.members[name]
        if self.stores is None:
            return _member_sink(json.dumps(joined.sink, sort_keys=True))
        return SegmentSink(SinkOptions.from_options(joined.sink), self.stores)

    @staticmethod
    def _entries(raw: pa.Table) -> tuple[pa.Table, dict[str, Member]]:
        """The rows that carry joined members' entries (:data:`ENTRY`) out of ``raw``."""
        is_entry = pc.fill_null(pc.equal(raw.column("value"), pa.scalar(ENTRY, pa.binary())), False)
        if not pc.any(is_entry).as_py():
            return raw, {}
        entries: dict[str, Member] = {}
        for row in raw.filter(is_entry).select(["member", "key"]).to_pylist():
            entries[row["member"]] = Member.from_json(row["member"], json.loads(row["key"]))
        return raw.filter(pc.invert(is_entry)), entries

    def write(self, iterator: Iterator[pa.RecordBatch]) -> GroupMessage:
        """Each member's part of the task, written by its own sink on a thread of its own:
        a member's read waits for its source (a Kafka fetch that a broker holds for
        ``fetch.wait.max.ms``, 50 ms on Tansu, however few its records), and one member
        after another made a task's time grow with its members, not with its records
        (bench/scale.py (b): 8 datastreams of 1,000 rows/s in batches of ~3 s, the worker's
        CPU 0.6 cores). The decoding and staging release the GIL for most of their time."""
        settle_worker()
        try:
            return self._write_members(iterator)
        finally:
            release_after_task()

    def _write_members(self, iterator: Iterator[pa.RecordBatch]) -> GroupMessage:
        raw, joined = self._entries(pa.Table.from_batches(list(iterator), schema=GROUP_SCHEMA))
        member = raw.column("member")
        parts: dict[str, pa.Table] = {}
        for name in sorted(pc.unique(member).to_pylist()):
            if name not in self.members and name not in joined:
                raise InvalidSpecError(
                    "members",
                    f"the shared query's source planned datastream {name!r}, which its sink "
                    f"does not have (members: {sorted(self.members)})",
                )
            parts[name] = raw.filter(pc.equal(member, pa.scalar(name))).drop_columns(["member"])

        sinks: dict[str, SegmentSink | str] = {}
        for name in parts:
            try:
                sinks[name] = self._sink_of(name, joined.get(name))
            except Exception as exc:
                log.warning("datastream %s: its part of a write task failed: %s", name, exc)
                sinks[name] = _member_failure(exc)
        current = self._current_specs([s for s in sinks.values() if isinstance(s, SegmentSink)])
        batch_id = _batch_id()

        def write(name: str) -> SinkMessage | str:
            """The member's message, or its error: a member's failure (a bad record with
            ``bad_records: fail``, its source not answering) must not fail the task, which
            holds the other members' parts too; the commit raises it after they committed."""
            sink = sinks[name]
            if isinstance(sink, str):
                return sink
            try:
                return sink.write_batch(
                    iter(parts[name].to_batches()), batch_id, current=current.get(sink.spec.name)
                )
            except Exception as exc:
                log.warning("datastream %s: its part of a write task failed: %s", name, exc)
                return _member_failure(exc)

        done = each_member(list(parts), write, "member-write")
        return GroupMessage(
            {n: m for n, m in done.items() if isinstance(m, SinkMessage)},
            {n: m for n, m in done.items() if isinstance(m, str)},
            {n: joined[n].since if n in joined else self.since.get(n, 0) for n in done},
            {n: joined[n] for n in done if n in joined},
        )

    @staticmethod
    def _current_specs(sinks: list[SegmentSink]) -> dict[str, TableSpec]:
        """Every member's table spec as it is now, in ONE read per metadata store: the spec
        each member's part decodes and stages under (a schema change reaches the running
        query at its next batch). A read per member was a round trip per table with records
        in each task. If the read fails, each member reads its own (its error is its own)."""
        by_store: dict[str, list[SegmentSink]] = {}
        for sink in sinks:
            by_store.setdefault(sink.settings.metadata_url, []).append(sink)
        out: dict[str, TableSpec] = {}
        for group in by_store.values():
            try:
                out.update(group[0]._store().table_specs([s.spec.name for s in group]))
            except Exception as exc:
                log.warning("a write task could not read its members' specs at once: %s", exc)
        return out

    def _of(
        self, name: str, messages: list[WriterCommitMessage | None]
    ) -> list[WriterCommitMessage | None]:
        return [m.messages.get(name) if isinstance(m, GroupMessage) else None for m in messages]

    def _sinks(self, messages: list[WriterCommitMessage | None]) -> dict[str, SegmentSink]:
        """The sink of every member the query started with or the batch's tasks wrote for."""
        joined: dict[str, Member] = {}
        for m in messages:
            if isinstance(m, GroupMessage):
                joined.update(m.joined)
        sinks = {n: self._sink_of(n, e) for n, e in joined.items()}
        return dict(sorted({**self.members, **sinks}.items()))

    @staticmethod
    def _incarnations(messages: list[WriterCommitMessage | None]) -> dict[str, set[int]]:
        out: dict[str, set[int]] = {}
        for m in messages:
            if isinstance(m, GroupMessage):
                for name, since in m.since.items():
                    out.setdefault(name, set()).add(since)
        return out

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Commit each member's part of the batch (together: :meth:`_commit_together`), each
        rolled back alone if it fails. A member whose part
        of some write task failed commits nothing of the batch (its staged files are
        deleted): the others commit, then its error is raised naming it.

        In a running query whose members change (``membership``), the commit holds the
        membership's shared lock: a member that left the query (or whose incarnation the
        batch was written for was replaced) commits nothing of it, its staged files are
        deleted, and its error, if any, is not raised; none can leave meanwhile."""
        if self.membership is None:
            self._commit(messages, batchId, None)
            return
        with self.membership.shared() as current:
            self._commit(messages, batchId, {n: m.since for n, m in current.items()})

    def _commit(
        self,
        messages: list[WriterCommitMessage | None],
        batchId: int,
        current: dict[str, int] | None,
    ) -> None:
        errors: list[Exception] = []
        failed: dict[str, str] = {}
        for m in messages:
            if isinstance(m, GroupMessage):
                for name, error in m.failed.items():
                    failed.setdefault(name, error)
        incarnations = self._incarnations(messages)
        ready: dict[str, tuple[SegmentSink, list[WriterCommitMessage | None], TableBatch]] = {}
        for name, sink in self._sinks(messages).items():
            mine: list[WriterCommitMessage | None] = [
                m for m in self._of(name, messages) if m is not None
            ]
            if (
                current is not None
                and name in incarnations
                and incarnations[name] != {current.get(name)}
            ):
                log.info(
                    "batch %s of datastream %s is not committed: the datastream left the "
                    "shared query (its files are deleted)",
                    batchId,
                    name,
                )
                if mine:
                    sink.abort([*mine, None], batchId)
                continue
            if name in failed:
                if mine:
                    sink.abort([*mine, None], batchId)  # deletes what it staged
                try:
                    with member_errors(name):
                        raise MemberWriteError(failed[name])
                except MemberWriteError as exc:
                    errors.append(exc)
                continue
            if not mine:
                continue
            try:
                with member_errors(name):
                    batch = sink.prepare(mine, batchId)
            except Exception as exc:
                log.warning("batch %s of datastream %s was not committed: %s", batchId, name, exc)
                errors.append(exc)
                continue
            if batch is not None:
                ready[name] = (sink, mine, batch)
        errors.extend(self._commit_together(ready, batchId))
        if errors:
            raise errors[0]

    def _commit_together(
        self,
        ready: dict[str, tuple[SegmentSink, list[WriterCommitMessage | None], TableBatch]],
        batchId: int,
    ) -> list[Exception]:
        """Commit the members' parts of the batch in ONE metadata transaction per store
        (:func:`~millstream.table.commit.commit_many`): a member that is fenced, refused or
        loses a race is rolled back alone and its error returned (carrying
        :data:`MEMBER_NOTE`); the others commit and log their batch."""
        errors: list[Exception] = []
        stores: dict[tuple[str, str], list[str]] = {}
        for name, (sink, _, _) in ready.items():
            where = (sink.settings.metadata_url, sink.settings.deep_store)
            stores.setdefault(where, []).append(name)
        for names in stores.values():
            first = ready[names[0]][0]
            started = time.perf_counter()
            results = commit_many(first._store(), first._deep(), {n: ready[n][2] for n in names})
            took = time.perf_counter() - started
            for name, result in results.items():
                sink, mine, _ = ready[name]
                try:
                    with member_errors(name):
                        if isinstance(result, Exception):
                            raise result
                        sink.finish(mine, batchId, result, took)
                except Exception as exc:
                    log.warning("batch %s of datastream %s did not commit: %s", batchId, name, exc)
                    errors.append(exc)
        return errors

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if all(isinstance(m, GroupMessage) for m in messages):
            return  # every task succeeded: commit disposed of the files (see SegmentSink)
        for name, sink in self._sinks(messages).items():
            mine = self._of(name, messages)
            if any(m is not None for m in mine):
                sink.abort([*mine, None], batchId)


def group_sink(options: Mapping[str, str]) -> GroupSink:
    """The shared query's sink of ``options`` (the query's sink options, as Spark passes them),
    one per process and exact options: a sink holds nothing of a batch, and a query's options
    (every member's spec, settings and epochs) stay the same from its start to its stop.
    Parsing them was about half of every batch's commit process over 100 small tables, and
    their unpickling ~10% of every write task; any change of them (a restart's epochs, a
    spec, ``bad_records``) is another text, so another sink. A member's current spec is read at each batch, not kept here
    (:meth:`GroupSink._current_specs`)."""
    return _group_sink_of(json.dumps(dict(options), sort_keys=True))


@functools.lru_cache(maxsize=8)
def _group_sink_of(text: str) -> GroupSink:
    sink = GroupSink(GroupSinkOptions.from_options(json.loads(text)))
    sink.options_text = text
    return sink


@functools.lru_cache(maxsize=4096)
def _member_sink(text: str) -> SegmentSink:
    """The sink of a member that joined a running query, by its entry's sink options (as
    text): made once per process and entry, not for every write task and commit."""
    return SegmentSink(SinkOptions.from_options(json.loads(text)))


#: A writer's commit log is rotated past this size: ``commits.jsonl`` becomes
#: ``commits.jsonl.1`` (replacing the previous one), so a writer that runs for months keeps at
#: most twice this on disk (a line per micro-batch: about 40,000 batches per file).
COMMIT_LOG_BYTES = 8 * 1024 * 1024


def append_commit_log(path: Path, entry: dict[str, Any], *, limit: int = COMMIT_LOG_BYTES) -> None:
    """Append ``entry`` to the commit log at ``path``; rotate the log once it is past
    ``limit`` bytes (its readers, :class:`millstream.spark.runner.CommitLogTotals`, finish the
    rotated file before they read the new one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(entry) + "\n")
        size = f.tell()
    if size > limit:
        os.replace(path, rotated_log(path))


def rotated_log(path: Path) -> Path:
    return path.with_name(path.name + ".1")


def _lost_offsets(result: BatchCommit, messages: list[SinkMessage]) -> dict[str, Any]:
    """The source offsets lost (skipped by ``on_data_loss: accept``) in the ranges this commit
    appended: ``lost`` per partition (a count, as the row counts) and ``lost_ranges``
    ``[partition, first, end]``. A replayed range that was dropped as persisted already
    counted its loss when it committed."""
    appended = {(s.partition, s.decision.end) for s in result.table.shards if s.decision.appends}
    counts: dict[str, int] = {}
    ranges: list[list[int]] = []
    for m in messages:
        for p, first, end in m.lost:
            if p in m.ranges and (p, m.ranges[p][1]) in appended:
                counts[str(p)] = counts.get(str(p), 0) + end - first
                ranges.append([p, first, end])
    return {"lost": counts, "lost_ranges": ranges} if ranges else {}


def _row_counts(result: BatchCommit) -> dict[str, dict[str, int]]:
    """Per partition whose range this commit appended (not dropped as already persisted): the
    records consumed (rows plus bad records) and the bad records dead-lettered. A range
    trimmed at the upper counts the records the task staged (an upper bound)."""
    # An appended range ends where its shard's decision ends; a partition split over several
    # write tasks has a piece per task, and only the pieces that appended count.
    appended = {(s.partition, s.decision.end) for s in result.table.shards if s.decision.appends}
    consumed: dict[str, int] = {}
    dead_lettered: dict[str, int] = {}
    for a in result.appends:
        if (a.partition, a.hi) in appended and a.row_count:
            consumed[str(a.partition)] = consumed.get(str(a.partition), 0) + a.row_count
    for a in result.dead_letter_appends:
        if (a.partition, a.hi) in appended and a.row_count:
            p = str(a.partition)
            consumed[p] = consumed.get(p, 0) + a.row_count
            dead_lettered[p] = dead_lettered.get(p, 0) + a.row_count
    return {"consumed": consumed, "dead_lettered": dead_lettered}
