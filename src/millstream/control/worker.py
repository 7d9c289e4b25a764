"""A worker: one SparkSession; one streaming query for all its assigned writers (actives and
standbys).

Each :meth:`Worker.tick` reads the stored assignments and datastream states and reconciles:

* assigned and READY -> the writer runs (standbys run the same query; their sink commits only
  when the active's worker stops heartbeating, or always in ``active-active`` mode);
* assigned and PAUSED -> the writer is stopped; its position is the shard upper, so resume
  continues exactly there;
* a table of a multi-table datastream paused on its own (``paused_tables``) -> that table's
  writer is stopped likewise while the datastream's other tables run on;
* not assigned (stop, delete, rebalance) -> the writer is stopped and released.

The writers of all its READY datastreams run in ONE streaming query
(:mod:`millstream.spark.shared`): a micro-batch's fixed cost is paid once per trigger for all
of them instead of once per datastream. A change to its membership (a datastream added,
paused, stopped, or back from its backoff) does not restart it: the datastream joins or leaves
the running query (:meth:`SharedQueryRunner.add`, :meth:`SharedQueryRunner.remove`); only a
change it cannot take (the last member leaving, a member whose trigger is shorter than the
query's) restarts it. A member's error takes that member out (ERROR, or a backoff) and the
others run on.

It then heartbeats its status and the writers it runs. The worker reports RUNNING only when
every writer it hosts, standbys included, holds its state-directory lock.

A stall watchdog (:mod:`millstream.control.watchdog`) runs on its own supervised thread: a
writer running actively whose shard upper has not moved for ``stall_seconds`` while its source
holds records above it is reported in the heartbeat (its ``health``) and restarted with the
backoff of a failed writer. Each writer's ``health`` (running, retrying with the error and
since when, stalled) goes out with every heartbeat; it stays ``retrying`` or ``stalled``
after a restart until the watchdog sees the writer advance (or catch up).

Sealing runs on its own supervised thread (:mod:`millstream.supervise`): each table's pass has
its own supervisor, so an error is logged with the table, counted, and retried with backoff
for that table alone while the other tables keep sealing; the loop's status goes out in the
heartbeat's ``info["loops"]`` and each table's in ``info["sealing"][datastream]["loop"]``
beside the sealer's own status (listed in ``loops`` too by
:func:`~millstream.control.workers.list_workers`). The heartbeat thread writes the liveness
every beat and that whole status only when due (:data:`STATUS_SECONDS`).
"""

from __future__ import annotations

import logging
import socket
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from millstream.catalog import Catalog
from millstream.clock import SYSTEM_CLOCK, Clock
from millstream.control.controller import ControlSettings
from millstream.control.registry import Registry
from millstream.control.topics import Topics, datastream_of, member_key
from millstream.control.watchdog import Stall, StallWatch
from millstream.control.workers import heartbeat
from millstream.core.lifecycle import State
from millstream.datastream import DatastreamSpec, dead_letter_spec
from millstream.errors import (
    BadRecordError,
    CommitStateUnknownError,
    MillstreamError,
    SourceGapError,
    SourceOffsetsRewoundError,
    SourceReadError,
    StateDirLockedError,
    TableNotFoundError,
    from_spark_failure,
)
from millstream.ingest.sources import spec_reader
from millstream.ingest.sources.base import latest_offsets_of
from millstream.metastore.engine import STORE_ERRORS
from millstream.metastore.models import SealingReads
from millstream.sealing.compaction import CompactionPolicy
from millstream.sealing.maintenance import Maintainer
from millstream.sealing.publishing import PublisherProcess
from millstream.sealing.sealer import Sealer
from millstream.sealing.thresholds import Thresholds
from millstream.spark.options import CommitGate
from millstream.spark.runner import CommitLogTotals, DatastreamRunner
from millstream.spark.shared import SharedQueryMemberError, SharedQueryRunner
from millstream.spec import TableSpec
from millstream.storage.statedir import StateDirCleaner, StateDirectory
from millstream.supervise import Backoff, LoopStatus, SupervisedLoop, Supervisor

log = logging.getLogger(__name__)

#: A shared query's member whose state directory someone else holds is tried again this much
#: later (each try restarts the shared query).
LOCK_RETRY_SECONDS = 5.0
LOCK_RETRY_MAX_SECONDS = 60.0

#: The heartbeat thread's beat writes the worker's liveness (its status and heartbeat time, by
#: the row's compare-and-set) every ``tick_seconds``, and its whole status (``info``: the
#: writers, each table's sealing, the loops, the maintenance, the row counters; ~170 KB of
#: JSON at 100 tables) only when its writers or its shared query changed, or when this long
#: has passed since it was last written: at 100 tables, writing and building it twice a second
#: was a quarter of the worker's own process (issue 38). What lags by up to this long: the
#: counters and times of the metrics and ``debugInfo``.
STATUS_SECONDS = 5.0

#: A shared query's member that fails with one of these as the query starts (its source or
#: the metadata store not answering) waits out a backoff instead of going to ERROR.
TRANSIENT = (SourceReadError, CommitStateUnknownError)


#: Source offsets a writer cannot go on from without an operator (records the broker deleted
#: before they were read, offsets that went backwards): the datastream goes to ERROR.
SOURCE_OFFSET_ERRORS = (SourceGapError, SourceOffsetsRewoundError)


