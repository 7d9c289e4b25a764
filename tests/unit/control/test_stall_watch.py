"""The stall watchdog's judgement against a declarative oracle, over random histories of a
producer and a writer (random gaps between observations, uppers that move or not, sources
that grow or not): a partition is stalled at an observation exactly when it is behind its
source and has been behind with that same upper at every observation for at least the
stall time. Hypothesis prints the failing history and a reproduction blob."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from millstream.control.watchdog import StallWatch

PARTITIONS = (0, 1)

step = st.tuples(
    st.floats(min_value=0.0, max_value=200.0, allow_nan=False),  # seconds since the last look
    st.tuples(*(st.sampled_from([0, 0, 0, 1, 3]) for _ in PARTITIONS)),  # the writer commits
    st.tuples(*(st.sampled_from([0, 0, 1, 4]) for _ in PARTITIONS)),  # the producer appends
)


def oracle_stalled(history: list[tuple[float, int, int]], stall: float) -> bool:
    """``history`` is one partition's (time, upper, latest) at each observation, the last
    being now: stalled if behind now and behind with the same upper at every observation
    since one at least ``stall`` seconds ago."""
    now, upper, latest = history[-1]
    if latest <= upper:
        return False
    for t, u, end in reversed(history):
        if u != upper or end <= u:
            return False
        if now - t >= stall:
            return True
    return False


@settings(max_examples=300, deadline=None, print_blob=True)
@given(
    stall=st.floats(min_value=10.0, max_value=600.0, allow_nan=False),
    steps=st.lists(step, min_size=1, max_size=40),
)
def test_the_watch_agrees_with_the_oracle(
    stall: float, steps: list[tuple[float, tuple[int, ...], tuple[int, ...]]]
) -> None:
    watch = StallWatch(stall)
    now = 1_800_000_000.0
    uppers = dict.fromkeys(PARTITIONS, 0)
    latest = dict.fromkeys(PARTITIONS, 0)
    histories: dict[int, list[tuple[float, int, int]]] = {p: [] for p in PARTITIONS}
    previous: dict[int, int] | None = None
    for gap, commits, appends in steps:
        now += gap
        for p in PARTITIONS:
            latest[p] += appends[p]
            uppers[p] = min(latest[p], uppers[p] + commits[p])  # never past the source
            histories[p].append((now, uppers[p], latest[p]))
        verdict = watch.observe("ds", dict(uppers), dict(latest), now)
        expected = {p for p in PARTITIONS if oracle_stalled(histories[p], stall)}
        got = set(verdict.stall.partitions) if verdict.stall is not None else set()
        assert got == expected, (now, uppers, latest)
        if verdict.stall is not None:
            for p in got:
                assert verdict.stall.partitions[p] == (uppers[p], latest[p])
        moved = previous is not None and previous != uppers
        caught_up = all(latest[p] <= uppers[p] for p in PARTITIONS)
        assert verdict.healthy == (not expected and (moved or caught_up))
        previous = dict(uppers)
