"""Automatic table maintenance: expiry (retention) and garbage collection.

The worker that runs a datastream actively (or a standalone ``millstream run``) maintains its
table and dead-letter table on its background (sealing) thread, every ``interval`` seconds with +-20% jitter, so many tables do not
all run at the same moment. One table's maintenance is supervised on its own: an error is
logged with the table, counted (``millstream_background_errors{loop="maintainer"}``), visible in
``debugInfo`` and retried with backoff; it never stops sealing or another table's maintenance.
Two workers maintaining one table at once (active-active) are safe: expiry is a compare-and-set
on the table row, and GC deletes only what nothing references.

:class:`Publisher` publishes each table's Iceberg view (:func:`millstream.table.iceberg.publish`)
every ``interval`` seconds, incrementally (one :class:`~millstream.table.iceberg.PublishCache`
per publisher), supervised the same way (``loop="publisher"``): a worker (and ``millstream
run``) runs it in a process of its own (:mod:`millstream.sealing.publishing`), so neither a
slow publish nor a failing one delays sealing or ingestion, nor holds the writer's GIL. A
:class:`Maintainer` given ``publish_interval`` runs one on the maintenance thread instead. Two
publishers of one table are safe (the pointer moves by compare-and-set).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from millstream.catalog import Catalog
from millstream.clock import SYSTEM_CLOCK, Clock
from millstream.core.memory import release_freed_memory
from millstream.supervise import Backoff, LoopStatus, Supervisor
from millstream.table.gc import DEFAULT_GRACE_SECONDS
from millstream.table.maintain import Maintenance, maintain

if TYPE_CHECKING:
    from millstream.sealing.publishing import PublisherProcess

log = logging.getLogger(__name__)

#: Seconds between two maintenance runs of a table (before jitter).
DEFAULT_MAINTENANCE_INTERVAL = 600.0
#: Seconds between two publishes of a table's Iceberg view at the defaults: the newest
#: snapshot then lags the newest committed version by about this plus one publish.
DEFAULT_PUBLISH_INTERVAL = 15.0


@dataclass
class TableMaintenance:
    """What a worker's maintenance of one table removed so far, and its last run."""

    runs: int = 0
    versions_expired: int = 0
    files_removed: int = 0
    bytes_removed: int = 0
    last_run_at: float | None = None
    last: dict[str, Any] = field(default_factory=dict)

    def add(self, report: Maintenance, now: float) -> None:
        self.runs += 1
        self.versions_expired += report.expiry.versions
        self.files_removed += len(report.files_removed)
        self.bytes_removed += report.bytes_removed
        self.last_run_at = now
        self.last = report.to_dict()

    def to_dict(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "versions_expired": self.versions_expired,
            "files_removed": self.files_removed,
            "bytes_removed": self.bytes_removed,
            "last_run_at": self.last_run_at,
            "last": self.last,
        }


def load_view_collection() -> None:
    """Import what a maintenance pass's Iceberg view collection runs
    (:func:`millstream.table.maintain.maintain` imports it lazily: pyiceberg and its models,
    fastavro; some 120 modules, ~10-15 MB of a worker's RSS). Called when a datastream whose
    tables have views first shows up, so a long-lived process pays that once at its start
    rather than as a step in its RSS at its first pass, one maintenance interval (600 s) into
    its life. Imported once (Python's module cache)."""
    # lazy: pyiceberg loads only in a process whose tables have Iceberg views
    import millstream.table.iceberg  # noqa: F401


