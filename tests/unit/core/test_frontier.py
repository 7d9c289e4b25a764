"""decide(): the compare-and-append rule of one shard, as a table of cases.

A shard at ``upper`` accepts a batch ``[lo, hi)`` like this: rows below ``upper`` are
dropped, because they are already persisted; a batch starting at ``upper`` commits; a
batch starting above it is a gap. A writer whose epoch differs from the shard's is fenced
before anything else is looked at.
"""

from __future__ import annotations

import pytest

from millstream.core.frontier import Decision, Outcome, decide

COMMIT, TRIM, DROP, GAP, FENCED = (
    Outcome.COMMIT,
    Outcome.TRIM,
    Outcome.DROP,
    Outcome.GAP,
    Outcome.FENCED,
)

# (upper, lo, hi) -> (outcome, start, end, new_upper); shard and writer both at epoch 0.
CASES = [
    pytest.param(10, 10, 15, (COMMIT, 10, 15, 15), id="batch_at_upper_commits"),
    pytest.param(0, 0, 1, (COMMIT, 0, 1, 1), id="first_offset_commits"),
    pytest.param(10, 10, 10, (DROP, 10, 10, 10), id="empty_batch_at_upper_is_dropped"),
    pytest.param(10, 5, 8, (DROP, 10, 10, 10), id="batch_below_upper_is_dropped_not_held"),
    pytest.param(10, 0, 10, (DROP, 10, 10, 10), id="replay_ending_at_upper_is_dropped"),
    pytest.param(10, 8, 11, (TRIM, 10, 11, 11), id="batch_straddling_upper_is_trimmed"),
    pytest.param(10, 8, 12, (TRIM, 10, 12, 12), id="trim_keeps_everything_from_upper"),
    pytest.param(10, 9, 10_000, (TRIM, 10, 10_000, 10_000), id="long_straddling_batch"),
    pytest.param(10, 11, 15, (GAP, 10, 10, 10), id="batch_above_upper_is_a_gap"),
    pytest.param(10, 11, 11, (GAP, 10, 10, 10), id="empty_batch_above_upper_is_a_gap"),
]


@pytest.mark.parametrize(("upper", "lo", "hi", "expected"), CASES)
def test_decide_commits_trims_drops_or_refuses_a_gap(
    upper: int, lo: int, hi: int, expected: tuple[Outcome, int, int, int]
) -> None:
    d = decide(upper=upper, epoch=0, lo=lo, hi=hi, writer_epoch=0)
    assert (d.outcome, d.start, d.end, d.new_upper) == expected


def test_an_empty_batch_at_the_upper_is_dropped_but_is_not_a_lost_race() -> None:
    """An idle writer's empty micro-batches must not show up as races in the metrics."""
    empty = decide(upper=10, epoch=0, lo=10, hi=10, writer_epoch=0)
    replay = decide(upper=10, epoch=0, lo=5, hi=8, writer_epoch=0)
    assert empty.outcome is replay.outcome is Outcome.DROP
    assert (empty.lost_race, replay.lost_race) == (False, True)


@pytest.mark.parametrize(("upper", "lo", "hi", "expected"), CASES)
def test_decide_never_moves_the_upper_backwards_and_never_strands_a_batch(
    upper: int, lo: int, hi: int, expected: tuple[Outcome, int, int, int]
) -> None:
    d = decide(upper=upper, epoch=0, lo=lo, hi=hi, writer_epoch=0)
    assert d.new_upper >= upper
    if lo <= upper:
        assert d.new_upper == max(upper, hi), "a batch reaching past the upper must land"


@pytest.mark.parametrize(
    ("shard_epoch", "writer_epoch", "lo", "hi"),
    [
        pytest.param(1, 0, 10, 15, id="stale_writer_at_upper"),
        pytest.param(1, 0, 5, 8, id="stale_writer_below_upper"),
        pytest.param(1, 0, 11, 15, id="stale_writer_above_upper"),
        pytest.param(0, 1, 10, 15, id="writer_ahead_of_shard_epoch"),
    ],
)
def test_decide_fences_a_writer_from_another_epoch_before_anything_else(
    shard_epoch: int, writer_epoch: int, lo: int, hi: int
) -> None:
    d = decide(upper=10, epoch=shard_epoch, lo=lo, hi=hi, writer_epoch=writer_epoch)
    assert d == Decision(FENCED, 10, 10, 10)
    assert not d.appends


@pytest.mark.parametrize(
    ("outcome", "appends", "lost_race"),
    [(COMMIT, True, False), (TRIM, True, True), (DROP, False, True), (GAP, False, False)],
)
def test_decision_reports_whether_it_appends_and_whether_a_peer_won(
    outcome: Outcome, appends: bool, lost_race: bool
) -> None:
    d = Decision(outcome, 0, 0, 0)
    assert (d.appends, d.lost_race) == (appends, lost_race)


def test_decide_rejects_a_reversed_range() -> None:
    with pytest.raises(ValueError, match="reversed"):
        decide(upper=10, epoch=0, lo=12, hi=11, writer_epoch=0)
