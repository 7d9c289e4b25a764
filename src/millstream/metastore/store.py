"""The metadata store: tables, shards and manifests on SQLAlchemy Core (SQLite or PostgreSQL).

:class:`MetadataStore` is the facade; the work is done by one module per idea:

* :mod:`~millstream.metastore.engine`: the engine, read and write transactions, the retry of
  lost compare-and-sets, the schema migration;
* :mod:`~millstream.metastore.tables`: creating and looking up tables;
* :mod:`~millstream.metastore.shards`: reading shards and bootstrapping missing ones;
* :mod:`~millstream.metastore.append`: applying compare-and-append (a writer's commit);
* :mod:`~millstream.metastore.reads`: reading a table's manifest, now or as of a version;
* :mod:`~millstream.metastore.claims`, :mod:`~millstream.metastore.swaps`,
  :mod:`~millstream.metastore.rollback`: a sealer's claims, the seal, compaction and
  re-ingestion swaps, rollbacks;
* :mod:`~millstream.metastore.expiry`, :mod:`~millstream.metastore.pins`,
  :mod:`~millstream.metastore.iceberg`, :mod:`~millstream.metastore.jobs`,
  :mod:`~millstream.metastore.evolve`, :mod:`~millstream.metastore.owners`,
  :mod:`~millstream.metastore.assignments`: retention, read pins, the Iceberg view's pointer,
  controller jobs, ``schema_evolution: auto``, table owners, the standby commit gate.

Embedded default: a SQLite file in WAL mode. Multi-host: PostgreSQL by URL. Write transactions
on SQLite take the write lock up front (``BEGIN IMMEDIATE``) so two processes never deadlock
upgrading a read lock; on PostgreSQL every row change is a compare-and-set on ``version`` and a
lost race is retried from a fresh read.

The facade calls down into those modules: each method opens a read or write transaction (or
runs the module's transaction function in :meth:`MetadataStore.retrying`, or a
:class:`~millstream.metastore.manifest.Reconcilable` in
:func:`~millstream.metastore.manifest.reconcile`) and passes a connection, its clock and plain
values. None of them imports the facade: import-linter contracts keep the package free of
import cycles and ``store`` the only module above the others.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from datetime import datetime
from typing import Any, Concatenate, ParamSpec, TypeVar

from sqlalchemy import Connection

from millstream import faults
from millstream.clock import SYSTEM_CLOCK, Clock
from millstream.core.assignment import Placement
from millstream.core.evolution import Change
from millstream.errors import CommitConflictError, MillstreamError
from millstream.metastore import (
    append,
    assignments,
    claims,
    engine,
    evolve,
    expiry,
    iceberg,
    jobs,
    owners,
    pins,
    reads,
    rollback,
    shards,
    swaps,
    tables,
)
from millstream.metastore import schema as s
from millstream.metastore.claims import DEFAULT_CLAIM_TTL
from millstream.metastore.manifest import reconcile
from millstream.metastore.models import (
    AppendResult,
    DeleteVector,
    Entry,
    Manifest,
    ManifestChanges,
    SealingReads,
    Shard,
    ShardAppend,
    TableInfo,
)
from millstream.spec import DEAD_LETTER_SUFFIX, TableSpec

P = ParamSpec("P")
T = TypeVar("T")


class MetadataStore:
    """Authoritative state of tables, shards and segments. Safe across threads and processes."""

    def __init__(self, url: str, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.url = url
        self.clock = clock
        self.is_sqlite = url.startswith("sqlite")
        self.engine = engine.make_engine(url, is_sqlite=self.is_sqlite)
        #: Compare-and-set retries in this process (reported as commit conflicts).
        self.conflicts = 0
        self._conflicts_lock = threading.Lock()
        engine.migrate(self)

    # -- fault points ----------------------------------------------------------------------

    @property
    def on_commit(self) -> Callable[[bool], None] | None:
        """What a write transaction calls as ``on_commit(landed)`` right before
        (``landed=False``) and right after (``landed=True``) its COMMIT: the fault points
        ``before_metadata_commit`` / ``after_metadata_commit`` (:mod:`millstream.faults`,
        this store as their source). An exception there is a failure during COMMIT, an
        unknown outcome (:class:`CommitStateUnknownError`). None while no fault handler is
        installed, so a transaction pays one check."""
        return self._commit_point if faults.armed() else None

    @on_commit.setter
    def on_commit(self, _hook: object) -> None:
        raise AttributeError("install a fault handler instead: millstream.faults.install")

    def _commit_point(self, landed: bool) -> None:
        faults.hit("after_metadata_commit" if landed else "before_metadata_commit", None, self)

    # -- connection plumbing ---------------------------------------------------------------

    def read(self) -> AbstractContextManager[Connection]:
        """A read-only transaction over one consistent snapshot."""
        return engine.read_transaction(self)

    def write(self) -> AbstractContextManager[Connection]:
        """A write transaction. A failure inside COMMIT becomes CommitStateUnknownError."""
        return engine.write_transaction(self)

    def retrying(
        self,
        fn: Callable[Concatenate[Connection, P], T],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> tuple[T, int]:
        """Run ``fn(conn, *args, **kwargs)`` in a write transaction, retrying lost
        compare-and-sets. Returns ``fn``'s result and how many times it was retried."""
        return engine.retrying(self, fn, *args, **kwargs)

    def _count_conflict(self) -> None:
        with self._conflicts_lock:
            self.conflicts += 1

    def schema_version(self) -> int:
        with self.read() as conn:
            return s.current_schema_version(conn)

    def dispose(self) -> None:
        self.engine.dispose()

    # -- tables ----------------------------------------------------------------------------

    def create_table(self, spec: TableSpec, *, exist_ok: bool = True) -> TableInfo:
        """Create a table; an identical existing one is returned when ``exist_ok``."""
        info, _ = self.retrying(tables.create_table, self.clock, spec, exist_ok=exist_ok)
        return info

    def evolve_table(self, spec: TableSpec) -> tuple[TableInfo, list[Change]]:
        """Change the table's spec to ``spec`` if the change is compatible (one transaction:
        compare-and-set on the table row plus the new schema version's row); a lost race is
        retried and re-checked against the winner. IncompatibleChangeError otherwise."""
        result, _ = self.retrying(tables.evolve_table, self.clock, spec)
        return result

    def schema_history(self, name: str) -> list[tuple[int, TableSpec, int]]:
        """Every schema version of the table, oldest first: (version, spec, manifest version
        it took effect at)."""
        with self.read() as conn:
            tables.find_table(conn, name)
            return tables.schema_history(conn, name)

    def get_table(self, name: str) -> TableInfo:
        with self.read() as conn:
            info = self._table(conn, name)
            assert info is not None
            return info

    def manifest_version(self, name: str) -> int:
        """The table's current manifest version, read without its manifest (a sealing pass
        skips an unchanged table's manifest read on it)."""
        with self.read() as conn:
            return tables.manifest_version(conn, name)

    def manifest_changes(self, name: str, *, after: int) -> ManifestChanges:
        """The table's current manifest version and what changed after version ``after`` (the
        entries added, how many were removed), in one read: a sealing pass that remembered
        ``after`` judges the appends since without reading the whole manifest."""
        with self.read() as conn:
            version = tables.manifest_version(conn, name)
            return reads.changes_since(conn, name, after, version)

    def sealing_reads(self, afters: Mapping[str, int | None]) -> dict[str, SealingReads]:
        """For each table of ``afters`` that exists: its force commits' targets
        (:meth:`force_commit_targets`) and, where ``afters`` gives the version its sealing
        pass last read, what changed after it (:meth:`manifest_changes`), all in ONE read
        transaction: a worker's sealing pass over 100 tables made 200 small transactions of
        these, a fifth of its own process (issue 38). Each table's answer is the one its own
        reads would give."""
        with self.read() as conn:
            versions = tables.manifest_versions(conn, list(afters))
            forced = jobs.force_commit_targets_of(conn, list(versions))
            out: dict[str, SealingReads] = {}
            for name, version in versions.items():
                after = afters[name]
                changes = None if after is None else reads.changes_since(conn, name, after, version)
                out[name] = SealingReads(forced.get(name, {}), after, changes)
            return out

    def table_specs(self, names: Sequence[str]) -> dict[str, TableSpec]:
        """The specs of the tables ``names`` that exist, in one read: a shared query's write
        task reads every member's spec at once instead of a read per member."""
        with self.read() as conn:
            return tables.table_specs(conn, names)

    def list_tables(self) -> list[TableInfo]:
        with self.read() as conn:
            return tables.list_tables(conn)

    def table_row(self, conn: Connection, name: str, *, lock: bool = False) -> TableInfo:
        """The table's row inside ``conn``'s transaction (TableNotFoundError if missing)."""
        info = self._table(conn, name, lock=lock)
        assert info is not None
        return info

    def _table(
        self, conn: Connection, name: str, *, missing_ok: bool = False, lock: bool = False
    ) -> TableInfo | None:
        """The table row. ``lock`` takes its row lock first (PostgreSQL ``FOR UPDATE``; SQLite's
        write transactions already hold the database lock): racing committers then wait
        instead of doing all their work and losing the final compare-and-set."""
        return tables.find_table(
            conn, name, missing_ok=missing_ok, for_update=lock and not self.is_sqlite
        )

    # -- shards ----------------------------------------------------------------------------

    def get_shard(self, table: str, partition: int) -> Shard | None:
        with self.read() as conn:
            self._table(conn, table)
            rows = self._shards(conn, table, [partition])
            return rows.get(partition)

    def list_shards(self, table: str) -> list[Shard]:
        with self.read() as conn:
            self._table(conn, table)
            return sorted(self._shards(conn, table, None).values(), key=lambda sh: sh.partition)

    def covered_shards(self, table: str) -> list[Shard]:
        """:meth:`list_shards`, where a dead-letter table's uppers are how far its dead
        letters are recorded: the higher of its own and its table's (its shard moves only with
        a dead letter; every offset below the table's upper had its dead letters recorded in
        the transaction that committed it, :func:`~millstream.metastore.append.dead_letter_upper`).
        What a user reads as the dead-letter table's position and lag."""
        base = table.removesuffix(DEAD_LETTER_SUFFIX)
        with self.read() as conn:
            self._table(conn, table)
            own = self._shards(conn, table, None)
            if base == table:
                return sorted(own.values(), key=lambda sh: sh.partition)
            theirs = self._shards(conn, base, None)
        out = []
        for p in sorted(own.keys() | theirs.keys()):
            mine, base_shard = own.get(p), theirs.get(p)
            shown = mine if mine is not None else replace(theirs[p], table=table)
            out.append(replace(shown, upper=append.dead_letter_upper(base_shard, mine, 0)))
        return out

    def _shards(
        self, conn: Connection, table: str, partitions: Sequence[int] | None
    ) -> dict[int, Shard]:
        return shards.shards_of(conn, table, partitions)

    def ensure_shards(
        self, table: str, starts: dict[int, int], *, together_with: Sequence[str] = ()
    ) -> dict[int, Shard]:
        """Create the missing shards of ``table`` (and of the ``together_with`` tables, its
        dead-letter table) in ONE transaction; existing shards are left alone. Returns
        ``table``'s requested shards as they now are.

        A partition none of the tables has a shard for starts at ``starts[partition]``
        (epoch 0). A partition some of them already have starts, in the others, at the lowest
        upper among those: a table and its dead-letter table must cover the same offsets, or
        the bad records between the two starts would be in neither (a crash between two
        separate creations, or two replicas bootstrapping a new datastream under traffic)."""
        created, _ = self.retrying(shards.ensure_shards, table, starts, together_with=together_with)
        return created

    # -- commits ---------------------------------------------------------------------------

    def compare_and_append(
        self,
        table: str,
        appends: Sequence[ShardAppend],
        *,
        writer_id: str | None = None,
        batch_id: int | None = None,
    ) -> AppendResult:
        """Commit a batch touching several shards of ``table`` in ONE transaction.

        Each shard is decided by :func:`millstream.core.frontier.decide`: drop what is below
        ``upper``, trim a batch straddling it, commit one starting at it, refuse one starting
        above it (a gap). A stale epoch on any shard fences the whole batch
        (:class:`WriterFencedError`, nothing committed). Replaying a committed batch is a
        harmless DROP. Shards are created on first commit with ``upper = lo``.
        """
        ordered = append.checked_appends(appends)
        result, retries = self.retrying(
            append.append_txn, self.clock, not self.is_sqlite, table, ordered, writer_id, batch_id
        )
        return AppendResult(
            result.table, result.version, result.shards, retries, result.files_referenced
        )

    def commit_batch(
        self,
        changes: dict[str, Sequence[ShardAppend]],
        *,
        writer_id: str | None = None,
        batch_id: int | None = None,
        precondition: Callable[[], None] | None = None,
    ) -> dict[str, AppendResult]:
        """compare_and_append on several tables (a table and its dead-letter table) in ONE
        transaction: either every table's decision is recorded or none is. ``precondition``
        runs inside the transaction right before COMMIT (every lock held); if it raises,
        nothing is committed."""
        ordered = {t: append.checked_appends(a) for t, a in sorted(changes.items())}
        lock = not self.is_sqlite

        def _txn(conn: Connection) -> dict[str, AppendResult]:
            results = append.append_tables_txn(conn, self.clock, lock, ordered, writer_id, batch_id)
            if precondition is not None:
                precondition()  # last, with every lock held: right before COMMIT
            return results

        results, retries = self.retrying(_txn)
        return {
            t: AppendResult(r.table, r.version, r.shards, retries, r.files_referenced)
            for t, r in results.items()
        }

    def commit_batches(
        self, batches: Mapping[str, append.BatchAppends]
    ) -> dict[str, dict[str, AppendResult] | MillstreamError]:
        """:meth:`commit_batch` of several writers' batches (the members of a shared query)
        in ONE transaction: one round trip and one COMMIT for the lot instead of one per
        writer, where each batch keeps every precondition its own transaction checks. Each
        batch runs in a savepoint (:func:`~millstream.metastore.append.append_batches_txn`):
        one that is fenced, refused or that lost a compare-and-set is rolled back alone and
        never holds the others back. Per batch: its results by table, or its error. A batch
        that lost a compare-and-set (a concurrent writer moved its row) is then committed
        on its own (:meth:`commit_batch`, retried from a fresh read). An unknown outcome of
        the shared COMMIT raises :class:`CommitStateUnknownError` for the caller to reconcile
        per batch."""
        out: dict[str, dict[str, AppendResult] | MillstreamError] = {}
        todo: dict[str, append.BatchAppends] = {}
        for key, b in sorted(batches.items()):
            try:
                changes = {t: append.checked_appends(a) for t, a in sorted(b.changes.items())}
            except MillstreamError as exc:
                out[key] = exc
                continue
            todo[key] = append.BatchAppends(changes, b.writer_id, b.batch_id, b.precondition)
        lock = not self.is_sqlite
        done: dict[str, dict[str, AppendResult] | MillstreamError] = {}
        retries = 0
        while todo:
            try:
                done, retries = self.retrying(append.append_batches_txn, self.clock, lock, todo)
                break
            except append.LatePreconditionError as late:
                out.update(late.errors)
                todo = {k: b for k, b in todo.items() if k not in late.errors}
        for key, result in done.items():
            if isinstance(result, CommitConflictError):  # a lost race: alone, from a fresh read
                b = batches[key]
                try:
                    out[key] = self.commit_batch(
                        dict(b.changes),
                        writer_id=b.writer_id,
                        batch_id=b.batch_id,
                        precondition=b.precondition,
                    )
                except MillstreamError as exc:
                    out[key] = exc
            elif isinstance(result, MillstreamError):
                out[key] = result
            else:
                out[key] = {
                    t: AppendResult(r.table, r.version, r.shards, retries, r.files_referenced)
                    for t, r in result.items()
                }
        return dict(sorted(out.items()))

    # -- manifests -------------------------------------------------------------------------

    def manifest(self, table: str, *, as_of: int | float | datetime | None = None) -> Manifest:
        """The table's entries at its current manifest version, or at ``as_of``.

        ``as_of`` is a manifest version (int) or a point in time (datetime or epoch seconds as a
        float): the last version committed at or before it.
        """
        with self.read() as conn:
            info = self._table(conn, table)
            assert info is not None
            return reads.manifest_at(conn, info, reads.resolve_version(conn, info, as_of))

    def oldest_kept_version(self, table: str) -> int:
        """The oldest manifest version ``table`` keeps (retention expires older ones)."""
        with self.read() as conn:
            return reads.oldest_kept_version(conn, table)

    def operations_between(self, table: str, after: int, upto: int) -> list[str]:
        """What made each kept version of ``table`` after ``after`` up to ``upto``
        (:func:`~millstream.metastore.reads.operations_between`)."""
        with self.read() as conn:
            return reads.operations_between(conn, table, after, upto)

    def referenced_files(self, table: str) -> set[str]:
        """Every data file any entry or delete vector of ``table`` references (removed ones
        included: time travel may still read them)."""
        with self.read() as conn:
            return reads.referenced_files(conn, table)

    # -- schema evolution (:mod:`.evolve`) -------------------------------------------------

    def absorb(
        self, table: str, propose: Callable[[TableSpec], TableSpec]
    ) -> tuple[TableInfo, list[Change]]:
        """``schema_evolution: auto``: :func:`~millstream.metastore.evolve.absorb` in ONE
        retried transaction (``propose`` runs on the spec read inside it)."""
        result, _ = self.retrying(evolve.absorb, self.clock, table, propose)
        return result

    # -- seal claims and swaps (:mod:`.claims`, :mod:`.swaps`) -----------------------------

    def claim_run(
        self, run: Sequence[Entry], *, owner: str, ttl: float = DEFAULT_CLAIM_TTL
    ) -> dict[int, int] | None:
        """:func:`~millstream.metastore.claims.claim_run` in one retried transaction."""
        claimed, _ = self.retrying(claims.claim_run, self.clock, run, owner=owner, ttl=ttl)
        return claimed

    def release_run(
        self, claimed: Mapping[int, int], *, error: str, fail_first: bool
    ) -> int | None:
        """:func:`~millstream.metastore.claims.release_run` in one retried transaction."""
        released, _ = self.retrying(claims.release_run, claimed, error=error, fail_first=fail_first)
        return released

    def renew_claim(
        self, claimed: Mapping[int, int], *, owner: str, ttl: float = DEFAULT_CLAIM_TTL
    ) -> dict[int, int] | None:
        """:func:`~millstream.metastore.claims.renew_claim` in one retried transaction."""
        renewed, _ = self.retrying(claims.renew_claim, self.clock, claimed, owner=owner, ttl=ttl)
        return renewed

    def replace_run(
        self,
        table: str,
        partition: int,
        claimed: Mapping[int, int],
        sealed: swaps.SealedSegment,
        *,
        deadline: float | None = None,
        sealer_clock: Clock | None = None,
    ) -> tuple[Entry, int | None]:
        """A seal's swap (:func:`~millstream.metastore.swaps.replace_run`), its unknown
        outcome reconciled by re-reading."""
        return reconcile(
            self,
            swaps.replace_run(
                self.clock,
                table,
                partition,
                claimed,
                sealed,
                deadline=deadline,
                sealer_clock=sealer_clock,
            ),
        )

    def replace_sealed(
        self,
        table: str,
        partition: int,
        window: Sequence[Entry],
        vectors: Sequence[DeleteVector],
        reflects: tuple[tuple[int, ...], tuple[int, ...]],
        merged: swaps.CompactedSegment,
        *,
        deadline: float,
        clock: Clock,
    ) -> tuple[Entry, int | None]:
        """A compaction's swap (:func:`~millstream.metastore.swaps.replace_sealed`), its
        unknown outcome reconciled by re-reading."""
        return reconcile(
            self,
            swaps.replace_sealed(
                self.clock,
                table,
                partition,
                window,
                vectors,
                reflects,
                merged,
                deadline=deadline,
                clock=clock,
            ),
        )

    def replace_entry(
        self,
        old: Entry,
        *,
        file_path: str,
        row_count: int,
        size_bytes: int,
        precondition: Callable[[], None] | None = None,
    ) -> Entry:
        """A re-ingestion's swap (:func:`~millstream.metastore.swaps.replace_entry`), its
        unknown outcome reconciled by re-reading."""
        return reconcile(
            self,
            swaps.replace_entry(
                self.clock,
                old,
                file_path=file_path,
                row_count=row_count,
                size_bytes=size_bytes,
                precondition=precondition,
            ),
        )

    def rollback_partition(
        self, table: str, partition: int, from_seq: int, *, dry_run: bool = True
    ) -> rollback.RollbackPlan:
        """Plan or apply a rollback (:func:`~millstream.metastore.rollback.rollback_partition`),
        its unknown outcome reconciled by re-reading."""
        return reconcile(
            self,
            rollback.rollback_partition(self.clock, table, partition, from_seq, dry_run=dry_run),
        )

    # -- retention and read pins (:mod:`.expiry`, :mod:`.pins`) ----------------------------

    def expire_versions(self, table: str, *, now: float, dry_run: bool = False) -> expiry.Expiry:
        """:func:`~millstream.metastore.expiry.expire_versions` in one retried transaction."""
        result, _ = self.retrying(expiry.expire_versions, table, now=now, dry_run=dry_run)
        return result

    def pin_version(
        self,
        table: str,
        as_of: int | float | datetime | None,
        *,
        holder: str,
        seconds: float,
        now: float,
    ) -> pins.Pin:
        """:func:`~millstream.metastore.pins.pin_version` in one retried transaction."""
        pin, _ = self.retrying(
            pins.pin_version, table, as_of, holder=holder, seconds=seconds, now=now
        )
        return pin

    def release_pin(self, pin: pins.Pin) -> bool:
        """Release ``pin``; False if it was gone already."""
        return engine.rerun_if_aborted(self, pins.release_pin, pin)

    def list_pins(self, table: str) -> list[pins.Pin]:
        with self.read() as conn:
            return pins.list_pins(conn, table)

    # -- the Iceberg view's pointer (:mod:`.iceberg`) --------------------------------------

    def read_pointer(self, table: str) -> iceberg.IcebergPointer | None:
        """The table's Iceberg pointer, or None if nothing was published yet."""
        with self.read() as conn:
            return iceberg.read_pointer(conn, table)

    def swap_pointer(
        self,
        table: str,
        expected: iceberg.IcebergPointer | None,
        *,
        metadata_location: str,
        manifest_version: int,
        now: float,
        precondition: Callable[[], None] | None = None,
    ) -> iceberg.IcebergPointer | None:
        """:func:`~millstream.metastore.iceberg.swap_pointer` in a write transaction; None
        when another publisher moved the pointer first (nothing changed here).
        ``precondition`` runs inside the transaction right before COMMIT; if it raises,
        nothing changed."""
        try:
            return engine.rerun_if_aborted(
                self,
                iceberg.swap_pointer,
                table,
                expected,
                metadata_location=metadata_location,
                manifest_version=manifest_version,
                now=now,
                precondition=precondition,
            )
        except iceberg.LOST_RACE:
            return None

    def version_committed_at(self, table: str, version: int) -> float:
        with self.read() as conn:
            return iceberg.version_committed_at(conn, self.clock, table, version)

    def publish_lag(self, table: str, now: float) -> float | None:
        """How far ``table``'s Iceberg view lags
        (:func:`~millstream.metastore.iceberg.publish_lag`)."""
        with self.read() as conn:
            return iceberg.publish_lag(conn, table, now)

    # -- controller jobs (:mod:`.jobs`) ----------------------------------------------------

    def submit_force_commit(self, manifest: Manifest, *, now: float) -> jobs.Job:
        return engine.rerun_if_aborted(self, jobs.submit_force_commit, manifest, now=now)

    def get_job(self, job_id: str) -> jobs.Job:
        with self.read() as conn:
            return jobs.get_job(conn, job_id)

    def force_commit_targets(self, table: str) -> dict[int, int]:
        with self.read() as conn:
            return jobs.force_commit_targets(conn, table)

    def start_reingest(
        self,
        table: str,
        segment: str,
        *,
        entry_id: int | None,
        owner: str,
        now: float,
        lease: float,
        trigger: str,
        respect_backoff: bool = False,
        after_read: Callable[[], None] | None = None,
    ) -> jobs.ReingestJob | None:
        """:func:`~millstream.metastore.jobs.start_reingest` in one retried transaction."""
        job, _ = self.retrying(
            jobs.start_reingest,
            table,
            segment,
            entry_id=entry_id,
            owner=owner,
            now=now,
            lease=lease,
            trigger=trigger,
            respect_backoff=respect_backoff,
            after_read=after_read,
        )
        return job

    def renew_reingest(
        self, job: jobs.ReingestJob, *, now: float, lease: float
    ) -> jobs.ReingestJob | None:
        """Extend ``job``'s lease; None if it changed since it was read (no longer its
        owner's)."""
        try:
            return engine.rerun_if_aborted(self, jobs.renew_reingest, job, now=now, lease=lease)
        except CommitConflictError:
            return None

    def finish_reingest(
        self,
        job: jobs.ReingestJob,
        *,
        now: float,
        status: str,
        error: str | None = None,
        result: dict[str, Any] | None = None,
        next_attempt_at: float | None = None,
        unrecoverable: str | None = None,
    ) -> jobs.ReingestJob | None:
        """Record ``job``'s outcome (:func:`~millstream.metastore.jobs.finish_reingest`); None
        if it changed since it was read (another controller took it over)."""
        try:
            return engine.rerun_if_aborted(
                self,
                jobs.finish_reingest,
                job,
                now=now,
                status=status,
                error=error,
                result=result,
                next_attempt_at=next_attempt_at,
                unrecoverable=unrecoverable,
            )
        except CommitConflictError:
            return None

    def reingest_jobs(self, table: str | None = None) -> list[jobs.ReingestJob]:
        """Every stored re-ingest job (of ``table``), oldest first."""
        with self.read() as conn:
            return jobs.reingest_jobs(conn, table)

    # -- owners and assignments (:mod:`.owners`, :mod:`.assignments`) ----------------------

    def claim_owners(self, tables: Sequence[str], datastream: str) -> None:
        """:func:`~millstream.metastore.owners.claim_tables` in a transaction of its own, for a
        writer run without the controller (:class:`~millstream.spark.runner.DatastreamRunner`
        run directly)."""

        def _txn(conn: Connection) -> None:
            owners.claim_tables(conn, tables, datastream, self.clock.now())

        self.retrying(_txn)

    def read_assignments(self) -> dict[str, Placement]:
        with self.read() as conn:
            return assignments.assignments_in(conn)

    def may_commit(
        self, datastream: str, worker_id: str, *, takeover_ttl: float, now: float
    ) -> bool:
        """Whether a standby-mode writer on ``worker_id`` may commit
        (:func:`~millstream.metastore.assignments.may_commit`)."""
        with self.read() as conn:
            return assignments.may_commit(
                conn, datastream, worker_id, takeover_ttl=takeover_ttl, now=now
            )


class StoreRegistry:
    """The metadata stores of one process, by URL. Spark builds a fresh sink object (and a
    source reader) for every micro-batch, in a Python worker it reuses across batches; keeping the store (its
    engine, connection pool and migration check) for the process saves ~6 ms per batch on
    SQLite and a new connection per batch on PostgreSQL. ``held`` are stores this process
    has open already (a driver's catalog store, which an ``available_now`` run commits with)."""

    def __init__(self, *held: MetadataStore) -> None:
        self._lock = threading.Lock()
        self._stores: dict[str, MetadataStore] = {s.url: s for s in held}

    def get(self, url: str) -> MetadataStore:
        with self._lock:
            store = self._stores.get(url)
            if store is None:
                store = self._stores[url] = MetadataStore(url)
            return store

    def close(self) -> None:
        with self._lock:
            stores, self._stores = list(self._stores.values()), {}
        for store in stores:
            store.dispose()


#: The stores of this process; a sink uses them unless it is given its own registry.
STORES = StoreRegistry()
