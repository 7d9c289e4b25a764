"""What a sealer seals and when: a partition's pending run (every entry not sealed yet, the
suffix after its last sealed segment) and whether the run has reached a flush threshold.

**Age seals spread over time.** Tables that start together (a worker taking 100 topics at
once) reach ``flush_seconds`` together, every ``flush_seconds``: 100 seals in one pass, a
minute of the worker's CPU at 3x its usual a batch (issue 38). With ``Thresholds.spread`` each
table has a *slot* every ``flush_seconds``, at a phase from a stable hash of its name
(:func:`slot_phase`); a run at least :data:`SPREAD_MIN_SHARE` of ``flush_seconds`` old is due
at its table's first slot. A seal is thereby only ever earlier than ``flush_seconds``, never
later (the age threshold still holds on its own). After one seal at its slot, a busy table's
next run is ``flush_seconds`` old at its next slot: its seals keep its phase, and the tables'
seals stay spread over the period. A table whose slot falls in the first
:data:`SPREAD_MIN_SHARE` of its run's age seals by age (a tenth of tables started together
stay together)."""

from __future__ import annotations

import zlib

from millstream.clock import Clock
from millstream.metastore.models import Entry, Manifest, SegmentState
from millstream.sealing.thresholds import Thresholds

#: The share of ``flush_seconds`` a run must be old before its table's slot may seal it: no
#: tiny run sealed because it began just before its slot.
SPREAD_MIN_SHARE = 0.1


def pending_run(manifest: Manifest, partition: int) -> list[Entry]:
    """The partition's entries not sealed yet, in sequence order."""
    return [
        e
        for e in manifest.entries
        if e.partition == partition and e.state is not SegmentState.ONLINE
    ]


def due(run: list[Entry], thresholds: Thresholds, clock: Clock, phase: float | None = None) -> bool:
    """Whether ``run`` reached any threshold: rows, bytes, or the age of its oldest entry (or
    its table's slot, ``phase``: see the module's docstring)."""
    if not run:
        return False
    return due_totals(
        sum(e.row_count for e in run),
        sum(e.size_bytes for e in run),
        min(e.created_at for e in run),
        thresholds,
        clock.now(),
        phase,
    )


def slot_phase(table: str, every: float) -> float:
    """Where in each period of ``every`` seconds (from the epoch) ``table``'s seal slot falls:
    from a hash of its name that every process computes alike (not Python's ``hash``)."""
    return zlib.crc32(table.encode()) / 2**32 * every


def slot_reached(oldest: float, now: float, every: float, phase: float) -> bool:
    """Whether the table's latest slot at or before ``now`` came at least
    :data:`SPREAD_MIN_SHARE` of ``every`` after the run's oldest entry was created."""
    latest = now - (now - phase) % every
    return latest >= oldest + SPREAD_MIN_SHARE * every


def due_totals(
    rows: int,
    size_bytes: int,
    oldest: float,
    thresholds: Thresholds,
    now: float,
    phase: float | None = None,
) -> bool:
    """:func:`due` from a run's totals: its rows, its bytes and its oldest entry's
    ``created_at`` (what a sealing pass keeps of a run between its manifest reads)."""
    t = thresholds
    if rows >= t.flush_rows or size_bytes >= t.flush_bytes:
        return True
    if now - oldest >= t.flush_seconds:
        return True  # the user's bound: a run is sealed within flush_seconds, spread or not
    return phase is not None and slot_reached(oldest, now, t.flush_seconds, phase)


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
