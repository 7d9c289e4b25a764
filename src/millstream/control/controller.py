"""The controller: leader election, the leader's event queue, assignment, completions.

Any number of controllers may run; the one holding the ``controller`` lease is the leader.
Each :meth:`Controller.tick` renews (or tries to take) the lease, processes pending events in
order, recomputes the sticky assignment over live workers (written fenced by the lease token),
and applies asynchronous completions conditionally:

* INITIALIZING -> READY once the table exists;
* STOPPING -> STOPPED once no live worker runs a writer of the datastream;
* DELETING -> gone likewise.

The leader also repairs segments whose data file is lost (:mod:`millstream.control.repair`).

A completion reads the authoritative record in its own transaction and applies only if the
state is still the one it expects, so a late stop completion never overrides a resume
(Brooklin #974). The sweep over all STOPPING datastreams is therefore harmless.
"""

from __future__ import annotations

import logging
import socket
import threading
import uuid
from dataclasses import dataclass

from millstream.catalog import Catalog
from millstream.clock import SYSTEM_CLOCK, Clock
from millstream.control import events
from millstream.control.leases import Lease, acquire_or_renew, release
from millstream.control.registry import Registry
from millstream.control.repair import AutoRepair, RepairSettings
from millstream.control.watchdog import DEFAULT_STALL_SECONDS, check_stall_seconds
from millstream.control.workers import (
    CONTROLLER_LEASE,
    list_workers,
    write_assignments,
)
from millstream.core.assignment import assign
from millstream.core.lifecycle import ASSIGNED_STATES, State
from millstream.datastream import dead_letter_spec
from millstream.errors import LeaseLostError, MillstreamError
from millstream.metastore.engine import STORE_ERRORS
from millstream.sealing.maintenance import DEFAULT_PUBLISH_INTERVAL
from millstream.sealing.repair import ReingestRunner
from millstream.table.gc import DEFAULT_GRACE_SECONDS, check_gc_grace

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ControlSettings:
    lease_ttl: float = 6.0
    worker_ttl: float = 6.0
    #: A warm standby may commit once its active's worker has not heartbeaten for this long
    #: (workers heartbeat every ``tick_seconds``). Much shorter than ``worker_ttl``: a takeover
    #: that was not needed (a pause of the active longer than this) is two writers racing
    #: through compare-and-append for a moment, never a lost or duplicated record; moving
    #: writers to other workers (``worker_ttl``) is the expensive decision and waits longer.
    takeover_ttl: float = 1.5
    tick_seconds: float = 0.5
    #: A worker deletes state directories nobody holds that were idle longer than this.
    state_cleanup_delay: float = 600.0
    #: Seconds between two maintenance runs (expiry + GC) of a table, +-20% jitter.
    maintenance_interval: float = 600.0
    #: Seconds between two publishes of a written table's Iceberg view (and its dead-letter
    #: table's) by the worker that writes it, on a thread of its own; None (or 0): not
    #: published automatically. Each publish after a worker's first of a table is incremental
    #: (see docs/design.md "Open tables").
    iceberg_publish_interval: float | None = DEFAULT_PUBLISH_INTERVAL
    #: GC deletes unreferenced files only once they are older than this (a writer's staged
    #: files are unreferenced until its commit, which refuses files older than half of it).
    gc_grace_seconds: float = DEFAULT_GRACE_SECONDS
    #: The leader re-ingests segments whose data file is missing or unreadable
    #: (``controller.segment.error.autoReset`` in Pinot), scanning every ``repair_interval``.
    auto_repair: bool = True
    repair_interval: float = 30.0
    #: A failed repair of a segment is retried after base * 2**(attempts-1) seconds, capped.
    repair_backoff_base: float = 60.0
    repair_backoff_max: float = 3600.0
    #: A segment whose source range is gone is tried again only this rarely.
    repair_unrecoverable_retry: float = 86400.0
    repair_max_running: int = 2
    #: A re-ingest job's lease: its controller renews it every third; a job not renewed for
    #: this long reads as ABANDONED and may be taken over.
    reingest_job_lease: float = 60.0
    #: The stall watchdog: a datastream whose shard upper has not moved for this long while
    #: its source holds records above it is reported (``millstream_datastream_stalled``, its
    #: health ``stalled``) and its writer restarted with backoff. Between
    #: ``MIN_STALL_SECONDS`` and ``MAX_STALL_SECONDS`` (10 s .. 1 day).
    stall_seconds: float = DEFAULT_STALL_SECONDS

    def __post_init__(self) -> None:
        check_stall_seconds(self.stall_seconds)
        # The workers' maintenance collects the view of every table that has one, whoever
        # publishes it: the publish limit applies whatever this interval is.
        check_gc_grace(self.gc_grace_seconds)


