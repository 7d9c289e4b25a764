"""The sealer: compacts a partition's consuming segments into one sealed segment, in the
background (pauseless: writers keep committing while a seal builds and uploads).

One seal of partition P:

1. **claim** the run: every not-yet-sealed entry of P, in sequence order (always the whole
   suffix after the last sealed segment, so segments of a partition seal strictly in order).
   Claiming is a compare-and-set of each entry CONSUMING -> COMMITTING; a run another sealer
   has claimed is left alone until its claim expires, judged on the metadata store's clock
   (never this sealer's, which may be skewed), as are the claim's renewals and the swap's
   expiry check.
2. **build**: read the run's rows and :meth:`~millstream.core.engines.base.MergeEngine.compact` them (resolving
   keys where that provably gives the same table), sorted by key, in sized row groups; look
   the run's keys up in the partition's key index (:mod:`millstream.sealing.keyindex`) to find
   the rows of older sealed segments the run supersedes.
3. **upload** the sealed file and, if any rows are superseded, their delete vector.
4. **swap** the manifest in one transaction: the run's entries are removed (if, and only if,
   they are still exactly as claimed) and one ONLINE entry covering ``[run start, run end)``
   with the run's first sequence number is added, with its delete vector; the partition's
   sealed entries and delete vectors must still be the ones the key index reflects.

The cost of a seal grows with its run, not with the table: it reads only the run, and the key
index answers which older rows are superseded without reading older segments.

A failure at any point leaves the consuming segments in place and queryable (the read result
never depends on sealing), deletes an uploaded but unswapped file, and puts the run back to
CONSUMING with the error; after ``max_failures`` consecutive failures its first entry goes to
ERROR (reported by ``/tables/{t}/debugInfo``) and is retried with backoff. This holds for every
engine, dedup and partial included: the inputs are the durable consuming segments.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from millstream import faults
from millstream.catalog import Catalog
from millstream.clock import SYSTEM_CLOCK, Clock
from millstream.core.engines import engine_for
from millstream.errors import (
    CommitConflictError,
    CommitStateUnknownError,
    InjectedFault,
    SegmentChangedError,
    SegmentUnavailableError,
)
from millstream.metastore.claims import DEFAULT_CLAIM_TTL
from millstream.metastore.models import (
    Entry,
    Manifest,
    ManifestChanges,
    SealingReads,
    SegmentState,
)
from millstream.metastore.swaps import (
    CompactedSegment,
    SealedSegment,
)
from millstream.sealing.compaction import (
    CompactionPlan,
    CompactionPolicy,
    merge_window,
    plan_compaction,
)
from millstream.sealing.indexes import TIMES_KEPT, SealerIndexes
from millstream.sealing.keyindex import IndexCache, KeyIndex, Reflects
from millstream.sealing.planning import due, due_totals, pending_run, shortfall, slot_phase
from millstream.sealing.thresholds import Thresholds
from millstream.spec import OFFSET_COL, SYSTEM_COLUMNS
from millstream.storage.deepstore import dictionary_columns, table_data_prefix
from millstream.table import merged
from millstream.table.read import read_entries, read_manifest

log = logging.getLogger(__name__)

ROW_GROUP_ROWS = 128 * 1024
#: How many partitions one pass of :meth:`Sealer.seal_what_is_due` seals at once: the cores
#: (at most 2: a seal's Python steps hold the GIL, and each seal holds its rows in memory).
SEAL_THREADS = max(1, min(2, os.cpu_count() or 1))
#: How many of its last compactions' results a sealer keeps (its status counts them all).
COMPACTIONS_KEPT = 100


class _ClaimRenewer:
    """Renews a seal's claim (:func:`~millstream.metastore.claims.renew_claim`, judged on the
    metadata store's clock) every third of its TTL while the seal builds, on a thread of its
    own. A renewal the store refuses (the claim expired: this sealer was frozen past it, or
    another sealer took the run over) ends the renewals; the seal's swap then refuses too. A
    failed renewal (the store unreachable) is logged, counted and tried again next time."""

    def __init__(self, sealer: Sealer, partition: int, claimed: dict[int, int]) -> None:
        self.sealer, self.partition, self.claimed = sealer, partition, dict(claimed)
        self.every = sealer.claim_renew_seconds
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._run, name=f"claim-renewer-{sealer.table}-{partition}", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        s = self.sealer
        while not self._stop.wait(self.every):
            try:
                faults.hit("renew_claim", self.partition, s)
                with self._lock:
                    if self._stop.is_set():
                        return
                    renewed = s.store.renew_claim(
                        self.claimed, owner=s.claim_owner, ttl=s.claim_ttl
                    )
                    if renewed is None:
                        s.claims_lost += 1
                        log.warning(
                            "the claim of sealer %s on %s partition %d expired or was taken "
                            "over before it was renewed; the seal will be discarded",
                            s.claim_owner,
                            s.table,
                            self.partition,
                        )
                        return
                    self.claimed = renewed
                    s.claim_renewals += 1
            except Exception as exc:  # the store may be down: try again next time
                s.claim_renewal_failures += 1
                log.warning(
                    "could not renew the claim of sealer %s on %s partition %d: %s",
                    s.claim_owner,
                    s.table,
                    self.partition,
                    exc,
                )

    def stop(self) -> dict[int, int]:
        """Stop renewing (idempotent); the claim's entry versions after the last renewal."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
        with self._lock:
            return dict(self.claimed)


