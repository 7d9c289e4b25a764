"""The process campaign's lifecycle checker: what it accepts and what it flags. A false alarm
(the first long run flagged a resume that found a datastream STOPPED after an earlier resume
was refused while it was STOPPING) sends people after bugs that are not there; a missed
contradiction hides one."""

from __future__ import annotations

from harness.chaos.process import LifecycleModel
from millstream.core.lifecycle import Command, State


def test_a_stopping_datastream_may_be_stopped_by_the_next_command() -> None:
    model = LifecycleModel()
    assert model.apply(Command.STOP, 200, "STOPPING") == ""
    assert model.apply(Command.RESUME, 409, None) == ""  # refused while STOPPING ...
    assert model.apply(Command.RESUME, 200, "READY") == ""  # ... allowed once it is STOPPED
    assert model.settled() == {State.READY}


def test_an_answer_the_lifecycle_table_forbids_is_flagged() -> None:
    model = LifecycleModel()
    assert model.apply(Command.STOP, 200, "STOPPING") == ""
    assert "may only lead to" in model.apply(Command.PAUSE, 200, "PAUSED")


def test_a_refusal_where_every_possible_state_allows_the_command_is_flagged() -> None:
    model = LifecycleModel()  # READY
    assert "refused (409)" in model.apply(Command.PAUSE, 409, None)


def test_an_unknown_outcome_allows_either_state() -> None:
    model = LifecycleModel()
    assert model.apply(Command.PAUSE, None, None) == ""
    assert model.settled() == {State.READY, State.PAUSED}
