"""Live rows per table (``millstream_table_rows``): the rows a reader of the current table
sees, after its engine merged the versions of each key and applied deletes.

* An ``append`` table (dead-letter tables included) keeps every row: its live rows are its
  entries' row counts, from the manifest, without reading anything. (A batch trimmed at the
  upper, which happens only when a lagging writer's batch straddles it, counts the rows its
  writer staged: an upper bound.)
* A keyed table (``upsert``, ``dedup``, ``partial``) needs a merge: no figure of the manifest
  is exact (a seal keeps each key's latest delete as a row; unsealed segments hold any number
  of versions of a key). Its rows are counted by reading it, once per manifest version and at
  most once per ``min_interval`` seconds (a table gets a version per micro-batch; reading all
  of a large table every second would cost the controller more than the figure is worth): a
  scrape starts the count of a version it has not seen in a background thread and waits for it
  at most ``wait`` seconds; until it is done the last version counted is reported (or nothing,
  before the first count), and one table is never counted twice at once. A count that fails (a
  file gone with an expired version) is not retried for that version.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from millstream.api.status import rows_per_table
from millstream.catalog import Catalog
from millstream.clock import SYSTEM_CLOCK, Clock
from millstream.table.read import read_manifest

log = logging.getLogger(__name__)

#: Seconds a scrape waits for the count of a keyed table's new version.
DEFAULT_WAIT = 2.0
#: Seconds between two counts of one table (a newer version waits until then).
DEFAULT_MIN_INTERVAL = 30.0


@dataclass
class _Count:
    version: int | None = None  # the version ``rows`` is of
    rows: int | None = None
    pending: int | None = None  # the version being counted now
    done: threading.Event | None = None
    failed: int | None = None  # the last version whose count failed
    started_at: float | None = None  # when the last count started


class LiveRows:
    """Live rows of every table, for the metrics; one per app."""

    def __init__(
        self,
        catalog: Catalog,
        *,
        wait: float = DEFAULT_WAIT,
        min_interval: float = DEFAULT_MIN_INTERVAL,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.catalog = catalog
        self.wait = wait
        self.min_interval = min_interval
        self.clock = clock
        self.reads = 0  # counts started (tests look)
        self._lock = threading.Lock()
        self._counts: dict[str, _Count] = {}

    def rows(self) -> dict[str, int]:
        store = self.catalog.store
        current = {t.name: (t.manifest_version, t.spec) for t in store.list_tables()}
        stored = rows_per_table(store)
        out: dict[str, int] = {}
        waits: list[tuple[str, threading.Event]] = []
        for name, (version, spec) in sorted(current.items()):
            if not spec.keyed:
                out[name] = stored.get(name, 0)
                continue
            done = self._start(name, version)
            if done is not None:
                waits.append((name, done))
        for _, done in waits:
            done.wait(self.wait)  # bounded: the counts run on while the scrape goes on
        with self._lock:
            for name in current:
                c = self._counts.get(name)
                if c is not None and c.rows is not None and current[name][1].keyed:
                    out[name] = c.rows
            for gone in set(self._counts) - set(current):
                del self._counts[gone]
        return dict(sorted(out.items()))

    def _start(self, name: str, version: int) -> threading.Event | None:
        """The event of the count of ``version`` of ``name``, started unless it is counted,
        being counted or failed already, or the table was counted less than ``min_interval``
        ago (None: nothing to wait for)."""
        now = self.clock.now()
        with self._lock:
            c = self._counts.setdefault(name, _Count())
            if version in (c.version, c.failed):
                return None
            if c.pending is not None:
                return c.done  # one count at a time; the newest version is counted next
            if c.started_at is not None and now - c.started_at < self.min_interval:
                return None  # the last count stands until the interval passed
            c.pending, c.done, c.started_at = version, threading.Event(), now
            done = c.done
            self.reads += 1
        threading.Thread(
            target=self._count, args=(name, c, done), name=f"live-rows-{name}", daemon=True
        ).start()
        return done

    def _count(self, name: str, c: _Count, done: threading.Event) -> None:
        rows: int | None = None
        version: int | None = None
        try:
            manifest = self.catalog.manifest(name)
            version = manifest.version
            rows = read_manifest(
                self.catalog.deep, manifest, cache=self.catalog.read_cache
            ).num_rows
        except Exception as exc:  # reported as a missing update, never a failed scrape
            log.warning("cannot count the live rows of table %s: %s", name, exc)
        with self._lock:
            if rows is not None and version is not None:
                c.version, c.rows = version, rows
            else:
                c.failed = c.pending if version is None else version
            c.pending = None
        done.set()