class Maintainer:
    """Runs :func:`millstream.table.maintain.maintain` for the tables it is handed when due."""

    def __init__(
        self,
        catalog: Catalog,
        *,
        interval: float = DEFAULT_MAINTENANCE_INTERVAL,
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
        clock: Clock = SYSTEM_CLOCK,
        rng: random.Random | None = None,
        backoff: Backoff | None = None,
        publish_interval: float | None = None,
    ) -> None:
        self.catalog = catalog
        self.interval = interval
        self.grace_seconds = grace_seconds
        self.clock = clock
        self._rng = rng or random.Random()
        self.backoff = backoff or Backoff(base=min(30.0, interval), cap=interval)
        #: Publishes the tables' Iceberg views on this thread (None: not published here).
        self.publisher = (
            Publisher(catalog, interval=publish_interval, clock=clock, backoff=self.backoff)
            if publish_interval is not None
            else None
        )
        #: The publisher another thread runs: the Iceberg publish that follows an expiry uses
        #: its cache (see :func:`millstream.table.maintain.maintain`); a publisher in a
        #: process of its own (:class:`~millstream.sealing.publishing.PublisherProcess`)
        #: drops the expired snapshots at its next turn instead, and maintenance does not
        #: publish (a publish here would compete with the writer for this process's GIL).
        self.shared_publisher: Publisher | PublisherProcess | None = None
        self.supervisors: dict[str, Supervisor] = {}
        self.tables: dict[str, TableMaintenance] = {}
        self._next: dict[str, float] = {}
        #: The last whole pass's Iceberg view collections (summed over its tables) and the
        #: process's view references after it (see :meth:`view_gc_status`).
        self.view_gc_last_pass: dict[str, Any] | None = None
        self.view_gc_references: dict[str, Any] | None = None

    def _jittered(self) -> float:
        return self.interval * (0.8 + 0.4 * self._rng.random())

    def run_due(self, tables: Mapping[str, Sequence[str]]) -> None:
        """``tables``: datastream -> its tables. Maintain each datastream's tables whose turn
        has come (the first turn is one jittered interval after the datastream shows up)."""
        now = self.clock.now()
        if self.publisher is not None:
            self.publisher.run_due(tables)
        for ds, names in tables.items():
            if ds not in self._next:
                self._next[ds] = now + self._jittered()
                if self.publisher is not None or self.shared_publisher is not None:
                    load_view_collection()  # its tables have Iceberg views
                continue
            if now < self._next[ds]:
                continue
            supervisor = self.supervisors.get(ds)
            if supervisor is None:  # created at the first run: a status only once there is one
                supervisor = Supervisor(
                    "maintainer", table=names[0], clock=self.clock, backoff=self.backoff
                )
                self.supervisors[ds] = supervisor
            if not supervisor.due():
                continue
            if supervisor.attempt(self.maintain, names):
                self._next[ds] = self.clock.now() + self._jittered()

    def maintain(self, names: Sequence[str]) -> None:
        publisher = self.publisher or self.shared_publisher
        elsewhere = publisher is not None and not isinstance(publisher, Publisher)
        view_gc: dict[str, Any] = {
            "tables": 0,
            "cpu_seconds": 0.0,
            "files_removed": 0,
            "hits": 0,
            "misses": 0,
            "read": {},
        }
        for name in names:
            report = maintain(
                self.catalog.store,
                self.catalog.deep,
                name,
                grace_seconds=self.grace_seconds,
                clock=self.clock,
                publish_cache=None if publisher is None else publisher.cache,
                publish_view=not elsewhere,
            )
            self.tables.setdefault(name, TableMaintenance()).add(report, self.clock.now())
            if report.files_removed or report.expiry.versions:
                log.info("maintenance: %s", report.describe())
            if report.view_gc is not None:
                view_gc["tables"] += 1
                for k in ("cpu_seconds", "files_removed", "hits", "misses"):
                    view_gc[k] += report.view_gc[k]
                for k, n in report.view_gc["read"].items():
                    view_gc["read"][k] = view_gc["read"].get(k, 0) + n
                self.view_gc_references = report.view_gc["references"]
        if view_gc["tables"]:
            view_gc["cpu_seconds"] = round(view_gc["cpu_seconds"], 6)
            self.view_gc_last_pass = {**view_gc, "at": self.clock.now()}

    def view_gc_status(self) -> dict[str, Any] | None:
        """The Iceberg views' garbage collection in this process (None before the first):
        the last pass's figures over its tables with a view (CPU seconds, files removed, the
        files found kept in the references and read) and the references' status (entries,
        references held and their bound, hits, misses, evictions, files read by kind)."""
        if self.view_gc_last_pass is None:
            return None
        return {"last_pass": self.view_gc_last_pass, "references": self.view_gc_references}

    def status(self) -> dict[str, dict[str, Any]]:
        """Per table: its maintenance and, under ``iceberg``, its view as published in this
        process (by this thread's publisher or the one another thread runs)."""
        out = {name: t.to_dict() for name, t in sorted(self.tables.items())}
        publisher = self.publisher or self.shared_publisher
        if publisher is not None:
            for name, view in publisher.status().items():
                out.setdefault(name, TableMaintenance().to_dict())["iceberg"] = view
        return out

    def loop_statuses(self, *, alive: bool) -> list[LoopStatus]:
        mine = [s.status(alive=alive) for _, s in sorted(self.supervisors.items())]
        if self.publisher is not None:
            mine += self.publisher.loop_statuses(alive=alive)
        return mine


