"""The sealer: compacts a partition's consuming segments into one sealed segment, in the
background (pauseless: writers keep committing while a seal builds and uploads).

One seal of partition P:

1. **claim** the run: every not-yet-sealed entry of P, in sequence order (always the whole
   suffix after the last sealed segment, so segments of a partition seal strictly in order).
   Claiming is a compare-and-set of each entry CONSUMING -> COMMITTING; a run another sealer
   has claimed is left alone.
2. **build**: read the run's rows and :func:`millstream.core.merge.compact` them (resolving
   keys where that provably gives the same table), sorted by key, in sized row groups.
3. **upload** the sealed file to the deep store.
4. **swap** the manifest in one transaction: the run's entries are removed (if, and only if,
   they are still exactly as claimed) and one ONLINE entry covering ``[run start, run end)``
   with the run's first sequence number is added.

A failure at any point leaves the consuming segments in place and queryable (the read result
never depends on sealing), deletes an uploaded but unswapped file, and puts the run back to
CONSUMING with the error; after ``max_failures`` consecutive failures its first entry goes to
ERROR (reported by ``/tables/{t}/debugInfo``) and is retried with backoff. This holds for every
engine, dedup and partial included: the inputs are the durable consuming segments.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import Connection, select, update

from millstream.catalog import Catalog
from millstream.clock import SYSTEM_CLOCK, Clock
from millstream.core.merge import compact
from millstream.errors import CommitConflictError, MillstreamError
from millstream.metastore import schema as s
from millstream.metastore.models import Entry, SegmentState
from millstream.metastore.store import _entry, get_entry, insert_entry, publish_version
from millstream.storage.deepstore import table_data_prefix
from millstream.table.read import read_entries

log = logging.getLogger(__name__)

#: Named fault points, in the order a seal reaches them.
FAULT_POINTS = ("before_build", "before_upload", "before_swap", "after_swap")
ROW_GROUP_ROWS = 128 * 1024


class InjectedSealFault(MillstreamError):
    """A fault injected at a named seal point (tests, drills)."""


class SealDiscardedError(MillstreamError):
    """The run changed while it was being sealed (rolled back, or re-claimed after this sealer
    was presumed dead); the sealed file is discarded and the run left as it is now."""


@dataclass
class SealFaults:
    """Fail the next ``n`` seals at a point: ``SealFaults({"before_swap": 2})``. A callable
    ``hook(point, partition)`` runs at every point too (tests use it to delay a build)."""

    remaining: dict[str, int] = field(default_factory=dict)
    hook: Callable[[str, int], None] | None = None

    def check(self, point: str, partition: int) -> None:
        if self.hook is not None:
            self.hook(point, partition)
        if self.remaining.get(point, 0) > 0:
            self.remaining[point] -= 1
            raise InjectedSealFault(
                f"fault injected at {point} (partition {partition})", point=point
            )


@dataclass(frozen=True, slots=True)
class SealResult:
    table: str
    partition: int
    sealed: Entry
    replaced: tuple[str, ...]
    rows_in: int
    rows_out: int
    seconds: float


@dataclass(frozen=True, slots=True)
class Thresholds:
    flush_rows: int = 500_000
    flush_seconds: float = 300.0
    flush_bytes: int = 256 * 1024**2


class Sealer:
    def __init__(
        self,
        catalog: Catalog,
        table: str,
        *,
        thresholds: Thresholds | None = None,
        clock: Clock = SYSTEM_CLOCK,
        faults: SealFaults | None = None,
        max_failures: int = 3,
    ) -> None:
        self.catalog = catalog
        self.store = catalog.store
        self.table = table
        self.thresholds = thresholds or Thresholds()
        self.clock = clock
        self.faults = faults or SealFaults()
        self.max_failures = max_failures
        self.failures: dict[int, int] = {}
        self.last_error: dict[int, str] = {}
        self.durations: list[float] = []
        self._next_try: dict[int, float] = {}

    # -- planning --------------------------------------------------------------------------

    def pending_run(self, partition: int) -> list[Entry]:
        """The partition's entries not sealed yet, in sequence order."""
        manifest = self.catalog.manifest(self.table)
        return [
            e
            for e in manifest.entries
            if e.partition == partition and e.state is not SegmentState.ONLINE
        ]

    def due(self, run: list[Entry]) -> bool:
        if not run:
            return False
        t = self.thresholds
        return (
            sum(e.row_count for e in run) >= t.flush_rows
            or sum(e.size_bytes for e in run) >= t.flush_bytes
            or self.clock.now() - min(e.created_at for e in run) >= t.flush_seconds
        )

    def partitions(self) -> list[int]:
        return [sh.partition for sh in self.store.list_shards(self.table)]

    # -- sealing ---------------------------------------------------------------------------

    def seal_due(self) -> list[SealResult]:
        """Seal every partition whose thresholds are reached. Failures are recorded and the
        partition is retried with exponential backoff (capped at a minute), never raised: this
        runs in the background beside the writers."""
        out = []
        for p in self.partitions():
            if self._next_try.get(p, 0.0) > self.clock.now():
                continue
            try:
                r = self.seal_partition(p)
            except Exception as exc:
                delay = min(60.0, 2.0 ** self.failures.get(p, 1))
                self._next_try[p] = self.clock.now() + delay
                log.warning(
                    "seal of %s partition %d failed (retry in %.0fs): %s", self.table, p, delay, exc
                )
                continue
            if r is not None:
                out.append(r)
        return out

    def status(self) -> dict[str, object]:
        return {
            "failures": {str(p): n for p, n in self.failures.items()},
            "last_error": {str(p): e for p, e in self.last_error.items()},
            "last_seal_seconds": self.durations[-1] if self.durations else None,
            "seals": len(self.durations),
        }

    def seal_partition(self, partition: int, *, force: bool = False) -> SealResult | None:
        """Seal the partition's consuming run if due (or ``force``). Returns None when there is
        nothing to do or another sealer holds the run; raises the failure otherwise (after
        putting the run back)."""
        run = self.pending_run(partition)
        if not run or not (force or self.due(run)):
            return None
        if any(e.state is SegmentState.COMMITTING for e in run):
            return None  # another sealer is building it
        started = time.monotonic()
        claimed = self._claim(run)
        if claimed is None:
            return None
        path: str | None = None
        try:
            self.faults.check("before_build", partition)
            spec = self.catalog.table(self.table).spec
            rows = read_entries(self.catalog.deep, spec, run)
            sealed_rows = compact(spec, rows)
            self.faults.check("before_upload", partition)
            path = f"{table_data_prefix(self.table)}/sealed-p{partition}-s{run[0].seq}-{uuid.uuid4().hex}.parquet"
            size = self.catalog.deep.write_parquet(path, sealed_rows, row_group_size=ROW_GROUP_ROWS)
            self.faults.check("before_swap", partition)
            sealed = self._swap(partition, claimed, path, sealed_rows.num_rows, size)
        except BaseException as exc:
            if path is not None:
                self.catalog.deep.delete(path)
            self._release(
                claimed, str(exc).splitlines()[0][:1000] if str(exc) else type(exc).__name__
            )
            raise
        self.failures.pop(partition, None)
        self.last_error.pop(partition, None)
        seconds = time.monotonic() - started
        self.durations.append(seconds)
        result = SealResult(
            self.table,
            partition,
            sealed,
            tuple(e.name for e in run),
            rows.num_rows,
            sealed_rows.num_rows,
            seconds,
        )
        try:
            self.faults.check("after_swap", partition)
        except InjectedSealFault as exc:
            # The seal is done; only cleanup (nothing mandatory: GC removes unreferenced files
            # once time travel no longer needs them) was interrupted.
            log.warning(
                "after-swap cleanup of %s partition %d interrupted: %s", self.table, partition, exc
            )
        return result

    # -- metadata steps --------------------------------------------------------------------

    def _claim(self, run: list[Entry]) -> dict[int, int] | None:
        """CONSUMING|ERROR -> COMMITTING for every entry of the run; {entry id: new version}."""

        def _txn(conn: Connection) -> dict[int, int] | None:
            versions: dict[int, int] = {}
            for e in run:
                row = (
                    conn.execute(select(s.entries).where(s.entries.c.id == e.id)).mappings().first()
                )
                if (
                    row is None
                    or row["removed_version"] is not None
                    or row["state"] == "COMMITTING"
                ):
                    return None
                n = conn.execute(
                    update(s.entries)
                    .where(s.entries.c.id == e.id, s.entries.c.version == row["version"])
                    .values(state=SegmentState.COMMITTING.value, version=row["version"] + 1)
                ).rowcount
                if n != 1:
                    raise CommitConflictError(f"segment {e.name} changed while claiming it")
                versions[e.id] = row["version"] + 1
            return versions

        claimed, _ = self.store.retrying(_txn)
        return claimed  # type: ignore[no-any-return]

    def _release(self, claimed: dict[int, int], error: str) -> None:
        """Put a failed run back: CONSUMING with the error, or ERROR after repeated failures."""
        first = min(claimed)

        def _txn(conn: Connection) -> None:
            part = None
            for entry_id, version in claimed.items():
                row = (
                    conn.execute(select(s.entries).where(s.entries.c.id == entry_id))
                    .mappings()
                    .first()
                )
                if row is None or row["version"] != version:
                    continue
                part = row["partition"]
            if part is None:
                return
            count = self.failures.get(part, 0) + 1
            for entry_id, version in claimed.items():
                state = (
                    SegmentState.ERROR
                    if (count >= self.max_failures and entry_id == first)
                    else SegmentState.CONSUMING
                )
                conn.execute(
                    update(s.entries)
                    .where(s.entries.c.id == entry_id, s.entries.c.version == version)
                    .values(state=state.value, last_error=error, version=version + 1)
                )
            self.failures[part] = count
            self.last_error[part] = error

        self.store.retrying(_txn)

    def _swap(
        self, partition: int, claimed: dict[int, int], path: str, rows: int, size: int
    ) -> Entry:
        def _txn(conn: Connection) -> Entry:
            info = self.store._table(conn, self.table)
            assert info is not None
            entries = []
            for entry_id, version in claimed.items():
                row = (
                    conn.execute(select(s.entries).where(s.entries.c.id == entry_id))
                    .mappings()
                    .first()
                )
                if row is None or row["version"] != version or row["removed_version"] is not None:
                    raise SealDiscardedError(
                        f"the run being sealed in {self.table} partition {partition} changed "
                        "(rolled back or claimed by another sealer); the seal is discarded"
                    )
                entries.append(_entry(row))
            entries.sort(key=lambda e: e.seq)
            new_version = info.manifest_version + 1
            now = self.clock.now()
            for e in entries:
                conn.execute(
                    update(s.entries)
                    .where(s.entries.c.id == e.id)
                    .values(removed_version=new_version, version=claimed[e.id] + 1)
                )
            new_id = insert_entry(
                conn,
                table=self.table,
                partition=partition,
                seq=entries[0].seq,
                file_path=path,
                start=entries[0].start,
                end=entries[-1].end,
                state=SegmentState.ONLINE,
                row_count=rows,
                size_bytes=size,
                added_version=new_version,
                now=now,
                writer_id="sealer",
            )
            publish_version(conn, info, "seal", now)
            return get_entry(conn, new_id)

        sealed, _ = self.store.retrying(_txn)
        return sealed  # type: ignore[no-any-return]
