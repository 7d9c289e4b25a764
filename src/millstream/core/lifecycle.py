"""The datastream lifecycle: every transition in one table (docs/design.md, "Control plane").

    INITIALIZING -> READY <-> PAUSED
    READY | PAUSED -> STOPPING -> STOPPED -> READY (resume)
    any -> ERROR;  ERROR -> READY (resume)
    any -> DELETING -> gone

Commands (what a user asks for) map to a target state; asynchronous completions
(INITIALIZING -> READY, STOPPING -> STOPPED, DELETING -> gone) carry the state they expect and
apply only if the record is still in it (Brooklin #974: a late stop completion must never move a
resumed datastream back to STOPPED).
"""

from __future__ import annotations

import enum

from millstream.errors import InvalidTransitionError


class State(enum.StrEnum):
    INITIALIZING = "INITIALIZING"
    READY = "READY"
    PAUSED = "PAUSED"
    STOPPING = "STOPPING"
    STOPPED = "STOPPED"
    ERROR = "ERROR"
    DELETING = "DELETING"


S = State
#: from-state -> states it may move to. ERROR and DELETING are reachable from anywhere.
TRANSITIONS: dict[State, frozenset[State]] = {
    S.INITIALIZING: frozenset({S.READY, S.ERROR, S.DELETING}),
    S.READY: frozenset({S.PAUSED, S.STOPPING, S.ERROR, S.DELETING}),
    S.PAUSED: frozenset({S.READY, S.STOPPING, S.ERROR, S.DELETING}),
    S.STOPPING: frozenset({S.STOPPED, S.ERROR, S.DELETING}),
    S.STOPPED: frozenset({S.READY, S.ERROR, S.DELETING}),
    S.ERROR: frozenset({S.READY, S.DELETING}),
    S.DELETING: frozenset(),
}


class Command(enum.StrEnum):
    PAUSE = "pause"
    RESUME = "resume"
    STOP = "stop"
    DELETE = "delete"


#: What a user command asks for, by the state it finds.
COMMAND_TARGETS: dict[Command, dict[State, State]] = {
    Command.PAUSE: {S.READY: S.PAUSED},
    Command.RESUME: {S.PAUSED: S.READY, S.STOPPED: S.READY, S.ERROR: S.READY},
    Command.STOP: {S.READY: S.STOPPING, S.PAUSED: S.STOPPING},
    Command.DELETE: {s: S.DELETING for s in State if s is not S.DELETING},
}

#: States a running writer should be consuming in.
CONSUMING_STATES = frozenset({S.READY})
#: States in which writers are assigned (a paused writer holds its position, not consuming).
ASSIGNED_STATES = frozenset({S.READY, S.PAUSED})


def allowed(from_state: State) -> list[str]:
    return sorted(s.value for s in TRANSITIONS[from_state])


def check_transition(name: str, from_state: State, to_state: State) -> None:
    if to_state not in TRANSITIONS[from_state]:
        raise InvalidTransitionError(name, from_state.value, to_state.value, allowed(from_state))


def command_target(name: str, command: Command, current: State) -> State:
    """The state ``command`` moves a datastream in ``current`` to, or InvalidTransitionError."""
    target = COMMAND_TARGETS[command].get(current)
    if target is None:
        wanted = {
            Command.PAUSE: S.PAUSED,
            Command.RESUME: S.READY,
            Command.STOP: S.STOPPING,
            Command.DELETE: S.DELETING,
        }[command]
        raise InvalidTransitionError(name, current.value, wanted.value, allowed(current))
    check_transition(name, current, target)
    return target
