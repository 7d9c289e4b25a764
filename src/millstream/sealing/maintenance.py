"""Automatic table maintenance: expiry (retention) and garbage collection.

The worker that runs a datastream actively (or a standalone ``millstream run``) maintains its
table and dead-letter table on its background (sealing) thread, every ``interval`` seconds with +-20% jitter, so many tables do not
all run at the same moment. One table's maintenance is supervised on its own: an error is
logged with the table, counted (``millstream_background_errors{loop="maintainer"}``), visible in
``debugInfo`` and retried with backoff; it never stops sealing or another table's maintenance.
Two workers maintaining one table at once (active-active) are safe: expiry is a compare-and-set
on the table row, and GC deletes only what nothing references.
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
    ) -> None:
        self.catalog = catalog
        self.interval = interval
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
        return {name: t.to_dict() for name, t in sorted(self.tables.items())}

    def loop_statuses(self, *, alive: bool) -> list[LoopStatus]:
        return [s.status(alive=alive) for _, s in sorted(self.supervisors.items())]