class Controller:
    def __init__(
        self,
        catalog: Catalog,
        *,
        controller_id: str | None = None,
        settings: ControlSettings | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.catalog = catalog
        self.store = catalog.store
        self.clock = clock
        self.settings = settings or ControlSettings()
        self.id = controller_id or f"controller-{socket.gethostname()}-{uuid.uuid4().hex[:6]}"
        self.registry = Registry(self.store, clock=clock)
        self.lease: Lease | None = None
        self._stop = threading.Event()
        st = self.settings
        #: Runs this process's re-ingest jobs (the API's and the repairs').
        self.reingest = ReingestRunner(
            self.store,
            owner=self.id,
            clock=clock,
            lease=st.reingest_job_lease,
            backoff_base=st.repair_backoff_base,
            backoff_max=st.repair_backoff_max,
            unrecoverable_retry=st.repair_unrecoverable_retry,
        )
        self.repair = AutoRepair(
            catalog,
            self.registry,
            self.reingest,
            RepairSettings(st.auto_repair, st.repair_interval, st.repair_max_running),
            clock,
        )

    @property
    def is_leader(self) -> bool:
        return self.lease is not None and self.lease.held_by(self.id, self.clock.now())

    def tick(self) -> bool:
        """One round of leadership work. Returns whether this controller is the leader."""
        self.lease = acquire_or_renew(
            self.store, CONTROLLER_LEASE, self.id, self.settings.lease_ttl, self.clock
        )
        if self.lease is None:
            return False
        try:
            for ev in events.pending(self.store):
                self._handle(ev)
                events.mark_processed(self.store, ev.id, self.clock.now())
            self.reconcile(self.lease)
            self.repair.maybe_scan()  # supervised per table: never raises a table's error
        except LeaseLostError as exc:
            log.warning("controller %s stepped down: %s", self.id, exc)
            self.lease = None
            return False
        return True

    def _handle(self, ev: events.Event) -> None:
        if ev.kind != events.CREATE or ev.datastream is None:
            return  # stop/delete/assign are handled by reconcile(), idempotently
        rec = self.registry.find(ev.datastream)
        if rec is None or rec.state is not State.INITIALIZING:
            return
        try:
            # a topic_pattern's tables are created as the worker finds their topics
            for member in rec.spec.declared_tables().values():
                table = member.table_spec()
                self.catalog.create_table(table)
                self.catalog.create_table(dead_letter_spec(table))
        except MillstreamError as exc:
            self.registry.fail(rec.name, f"cannot create table: {exc.message}")
            return
        self.registry.complete(rec.name, expected=State.INITIALIZING, to=State.READY)

    def reconcile(self, lease: Lease) -> None:
        now = self.clock.now()
        workers = [w for w in list_workers(self.store) if w.alive(now, self.settings.worker_ttl)]
        records = self.registry.list()
        replicas = {r.name: r.spec.replicas for r in records if r.state in ASSIGNED_STATES}
        target = assign(replicas, [w.id for w in workers], self.store.read_assignments())
        if write_assignments(
            self.store, target, holder=self.id, token=lease.token, clock=self.clock
        ):
            log.info("controller %s (token %d) assigned %s", self.id, lease.token, target)
        running = {
            w_["datastream"]
            for w in workers
            for w_ in w.info.get("writers", [])
            if w_.get("running")
        }
        for r in records:
            if r.name in running:
                continue
            if r.state is State.STOPPING:
                self.registry.complete(r.name, expected=State.STOPPING, to=State.STOPPED)
            elif r.state is State.DELETING:
                self.registry.remove(r.name)

    def run_forever(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except (MillstreamError, *STORE_ERRORS) as exc:
                # A tick is idempotent: one the metadata store failed (a dropped connection, a
                # store briefly unreachable) runs again next time instead of ending the process.
                log.warning("controller %s tick failed: %s", self.id, exc)
            self._stop.wait(self.settings.tick_seconds)
        if self.lease is not None:
            release(self.store, CONTROLLER_LEASE, self.id, self.clock)

    def stop(self) -> None:
        self._stop.set()
