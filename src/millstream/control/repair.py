"""Automatic repair (Pinot's ``controller.segment.error.autoReset``), run by the leader.

Every ``repair_interval`` seconds the leading controller scans the table of each datastream
(each table of one that writes a table per topic: a ``topics`` list's, and the tables a
``topic_pattern`` made whose topics the broker lists; not a dead-letter table: its rows are not
re-read from the source) for segments
re-ingestion can fix (:func:`millstream.sealing.repair.find_broken`: a missing data file, or an
unreadable one in a partition whose seal keeps failing) and starts a durable re-ingest job for
each (``trigger: auto``, visible in ``GET /reingestJobs``), at most ``repair_max_running`` at
a time. The per-segment backoff lives in the jobs themselves (``next_attempt_at``), so a new
leader goes on where the old one left off; a segment whose source range is gone is marked
unrecoverable and tried again only after ``repair_unrecoverable_retry``. A job left RUNNING by
a controller that died is taken over once its lease ran out; one whose segment needs no repair
any more is closed as ABANDONED.

Why the leader and not a worker's maintenance thread: the leader is one process for the whole
cluster, so repairs are not duplicated and a table is repaired even when no worker hosts its
datastream (a worker whose writer crash-loops, a paused datastream); it has every datastream's
spec (the source to re-read); and its jobs are in the same store the API lists. The unique
``active_key`` of a job makes a second controller's start fail all the same (two leaders for a
moment, or an operator's POST racing the scan).

Each table's scan is supervised (:class:`millstream.supervise.Supervisor`, ``loop="repairer"``):
an error is logged with the table, counted, shown in ``/tables/{t}/debugInfo`` and retried
after a capped exponential backoff; it never ends the controller's tick. So is the listing of a
``topic_pattern`` datastream's topics (which topic each of its tables re-reads, ``loop=
"repair-topics"``, per datastream): a broker that does not answer backs the listing off, and
the tables of the last listing are scanned meanwhile.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from millstream.catalog import Catalog
from millstream.clock import Clock
from millstream.control.registry import Registry
from millstream.control.topics import Lister, broker_topics, current_tables
from millstream.core.lifecycle import State
from millstream.datastream import DatastreamSpec, KafkaSource
from millstream.errors import AlreadyExistsError, TableNotFoundError
from millstream.metastore.jobs import (
    ABANDONED,
    newest_per_segment,
)
from millstream.sealing.repair import ReingestRunner, find_broken
from millstream.spec import TableSpec
from millstream.supervise import Backoff, Supervisor

log = logging.getLogger(__name__)

#: Datastreams whose table may not exist (yet, or any more).
_NO_TABLE = frozenset({State.INITIALIZING, State.DELETING})


@dataclass(frozen=True)
class RepairSettings:
    enabled: bool = True
    interval: float = 30.0
    max_running: int = 2


class AutoRepair:
    """The leader's repair scan; :meth:`maybe_scan` runs on every tick of the leader."""

    def __init__(
        self,
        catalog: Catalog,
        registry: Registry,
        runner: ReingestRunner,
        settings: RepairSettings,
        clock: Clock,
        lister: Lister = broker_topics,
    ) -> None:
        self.catalog = catalog
        self.registry = registry
        self.runner = runner
        self.settings = settings
        self.clock = clock
        self.lister = lister
        self.supervisors: dict[str, Supervisor] = {}
        #: Per topic_pattern datastream: the supervision of its topics' listing, and the
        #: tables (with their single-topic specs) the last listing that answered found.
        self.listings: dict[str, Supervisor] = {}
        self.found: dict[str, dict[str, DatastreamSpec]] = {}
        #: Per table, what the last scan found (``debugInfo``'s ``repair.last_scan``).
        self.last_scan: dict[str, dict[str, Any]] = {}
        self._last_scan_at: float | None = None

    def maybe_scan(self) -> None:
        """Scan if enabled and ``interval`` has passed since the last scan."""
        now = self.clock.now()
        if not self.settings.enabled:
            return
        if self._last_scan_at is not None and now - self._last_scan_at < self.settings.interval:
            return
        self._last_scan_at = now
        self.scan()

    def scan(self) -> None:
        records = self.registry.list()
        for rec in records:
            if rec.state in _NO_TABLE:
                continue
            for table, spec in self._tables(rec.name, rec.spec).items():
                self._scan(table, spec)
        for gone in set(self.found) - {r.name for r in records if r.state not in _NO_TABLE}:
            self.found.pop(gone, None)
            self.listings.pop(gone, None)

    def _tables(self, name: str, spec: DatastreamSpec) -> dict[str, DatastreamSpec]:
        """The tables of datastream ``name`` to scan, each with the single-topic spec that
        re-reads it: its one table, or a ``topics`` list's; for a ``topic_pattern`` (or tables
        made from the registry's writer schemas) those it made so far whose topics the broker
        lists now (the listing supervised per datastream; while it fails, the last one's)."""
        source = spec.source
        if not spec.multi_table or (
            isinstance(source, KafkaSource)
            and source.topics is not None
            and not spec.schema_from_registry
        ):
            return spec.declared_tables()
        sup = self.listings.get(name)
        if sup is None:
            sup = self.listings[name] = Supervisor(
                "repair-topics",
                table=name,
                clock=self.clock,
                backoff=Backoff(base=min(max(1.0, self.settings.interval), 3600.0), cap=3600.0),
            )
        if sup.due():
            sup.attempt(self._list, name, spec)
        return self.found.get(name, {})

    def _list(self, name: str, spec: DatastreamSpec) -> None:
        self.found[name] = current_tables(spec, stored=self._stored, lister=self.lister)

    def _stored(self, table: str) -> TableSpec | None:
        try:
            return self.catalog.table(table).spec
        except TableNotFoundError:
            return None

    def _scan(self, table: str, spec: DatastreamSpec) -> None:
        sup = self.supervisors.get(table)
        if sup is None:
            sup = Supervisor(
                "repairer",
                table=table,
                clock=self.clock,
                # Failed scans of a table back off from the scan interval (at least 1 s).
                backoff=Backoff(base=min(max(1.0, self.settings.interval), 3600.0), cap=3600.0),
            )
            self.supervisors[table] = sup
        if sup.due():
            sup.attempt(self.scan_table, spec)

    def scan_table(self, spec: DatastreamSpec) -> None:
        """Start a re-ingestion of every broken segment of ``spec``'s (single-topic) table."""
        table = spec.table_name
        manifest = self.catalog.manifest(table)
        broken = find_broken(self.catalog.deep, manifest)
        now = self.clock.now()
        names = {b.entry.name for b in broken}
        # A job its controller stopped renewing, for a segment that needs nothing now, is
        # closed; one whose segment is still broken is taken over by the start below.
        for old in newest_per_segment(self.catalog.store.reingest_jobs(table)).values():
            if old.status(now) == ABANDONED and old.segment not in names:
                self.catalog.store.finish_reingest(
                    old,
                    now=now,
                    status=ABANDONED,
                    error=f"{old.payload.get('owner')} stopped renewing the job's lease",
                )
        started, waiting = [], []
        for b in broken:
            if self.runner.running() >= self.settings.max_running:
                waiting.append(b.entry.name)
                continue
            try:
                job = self.runner.start(
                    self.catalog, spec, b.entry.name, trigger="auto", respect_backoff=True
                )
            except AlreadyExistsError:
                continue  # running elsewhere (an operator's job, another controller)
            if job is None:
                waiting.append(b.entry.name)
            else:
                started.append(b.entry.name)
                log.info(
                    "auto repair of %s: segment %s is %s (%s), job %s",
                    table,
                    b.entry.name,
                    b.reason,
                    b.detail,
                    job.id,
                )
        self.last_scan[table] = {
            "at": now,
            "broken": [
                {"segment": b.entry.name, "reason": b.reason, "detail": b.detail} for b in broken
            ],
            "started": started,
            "waiting": waiting,
        }

    def status(self, table: str) -> dict[str, Any]:
        sup = self.supervisors.get(table)
        # a topic_pattern's table: the listing of its datastream's topics too
        listing = next(
            (self.listings.get(ds) for ds, found in list(self.found.items()) if table in found),
            None,
        )
        return {
            "enabled": self.settings.enabled,
            "controller": self.runner.owner,
            "loop": None if sup is None else sup.status(alive=True).to_dict(),
            "last_scan": self.last_scan.get(table),
            **({"topics_loop": listing.status(alive=True).to_dict()} if listing else {}),
        }
