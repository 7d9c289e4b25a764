"""Compaction of sealed segments: per partition, merge the newest sealed segments into one and
apply the delete vectors that name their rows, so a partition keeps a bounded number of files
and delete vectors however long it runs (LSM-style, size-tiered).

**Which segments.** A window is always a *suffix* of the partition's sealed segments (the newest
ones, in sequence order), walking back from the newest while a segment holds no more live rows
(rows no delete vector names) than ``size_ratio`` (1.25) times the window so far, or at least
``delete_share`` of its rows are deleted. A window of ``min_segments`` or more is merged; so is a shorter one (two or more)
that holds a mostly deleted segment. Equal seals then merge ``min_segments`` at a time, merged
segments merge again once as many live rows have piled up behind them, and a segment whose rows
newer seals keep superseding shrinks until it joins. So a partition holds ``O(log rows)``
sealed segments and each row is rewritten ``O(log rows)`` times. Segments of ``max_rows`` live
rows or more are left alone (unless mostly deleted). Sizes that keep shrinking never fill a
tier: past ``max_segments`` segments the newest ``min_segments`` are merged all the same.

**Which rows go.** Exactly the rows of the window that the delete vectors of the window's own
seals (``source_seq`` within the window) name; every other row is kept, with its offset, so the
key index (which holds the live rows by offset) stays exact and only learns the new entry ids.
A delete vector only names rows that cannot change any read, so the merged segment reads the
same. The rows those vectors name *before* the window go into one new vector whose source is the
merged segment.

**Why a suffix.** A delete vector written by the seal of segment ``s`` names rows older than
``s``, and a rollback to ``s`` or before removes it: the rows it named are current again. A
merged window applies vectors whose sources all lie inside it, and a rollback can only start at
a live segment's sequence number: before the window (the merged segment goes too, and its
replacement vector with it) or after it (no applied vector is touched). A window that was not a
suffix would have to apply vectors from seals after it, and a rollback of those would need rows
the compaction had thrown away.

The swap is one compare-and-set transaction (:func:`millstream.metastore.swaps.replace_sealed`):
it lands only if the partition's sealed segments and delete vectors are still the ones planned
from, so a concurrent seal, rollback, re-ingestion or compaction discards it (and it is planned
again). The sealer runs it on its own thread after its seals, so it never waits on ingestion
and ingestion never waits on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from millstream.errors import SegmentUnavailableError
from millstream.metastore.models import DeleteVector, Entry, Manifest, SegmentState
from millstream.spec import OFFSET_COL, TableSpec
from millstream.storage.deepstore import DeepStore
from millstream.table.read import read_entries


@dataclass(frozen=True, slots=True)
class CompactionPolicy:
    """When a partition's sealed segments are merged (the ``segments`` section's
    ``compaction``, ``compaction_min_segments`` and ``compaction_max_rows``)."""

    enabled: bool = True
    min_segments: int = 4
    max_segments: int = 12
    max_rows: int = 4_000_000
    delete_share: float = 0.5
    #: How much larger than the newer segments together a segment may be and still join them.
    size_ratio: float = 1.25

    @classmethod
    def of(cls, segments: Any) -> CompactionPolicy:
        """From a datastream's ``segments`` section (:class:`millstream.datastream.SegmentsSection`)."""
        return cls(
            enabled=segments.compaction,
            min_segments=segments.compaction_min_segments,
            max_segments=max(segments.compaction_min_segments, 12),
            max_rows=segments.compaction_max_rows,
        )


@dataclass(frozen=True, slots=True)
class CompactionPlan:
    """A window of sealed segments to merge, and the delete vectors the merge replaces."""

    table: str
    partition: int
    window: tuple[Entry, ...]
    vectors: tuple[DeleteVector, ...]
    #: (live sealed entry ids, live delete vector ids) of the partition when planned.
    reflects: tuple[tuple[int, ...], tuple[int, ...]]
    live_rows: tuple[int, ...]
    reason: str

    @property
    def rows_in(self) -> int:
        return sum(e.row_count for e in self.window)

    def to_dict(self) -> dict[str, object]:
        return {
            "partition": self.partition,
            "segments": [e.name for e in self.window],
            "rows": self.rows_in,
            "live_rows": sum(self.live_rows),
            "delete_vectors": len(self.vectors),
            "reason": self.reason,
        }


def sealed_segments(manifest: Manifest, partition: int) -> list[Entry] | None:
    """The partition's sealed segments in sequence order, or None if they are not a prefix of
    its live segments (a segment not sealed lies among them: nothing is compacted then)."""
    live = sorted((e for e in manifest.entries if e.partition == partition), key=lambda e: e.seq)
    sealed = [e for e in live if e.state is SegmentState.ONLINE]
    if live[: len(sealed)] != sealed:
        return None
    return sealed


