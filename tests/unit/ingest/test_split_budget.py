"""``split_budget`` admits exactly the batch budget, shared by backlog: rounding every share
down left up to one offset per partition behind per batch, so a catch-up over 256 partitions
took one more (small, ~0.4 s) micro-batch than over 4 (bench/scale.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from millstream.ingest.sources.base import split_budget


def test_256_partitions_catch_up_in_as_many_budgets_as_4() -> None:
    rows, budget = 1_000_000, 100_000
    for partitions in (4, 64, 256):
        latest = {p: rows // partitions + (p < rows % partitions) for p in range(partitions)}
        pos, batches = dict.fromkeys(latest, 0), 0
        while pos != latest:
            end = split_budget(pos, latest, budget)
            assert sum(end.values()) - sum(pos.values()) == min(
                budget, sum(latest.values()) - sum(pos.values())
            )
            pos, batches = end, batches + 1
        assert batches == 10, partitions


@given(
    st.dictionaries(st.integers(0, 300), st.tuples(st.integers(0, 50), st.integers(0, 500))),
    st.integers(1, 2000),
)
def test_the_shares_add_up_to_the_budget_and_every_backlog_moves(
    parts: dict[int, tuple[int, int]], budget: int
) -> None:
    start = {p: s for p, (s, _) in parts.items()}
    latest = {p: s + lag for p, (s, lag) in parts.items()}
    end = split_budget(start, latest, budget)
    moved = {p: end[p] - start[p] for p in parts}
    backlog = {p: lag for p, (_, lag) in parts.items()}
    assert all(0 <= moved[p] <= backlog[p] for p in parts)
    total = sum(backlog.values())
    if total <= budget:
        assert moved == backlog
        return
    assert all(moved[p] >= 1 for p in parts if backlog[p])
    if all(budget * lag >= total for lag in backlog.values() if lag):
        assert sum(moved.values()) == budget
    else:  # a partition whose share is under one offset still moves by one
        assert budget <= sum(moved.values()) <= budget + sum(1 for lag in backlog.values() if lag)
    # proportional: no share is more than one offset above its exact share (floored at one)
    assert all(moved[p] <= max(1, -(-budget * backlog[p] // total)) for p in parts)
