"""The compare-and-append decision, as a pure function.

A shard's ``upper`` is the first offset not yet committed; everything below it is persisted
exactly once. A writer proposes a batch covering the source offset range ``[lo, hi)`` of one
partition. The decision (docs/design.md, "compare_and_append"):

* ``hi <= upper``      -> DROP: already persisted (by this writer's earlier attempt or a peer).
* ``lo < upper < hi``  -> TRIM: commit only ``[upper, hi)``; rows below upper are dropped.
* ``lo == upper``      -> COMMIT ``[lo, hi)``.
* ``lo > upper``       -> GAP: do not commit; the writer restarts from ``upper``.
* stale epoch          -> FENCED, checked before anything else.

Dropping below-upper rows (instead of holding them until ``upper == lo``, which can never
happen again) is what keeps the frontier advancing when writers race: Materialize #36860.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Outcome(enum.StrEnum):
    COMMIT = "commit"
    TRIM = "trim"
    DROP = "drop"
    GAP = "gap"
    FENCED = "fenced"


@dataclass(frozen=True, slots=True)
class Decision:
    outcome: Outcome
    #: The valid offset range to record, ``[start, end)``; only for COMMIT and TRIM.
    start: int
    end: int
    #: The shard's upper after applying the decision.
    new_upper: int
    #: The batch covered no offsets (``lo == hi``): nothing to commit, nothing lost.
    empty: bool = False

    @property
    def appends(self) -> bool:
        return self.outcome in (Outcome.COMMIT, Outcome.TRIM)

    @property
    def lost_race(self) -> bool:
        """Some or all of the batch had already been persisted by someone else."""
        return self.outcome is Outcome.TRIM or (self.outcome is Outcome.DROP and not self.empty)


def decide(*, upper: int, epoch: int, lo: int, hi: int, writer_epoch: int) -> Decision:
    """Decide what committing ``[lo, hi)`` to a shard at ``upper``/``epoch`` does."""
    if lo > hi:
        raise ValueError(f"batch range [{lo}, {hi}) is reversed")
    if writer_epoch != epoch:
        return Decision(Outcome.FENCED, upper, upper, upper)
    if hi <= upper:
        # Also covers an empty batch at or below upper.
        return Decision(Outcome.DROP, upper, upper, upper, empty=lo == hi)
    if lo > upper:
        return Decision(Outcome.GAP, upper, upper, upper)
    if lo < upper:
        return Decision(Outcome.TRIM, upper, hi, hi)
    return Decision(Outcome.COMMIT, lo, hi, hi)
