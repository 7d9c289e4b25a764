"""Writer placement (core.assignment.assign): one active plus ``replicas - 1`` standbys per
datastream, sticky, spread by load, deterministic. Pure: no store, no clock."""

from __future__ import annotations

import itertools
from collections import Counter

from hypothesis import given, note, settings
from hypothesis import strategies as st

from millstream.core.assignment import ACTIVE, STANDBY, Placement, assign


def load(result: dict[str, Placement]) -> Counter[str]:
    return Counter(w for placement in result.values() for w, _ in placement)


def test_new_datastreams_spread_one_active_per_worker() -> None:
    result = assign({"a": 1, "b": 1, "c": 1}, ["w1", "w2", "w3"], {})
    assert result == {"a": [("w1", ACTIVE)], "b": [("w2", ACTIVE)], "c": [("w3", ACTIVE)]}


def test_replicas_get_one_active_first_and_standbys_on_distinct_workers_balanced() -> None:
    result = assign({"a": 2, "b": 2, "c": 2}, ["w1", "w2", "w3"], {})
    for placement in result.values():
        assert len(placement) == 2
        assert placement[0][1] == ACTIVE and placement[1][1] == STANDBY
        assert placement[0][0] != placement[1][0]
    assert load(result) == {"w1": 2, "w2": 2, "w3": 2}


def test_placements_are_sticky_when_a_worker_joins() -> None:
    before = assign({"a": 2, "b": 1}, ["w1", "w2"], {})
    after = assign({"a": 2, "b": 1, "c": 1}, ["w1", "w2", "w3"], before)
    assert after["a"] == before["a"]
    assert after["b"] == before["b"]
    assert after["c"] == [("w3", ACTIVE)]  # the new datastream goes to the idle worker


def test_the_standby_is_promoted_when_the_actives_worker_dies() -> None:
    current = {"a": [("w1", ACTIVE), ("w2", STANDBY)]}
    result = assign({"a": 2}, ["w2", "w3"], current)
    assert result == {"a": [("w2", ACTIVE), ("w3", STANDBY)]}


def test_the_first_surviving_standby_is_promoted() -> None:
    current = {"a": [("w1", ACTIVE), ("w3", STANDBY), ("w2", STANDBY)]}
    result = assign({"a": 3}, ["w2", "w3"], current)
    assert result == {"a": [("w3", ACTIVE), ("w2", STANDBY)]}


def test_a_datastream_whose_workers_all_died_moves_to_the_least_loaded_worker() -> None:
    current = {"a": [("w1", ACTIVE)], "b": [("w2", ACTIVE)], "c": [("w2", STANDBY)]}
    result = assign({"a": 1, "b": 1}, ["w2", "w3"], current)
    assert result["a"] == [("w3", ACTIVE)]
    assert result["b"] == [("w2", ACTIVE)]


def test_more_replicas_than_workers_places_as_many_as_there_are_workers() -> None:
    result = assign({"a": 4}, ["w1", "w2"], {})
    assert result == {"a": [("w1", ACTIVE), ("w2", STANDBY)]}


def test_no_live_workers_leaves_every_datastream_unplaced() -> None:
    assert assign({"a": 2}, [], {"a": [("w1", ACTIVE)]}) == {"a": []}


def test_a_datastream_that_is_no_longer_assigned_loses_its_placement() -> None:
    current = {"a": [("w1", ACTIVE)], "stopped": [("w2", ACTIVE)]}
    assert assign({"a": 1}, ["w1", "w2"], current) == {"a": [("w1", ACTIVE)]}


def test_fewer_replicas_keep_the_active() -> None:
    current = {"a": [("w1", ACTIVE), ("w2", STANDBY), ("w3", STANDBY)]}
    assert assign({"a": 1}, ["w1", "w2", "w3"], current) == {"a": [("w1", ACTIVE)]}


def test_the_result_does_not_depend_on_worker_or_datastream_order() -> None:
    replicas = {"a": 2, "b": 1, "c": 3, "d": 1}
    current = {"c": [("w4", ACTIVE), ("w2", STANDBY)], "a": [("w9", ACTIVE)]}
    workers = ["w1", "w2", "w3", "w4"]
    first = assign(replicas, workers, current)
    for perm in itertools.permutations(workers):
        shuffled_replicas = dict(reversed(list(replicas.items())))
        shuffled_current = dict(reversed(list(current.items())))
        assert assign(shuffled_replicas, list(perm), shuffled_current) == first


WORKERS = [f"w{i}" for i in range(5)]
NAMES = ["a", "b", "c", "d", "e"]


@st.composite
def inputs(draw: st.DrawFn) -> tuple[dict[str, int], list[str], dict[str, Placement]]:
    replicas = draw(st.dictionaries(st.sampled_from(NAMES), st.integers(1, 4), max_size=5))
    live = draw(st.lists(st.sampled_from(WORKERS), unique=True, max_size=5))
    current: dict[str, Placement] = {}
    for name in draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=5)):
        holders = draw(st.lists(st.sampled_from(WORKERS), unique=True, min_size=1, max_size=4))
        current[name] = [(holders[0], ACTIVE)] + [(w, STANDBY) for w in holders[1:]]
    return replicas, live, current


@settings(max_examples=300, deadline=None, print_blob=True)
@given(inputs())
def test_assignment_invariants_hold_for_any_input(
    case: tuple[dict[str, int], list[str], dict[str, Placement]],
) -> None:
    replicas, live, current = case
    note(f"replicas={replicas} live={live} current={current}")
    result = assign(replicas, live, current)
    assert set(result) == set(replicas)
    for name, placement in result.items():
        holders = [w for w, _ in placement]
        assert len(holders) == len(set(holders)), "a worker holds a datastream twice"
        assert set(holders) <= set(live), "a dead worker keeps a placement"
        assert len(placement) == min(replicas[name], len(live))
        if placement:
            assert placement[0][1] == ACTIVE
            assert all(role == STANDBY for _, role in placement[1:])
        # Sticky: live holders within the replica count stay; a live active stays active.
        kept = [w for w, _ in current.get(name, []) if w in live][: replicas[name]]
        assert set(kept) <= set(holders)
        old_active = next((w for w, r in current.get(name, []) if r == ACTIVE), None)
        if old_active in live:
            assert placement[0] == (old_active, ACTIVE)
        elif kept:
            assert placement[0] == (kept[0], ACTIVE), "the first surviving standby is promoted"
    assert assign(dict(reversed(list(replicas.items()))), list(reversed(live)), current) == result
