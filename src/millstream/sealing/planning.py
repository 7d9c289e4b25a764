"""What a sealer seals and when: a partition's pending run (every entry not sealed yet, the
suffix after its last sealed segment) and whether the run has reached a flush threshold."""

from __future__ import annotations

from millstream.clock import Clock
from millstream.metastore.models import Entry, Manifest, SegmentState
from millstream.sealing.thresholds import Thresholds


def pending_run(manifest: Manifest, partition: int) -> list[Entry]:
    """The partition's entries not sealed yet, in sequence order."""
    return [
        e
        for e in manifest.entries
        if e.partition == partition and e.state is not SegmentState.ONLINE
    ]


def due(run: list[Entry], thresholds: Thresholds, clock: Clock) -> bool:
    """Whether ``run`` reached any threshold: rows, bytes, or the age of its oldest entry."""
    if not run:
        return False
    t = thresholds
    return (
        sum(e.row_count for e in run) >= t.flush_rows
        or sum(e.size_bytes for e in run) >= t.flush_bytes
        or clock.now() - min(e.created_at for e in run) >= t.flush_seconds
    )


def shortfall(run: list[Entry], thresholds: Thresholds, clock: Clock) -> str:
    """How far a run that is not due is from each threshold, in words."""
    t = thresholds
    rows = sum(e.row_count for e in run)
    size = sum(e.size_bytes for e in run)
    age = clock.now() - min(e.created_at for e in run)
    return (
        f"{len(run)} segments below every threshold: {rows} rows of flush_rows "
        f"{t.flush_rows}, {size} bytes of flush_bytes {t.flush_bytes}, oldest {age:.0f}s "
        f"of flush_seconds {t.flush_seconds:.0f}"
    )