class Publisher:
    """Publishes the Iceberg view of the tables it is handed (:meth:`run_due`), each
    datastream's tables every ``interval`` seconds, under one supervisor per datastream: an
    error is logged with the table, counted (``millstream_background_errors{loop="publisher"}``),
    shown in ``debugInfo`` and retried with backoff; it never stops another table's publishing.
    Its :class:`~millstream.table.iceberg.PublishCache` makes every publish after a table's
    first incremental."""

    def __init__(
        self,
        catalog: Catalog,
        *,
        interval: float = DEFAULT_PUBLISH_INTERVAL,
        clock: Clock = SYSTEM_CLOCK,
        backoff: Backoff | None = None,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"publish interval must be positive, got {interval}")
        self.catalog = catalog
        self.interval = interval
        self.clock = clock
        self.backoff = backoff or Backoff(base=min(5.0, interval), cap=max(60.0, interval))
        self.supervisors: dict[str, Supervisor] = {}
        self._next: dict[str, float] = {}
        #: Per table: the manifest version its view shows, when it was published, what the
        #: last publish reused, the publishes this publisher made and the data files whose
        #: columns they read.
        self.published: dict[str, dict[str, Any]] = {}
        self._cache: Any = None  # a PublishCache, created at the first publish

    @property
    def cache(self) -> Any:
        if self._cache is None:
            # lazy: pyiceberg loads only in a process that publishes Iceberg views
            from millstream.table.iceberg import PublishCache

            self._cache = PublishCache()
        return self._cache

    def run_due(self, tables: Mapping[str, Sequence[str]]) -> None:
        """``tables``: datastream -> its tables. Publish those whose turn has come; after a
        round that published, give back what it freed (:func:`release_freed_memory`)."""
        now = self.clock.now()
        ran = False
        for ds, names in tables.items():
            if now < self._next.get(ds, 0.0):
                continue
            supervisor = self.supervisors.get(ds)
            if supervisor is None:
                supervisor = Supervisor(
                    "publisher", table=names[0], clock=self.clock, backoff=self.backoff
                )
                self.supervisors[ds] = supervisor
            if not supervisor.due():
                continue
            ran = True
            if supervisor.attempt(self.publish, names):
                self._next[ds] = self.clock.now() + self.interval
        if ran:
            # A round allocates and frees many small objects (pyiceberg's metadata copies and
            # Avro writers, NumPy arrays, Arrow buffers) on several threads, and glibc keeps the
            # freed pages of each thread's arena: a long-lived publisher over 20 busy tables (in
            # process, ``bench/publisher_growth.py --memory``) grew 213 -> 249 MB from round 10
            # to 80 while its Python heap grew 5.6 MB and Arrow's allocations 0.7 MB; given back
            # after every round, it ran 8-13 MB lower (207 against 215 MB after 60 rounds), at
            # the same CPU a round (0.64 against 0.67 s).
            release_freed_memory()

    def publish(self, names: Sequence[str]) -> None:
        """Publish each table's current version as an Iceberg snapshot (if it is new)."""
        # lazy: pyiceberg loads only in a process that publishes Iceberg views
        from millstream.table.iceberg import publish

        for name in names:
            started = time.monotonic()  # a duration: not the clock (a child's stands still)
            result = publish(self.catalog.store, self.catalog.deep, name, cache=self.cache)
            if result.pointer is None:
                continue
            before = self.published.get(name, {})
            self.published[name] = {
                "manifest_version": result.pointer.manifest_version,
                "published_at": result.pointer.published_at,
                "metadata_location": result.pointer.metadata_location,
                "publishes": int(before.get("publishes", 0)) + int(result.published),
                # data files whose merge columns its publishes read from the deep store (the
                # publish cache's misses): after the first incremental publish, the new ones
                "files_read": int(before.get("files_read", 0))
                + int(result.stats.get("files_read", 0) if result.published else 0),
                "last_publish_seconds": round(time.monotonic() - started, 3)
                if result.published
                else before.get("last_publish_seconds"),
                "last": result.stats if result.published else before.get("last", {}),
            }
            if result.published:
                log.debug(
                    "iceberg view of %s: version %d %s",
                    name,
                    result.pointer.manifest_version,
                    result.stats,
                )

    def status(self) -> dict[str, dict[str, Any]]:
        return {name: dict(view) for name, view in sorted(self.published.items())}

    def loop_statuses(self, *, alive: bool) -> list[LoopStatus]:
        return [s.status(alive=alive) for _, s in sorted(self.supervisors.items())]
