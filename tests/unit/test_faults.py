"""The one fault seam (:mod:`millstream.faults`): the environment form the process campaigns
and drills use, and the in-process handlers' scoping."""

from __future__ import annotations

import pytest

from millstream import faults
from millstream.errors import InjectedFault, InvalidSpecError


def test_the_environment_form_fails_the_next_hits_of_a_point_and_only_for_its_key() -> None:
    for handler in faults.from_environment("before_swap=fail*2, before_commit@3=fail"):
        faults.install(handler)
    for _ in range(2):
        with pytest.raises(InjectedFault, match="before_swap"):
            faults.hit("before_swap", 0)
    faults.hit("before_swap", 0)  # the two are spent
    faults.hit("before_commit", 2)  # another batch
    with pytest.raises(InjectedFault, match=r"before_commit \(3\)"):
        faults.hit("before_commit", 3)
    faults.hit("before_commit", 3)


@pytest.mark.parametrize(
    "item", ["before_swap:2", "no_such_point=fail", "before_swap=fail*x", "after_stage=crash"]
)
def test_a_malformed_environment_item_is_refused_naming_it(item: str) -> None:
    with pytest.raises(InvalidSpecError, match="MILLSTREAM_FAULTS") as raised:
        faults.from_environment(f"after_commit=hang,{item}")
    assert repr(item) in str(raised.value)


def test_a_handler_for_one_source_leaves_the_others_alone() -> None:
    mine, other = object(), object()
    seen: list[tuple[str, object]] = []
    uninstall = faults.install(
        faults.call("before_build", lambda p, k: seen.append((p, k)), source=mine)
    )
    faults.install(faults.fail({"before_swap": 1}, source=mine))
    faults.hit("before_build", 1, other)
    faults.hit("before_swap", 1, other)
    faults.hit("before_build", 2, mine)
    with pytest.raises(InjectedFault):
        faults.hit("before_swap", 2, mine)
    assert seen == [("before_build", 2)]
    uninstall()
    faults.hit("before_build", 3, mine)
    assert seen == [("before_build", 2)]


def test_nothing_installed_is_nothing_armed() -> None:
    assert not faults.armed()
    faults.hit("before_swap", 0)  # a no-op
    with faults.installed(faults.fail({"before_swap": 1})):
        assert faults.armed()
    assert not faults.armed()
