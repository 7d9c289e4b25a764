"""Plain records the metadata store returns and accepts."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from millstream.core.frontier import Decision, Outcome
from millstream.errors import ShardGapError
from millstream.spec import TableSpec


class SegmentState(enum.StrEnum):
    CONSUMING = "CONSUMING"
    COMMITTING = "COMMITTING"
    ONLINE = "ONLINE"
    ERROR = "ERROR"


@dataclass(frozen=True, slots=True)
class TableInfo:
    spec: TableSpec
    manifest_version: int
    created_at: float
    version: int
    #: The schema version of ``spec`` (schema v9): 1 at creation, +1 per schema change.
    schema_version: int = 1

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass(frozen=True, slots=True)
class Shard:
    table: str
    partition: int
    upper: int
    epoch: int
    next_seq: int
    version: int
    #: Timestamp (epoch ms) of the last record committed below ``upper`` (schema v8): the
    #: source's record timestamp, or the ingestion time for a source without one. None
    #: before the first commit with records, and after a rollback.
    last_record_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Entry:
    """One segment: the rows of ``file_path`` for ``partition`` with offsets in [start, end)."""

    id: int
    table: str
    partition: int
    seq: int
    file_path: str | None
    start: int
    end: int
    state: SegmentState
    row_count: int
    size_bytes: int
    added_version: int
    removed_version: int | None
    writer_id: str | None
    batch_id: int | None
    created_at: float
    last_error: str | None = None
    #: The sealer that claimed this entry (state COMMITTING), and until when its claim holds.
    claimed_by: str | None = None
    claim_expires_at: float | None = None
    #: The row's compare-and-set version when it was read (every change bumps it).
    row_version: int = 0

    def claim_held(self, now: float) -> bool:
        """Whether a sealer's claim on this entry still holds at ``now`` (COMMITTING with an
        expiry in the future). An expired claim, or one without an expiry (schema v3), belongs
        to a sealer presumed dead: the run may be claimed again."""
        return (
            self.state is SegmentState.COMMITTING
            and self.claim_expires_at is not None
            and self.claim_expires_at > now
        )

    @property
    def name(self) -> str:
        """Segment name used by the CLI and REST API: ``table__partition__seq``."""
        return f"{self.table}__{self.partition}__{self.seq}"


@dataclass(frozen=True, slots=True)
class DeleteVector:
    """Offsets (in ``file_path``, one ``_ms_offset`` column) of rows of ``partition`` that the
    seal of segment ``source_seq`` found superseded in older sealed segments."""

    id: int
    table: str
    partition: int
    source_seq: int
    file_path: str
    row_count: int
    added_version: int
    removed_version: int | None = None


@dataclass(frozen=True, slots=True)
class ManifestChanges:
    """What changed in a table's manifest after a version a reader remembers, up to the current
    one (``version``): the entries added since (still live or not) and how many entries were
    removed since. A sealing pass that remembered a read decides from this alone whether the
    appends since made anything due (``MetadataStore.manifest_changes``)."""

    version: int
    added: tuple[Entry, ...] = ()
    removed: int = 0


@dataclass(frozen=True, slots=True)
class SealingReads:
    """What one table's sealing pass reads of the store before it decides anything, read for
    all of a worker's tables in one transaction (``MetadataStore.sealing_reads``): its force
    commits' targets (partition -> the highest segment sequence named) and, when the pass
    remembered a manifest version (``after``), what changed after it (``changes``)."""

    forced: dict[int, int]
    after: int | None = None
    changes: ManifestChanges | None = None


@dataclass(frozen=True, slots=True)
class Manifest:
    """The entries visible at one manifest version: a consistent snapshot of a table."""

    table: TableInfo
    version: int
    entries: tuple[Entry, ...]
    delete_vectors: tuple[DeleteVector, ...] = ()

    @property
    def row_count(self) -> int:
        return sum(e.row_count for e in self.entries)

    def delete_vector_totals(self) -> dict[int, tuple[int, int]]:
        """Per partition: (delete vectors, rows they mark superseded)."""
        totals: dict[int, tuple[int, int]] = {}
        for dv in self.delete_vectors:
            n, rows = totals.get(dv.partition, (0, 0))
            totals[dv.partition] = (n + 1, rows + dv.row_count)
        return totals


@dataclass(frozen=True, slots=True)
class ShardAppend:
    """A proposed append of the source range ``[lo, hi)`` of one partition.

    ``row_count`` is the number of rows of this partition in ``file_path`` (may be 0 with no
    file, which still advances the frontier: offsets need not be contiguous).
    """

    partition: int
    lo: int
    hi: int
    epoch: int
    file_path: str | None
    row_count: int
    size_bytes: int = 0
    #: Timestamp (epoch ms) of the range's last record, if it holds any: recorded on the
    #: shard when this append advances its upper (the ingestion delay is measured from it).
    last_record_ms: int | None = None


@dataclass(frozen=True, slots=True)
class ShardResult:
    partition: int
    decision: Decision
    seq: int | None


@dataclass(frozen=True, slots=True)
class AppendResult:
    table: str
    #: The manifest version this commit created, or None if it changed nothing.
    version: int | None
    shards: tuple[ShardResult, ...]
    #: How many times the transaction lost a compare-and-set and was retried.
    retries: int = 0
    files_referenced: frozenset[str] = field(default_factory=frozenset)

    @property
    def lost_race(self) -> bool:
        return any(s.decision.lost_race for s in self.shards)

    def outcome(self, partition: int) -> Outcome:
        """The partition's outcome; for a partition split over several write tasks, its
        last piece's (a dropped piece below one that committed: the shard moved)."""
        found = [s.decision.outcome for s in self.shards if s.partition == partition]
        if not found:
            raise KeyError(partition)
        return found[-1]

    def raise_for_gaps(self, appends: list[ShardAppend]) -> None:
        los: dict[int, int] = {}  # a partition split over several tasks: its lowest piece
        for a in appends:
            los[a.partition] = min(a.lo, los.get(a.partition, a.lo))
        gaps = {
            s.partition: (s.decision.new_upper, los[s.partition])
            for s in self.shards
            if s.decision.outcome is Outcome.GAP
        }
        if gaps:
            raise ShardGapError(self.table, gaps)