@dataclass(frozen=True, slots=True)
class _Run:
    """What a pass keeps of a partition's pending run between manifest reads: its first
    sequence number (what a force commit names), its rows and bytes (the size thresholds) and
    the ``created_at`` of its oldest entry (when its age threshold is reached)."""

    first_seq: int
    rows: int
    size_bytes: int
    oldest: float

    @classmethod
    def of(cls, run: list[Entry]) -> _Run:
        return cls(
            min(e.seq for e in run),
            sum(e.row_count for e in run),
            sum(e.size_bytes for e in run),
            min(e.created_at for e in run),
        )

    def due(self, thresholds: Thresholds, now: float, phase: float | None) -> bool:
        return due_totals(self.rows, self.size_bytes, self.oldest, thresholds, now, phase)


@dataclass(frozen=True, slots=True)
class _LastRead:
    """A pass's manifest read in which no partition was due, as of manifest ``version``
    (advanced by the appends since, while nothing else changed): per partition with a pending
    run, what the pass keeps of the run."""

    version: int
    runs: dict[int, _Run]

    def advanced(self, changes: ManifestChanges) -> _LastRead | None:
        """This read as of ``changes.version``, if what changed since is consuming entries
        appended and nothing else; None if anything else changed (a seal, a compaction, a
        rollback, a re-ingest: the pass reads the whole manifest, whose sealed entries the
        compaction check needs) or the version went back."""
        if (
            changes.version < self.version
            or changes.removed
            or any(e.state is not SegmentState.CONSUMING for e in changes.added)
        ):
            return None
        runs = dict(self.runs)
        for e in changes.added:
            run = runs.get(e.partition)
            if run is None:  # the partition had nothing pending: the entry starts its run
                runs[e.partition] = _Run(e.seq, e.row_count, e.size_bytes, e.created_at)
                continue
            runs[e.partition] = _Run(
                min(run.first_seq, e.seq),
                run.rows + e.row_count,
                run.size_bytes + e.size_bytes,
                min(run.oldest, e.created_at),
            )
        return _LastRead(changes.version, runs)


@dataclass(frozen=True, slots=True)
class SealResult:
    table: str
    partition: int
    sealed: Entry
    replaced: tuple[str, ...]
    rows_in: int
    rows_out: int
    seconds: float
    rows_deleted: int = 0


@dataclass(frozen=True, slots=True)
class CompactionResult:
    table: str
    partition: int
    merged: Entry
    replaced: tuple[str, ...]
    vectors_replaced: int
    rows_in: int
    rows_out: int
    seconds: float


