"""The stall watchdog: a writer whose shard upper stops moving while its source holds records
above it (Materialize #36860: a frontier that stopped advancing while the status said
running) is reported and restarted.

:class:`StallWatch` is the judgement, on the caller's clock (tests move a
:class:`~millstream.clock.ManualClock`, no sleeps): per datastream and partition it keeps
the upper last seen and since when the partition has been *behind* (its source's latest
offset above the upper) with that upper. A partition is stalled once it has been behind
with the same upper for ``stall_seconds``. An upper that moves, or a partition that is
caught up (an idle datastream: no new records), starts the clock again, so a datastream that
was idle for an hour is not stalled by the first record after it.

The worker (:meth:`millstream.control.worker.Worker.watch`) observes each writer it runs
actively on its own supervised thread, reports what this returns in its heartbeat
(``health``: the REST record, ``/metrics``' ``millstream_datastream_stalled``, debugInfo,
the console) and restarts a stalled writer with the backoff of a failed one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from millstream.errors import InvalidSpecError

#: Bounds of the ``stall_seconds`` setting: below the minimum a slow but healthy batch (a
#: seal, a catch-up of a large range) would read as a stall; above the maximum a stall would
#: go unseen for more than a day.
MIN_STALL_SECONDS = 10.0
MAX_STALL_SECONDS = 86_400.0
DEFAULT_STALL_SECONDS = 300.0


def check_stall_seconds(value: float) -> float:
    if not MIN_STALL_SECONDS <= value <= MAX_STALL_SECONDS:
        raise InvalidSpecError(
            "stall_seconds",
            f"must be between {MIN_STALL_SECONDS:g} and {MAX_STALL_SECONDS:g} seconds, "
            f"got {value:g}",
        )
    return value


@dataclass(frozen=True, slots=True)
class Stall:
    """A stalled datastream: per stalled partition its shard upper and the source's latest
    offset, and since when (the earliest partition's) the upper has not moved while behind."""

    datastream: str
    since: float
    partitions: dict[int, tuple[int, int]]

    def describe(self, now: float) -> str:
        parts = ", ".join(
            f"partition {p} at offset {upper} (source latest {latest})"
            for p, (upper, latest) in sorted(self.partitions.items())
        )
        return (
            f"stalled: datastream {self.datastream!r} has not advanced for "
            f"{max(0.0, now - self.since):.0f} s while its source holds newer records: {parts}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "since": self.since,
            "partitions": {
                str(p): {"upper": upper, "latest": latest}
                for p, (upper, latest) in sorted(self.partitions.items())
            },
        }


@dataclass(slots=True)
class _Partition:
    upper: int
    behind_since: float | None = None


@dataclass(frozen=True, slots=True)
class Verdict:
    """One observation of a datastream: ``stall`` when some partition is stalled; ``healthy``
    when none is and the writer showed it works (an upper moved, or every partition is caught
    up)."""

    stall: Stall | None
    healthy: bool


@dataclass
class StallWatch:
    stall_seconds: float = DEFAULT_STALL_SECONDS
    _seen: dict[str, dict[int, _Partition]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_stall_seconds(self.stall_seconds)

    def observe(
        self, datastream: str, uppers: dict[int, int], latest: dict[int, int], now: float
    ) -> Verdict:
        """Judge ``datastream`` from its shard uppers and its source's latest offsets."""
        seen = self._seen.setdefault(datastream, {})
        moved = False
        stalled: dict[int, tuple[int, int]] = {}
        since: float | None = None
        for p, upper in uppers.items():
            last = seen.get(p)
            if last is None or last.upper != upper:
                moved = moved or last is not None
                last = seen[p] = _Partition(upper)
            end = latest.get(p)
            if end is None or end <= upper:
                last.behind_since = None  # caught up (or no answer for it): nothing waits
                continue
            if last.behind_since is None:
                last.behind_since = now
            if now - last.behind_since >= self.stall_seconds:
                stalled[p] = (upper, end)
                since = last.behind_since if since is None else min(since, last.behind_since)
        for p in set(seen) - set(uppers):
            del seen[p]
        caught_up = all(latest.get(p, u) <= u for p, u in uppers.items())
        stall = Stall(datastream, since, stalled) if since is not None else None
        return Verdict(stall, healthy=stall is None and (moved or caught_up))

    def watching(self) -> set[str]:
        """The datastreams observed since they were last forgotten."""
        return set(self._seen)

    def forget(self, datastream: str) -> None:
        """Start over (a restarted writer gets a full ``stall_seconds`` again)."""
        self._seen.pop(datastream, None)
