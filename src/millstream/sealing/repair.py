"""Durable re-ingest jobs and what automatic repair may fix.

:class:`ReingestRunner` runs re-ingest jobs (:func:`millstream.sealing.reingest.reingest_segment`)
on threads of this process, each recorded in the metadata store
(:mod:`millstream.metastore.jobs`): it starts or takes the job over, renews its lease while the
segment is re-read, and records the outcome by compare-and-set. A failure plans the next attempt
with capped exponential backoff (``next_attempt_at``); a segment whose source range is gone
(:class:`~millstream.errors.SourceRangeGoneError`) is marked unrecoverable with the reason and
retried only after ``unrecoverable_retry`` (an operator may have restored the source).

:func:`find_broken` says which segments re-ingestion can fix: a live segment whose data file is
missing from the deep store, and, for a partition whose seal keeps failing (a segment in
ERROR), a segment of its unsealed run whose file cannot be read. Every other seal failure (the
store or the deep store unreachable, an injected fault, a lost race) is not the file's fault,
and re-reading the source would not help: the sealer retries those.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import dataclass

import pyarrow as pa

from millstream.catalog import Catalog
from millstream.clock import SYSTEM_CLOCK, Clock
from millstream.datastream import DatastreamSpec
from millstream.errors import NotFoundError, SourceRangeGoneError
from millstream.metastore.jobs import (
    FAILED,
    SUCCEEDED,
    ReingestJob,
)
from millstream.metastore.models import Entry, Manifest, SegmentState
from millstream.metastore.store import MetadataStore
from millstream.sealing.reingest import find_segment, reingest_segment
from millstream.spec import OFFSET_COL
from millstream.storage.deepstore import DeepStore, table_data_prefix
from millstream.supervise import describe_error

log = logging.getLogger(__name__)

#: ``millstream_auto_repairs`` outcomes.
OUTCOMES = ("started", "succeeded", "failed", "unrecoverable", "lost")


@dataclass(frozen=True)
class Broken:
    """A live segment re-ingestion can fix: its file is ``missing`` or ``unreadable``."""

    entry: Entry
    reason: str
    detail: str


def find_broken(deep: DeepStore, manifest: Manifest) -> list[Broken]:
    """The live segments of ``manifest`` whose data file is missing, and those of a partition
    with a segment in ERROR whose file cannot be read. The deep store is listed after the
    manifest was read (a file committed in between is in neither, never a false "missing"),
    and a file the listing lacks is looked up once more before it counts as missing."""
    entries = [e for e in manifest.entries if e.file_path is not None]
    listed = {f.path for f in deep.list_files(table_data_prefix(manifest.table.name))}
    out: list[Broken] = []
    missing: set[int] = set()
    for e in entries:
        assert e.file_path is not None
        if e.file_path not in listed and not deep.exists(e.file_path):
            missing.add(e.id)
            out.append(Broken(e, "missing", f"data file {e.file_path} is not in the deep store"))
    failing = {e.partition for e in entries if e.state is SegmentState.ERROR}
    for e in entries:
        if e.partition not in failing or e.state is SegmentState.ONLINE or e.id in missing:
            continue
        assert e.file_path is not None
        try:
            deep.read_parquet(e.file_path, columns=[OFFSET_COL])
        except (OSError, pa.ArrowInvalid) as exc:
            detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            out.append(Broken(e, "unreadable", f"data file {e.file_path}: {detail}"))
    return sorted(out, key=lambda b: (b.entry.partition, b.entry.seq))


def backoff_delay(attempts: int, base: float, cap: float) -> float:
    """Seconds before the next attempt after ``attempts`` failed ones: ``base * 2**(n-1)``,
    at most ``cap``."""
    return float(min(cap, base * 2.0 ** min(max(0, attempts - 1), 62)))


class ReingestRunner:
    """Runs durable re-ingest jobs on threads of this process, as ``owner``."""

    def __init__(
        self,
        store: MetadataStore,
        *,
        owner: str,
        clock: Clock = SYSTEM_CLOCK,
        lease: float = 60.0,
        backoff_base: float = 60.0,
        backoff_max: float = 3600.0,
        unrecoverable_retry: float = 86400.0,
    ) -> None:
        self.store = store
        self.owner = owner
        self.clock = clock
        self.lease = lease
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.unrecoverable_retry = unrecoverable_retry
        #: Outcomes of automatic repairs, by (table, outcome) (``millstream_auto_repairs``).
        self.auto_outcomes: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()
        self._threads: dict[str, threading.Thread] = {}

    def start(
        self,
        catalog: Catalog,
        spec: DatastreamSpec,
        segment: str,
        *,
        trigger: str = "api",
        respect_backoff: bool = False,
    ) -> ReingestJob | None:
        """Start (or take over) the segment's job and run it on a thread. 404/422 for an
        unknown segment and 409 for one whose job runs elsewhere (raised); None when
        ``respect_backoff`` and the segment's last attempt asked to wait."""
        entry = find_segment(catalog, segment)
        job = self.store.start_reingest(
            entry.table,
            segment,
            entry_id=entry.id,
            owner=self.owner,
            now=self.clock.now(),
            lease=self.lease,
            trigger=trigger,
            respect_backoff=respect_backoff,
        )
        if job is None:
            return None
        if trigger == "auto":
            self._count(job.table, "started")
        log.info(
            "re-ingest job %s of segment %s started by %s (%s, attempt %d)",
            job.id,
            segment,
            self.owner,
            trigger,
            job.attempts,
        )
        thread = threading.Thread(
            target=self._run, args=(catalog, spec, job), name=f"reingest-{segment}", daemon=True
        )
        with self._lock:
            self._threads[job.id] = thread
        thread.start()
        return job

    def running(self) -> int:
        """Jobs running on this process's threads."""
        with self._lock:
            return sum(1 for t in self._threads.values() if t.is_alive())

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for every job this runner started; whether they all ended (tests, shutdown)."""
        with self._lock:
            threads = list(self._threads.values())
        for t in threads:
            t.join(timeout)
        return not any(t.is_alive() for t in threads)

    def _count(self, table: str, outcome: str) -> None:
        with self._lock:
            self.auto_outcomes[(table, outcome)] += 1

    def _run(self, catalog: Catalog, spec: DatastreamSpec, job: ReingestJob) -> None:
        done = threading.Event()
        current = [job]
        lost = threading.Event()

        def renew() -> None:
            # The lease is renewed at a third of its length, so one slow renewal never lets
            # another controller take a job that is still running.
            while not done.wait(self.lease / 3):
                try:
                    renewed = self.store.renew_reingest(
                        current[0], now=self.clock.now(), lease=self.lease
                    )
                except Exception as exc:  # the store may be briefly down: try again
                    log.warning("re-ingest job %s: lease renewal failed: %s", job.id, exc)
                    continue
                if renewed is None:
                    lost.set()
                    return
                current[0] = renewed

        renewer = threading.Thread(target=renew, name=f"reingest-lease-{job.id}", daemon=True)
        renewer.start()
        status, error, result, retry_at, unrecoverable = SUCCEEDED, None, None, None, None
        try:
            e = reingest_segment(catalog, spec, job.segment, clock=self.clock)
            result = {"segment": e.name, "rows": e.row_count, "file": e.file_path}
        except SourceRangeGoneError as exc:
            status, error, unrecoverable = FAILED, exc.message, exc.reason
            retry_at = self.clock.now() + self.unrecoverable_retry
        except NotFoundError as exc:  # the segment is gone (sealed, rolled back): nothing to do
            status, error = FAILED, exc.message
        except Exception as exc:  # recorded on the job and retried with backoff
            status, error = FAILED, describe_error(exc)
            retry_at = self.clock.now() + backoff_delay(
                job.attempts, self.backoff_base, self.backoff_max
            )
        finally:
            done.set()
            renewer.join()
        outcome = "succeeded" if status == SUCCEEDED else (unrecoverable and "unrecoverable")
        outcome = outcome or "failed"
        finished = None
        if not lost.is_set():
            try:
                finished = self.store.finish_reingest(
                    current[0],
                    now=self.clock.now(),
                    status=status,
                    error=error,
                    result=result,
                    next_attempt_at=retry_at,
                    unrecoverable=unrecoverable,
                )
            except Exception as exc:  # the lease runs out; the job reads as ABANDONED
                log.warning("re-ingest job %s: could not record its outcome: %s", job.id, exc)
        if finished is None:
            outcome = "lost"
            log.warning(
                "re-ingest job %s of segment %s was taken over by another controller before "
                "%s recorded its outcome (%s)",
                job.id,
                job.segment,
                self.owner,
                status,
            )
        elif status == SUCCEEDED:
            log.info("re-ingest job %s rebuilt segment %s: %s", job.id, job.segment, result)
        else:
            log.warning(
                "re-ingest job %s of segment %s failed (attempt %d%s): %s",
                job.id,
                job.segment,
                job.attempts,
                f", unrecoverable: {unrecoverable}" if unrecoverable else "",
                error,
            )
        if job.payload.get("trigger") == "auto":
            self._count(job.table, outcome)