def read_vector_offsets(
    deep: DeepStore, spec: TableSpec, vectors: list[DeleteVector]
) -> np.ndarray:
    """Every offset ``vectors`` name, sorted. Unlike a read, compaction cannot do without a
    vector: it would drop the vector while keeping its rows out of the key index."""
    chunks = [np.zeros(0, dtype=np.int64)]
    for dv in vectors:
        try:
            col = deep.read_parquet(dv.file_path, columns=[OFFSET_COL]).column(OFFSET_COL)
        except (OSError, pa.ArrowInvalid, KeyError) as exc:
            raise SegmentUnavailableError(
                spec.name,
                f"delete vector {dv.id} (from segment {dv.table}__{dv.partition}__{dv.source_seq})",
                dv.file_path,
                str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
            ) from exc
        chunks.append(np.asarray(col.to_numpy(), dtype=np.int64))
    return np.sort(np.concatenate(chunks))


def deleted_per_segment(sealed: list[Entry], offsets: np.ndarray) -> list[int]:
    """How many of ``offsets`` (sorted) fall in each of ``sealed`` (in sequence order)."""
    out = []
    for e in sealed:
        lo = np.searchsorted(offsets, e.start, side="left")
        hi = np.searchsorted(offsets, e.end, side="left")
        out.append(int(hi - lo))
    return out


def plan_compaction(
    deep: DeepStore, manifest: Manifest, partition: int, policy: CompactionPolicy
) -> CompactionPlan | None:
    """The window of ``partition``'s sealed segments due for a merge (see the module
    docstring), or None."""
    if not policy.enabled:
        return None
    sealed = sealed_segments(manifest, partition)
    if not sealed or len(sealed) < 2:
        return None
    spec = manifest.table.spec
    vectors = [d for d in manifest.delete_vectors if d.partition == partition]
    deleted = deleted_per_segment(sealed, read_vector_offsets(deep, spec, vectors))
    live = [max(0, e.row_count - d) for e, d in zip(sealed, deleted, strict=True)]
    heavy = [
        e.row_count > 0 and d >= policy.delete_share * e.row_count
        for e, d in zip(sealed, deleted, strict=True)
    ]
    i = len(sealed) - 1
    total = live[i]
    while i > 0:
        j = i - 1
        if heavy[j] or (live[j] <= policy.size_ratio * total and live[j] < policy.max_rows):
            total += live[j]
            i = j
            continue
        break
    has_heavy = any(heavy[i:])
    reason = f"{len(sealed) - i} segments of similar size"
    if has_heavy:
        reason = f"{sum(heavy[i:])} mostly deleted segment(s) among {len(sealed) - i}"
    if len(sealed) - i < policy.min_segments and not has_heavy:
        # No tier is full. Sizes that keep shrinking never fill one, so past ``max_segments``
        # segments (not counting full ones) the newest ``min_segments`` merge all the same.
        full = [k for k, n in enumerate(live) if n >= policy.max_rows]
        tail = len(sealed) - (full[-1] + 1 if full else 0)
        if tail <= policy.max_segments:
            return None
        i = len(sealed) - policy.min_segments
        reason = f"{tail} sealed segments, more than {policy.max_segments}"
    window = sealed[i:]
    if len(window) < 2:
        return None
    first = window[0].seq
    reflects = (
        tuple(sorted(e.id for e in sealed)),
        tuple(sorted(d.id for d in vectors)),
    )
    return CompactionPlan(
        manifest.table.name,
        partition,
        tuple(window),
        tuple(d for d in vectors if d.source_seq >= first),
        reflects,
        tuple(live[i:]),
        reason,
    )


def merge_window(
    deep: DeepStore, spec: TableSpec, plan: CompactionPlan
) -> tuple[pa.Table, np.ndarray, int]:
    """The merged rows of ``plan``'s window (its rows minus those its vectors name, sorted by
    key then offset), the offsets those vectors name before the window (for the replacement
    vector), and how many rows were dropped."""
    rows = read_entries(deep, spec, plan.window)
    offsets = read_vector_offsets(deep, spec, list(plan.vectors))
    start = plan.window[0].start
    inside = offsets[offsets >= start]
    before = offsets[offsets < start]
    if len(inside):
        gone = pc.is_in(rows.column(OFFSET_COL), value_set=pa.array(inside, pa.int64()))
        kept = rows.filter(pc.invert(gone))
    else:
        kept = rows
    order = [(k, "ascending") for k in spec.primary_key] + [(OFFSET_COL, "ascending")]
    kept = kept.take(pc.sort_indices(kept, sort_keys=order))
    return kept, np.unique(before), rows.num_rows - kept.num_rows
