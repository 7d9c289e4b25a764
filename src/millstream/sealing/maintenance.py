"""Automatic table maintenance: expiry (retention) and garbage collection.

The worker that runs a datastream actively (or a standalone ``millstream run``) maintains its
table and dead-letter table on its background (sealing) thread, every ``interval`` seconds with +-20% jitter, so many tables do not
all run at the same moment. One table's maintenance is supervised on its own: an error is
logged with the table, counted (``millstream_background_errors{loop="maintainer"}``), visible in
``debugInfo`` and retried with backoff; it never stops sealing or another table's maintenance.
Two workers maintaining one table at once (active-active) are safe: expiry is a compare-and-set
on the table row, and GC deletes only what nothing references.

With ``publish_interval`` set, the same thread also publishes each table's Iceberg view
(:func:`millstream.table.iceberg.publish`) every that many seconds, supervised the same way
(``loop="publisher"``); two publishers of one table are safe (the pointer moves by
compare-and-set).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from millstream.catalog import Catalog
from millstream.clock import SYSTEM_CLOCK, Clock
from millstream.supervise import Backoff, LoopStatus, Supervisor
from millstream.table.gc import DEFAULT_GRACE_SECONDS
from millstream.table.maintain import Maintenance, maintain

log = logging.getLogger(__name__)

#: Seconds between two maintenance runs of a table (before jitter).
DEFAULT_MAINTENANCE_INTERVAL = 600.0


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
        #: Seconds between two publishes of a table's Iceberg view (None: not published here).
        self.publish_interval = publish_interval
        self.publishers: dict[str, Supervisor] = {}
        self._next_publish: dict[str, float] = {}
        #: Per table: the manifest version its view shows, and when this worker last published.
        self.published: dict[str, dict[str, Any]] = {}
        self.grace_seconds = grace_seconds
        self.clock = clock
        self._rng = rng or random.Random()
        self.backoff = backoff or Backoff(base=min(30.0, interval), cap=interval)
        self.supervisors: dict[str, Supervisor] = {}
        self.tables: dict[str, TableMaintenance] = {}
        self._next: dict[str, float] = {}

    def _jittered(self) -> float:
        return self.interval * (0.8 + 0.4 * self._rng.random())

    def run_due(self, tables: Mapping[str, Sequence[str]]) -> None:
        """``tables``: datastream -> its tables. Maintain each datastream's tables whose turn
        has come (the first turn is one jittered interval after the datastream shows up)."""
        now = self.clock.now()
        if self.publish_interval is not None:
            self._publish_due(tables, now, self.publish_interval)
        for ds, names in tables.items():
            if ds not in self._next:
                self._next[ds] = now + self._jittered()
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

    def _publish_due(
        self, tables: Mapping[str, Sequence[str]], now: float, interval: float
    ) -> None:
        for ds, names in tables.items():
            if now < self._next_publish.get(ds, 0.0):
                continue
            supervisor = self.publishers.get(ds)
            if supervisor is None:
                supervisor = Supervisor(
                    "publisher", table=names[0], clock=self.clock, backoff=self.backoff
                )
                self.publishers[ds] = supervisor
            if not supervisor.due():
                continue
            if supervisor.attempt(self.publish, names):
                self._next_publish[ds] = self.clock.now() + interval

    def publish(self, names: Sequence[str]) -> None:
        """Publish each table's current version as an Iceberg snapshot (if it is new)."""
        # lazy: pyiceberg loads only in a process that publishes Iceberg views
        from millstream.table.iceberg import publish

        for name in names:
            result = publish(self.catalog.store, self.catalog.deep, name)
            if result.pointer is not None:
                self.published[name] = {
                    "manifest_version": result.pointer.manifest_version,
                    "published_at": result.pointer.published_at,
                    "metadata_location": result.pointer.metadata_location,
                }

    def maintain(self, names: Sequence[str]) -> None:
        for name in names:
            report = maintain(
                self.catalog.store,
                self.catalog.deep,
                name,
                grace_seconds=self.grace_seconds,
                clock=self.clock,
            )
            self.tables.setdefault(name, TableMaintenance()).add(report, self.clock.now())
            if report.files_removed or report.expiry.versions:
                log.info("maintenance: %s", report.describe())

    def status(self) -> dict[str, dict[str, Any]]:
        out = {name: t.to_dict() for name, t in sorted(self.tables.items())}
        for name, view in sorted(self.published.items()):
            out.setdefault(name, TableMaintenance().to_dict())["iceberg"] = view
        return out

    def loop_statuses(self, *, alive: bool) -> list[LoopStatus]:
        return [s.status(alive=alive) for _, s in sorted(self.supervisors.items())] + [
            s.status(alive=alive) for _, s in sorted(self.publishers.items())
        ]