def _kind(exc: BaseException) -> type[BaseException]:
    """The class of ``exc``, or of the error of ours a Spark query failed with."""
    if isinstance(exc, MillstreamError):
        return type(exc)
    ours = from_spark_failure(exc)
    return ours.kind if ours is not None else type(exc)


def _hopeless(exc: SharedQueryMemberError) -> bool:
    """A shared query's member error that restarting cannot help: the datastream goes to
    ERROR; any other is retried after a backoff."""
    return (isinstance(exc.error, MillstreamError) and not isinstance(exc.error, TRANSIENT)) or (
        isinstance(exc.error, Exception) and _bad_record(exc.error)
    )


def _bad_record(exc: Exception) -> bool:
    """The writer's query failed on a bad record (``bad_records: fail``) or on source offsets
    it cannot go on from (:data:`SOURCE_OFFSET_ERRORS`): restarting cannot help, the
    datastream goes to ERROR."""
    return issubclass(_kind(exc), (BadRecordError, *SOURCE_OFFSET_ERRORS))


@dataclass
class _Writer:
    #: the datastream, or a multi-table datastream's table as ``<datastream>.<table>``
    #: (:func:`~millstream.control.topics.member_key`): the shared query's member
    datastream: str
    role: str
    state_dir: StateDirectory
    runner: DatastreamRunner | None = None
    thread: threading.Thread | None = None
    error: str | None = None
    failed_at: float | None = None
    failures: int = 0
    locked: bool = False
    done: threading.Event = field(default_factory=threading.Event)
    #: Kept across restarts until the watchdog sees the writer advance: the last error, since
    #: when the writer has been failing, and the stall that restarted it (if one did).
    last_error: str | None = None
    error_since: float | None = None
    stalled: Stall | None = None

    def carried(self) -> dict[str, Any]:
        """What a restarted writer of the same datastream takes over from this one."""
        return {
            "failures": (self.failures + 1) if self.error else 0,
            "last_error": self.last_error,
            "error_since": self.error_since,
            "stalled": self.stalled,
        }

    @property
    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive()


