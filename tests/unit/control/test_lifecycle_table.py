"""The lifecycle table (docs/design.md, "Control plane"), checked pair by pair against a copy
written out from the design text, so a change to either shows up here:

    INITIALIZING -> READY <-> PAUSED
    READY | PAUSED -> STOPPING -> STOPPED -> READY (resume)
    any -> ERROR;  ERROR -> READY (resume)
    any -> DELETING -> gone
"""

from __future__ import annotations

import itertools

import pytest

from millstream.core.lifecycle import (
    TRANSITIONS,
    Command,
    State,
    check_transition,
    command_target,
)
from millstream.errors import InvalidTransitionError

S = State
#: The design's transitions, written out independently of ``TRANSITIONS``.
DESIGN_TRANSITIONS: dict[State, set[State]] = {
    S.INITIALIZING: {S.READY, S.ERROR, S.DELETING},
    S.READY: {S.PAUSED, S.STOPPING, S.ERROR, S.DELETING},
    S.PAUSED: {S.READY, S.STOPPING, S.ERROR, S.DELETING},
    S.STOPPING: {S.STOPPED, S.ERROR, S.DELETING},
    S.STOPPED: {S.READY, S.ERROR, S.DELETING},
    S.ERROR: {S.READY, S.DELETING},
    S.DELETING: set(),  # DELETING -> gone is a removal, not a state
}

#: What each user command does, by the state it finds; every other pair is refused.
DESIGN_COMMANDS: dict[tuple[State, Command], State] = {
    (S.READY, Command.PAUSE): S.PAUSED,
    (S.PAUSED, Command.RESUME): S.READY,
    (S.STOPPED, Command.RESUME): S.READY,
    (S.ERROR, Command.RESUME): S.READY,
    (S.READY, Command.STOP): S.STOPPING,
    (S.PAUSED, Command.STOP): S.STOPPING,
    **{(s, Command.DELETE): S.DELETING for s in State if s is not S.DELETING},
}

#: The state each command asks for (named in the error when it is refused).
WANTED = {
    Command.PAUSE: S.PAUSED,
    Command.RESUME: S.READY,
    Command.STOP: S.STOPPING,
    Command.DELETE: S.DELETING,
}

PAIRS = list(itertools.product(State, State))
COMMAND_PAIRS = list(itertools.product(State, Command))


def test_transition_table_is_the_design_table() -> None:
    assert {k: set(v) for k, v in TRANSITIONS.items()} == DESIGN_TRANSITIONS


def test_every_state_can_fail_and_be_deleted_except_while_deleting() -> None:
    for state in State:
        if state in (S.ERROR, S.DELETING):
            continue
        assert {S.ERROR, S.DELETING} <= TRANSITIONS[state], state
    assert TRANSITIONS[S.ERROR] == {S.READY, S.DELETING}
    assert TRANSITIONS[S.DELETING] == frozenset()


@pytest.mark.parametrize(("from_state", "to_state"), PAIRS, ids=lambda s: s.value)
def test_check_transition_allows_exactly_the_design_pairs(
    from_state: State, to_state: State
) -> None:
    if to_state in DESIGN_TRANSITIONS[from_state]:
        check_transition("orders", from_state, to_state)
        return
    with pytest.raises(InvalidTransitionError) as err:
        check_transition("orders", from_state, to_state)
    assert err.value.fields["from_state"] == from_state.value
    assert err.value.fields["to_state"] == to_state.value
    assert err.value.fields["name"] == "orders"


@pytest.mark.parametrize(("state", "command"), COMMAND_PAIRS, ids=lambda x: x.value)
def test_every_command_in_every_state_moves_to_its_target_or_names_the_allowed_states(
    state: State, command: Command
) -> None:
    expected = DESIGN_COMMANDS.get((state, command))
    if expected is not None:
        assert command_target("orders", command, state) is expected
        assert expected in DESIGN_TRANSITIONS[state]
        return
    with pytest.raises(InvalidTransitionError) as err:
        command_target("orders", command, state)
    exc = err.value
    assert exc.fields == {
        "name": "orders",
        "from_state": state.value,
        "to_state": WANTED[command].value,
    }
    allowed = sorted(s.value for s in DESIGN_TRANSITIONS[state])
    tail = ", ".join(allowed) if allowed else "nothing"
    assert exc.message == (
        f"datastream 'orders' cannot go from {state.value} to {WANTED[command].value}; "
        f"from {state.value} it may go to: {tail}"
    )


def test_commands_only_ever_target_states_reachable_by_one_legal_transition() -> None:
    for (state, _), target in DESIGN_COMMANDS.items():
        assert target in TRANSITIONS[state]


def test_deleting_twice_is_refused_and_says_nothing_is_allowed() -> None:
    with pytest.raises(InvalidTransitionError, match="it may go to: nothing"):
        command_target("orders", Command.DELETE, S.DELETING)