class Sealer:
    def __init__(
        self,
        catalog: Catalog,
        table: str,
        *,
        thresholds: Thresholds | None = None,
        clock: Clock = SYSTEM_CLOCK,
        max_failures: int = 3,
        checkpoint_seconds: float = 60.0,
        claim_ttl: float = DEFAULT_CLAIM_TTL,
        index_cache: IndexCache | None = None,
        compaction: CompactionPolicy | None = None,
    ) -> None:
        self.catalog = catalog
        self.store = catalog.store
        self.table = table
        self.thresholds = thresholds or Thresholds()
        #: Where in each ``flush_seconds`` this table's age seals fall, if spread (None: at
        #: ``flush_seconds`` exactly); see :mod:`millstream.sealing.planning`.
        self.phase = (
            slot_phase(table, self.thresholds.flush_seconds) if self.thresholds.spread else None
        )
        self.clock = clock
        self.max_failures = max_failures
        #: Who this sealer is in its claims, and how long a claim holds: after that, another
        #: sealer may take the run over (this one is presumed dead; its swap is then refused).
        self.claim_owner = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.claim_ttl = claim_ttl
        #: Seconds between renewals of a running seal's claim (a third of the TTL: two may
        #: fail before it expires), and their counts: renewed, failed (retried), refused.
        self.claim_renew_seconds = claim_ttl / 3
        self.claim_renewals = 0
        self.claim_renewal_failures = 0
        self.claims_lost = 0
        self.failures: dict[int, int] = {}
        self.last_error: dict[int, str] = {}
        #: Seals this sealer made, and the seconds of the newest (at most
        #: :data:`TIMES_KEPT`: a list a sealer of months would grow a float a seal).
        self.seals = 0
        self.durations: list[float] = []
        #: Per partition, the row versions this sealer's seals resolved away (a counter for
        #: the life of the sealer): rows of each run its engine did not keep, plus the older
        #: sealed rows each seal's delete vector marked superseded.
        self.superseded: dict[int, int] = {}
        self._next_try: dict[int, float] = {}
        #: When to merge sealed segments (:mod:`millstream.sealing.compaction`).
        self.compaction = compaction or CompactionPolicy()
        #: The last :data:`COMPACTIONS_KEPT` compactions' results; :attr:`compacted` counts
        #: them all (the status's ``compactions``).
        self.compactions: list[CompactionResult] = []
        self.compacted = 0
        self.compaction_failures: dict[int, int] = {}
        self.compaction_errors: dict[int, str] = {}
        self._next_compaction: dict[int, float] = {}
        #: Per partition, the sealed state last found with nothing to compact.
        self._compaction_idle: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        #: What the last pass's manifest read found, while nothing in it was due: the next
        #: pass skips its read unless something can have become due since (see _quiet).
        self._last_read: _LastRead | None = None
        #: Passes that skipped the table's manifest read (nothing can have become due).
        self.passes_skipped = 0
        #: The read (with system columns) the last merged copy was written from, and the
        #: manifest it is the read of: an ``--available-now`` run's Iceberg publish of that
        #: manifest builds its view on it instead of merging the table again.
        self.final_read: tuple[Manifest, pa.Table] | None = None
        #: Held while a seal updates the counters above (seals, durations, failures).
        self._counting = threading.Lock()
        #: The key indexes of the table's partitions (lookup, rebuild, checkpoints).
        self.indexes = SealerIndexes(
            catalog, table, checkpoint_seconds=checkpoint_seconds, cache=index_cache
        )

    # -- key index -------------------------------------------------------------------------

    @property
    def checkpoint_seconds(self) -> float:
        """How often (at most) a partition's key index is checkpointed after a seal."""
        return self.indexes.checkpoint_seconds

    @checkpoint_seconds.setter
    def checkpoint_seconds(self, seconds: float) -> None:
        self.indexes.checkpoint_seconds = seconds

    @property
    def index_rebuilds(self) -> int:
        """Key indexes this sealer had to rebuild by reading sealed segments."""
        return self.indexes.rebuilds

    @property
    def index_seconds(self) -> list[float]:
        """Seconds of key-index maintenance (run merges) after each seal."""
        return self.indexes.seconds

    @property
    def _where(self) -> str:
        """The key of this deployment's indexes in :data:`millstream.sealing.keyindex.CACHE`."""
        return self.indexes.where

    def checkpoint_path(self, partition: int) -> Path:
        return self.indexes.checkpoint_path(partition)

    def key_index(self, partition: int, manifest: Manifest) -> KeyIndex | None:
        """The partition's key index as of ``manifest``: the in-memory one if current, else the
        local checkpoint if current, else rebuilt from the sealed segments."""
        return self.indexes.current(partition, manifest)

    def checkpoint(self, *, force: bool = False) -> int:
        """Write the key index checkpoint of every partition due for one (or all, ``force``);
        returns how many were written. A checkpoint only saves a rebuild after a restart."""
        return self.indexes.checkpoint(self.partitions(), force=force)

    # -- planning --------------------------------------------------------------------------

    def pending_run(self, partition: int, manifest: Manifest | None = None) -> list[Entry]:
        """The partition's entries not sealed yet, in sequence order."""
        return pending_run(manifest or self.catalog.manifest(self.table), partition)

    def due(self, run: list[Entry]) -> bool:
        return due(run, self.thresholds, self.clock, self.phase)

    def not_due_reason(self, run: list[Entry]) -> str | None:
        """Why ``run`` is not due for a seal (None if it is): each threshold, and how far off."""
        if not run or self.due(run):
            return None
        return shortfall(run, self.thresholds, self.clock)

    def seal_what_is_due(self, *, everything: bool = False) -> dict[str, Any]:
        """One pass over every partition, reporting each: sealed (segments, rows), not due
        (why), or failed (the error). With ``everything``, every partition's consuming run is
        sealed whatever its size or age, and the sealed segments due for it are compacted
        (``compacted``): what an ``--available-now`` run does before it exits, where no
        background sealer outlives it, so that what it wrote is read as final rows."""
        sealed: dict[str, Any] = {}
        not_due: dict[str, str] = {}
        failed: dict[str, str] = {}
        manifest = self.catalog.manifest(self.table)
        to_seal: list[int] = []
        for p in self.partitions():
            run = self.pending_run(p, manifest)
            if not run:
                continue
            reason = None if everything else self.not_due_reason(run)
            if reason is not None:
                not_due[str(p)] = reason
                continue
            to_seal.append(p)

        def seal(p: int) -> tuple[int, SealResult | str | None]:
            try:
                return p, self.seal_partition(p, force=everything)
            except Exception as exc:
                return p, str(exc).splitlines()[0] if str(exc) else type(exc).__name__

        # The partitions' seals are independent (each claims and swaps its own run, a
        # compare-and-set of its own in the metadata store, retried when another partition's
        # swap moved the table's version first), and most of a seal is Arrow's work, which
        # releases the GIL: a pass seals them on up to SEAL_THREADS threads, so the run's final
        # pass uses the cores its ended JVM and write tasks left idle.
        threads = min(len(to_seal), SEAL_THREADS)
        if threads > 1:
            with ThreadPoolExecutor(threads, thread_name_prefix=f"seal-{self.table}") as pool:
                outcomes = list(pool.map(seal, to_seal))
        else:
            outcomes = [seal(p) for p in to_seal]
        for p, result in outcomes:
            if isinstance(result, str):
                failed[str(p)] = result
            elif result is None:
                not_due[str(p)] = "another sealer holds the run, or it changed meanwhile"
            else:
                sealed[str(p)] = {"segments": len(result.replaced), "rows": result.rows_out}
        report: dict[str, Any] = {"sealed": sealed, "not_due": not_due, "failed": failed}
        if everything:
            report["compacted"] = {
                str(c.partition): {"segments": len(c.replaced), "rows": c.rows_out}
                for c in self.compact_due()
            }
            failed.update({str(p): e for p, e in self.compaction_errors.items()})
        self.checkpoint(force=True)
        if everything:
            report["merged_copy"] = self._write_merged_copy()
        return report

    def _write_merged_copy(self) -> dict[str, Any] | None:
        """Store the read of the table as it now is as its merged copy
        (:mod:`millstream.table.merged`), so that reads until the next change read the live
        rows alone instead of merging every partition's sealed rows. None if the table has
        none (not keyed, or a partition is not all sealed: a seal failed, or a writer is at
        work); skipped for a table of more than :data:`~millstream.table.merged.MAX_ROWS`
        rows. A failure is logged and reported, never raised: reads merge instead."""
        version: int | None = None
        try:
            manifest = self.catalog.manifest(self.table)
            version = manifest.version
            if merged.copy_path(manifest) is None:
                return None
            if manifest.row_count > merged.MAX_ROWS:
                return {"skipped": f"{manifest.row_count} rows, over {merged.MAX_ROWS}"}
            # With the system columns: the Iceberg view of this manifest needs them (each
            # winner's partition and offset); the copy is the same rows without them.
            rows = read_manifest(self.catalog.deep, manifest, include_system_columns=True)
            written = merged.write_copy(
                self.catalog.deep,
                manifest,
                rows.drop_columns([c for c in SYSTEM_COLUMNS if c in rows.column_names]),
            )
            self.final_read = (manifest, rows)
        except Exception as exc:
            log.warning(
                "table %s: the merged copy of version %s was not written (reads merge instead): %s",
                self.table,
                version,
                exc,
            )
            return {"failed": str(exc).splitlines()[0] if str(exc) else type(exc).__name__}
        if written is None:
            return None
        return {"version": manifest.version, "rows": written.rows, "bytes": written.size_bytes}

    def partitions(self) -> list[int]:
        return [sh.partition for sh in self.store.list_shards(self.table)]

    # -- sealing ---------------------------------------------------------------------------

    @property
    def remembered_version(self) -> int | None:
        """The manifest version the last pass read (and later passes judged the appends
        since): what a worker's read of all its tables' changes asks after, or None when the
        next pass reads the manifest anyway."""
        return self._last_read.version if self._last_read is not None else None

    def seal_due(self, read: SealingReads | None = None) -> list[SealResult]:
        """Seal every partition whose thresholds are reached. Failures are recorded and the
        partition is retried with exponential backoff (capped at a minute), never raised: this
        runs in the background beside the writers. ``read`` is this table's part of a read of
        all of a worker's tables (``MetadataStore.sealing_reads``), taken at the start of the
        worker's pass; without it the pass reads its own."""
        out: list[SealResult] = []
        forced: dict[int, int] | None
        if read is not None:
            forced = dict(read.forced)
        else:
            try:
                forced = self.store.force_commit_targets(self.table)
            except Exception as exc:  # the store is down: thresholds apply, the next pass asks
                log.warning("cannot read force commits of %s: %s", self.table, exc)
                forced = None
        if forced is not None and self._quiet(forced, read):
            self.passes_skipped += 1
            return out
        forced = forced or {}
        self._last_read = None
        # One read of the manifest decides which partitions are due; only those read it again
        # to seal. A read per partition per pass (and again to compact) was most of a worker's
        # own CPU with 8 tables of 4 partitions (bench/scale.py (b)), and grew with the
        # unsealed segments.
        manifest: Manifest | None = None
        partitions = self.partitions()
        for p in partitions:
            if self._next_try.get(p, 0.0) > self.clock.now():
                continue
            try:
                if manifest is None:
                    manifest = self.catalog.manifest(self.table)
                if not self._may_seal(p, manifest, forced.get(p)):
                    continue
                r = self.seal_partition(p, force_up_to=forced.get(p))
            except Exception as exc:
                delay = min(60.0, 2.0 ** self.failures.get(p, 1))
                self._next_try[p] = self.clock.now() + delay
                log.warning(
                    "seal of %s partition %d failed (retry in %.0fs): %s", self.table, p, delay, exc
                )
                continue
            if r is not None:
                out.append(r)
        self.compact_due(manifest)
        if manifest is not None:
            self._remember(manifest, partitions)
        return out

    def _remember(self, manifest: Manifest, partitions: list[int]) -> None:
        """Remember this pass's manifest read for the next pass to skip its own, unless a
        partition was due in it (its seal may not have happened: another sealer's claim)."""
        runs = {p: run for p in partitions if (run := self.pending_run(p, manifest))}
        if any(self.due(run) for run in runs.values()):
            return
        self._last_read = _LastRead(manifest.version, {p: _Run.of(run) for p, run in runs.items()})

    def _quiet(self, forced: dict[int, int], prefetched: SealingReads | None = None) -> bool:
        """Whether nothing is due since the last pass's manifest read, judged from what changed
        since it (``MetadataStore.manifest_changes``: the entries added, how many removed), so
        this pass may skip the manifest read (and the compaction check, which depends on the
        sealed entries alone): only consuming entries were appended since (no seal,
        compaction, rollback or re-ingest), no seal or compaction retry is pending, no force
        commit names a segment of a pending run, and no pending run, with the appends since,
        reached a threshold (rows, bytes, age) by now. The remembered read then moves to the
        current version with the appends in it. The cost of a skipped pass grows with the
        appends since the last pass, not with a table's unsealed entries (a busy table's
        version moves every batch). A skipped pass only delays a seal by one pass: the manifest
        is read as soon as anything else changes or comes due, or the changes cannot be read.
        ``prefetched``'s changes stand in for this read only when they are the changes after the
        version remembered: changes after another version would count appends twice or miss
        them for good (the remembered runs move on past them)."""
        last = self._last_read
        if last is None or self.failures or self.compaction_failures:
            return False
        now = self.clock.now()
        if any(t > now for t in self._next_try.values()):
            return False
        if (
            prefetched is not None
            and prefetched.changes is not None
            and prefetched.after == last.version
        ):
            changes = prefetched.changes
        else:
            try:
                changes = self.store.manifest_changes(self.table, after=last.version)
            except Exception as exc:  # unknown: read the manifest as before
                log.warning("cannot read the manifest changes of %s: %s", self.table, exc)
                return False
        read = last.advanced(changes)
        if read is None:
            return False  # not appends alone since the last read: read the manifest
        if any(p in read.runs and read.runs[p].first_seq <= seq for p, seq in forced.items()):
            return False
        if any(run.due(self.thresholds, now, self.phase) for run in read.runs.values()):
            return False
        self._last_read = read
        return True

    def _may_seal(self, partition: int, manifest: Manifest, force_up_to: int | None) -> bool:
        """Whether :meth:`seal_partition` may find something to do, judged from a manifest
        read earlier in the pass: a run that became due since is sealed at the next pass."""
        run = self.pending_run(partition, manifest)
        if not run:
            return False
        return (force_up_to is not None and run[0].seq <= force_up_to) or self.due(run)

    def compact_due(self, manifest: Manifest | None = None) -> list[CompactionResult]:
        """Compact every partition whose sealed segments are due for it (after the seals, on
        the same thread: a seal and a compaction of one sealer never race). Failures back off
        per partition and are recorded, never raised, like failed seals. ``manifest``, read
        earlier in the pass, skips the partitions found with nothing to do last time and
        unchanged since (each due one is read again to compact)."""
        out: list[CompactionResult] = []
        if not self.compaction.enabled:
            return out
        for p in self.partitions():
            if self._next_compaction.get(p, 0.0) > self.clock.now():
                continue
            try:
                if manifest is not None and self._compaction_idle.get(p) == self._idle_key(
                    manifest, p
                ):
                    continue  # nothing changed since it was found with nothing to do
                r = self.compact_partition(p)
            except Exception as exc:
                n = self.compaction_failures.get(p, 0) + 1
                self.compaction_failures[p] = n
                self.compaction_errors[p] = (
                    str(exc).splitlines()[0][:1000] if str(exc) else (type(exc).__name__)
                )
                delay = min(60.0, 2.0**n)
                self._next_compaction[p] = self.clock.now() + delay
                log.warning(
                    "compaction of %s partition %d failed (retry in %.0fs): %s",
                    self.table,
                    p,
                    delay,
                    exc,
                )
                continue
            if r is not None:
                out.append(r)
        return out

    def status(self) -> dict[str, object]:
        last = self.compactions[-1] if self.compactions else None
        return {
            "failures": {str(p): n for p, n in self.failures.items()},
            "last_error": {str(p): e for p, e in self.last_error.items()},
            "last_seal_seconds": self.durations[-1] if self.durations else None,
            "seals": self.seals,
            "compactions": self.compacted,
            "last_compaction": None
            if last is None
            else {
                "partition": last.partition,
                "segments": len(last.replaced),
                "rows_in": last.rows_in,
                "rows_out": last.rows_out,
                "seconds": round(last.seconds, 3),
            },
            "compaction_failures": {str(p): n for p, n in self.compaction_failures.items()},
            "compaction_errors": {str(p): e for p, e in self.compaction_errors.items()},
            "claim_renewals": self.claim_renewals,
            "claim_renewal_failures": self.claim_renewal_failures,
            "claims_lost": self.claims_lost,
            "passes_skipped": self.passes_skipped,
        }

    # -- compaction of sealed segments -----------------------------------------------------

    def plan_compaction(
        self, partition: int, manifest: Manifest | None = None
    ) -> CompactionPlan | None:
        """The window of the partition's sealed segments due for a merge, or None."""
        manifest = manifest or self.catalog.manifest(self.table)
        return plan_compaction(self.catalog.deep, manifest, partition, self.compaction)

    @staticmethod
    def _idle_key(manifest: Manifest, partition: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """What a partition's compaction plan depends on: its sealed entries and delete
        vectors."""
        state = Reflects.of(manifest, partition)
        return state.entries, state.delete_vectors

    def compact_partition(self, partition: int) -> CompactionResult | None:
        """Merge the partition's sealed segments that are due (see
        :mod:`millstream.sealing.compaction`). Returns None when nothing is due; raises the
        failure otherwise (after deleting what it uploaded, unless the swap may have landed)."""
        manifest = self.catalog.manifest(self.table)
        idle = self._idle_key(manifest, partition)
        if self._compaction_idle.get(partition) == idle:
            return None  # nothing changed since it was last found with nothing to do
        plan = self.plan_compaction(partition, manifest)
        if plan is None:
            self._compaction_idle[partition] = idle
            return None
        started = time.monotonic()
        deadline = self.clock.now() + self.claim_ttl
        spec = manifest.table.spec
        path: str | None = None
        dv_path: str | None = None
        swapping = False
        try:
            faults.hit("before_compact_build", partition, self)
            try:
                rows, before, _ = merge_window(self.catalog.deep, spec, plan)
            except SegmentUnavailableError as exc:
                raise self._read_of_a_stale_manifest(exc) from exc
            faults.hit("before_compact_upload", partition, self)
            prefix = table_data_prefix(self.table)
            tag = f"p{partition}-s{plan.window[0].seq}-{uuid.uuid4().hex}"
            path = f"{prefix}/compacted-{tag}.parquet"
            size = self.catalog.deep.write_parquet(
                path, rows, row_group_size=ROW_GROUP_ROWS, dictionary=dictionary_columns(rows)
            )
            if len(before):
                dv_path = f"{prefix}/dv-compacted-{tag}.parquet"
                self.catalog.deep.write_parquet(
                    dv_path, pa.table({OFFSET_COL: pa.array(before, pa.int64())})
                )
            faults.hit("before_compact_swap", partition, self)
            swapping = True
            merged, dv_id = self.store.replace_sealed(
                self.table,
                partition,
                plan.window,
                plan.vectors,
                plan.reflects,
                CompactedSegment(
                    path,
                    rows.num_rows,
                    size,
                    delete_vector=None if dv_path is None else (dv_path, len(before)),
                ),
                deadline=deadline,
                clock=self.clock,
            )
        except BaseException as exc:
            # As for a seal: files are deleted only if the swap provably did not land.
            if not swapping or isinstance(exc, SegmentChangedError | CommitConflictError):
                for p in (path, dv_path):
                    if p is not None:
                        self.catalog.deep.delete(p)
            raise
        self.indexes.compacted(partition, plan, merged.id, dv_id)
        self.compaction_failures.pop(partition, None)
        self.compaction_errors.pop(partition, None)
        result = CompactionResult(
            self.table,
            partition,
            merged,
            tuple(e.name for e in plan.window),
            len(plan.vectors),
            plan.rows_in,
            rows.num_rows,
            time.monotonic() - started,
        )
        self.compactions.append(result)
        del self.compactions[:-COMPACTIONS_KEPT]
        self.compacted += 1
        log.info(
            "compacted %s partition %d: %d segments (%d rows, %d delete vectors) into %s "
            "(%d rows) in %.2fs: %s",
            self.table,
            partition,
            len(plan.window),
            plan.rows_in,
            len(plan.vectors),
            merged.name,
            rows.num_rows,
            result.seconds,
            plan.reason,
        )
        try:
            faults.hit("after_compact_swap", partition, self)
        except InjectedFault as exc:
            log.warning(
                "after-swap cleanup of the compaction of %s partition %d interrupted: %s",
                self.table,
                partition,
                exc,
            )
        return result

    def _read_of_a_stale_manifest(self, exc: SegmentUnavailableError) -> Exception:
        """What a seal's missing file means: a file the current manifest no longer names (a
        re-ingest or compaction replaced its segment after this seal read the manifest, and GC
        deleted it) is the run or its partition having changed (:class:`SegmentChangedError`:
        rebuilt from the current manifest next time); a file it still names is really missing
        (the error itself, which names the segment to re-ingest)."""
        path = exc.fields.get("path")
        try:
            now = self.catalog.manifest(self.table)
            live = {e.file_path for e in now.entries} | {dv.file_path for dv in now.delete_vectors}
        except Exception:  # cannot tell: the error as it was
            return exc
        if path is None or path in live:
            return exc
        return SegmentChangedError(
            f"segment {exc.fields.get('segment')} of table {self.table!r} changed while it was "
            f"read to seal or compact it (its file {path} was replaced and collected); nothing "
            "was swapped",
            segment=exc.fields.get("segment"),
        )

    def seal_partition(
        self, partition: int, *, force: bool = False, force_up_to: int | None = None
    ) -> SealResult | None:
        """Seal the partition's consuming run if due, or ``force``, or it starts at or below
        segment ``force_up_to`` (a force commit asked for it). Returns None when there is
        nothing to do or another sealer holds the run; raises the failure otherwise (after
        putting the run back)."""
        manifest = self.catalog.manifest(self.table)
        run = self.pending_run(partition, manifest)
        if force_up_to is not None and run and run[0].seq <= force_up_to:
            force = True
        if not run or not (force or self.due(run)):
            return None
        started = time.monotonic()
        # Whether another sealer's claim on any segment of the run still holds is judged by
        # claim_run on the metadata store's clock, not this sealer's (which may be skewed).
        claimed = self.store.claim_run(run, owner=self.claim_owner, ttl=self.claim_ttl)
        if claimed is None:
            return None  # another sealer is building it (its claim has not expired)
        # A seal may run longer than its claim (a large run, a slow deep store): the claim is
        # renewed while it builds, so no other sealer takes the run over from a live one.
        renewer = _ClaimRenewer(self, partition, claimed)
        path: str | None = None
        dv_path: str | None = None
        swapping = False  # from here on, the swap may have landed unless proven otherwise
        index: KeyIndex | None = None
        dropped = np.zeros(0, dtype=np.int64)
        try:
            faults.hit("before_build", partition, self)
            spec = manifest.table.spec
            try:
                rows = read_entries(self.catalog.deep, spec, run)
                index = self.key_index(partition, manifest)
                floor = None if index is None else index.comparison_floor(rows)
            except SegmentUnavailableError as exc:
                raise self._read_of_a_stale_manifest(exc) from exc
            sealed_rows = engine_for(spec).compact(rows, floor=floor)
            # The run's rows go before the sealed file is encoded and the index looked up:
            # a seal of a 2,500,000-row run held them beside its output throughout (issue 39).
            rows_in = rows.num_rows
            del rows, floor
            if index is not None:
                dropped = index.superseded(sealed_rows)
            faults.hit("before_upload", partition, self)
            # The uploaded files are swapped in within one claim's TTL of their upload, or not
            # at all: garbage collection deletes unreferenced files older than its grace period
            # (longer than any claim), and the renewed claim does not bound their age.
            deadline = self.clock.now() + self.claim_ttl
            prefix = table_data_prefix(self.table)
            tag = f"p{partition}-s{run[0].seq}-{uuid.uuid4().hex}"
            path = f"{prefix}/sealed-{tag}.parquet"
            size = self.catalog.deep.write_parquet(
                path,
                sealed_rows,
                row_group_size=ROW_GROUP_ROWS,
                dictionary=dictionary_columns(sealed_rows),
            )
            if index is not None and len(dropped):
                dv_path = f"{prefix}/dv-{tag}.parquet"
                self.catalog.deep.write_parquet(
                    dv_path, pa.table({OFFSET_COL: index.offsets(np.sort(dropped))})
                )
            faults.hit("before_swap", partition, self)
            claimed = renewer.stop()  # the versions of its last renewal
            swapping = True
            sealed_from = None
            if index is not None:
                sealed_from = (index.reflects.entries, index.reflects.delete_vectors)
            sealed, dv_id = self.store.replace_run(
                self.table,
                partition,
                claimed,
                SealedSegment(
                    path,
                    sealed_rows.num_rows,
                    size,
                    reflects=sealed_from,
                    delete_vector=None if dv_path is None else (dv_path, len(dropped)),
                ),
                deadline=deadline,
                sealer_clock=self.clock,
            )
        except BaseException as exc:
            claimed = renewer.stop()
            if not swapping or isinstance(exc, SegmentChangedError | CommitConflictError):
                # The swap never ran, or it refused (precondition) or gave up (lost every
                # compare-and-set): nothing references the uploaded files. Anything else (an
                # unknown outcome a re-read did not resolve, an interrupt during COMMIT) may
                # have landed: the files stay, and only GC, which checks, may delete them.
                for p in (path, dv_path):
                    if p is not None:
                        self.catalog.deep.delete(p)
            if isinstance(exc, SegmentChangedError | CommitStateUnknownError):
                self.indexes.forget(partition)
            self._release(
                partition,
                claimed,
                str(exc).splitlines()[0][:1000] if str(exc) else type(exc).__name__,
            )
            raise
        if index is not None:
            index = self.indexes.sealed(partition, index, dropped, sealed_rows, sealed.id, dv_id)
        seconds = time.monotonic() - started
        with self._counting:  # a pass may seal partitions on several threads
            self.failures.pop(partition, None)
            self.last_error.pop(partition, None)
            self.superseded[partition] = (
                self.superseded.get(partition, 0) + (rows_in - sealed_rows.num_rows) + len(dropped)
            )
            self.seals += 1
            self.durations.append(seconds)
            del self.durations[:-TIMES_KEPT]
        result = SealResult(
            self.table,
            partition,
            sealed,
            tuple(e.name for e in run),
            rows_in,
            sealed_rows.num_rows,
            seconds,
            len(dropped),
        )
        if index is not None:
            # Index maintenance (merging its sorted runs) is off the seal's critical path: the
            # seal is swapped and visible already.
            self.indexes.compact(index)
        self.checkpoint()
        try:
            faults.hit("after_swap", partition, self)
        except InjectedFault as exc:
            # The seal is done; only cleanup (nothing mandatory: GC removes unreferenced files
            # once time travel no longer needs them) was interrupted.
            log.warning(
                "after-swap cleanup of %s partition %d interrupted: %s", self.table, partition, exc
            )
        return result

    # -- metadata steps --------------------------------------------------------------------

    def _release(self, partition: int, claimed: dict[int, int], error: str) -> None:
        """Put a failed run back: CONSUMING with the error, or its first entry ERROR after
        ``max_failures`` consecutive failures (retried with backoff all the same). Entries no
        longer at their claimed version (re-ingested, taken over) are left alone."""
        count = self.failures.get(partition, 0) + 1
        self.failures[partition] = count
        self.last_error[partition] = error
        try:
            self.store.release_run(claimed, error=error, fail_first=count >= self.max_failures)
        except Exception as exc:  # the store may be down: the reason this seal failed
            # The claim expires on its own; another sealer (or this one) takes the run then.
            log.warning(
                "could not release the claim of a failed seal of %s partition %d: %s",
                self.table,
                partition,
                exc,
            )