class Worker:
    def __init__(
        self,
        catalog: Catalog,
        spark: Any,
        *,
        worker_id: str | None = None,
        settings: ControlSettings | None = None,
        clock: Clock = SYSTEM_CLOCK,
        state_root: Path | None = None,
        url: str | None = None,
    ) -> None:
        self.catalog = catalog
        self.spark = spark
        self.clock = clock
        self.settings = settings or ControlSettings()
        self.id = worker_id or f"worker-{socket.gethostname()}-{uuid.uuid4().hex[:6]}"
        self.state_root = state_root or catalog.settings.home / "workers" / self.id
        self.registry = Registry(catalog.store, clock=clock)
        self.url = url
        self.writers: dict[str, _Writer] = {}
        #: The one streaming query of every writer (see the module's docstring).
        self.shared: SharedQueryRunner | None = None
        #: The multi-table datastreams' topics and tables (:mod:`millstream.control.topics`),
        #: and the spec each such table's writer runs, by member key.
        self.topics = Topics(clock=clock, stored=self._stored_spec)
        self.member_specs: dict[str, DatastreamSpec] = {}
        #: Tables seen to exist (see :meth:`_made`).
        self._tables_made: set[str] = set()
        self.shared_thread: threading.Thread | None = None
        self._shared_writers: list[_Writer] = []
        #: A datastream whose state directory was held elsewhere: when to try it again, and
        #: the wait before that (doubling, see :meth:`_lock_free`).
        self._lock_retry: dict[str, tuple[float, float]] = {}
        self.sealers: dict[str, Sealer] = {}
        #: Per datastream: rows its writers committed here, from their commit logs (kept
        #: for the worker's life, so the counters it reports never go down).
        self.row_totals: dict[str, CommitLogTotals] = {}
        #: Per (datastream, error class name): writer failures on source offsets
        #: (:data:`SOURCE_OFFSET_ERRORS`) and the last one's message, for the worker's life
        self.source_errors: dict[tuple[str, str], tuple[int, str]] = {}
        #: Per writer: the shared query's restarts after Spark's transient failures while it
        #: was a member, and the last one's error, for the worker's life
        self.transient_restarts: dict[str, tuple[int, str]] = {}
        #: Backoff of a table whose sealing pass failed (other tables keep sealing meanwhile).
        self.seal_backoff = Backoff(base=5.0, cap=300.0)
        #: One supervisor per datastream's table sealing pass, inside the one sealing thread.
        self.seal_supervisors: dict[str, Supervisor] = {}
        #: Expiry and GC of the tables this worker writes actively (on the sealing thread).
        self.maintainer = Maintainer(
            catalog,
            interval=self.settings.maintenance_interval,
            grace_seconds=self.settings.gc_grace_seconds,
            clock=clock,
        )
        self.seal_loop = SupervisedLoop(
            "sealer", self.seal, interval=self.settings.tick_seconds * 2, clock=clock
        )
        #: The Iceberg views of the tables this worker writes actively, published by a child
        #: process driven from a thread of its own (a publish never delays a seal, nor holds
        #: this process's GIL); None when publishing is off.
        interval = self.settings.iceberg_publish_interval
        self.publisher = (
            PublisherProcess(catalog, interval=interval, clock=clock, owner=f"worker {self.id}")
            if interval
            else None
        )
        self.publish_loop = (
            SupervisedLoop(
                "publishing",
                self.publish,
                interval=min(1.0, interval),
                clock=clock,
                on_stop=self.publisher.close if self.publisher is not None else None,
            )
            if interval
            else None
        )
        #: An expiry's publish builds on this publisher's snapshots.
        self.maintainer.shared_publisher = self.publisher
        #: Heartbeats on their own thread: a tick that waits (stopping a writer joins its
        #: thread for up to 60 s) must not make this worker look dead to the standbys of its
        #: other writers, which take over after the takeover TTL (1.5 s by default).
        tick = self.settings.tick_seconds
        self.beat_loop = SupervisedLoop(
            "heartbeat",
            self._pulse,
            interval=tick,
            clock=clock,
            backoff=Backoff(base=tick, cap=max(tick, 2.0)),
        )
        #: One heartbeat at a time (the tick's and the heartbeat thread's): reading the
        #: writers' commit logs for the row counters is incremental.
        self._beat_lock = threading.Lock()
        #: What the last written status held of the writers and the shared query, and when
        #: the whole status is due again (see :data:`STATUS_SECONDS`).
        self._reported: dict[str, Any] | None = None
        self._status_due = 0.0
        self._last_clean = 0.0
        self._stop = threading.Event()
        #: The stall watchdog (see the module's docstring) and the restarts it made, per
        #: datastream (``millstream_writer_stall_restarts_total``).
        self.stall_watch = StallWatch(self.settings.stall_seconds)
        self.stall_restarts: dict[str, int] = {}
        self.watch_loop = SupervisedLoop(
            "watchdog",
            self.watch,
            interval=max(tick, min(30.0, self.settings.stall_seconds / 5)),
            clock=clock,
        )

    # -- reconcile -------------------------------------------------------------------------

    def tick(self) -> None:
        mine = {
            ds: role
            for ds, placement in self.catalog.store.read_assignments().items()
            for w, role in placement
            if w == self.id
        }
        states = {r.name: r for r in self.registry.list()}
        self._reconcile_shared(mine, states)
        self._clean_state_dirs()
        if not self.beat_loop.alive:  # else it beats at the same interval: once is enough
            self._heartbeat()

    # -- one shared query for every writer ---------------------------------------------------

    def _reconcile_shared(self, mine: dict[str, str], states: dict[str, Any]) -> None:
        """Change the shared query's members when the datastreams it should run differ from
        those it runs (READY and assigned here, less those waiting out a failure's backoff):
        they join or leave the running query; the query is restarted only when that cannot
        be done (see :meth:`_change_members`) or when none runs."""
        ready = self._tables_of(
            {
                ds: role
                for ds, role in mine.items()
                if (rec := states.get(ds)) is not None and rec.state is State.READY
            },
            states,
        )
        for ds, role in ready.items():
            if ds in self.writers:
                self.writers[ds].role = role
        running = self.shared_thread is not None and self.shared_thread.is_alive()
        members = set(self.shared.members) if self.shared is not None and running else set()
        wanted = {
            ds
            for ds in ready
            if self._may_restart(self.writers.get(ds))
            and (ds in members or self._lock_free(ds, ready[ds]))
        }
        gone = set(self.writers) - set(ready)
        if members == wanted and not gone and (running or not wanted):
            return
        if running and wanted and self._change_members(members, wanted, gone, ready):
            return
        self._stop_shared()
        for ds in gone:
            w = self.writers.pop(ds)
            self._count_last_commits(ds, w)
            if w.locked:
                w.state_dir.unlock()
        if wanted:
            self._start_shared({ds: ready[ds] for ds in sorted(wanted)})

    def _tables_of(self, ready: dict[str, str], states: dict[str, Any]) -> dict[str, str]:
        """The shared query's members for the READY datastreams ``ready``: a datastream, or
        each table of a multi-table one (``<datastream>.<table>``, its own writer: its own
        commits, epochs, dead-letter table, failures and backoff) that is not paused on its
        own (``paused_tables``: its writer leaves the query, its uppers stay as they are)."""
        out: dict[str, str] = {}
        for ds, role in ready.items():
            spec: DatastreamSpec = states[ds].spec
            if not spec.multi_table:
                out[ds] = role
                continue
            paused = set(states[ds].paused_tables)
            for table, member in self.topics.tables(ds, spec).members.items():
                if table in paused:
                    continue
                key = member_key(ds, table)
                self.member_specs[key] = member
                out[key] = role
        for ds in set(self.topics.found) - set(ready):
            self.topics.forget(ds)
        return out

    def _stored_spec(self, table: str) -> TableSpec | None:
        """A table's spec as stored (None: no such table yet)."""
        try:
            return self.catalog.table(table).spec
        except TableNotFoundError:
            return None

    def _lock_free(self, ds: str, role: str) -> bool:
        """Whether a datastream not in the shared query may join it now: its state directory
        is not held by someone else. Tried here, before it joins the query (or the query is
        restarted for it), and again only after a backoff: a restart for a try that fails
        would cost every member its freshness for nothing. Meanwhile it is listed unlocked, so the worker reports STARTING
        (KAFKA-8187)."""
        now = self.clock.now()
        w = self.writers.get(ds)
        if w is not None and w.locked:
            return True  # ours (a member in its backoff keeps its lock)
        retry_at, wait = self._lock_retry.get(ds, (0.0, 0.0))
        if now < retry_at:
            return False
        probe = StateDirectory(self.state_root, ds)
        try:
            probe.lock()
        except StateDirLockedError as exc:
            wait = min(LOCK_RETRY_MAX_SECONDS, max(LOCK_RETRY_SECONDS, 2 * wait))
            self._lock_retry[ds] = (now + wait, wait)
            log.info("writer %s waits for its state directory (again in %.0f s): %s", ds, wait, exc)
            if w is None:
                self.writers[ds] = _Writer(ds, role, probe)
            return False
        probe.unlock()
        self._lock_retry.pop(ds, None)
        return True

    def _change_members(
        self, members: set[str], wanted: set[str], gone: set[str], ready: dict[str, str]
    ) -> bool:
        """Change the running shared query's members without restarting it: those no longer
        wanted leave it, new ones join it at their shard uppers. False when a change needs a
        restart (the last member leaves, a commit holds the membership too long, a member's
        trigger is shorter than the query's); the caller then restarts the query."""
        shared, thread = self.shared, self.shared_thread
        assert shared is not None and thread is not None
        for ds in sorted(members - wanted):
            if not shared.remove(ds):
                return False
            w = self.writers[ds]
            w.thread = None
            w.done.set()
            if w.locked and w.error is None:  # a member in its backoff keeps its lock
                w.state_dir.unlock()
                w.locked = False
        for ds in gone:
            w = self.writers.pop(ds)
            self._count_last_commits(ds, w)  # out of the query: it commits no more
            if w.locked:
                w.state_dir.unlock()
        # Every new member joins in ONE membership change (the tables of a datastream, the
        # topics a pattern's listing found): their entries are made together.
        made = [self._new_member(ds, ready[ds]) for ds in sorted(wanted - members)]
        fresh = [w for w in made if w is not None]
        runners = [w.runner for w in fresh if w.runner is not None]
        joined = shared.add_many(runners) if runners else {}
        restart = False
        for new in fresh:
            ds = new.datastream
            outcome = joined.get(ds, False)
            if outcome is True:
                new.thread = thread
                self._shared_writers.append(new)
                continue
            new.state_dir.unlock()
            new.locked = False
            if isinstance(outcome, SharedQueryMemberError):
                self._count_source_error(ds, outcome.error, str(outcome))
                self._member_failed(ds, str(outcome), fail=_hopeless(outcome))
            else:
                restart = True
        return not restart

    def _new_member(self, ds: str, role: str) -> _Writer | None:
        """A fresh writer of ``ds`` holding its state directory, for the shared query (None,
        listed unlocked and retried later, if someone took the directory meanwhile)."""
        spec = self.member_specs[ds] if ds in self.member_specs else self.registry.get(ds).spec
        previous = self.writers.get(ds)
        if previous is not None and previous.locked:
            previous.state_dir.unlock()  # kept through its backoff; the new writer locks
        # a fresh writer per start (its backoff carried on)
        w = self.writers[ds] = _Writer(
            ds,
            role,
            StateDirectory(self.state_root, ds),
            **(previous.carried() if previous is not None else {}),
        )
        try:
            w.state_dir.lock()
        except StateDirLockedError as exc:
            # taken between the check and now: listed unlocked (STARTING), tried later
            log.info("writer %s waits for its state directory: %s", ds, exc)
            self._lock_retry[ds] = (self.clock.now() + LOCK_RETRY_SECONDS, LOCK_RETRY_SECONDS)
            return None
        w.locked = True
        w.runner = self._runner(spec, w.state_dir, member=ds)
        return w

    def _start_shared(self, wanted: dict[str, str]) -> None:
        runners: list[DatastreamRunner] = []
        members: list[_Writer] = []
        for ds, role in wanted.items():
            w = self._new_member(ds, role)
            if w is None:
                continue
            assert w.runner is not None
            runners.append(w.runner)
            members.append(w)
        if not runners:
            return
        shared = SharedQueryRunner(
            runners,
            self.spark,
            StateDirectory(self.state_root, "_shared-query"),
            on_transient=self._count_transient,
        )

        def _run() -> None:
            try:
                shared.run()
            except SharedQueryMemberError as exc:
                # A source or store that did not answer (at a restart for another member's
                # sake, say) is retried after a backoff; what restarting cannot help goes to
                # ERROR.
                self._count_source_error(exc.member, exc.error, str(exc))
                self._member_failed(exc.member, str(exc), fail=_hopeless(exc))
            except Exception as exc:  # the query's own: every member waits out a backoff
                for ds in list(shared.members):
                    self._member_failed(ds, str(exc) or repr(exc), fail=False)
            finally:
                for w in members:  # those that joined the running query too
                    w.done.set()

        thread = threading.Thread(target=_run, name="writer-shared-query", daemon=True)
        for w in members:
            w.thread = thread
        self.shared, self.shared_thread = shared, thread
        #: the query's writers, those that join it later included (see ``_run``)
        self._shared_writers = members
        thread.start()

    def _member_failed(self, ds: str, error: str, *, fail: bool) -> None:
        """Record a member's failure (its backoff starts now); with ``fail`` (restarting
        cannot help) the datastream goes to ERROR. A table of a multi-table datastream never
        takes its datastream (the other tables) down: it waits out its own backoff, retried
        alone, and its health says why."""
        w = self.writers.get(ds)
        error = error.splitlines()[0][:2000]
        log.error("writer %s on %s failed: %s", ds, self.id, error)
        if w is not None:
            self._failed(w, error)
        if fail and ds not in self.member_specs:
            self.registry.fail(ds, error)

    def _count_transient(self, members: Sequence[str], error: str) -> None:
        """The shared query restarted ``members`` after Spark's transient failure ``error``
        (:meth:`SharedQueryRunner.run`: none of them failed): counted per writer for the
        worker's life (its health, ``millstream_writer_transient_restarts``)."""
        for ds in members:
            n, _ = self.transient_restarts.get(ds, (0, ""))
            self.transient_restarts[ds] = (n + 1, error.splitlines()[0][:2000] if error else "")

    def _count_source_error(self, ds: str, exc: BaseException, message: str) -> None:
        """Count a writer failure on source offsets (:data:`SOURCE_OFFSET_ERRORS`) and keep
        its message: ``millstream_source_offset_errors`` and the table's ``debugInfo``."""
        kind = _kind(exc)
        if issubclass(kind, SOURCE_OFFSET_ERRORS):
            n, _ = self.source_errors.get((ds, kind.__name__), (0, ""))
            self.source_errors[(ds, kind.__name__)] = (n + 1, message.splitlines()[0][:2000])

    def _stop_shared(self) -> None:
        """Stop the shared query (if any) and release its members' state directories; a
        member waiting out a failure's backoff keeps its lock, so the worker still reports
        RUNNING meanwhile."""
        if self.shared is not None:
            self.shared.stop()
        if self.shared_thread is not None:
            self.shared_thread.join(timeout=60)
        self.shared = self.shared_thread = None
        for w in self.writers.values():
            if w.locked and w.error is None:
                w.state_dir.unlock()
                w.locked = False

    def _clean_state_dirs(self) -> None:
        """Delete this worker's state directories that no writer holds and that were idle
        longer than ``state_cleanup_delay`` (the cleaner takes each lock itself first)."""
        now = self.clock.now()
        if now - self._last_clean < min(60.0, self.settings.state_cleanup_delay):
            return
        self._last_clean = now
        removed = StateDirCleaner(
            self.state_root, delay=self.settings.state_cleanup_delay, clock=self.clock
        ).clean()
        if removed:
            log.info("worker %s removed idle state directories %s", self.id, removed)

    def _runner(
        self, spec: DatastreamSpec, state_dir: StateDirectory, *, member: str | None = None
    ) -> DatastreamRunner:
        """This worker's writer of ``spec`` (a standby's commits wait for its commit gate),
        ``member`` of the shared query (default: the datastream's name)."""
        gate = CommitGate(
            spec.name, self.id, spec.table_spec().name, takeover_ttl=self.settings.takeover_ttl
        )
        return DatastreamRunner(
            spec,
            self.catalog,
            self.spark,
            writer_id=self.id,
            state_dir=state_dir,
            commit_gate=gate if spec.replica_mode == "standby" else None,
            member=member,
        )

    def _failed(self, w: _Writer, error: str) -> None:
        """``w`` failed with ``error`` now: its backoff starts, its health says retrying."""
        now = self.clock.now()
        w.error, w.failed_at, w.last_error = error, now, error
        if w.error_since is None:
            w.error_since = now

    @staticmethod
    def _backoff(w: _Writer) -> float:
        return min(300.0, 5.0 * float(2 ** min(w.failures, 6)))

    def _may_restart(self, w: _Writer | None) -> bool:
        """A writer that failed (a broker briefly down, say) is restarted after a backoff that
        doubles per failure, capped at 5 minutes. Errors that put the datastream in ERROR (a bad
        record with ``bad_records: fail``) stop it through the lifecycle instead."""
        if w is None or w.error is None or w.failed_at is None:
            return True
        return self.clock.now() - w.failed_at >= self._backoff(w)

    # -- the stall watchdog ------------------------------------------------------------------

    def watch(self) -> None:
        """One pass of the stall watchdog over the writers running here (its own supervised
        thread): each running writer's shard uppers against its source's latest offsets. A
        stalled active writer is restarted with the backoff of a failed one (logged with the
        datastream, worker and partitions, counted); a writer seen advancing or caught up is
        healthy again. Standbys commit nothing: their source answering is their health."""
        running = {
            ds: w
            for ds, w in list(self.writers.items())
            if w.running and w.runner is not None and w.error is None and self._made(w)
        }
        for ds in self.stall_watch.watching() - set(running):
            self.stall_watch.forget(ds)
        if not running:
            return
        answers = latest_offsets_of(
            {ds: spec_reader(w.runner.spec.source) for ds, w in running.items() if w.runner}
        )
        now = self.clock.now()
        for ds, w in running.items():
            latest = answers[ds]
            if isinstance(latest, Exception) or w.runner is None:
                continue  # the writer meets the same source: its own error says why
            if w.role != "active":
                w.last_error = w.error_since = None
                w.stalled = None
                continue
            table = w.runner.spec.table_name
            uppers = {sh.partition: sh.upper for sh in self.catalog.store.list_shards(table)}
            verdict = self.stall_watch.observe(ds, uppers, latest, now)
            if verdict.healthy:
                if w.last_error is not None or w.stalled is not None:
                    log.info("writer %s on %s advances again", ds, self.id)
                w.last_error = w.error_since = None
                w.stalled = None
            elif verdict.stall is not None:
                self._restart_stalled(w, verdict.stall)

    def _restart_stalled(self, w: _Writer, stall: Stall) -> None:
        """Take a stalled writer down as if it had failed: the tick restarts it after the
        backoff (a shared query's member leaves the running query, and joins it again after
        the backoff)."""
        ds = w.datastream
        message = stall.describe(self.clock.now())
        self.stall_restarts[ds] = self.stall_restarts.get(ds, 0) + 1
        log.error(
            "watchdog: writer %s on worker %s is %s; restarting it (stall restart %d)",
            ds,
            self.id,
            message,
            self.stall_restarts[ds],
        )
        w.stalled = stall
        self.stall_watch.forget(ds)
        self._failed(w, message)

    def health(self, w: _Writer) -> dict[str, Any]:
        """A writer's health as the REST record, CLI and console show it: ``running``,
        ``retrying`` (failed; restarted after a backoff and not yet seen advancing),
        ``stalled`` (its upper stopped while its source holds newer records) or ``starting``
        (waiting for its state directory), with the error and since when."""
        if w.stalled is not None:
            status = "stalled"
        elif w.last_error is not None:
            status = "retrying"
        elif w.running:
            status = "running"
        else:
            status = "starting"
        retry_at = w.failed_at + self._backoff(w) if w.error is not None and w.failed_at else None
        shared = self.shared
        counted = shared.restarts.get(w.datastream) if shared is not None else None
        return {
            "status": status,
            "error": w.last_error,
            "since": w.error_since,
            "failures": w.failures + (1 if w.error else 0),
            "retry_at": retry_at,
            "stalled": w.stalled.to_dict() if w.stalled is not None else None,
            "stall_restarts": self.stall_restarts.get(w.datastream, 0),
            # restarts of its (shared) query after Spark's transient failures: not failures of
            # this writer, which kept running through them
            "transient_restarts": self.transient_restarts.get(w.datastream, (0, ""))[0],
            "transient_error": self.transient_restarts.get(w.datastream, (0, None))[1] or None,
            # restarts of its shared query after its fenced, gapped or expired commits: in all
            # (the query's life) and in a row without a commit (it fails past MAX_RESTARTS; 0
            # once it committed past where it started after the last one)
            "restarts": counted.total if counted is not None else 0,
            "restarts_in_a_row": (
                counted.shown(w.runner.committed_uppers if w.runner is not None else dict)
                if counted is not None
                else 0
            ),
        }

    def _stop_writer(self, ds: str) -> None:
        w = self.writers.pop(ds)
        if w.runner is not None:
            w.runner.stop()
        if w.thread is not None:
            w.thread.join(timeout=60)
        self._count_last_commits(ds, w)
        if w.locked:
            w.state_dir.unlock()

    def _count_last_commits(self, ds: str, w: _Writer) -> None:
        """Add the commits ``w`` made since its commit log was last read to the worker's row
        counters, once it has left (stopped, or out of the shared query): the log is read
        only with the whole status (every :data:`STATUS_SECONDS`), and the batches of a
        writer's last seconds here were never counted (``millstream_rows_consumed_total``,
        the dead-letter count and ``millstream_source_records_lost_total`` under-counted)."""
        if w.runner is None:
            return
        with self._beat_lock:  # the heartbeat thread reads the same totals
            self._read_commit_log(ds, w.runner)

    def _read_commit_log(self, ds: str, runner: DatastreamRunner) -> CommitLogTotals:
        """``ds``'s running totals with the lines its writer's commit log gained since the
        last read added (the caller holds the beat lock)."""
        totals = self.row_totals.get(ds)
        if totals is None:
            totals = self.row_totals[ds] = CommitLogTotals()
        totals.update(runner.stats_file)
        totals.table = runner.spec.table_name
        return totals

    def _heartbeat(self) -> None:
        """Heartbeat with the whole status (at the start, from the tick when the heartbeat
        thread is not running)."""
        with self._beat_lock:
            self._beat(whole=True)

    def _pulse(self) -> None:
        """The heartbeat thread's beat: the liveness always, the whole status when it is due
        (see :data:`STATUS_SECONDS`)."""
        with self._beat_lock:
            self._beat(whole=False)

    def _beat(self, *, whole: bool) -> None:
        # the tick thread adds and removes writers: work on a copy (list() of a dict's values
        # is one step under the GIL)
        hosted = list(self.writers.values())
        writers = [
            {
                "datastream": datastream_of(w.datastream),
                "table": w.runner.spec.table_name if w.runner is not None else None,
                "member": w.datastream,
                "role": w.role,
                "running": w.running,
                "locked": w.state_dir.held,
                "error": w.error,
                "health": self.health(w),
            }
            for w in hosted
        ]
        all_locked = all(w.state_dir.held for w in hosted)
        shared = self.shared
        # What the controller acts on (a writer running or gone: a STOPPING datastream's
        # completion) and the datastreams' health: written at the next beat once it changes
        reported = {
            "writers": writers,
            "shared_query": shared.status() if shared is not None else None,
        }
        now = self.clock.now()
        info: dict[str, Any] | None = None
        # due, or the wall clock stepped back past the last write (an NTP step must not hold
        # the status back for as long as the step)
        due = now >= self._status_due or now < self._status_due - STATUS_SECONDS
        if whole or reported != self._reported or due:
            info = self._status(reported)
        heartbeat(
            self.catalog.store,
            self.id,
            status="RUNNING" if all_locked else "STARTING",
            info=info,
            clock=self.clock,
            url=self.url,
        )
        if info is not None:  # written: the next is due STATUS_SECONDS later
            self._reported = reported
            self._status_due = now + STATUS_SECONDS

    def _status(self, reported: dict[str, Any]) -> dict[str, Any]:
        """The worker's whole status (its ``info``) around ``reported`` (its writers and shared
        query). Each table's sealer loop is stored once, under ``sealing[datastream]["loop"]``,
        not again in ``loops``: :func:`millstream.control.workers.list_workers` puts it back in
        ``loops`` for the readers."""
        rows = self.row_counters()  # reads each commit log's new lines
        lost_races = sum(t.lost_races for t in self.row_totals.values())
        return {
            "writers": reported["writers"],
            "commit_conflicts": self.catalog.store.conflicts,
            "sealing": self.sealing_status(),
            "maintenance": self.maintainer.status(),
            "view_gc": self.maintainer.view_gc_status(),
            "loops": [s.to_dict() for s in self.loop_statuses(tables=False)],
            "lost_races": lost_races,
            "rows": rows,
            "source_offsets": self.source_offsets(),
            "shared_query": reported["shared_query"],
        }

    def row_counters(self) -> list[dict[str, Any]]:
        """Per datastream, table and partition: rows this worker's writers consumed and
        dead-lettered (committed, from their commit logs) and row versions its sealers
        resolved away (duplicates, older or out-of-order versions). Counters for the life of
        this worker process (``millstream_rows_*_total{worker=...}``)."""
        out: list[dict[str, Any]] = []
        for ds in sorted(set(self.writers) | set(self.row_totals) | set(self.sealers)):
            w = self.writers.get(ds)
            totals = self.row_totals.get(ds)
            if w is not None and w.runner is not None:
                totals = self._read_commit_log(ds, w.runner)
                table = w.runner.spec.table_name
            elif ds in self.sealers:
                table = self.sealers[ds].table
            elif totals is not None and totals.table is not None:
                table = totals.table
            else:
                continue
            if totals is not None:
                totals.table = table
            counts = dict(totals.partitions) if totals is not None else {}
            sealer = self.sealers.get(ds)
            superseded = dict(sealer.superseded) if sealer is not None else {}
            for p in sorted(set(counts) | set(superseded)):
                c = counts.get(p, {})
                out.append(
                    {
                        "datastream": datastream_of(ds),
                        "table": table,
                        "partition": p,
                        "consumed": c.get("consumed", 0),
                        "dead_lettered": c.get("dead_lettered", 0),
                        "lost": c.get("lost", 0),
                        "superseded": superseded.get(p, 0),
                    }
                )
        return out

    def source_offsets(self) -> list[dict[str, Any]]:
        """Per datastream with source offsets lost or refused: the writer failures on source
        offsets (``errors``: {error class: {count, last_error}}) and the offsets an
        ``on_data_loss: accept`` source skipped (``lost_ranges`` ``[partition, first, end]``,
        the newest)."""
        out: dict[str, dict[str, Any]] = {}
        for (ds, kind), (n, message) in sorted(self.source_errors.items()):
            entry = out.setdefault(
                ds, {"datastream": datastream_of(ds), "errors": {}, "lost_ranges": []}
            )
            entry["errors"][kind] = {"count": n, "last_error": message}
        for ds, totals in sorted(self.row_totals.items()):
            if totals.lost_ranges:
                entry = out.setdefault(
                    ds, {"datastream": datastream_of(ds), "errors": {}, "lost_ranges": []}
                )
                entry["lost_ranges"] = list(totals.lost_ranges)
        for ds, entry in out.items():
            w = self.writers.get(ds)
            log_totals = self.row_totals.get(ds)
            entry["table"] = (
                w.runner.spec.table_name
                if w is not None and w.runner is not None
                else (log_totals.table if log_totals is not None else None)
            )
        return list(out.values())

    def seal(self) -> None:
        """Seal what is due for every datastream this worker runs actively. Runs on its own
        thread: consumption never waits for a seal (pauseless). Each table's pass is
        supervised on its own: a failure backs off that table only. What each table's pass
        reads before it decides anything (its force commits, its manifest's changes since its
        last read) is read for all the due tables at once, in one transaction; if that read
        fails, each pass reads its own as before."""
        due: list[tuple[str, DatastreamSpec, Supervisor]] = []
        for ds, w in list(self.writers.items()):
            if w.role != "active" or not w.running or w.runner is None or not self._made(w):
                continue
            spec = w.runner.spec
            supervisor = self.seal_supervisors.get(ds)
            if supervisor is None:
                supervisor = Supervisor(
                    "sealer", table=spec.table_name, clock=self.clock, backoff=self.seal_backoff
                )
                self.seal_supervisors[ds] = supervisor
            if supervisor.due():
                due.append((ds, spec, supervisor))
        reads = self._sealing_reads([(ds, spec.table_name) for ds, spec, _ in due])
        for ds, spec, supervisor in due:
            supervisor.attempt(self._seal_table, ds, spec, reads.get(spec.table_name))
        self.maintainer.run_due(self.active_tables())

    def _sealing_reads(self, tables: list[tuple[str, str]]) -> dict[str, SealingReads]:
        """The sealing passes' first reads of the tables ``tables`` ((datastream, table)), in
        one store transaction (:meth:`MetadataStore.sealing_reads`), or none if it fails."""
        if not tables:
            return {}
        afters = {}
        for ds, table in tables:
            sealer = self.sealers.get(ds)
            afters[table] = sealer.remembered_version if sealer is not None else None
        try:
            return self.catalog.store.sealing_reads(afters)
        except Exception as exc:  # each pass reads its own (and reports its own failure)
            log.warning("worker %s: cannot read its tables' sealing changes: %s", self.id, exc)
            return {}

    def active_tables(self) -> dict[str, list[str]]:
        """Per datastream this worker runs actively: its table and its dead-letter table."""
        return {
            ds: [w.runner.spec.table_name, dead_letter_spec(w.runner.spec.table_name).name]
            for ds, w in list(self.writers.items())
            if w.role == "active" and w.running and w.runner is not None and self._made(w)
        }

    def _made(self, w: _Writer) -> bool:
        """Whether ``w``'s table exists: a table of a multi-table datastream (a
        ``topic_pattern``'s) is made by its writer as the shared query takes it in, so until
        then there is nothing to seal, publish or watch (asked of the store until it exists,
        then remembered). A datastream's one table is the leader's to make: its absence is an
        error the sealing pass reports."""
        assert w.runner is not None
        table = w.runner.spec.table_name
        if w.datastream not in self.member_specs or table in self._tables_made:
            return True
        if self._stored_spec(table) is None:
            return False
        self._tables_made.add(table)
        return True

    def publish(self) -> None:
        """Publish the Iceberg views of the tables this worker writes actively, each when due
        (its own thread: see :class:`~millstream.sealing.maintenance.Publisher`)."""
        if self.publisher is not None:
            self.publisher.run_due(self.active_tables())

    def _seal_table(self, ds: str, spec: DatastreamSpec, read: SealingReads | None = None) -> None:
        sealer = self.sealers.get(ds)
        if sealer is None:
            seg = spec.segments
            sealer = Sealer(
                self.catalog,
                spec.table_name,
                thresholds=Thresholds.of(seg),
                compaction=CompactionPolicy.of(seg),
                clock=self.clock,
            )
            self.sealers[ds] = sealer
        sealer.seal_due(read)

    def sealing_status(self) -> dict[str, dict[str, Any]]:
        """Per datastream: its sealer's status (per-partition failures, last seal) and, under
        ``loop``, the supervision of its table's sealing passes."""
        alive = self.seal_loop.alive
        out: dict[str, dict[str, Any]] = {}
        for ds, supervisor in sorted(self.seal_supervisors.items()):
            sealer = self.sealers.get(ds)  # None if its first pass failed before creating it
            out[ds] = {
                **(sealer.status() if sealer is not None else {}),
                "loop": supervisor.status(alive=alive).to_dict(),
            }
        return out

    def loop_statuses(self, *, tables: bool = True) -> list[LoopStatus]:
        """Every background loop's status: the heartbeat's, the watchdog's, the sealing
        thread's and (unless ``tables`` is false: the heartbeat stores them under ``sealing``)
        each table's sealing pass's, the maintenance's, the publishing's and the topic
        discovery's."""
        alive = self.seal_loop.alive
        return [
            self.beat_loop.status(),
            self.watch_loop.status(),
            self.seal_loop.status(),
            *(
                (s.status(alive=alive) for _, s in sorted(self.seal_supervisors.items()))
                if tables
                else ()
            ),
            *self.maintainer.loop_statuses(alive=alive),
            *self._publish_statuses(),
            *self.topics.loop_statuses(alive=self.beat_loop.alive),
        ]

    def _publish_statuses(self) -> list[LoopStatus]:
        if self.publisher is None or self.publish_loop is None:
            return []
        alive = self.publish_loop.alive
        return [self.publish_loop.status(), *self.publisher.loop_statuses(alive=alive)]

    # -- loop ------------------------------------------------------------------------------

    def run_forever(self) -> None:
        self._heartbeat()
        self.beat_loop.start()
        self.seal_loop.start()
        if self.publish_loop is not None:
            self.publish_loop.start()
        self.watch_loop.start()
        while not self._stop.is_set():
            try:
                self.tick()
            except (MillstreamError, *STORE_ERRORS) as exc:
                # A tick is idempotent: one the metadata store failed (a dropped connection, a
                # store briefly unreachable) runs again next time instead of ending the process.
                log.warning("worker %s tick failed: %s", self.id, exc)
            self._stop.wait(self.settings.tick_seconds)
        self.watch_loop.stop()
        if self.publish_loop is not None:
            self.publish_loop.stop()
        self.seal_loop.stop()  # lets a seal in progress finish first
        self.beat_loop.stop()  # before the last heartbeat, which says STOPPED
        self._stop_shared()
        for ds in list(self.writers):
            self._stop_writer(ds)
        for sealer in self.sealers.values():
            sealer.checkpoint(force=True)  # the next owner loads the key index, not rebuilds it
        heartbeat(
            self.catalog.store, self.id, status="STOPPED", info={"writers": []}, clock=self.clock
        )

    def stop(self) -> None:
        self._stop.set()
