"""Fault handlers of one sealer or one metadata store, installed on the one fault seam
(:mod:`millstream.faults`); tests/conftest.py uninstalls every handler after each test."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from millstream import faults


def at_sealer(
    sealer: Any,
    *,
    fail: Mapping[str, int] | None = None,
    hook: Callable[[str, int], None] | None = None,
) -> Callable[[], None]:
    """At ``sealer``'s seal, compaction and claim-renewal points only: fail the next
    ``fail[point]`` hits of each point, and/or call ``hook(point, partition)`` at every one
    (before any fail). Returns what uninstalls both."""
    undo = []
    if hook is not None:
        undo.append(faults.install(faults.call(faults.POINTS, hook, source=sealer)))
    if fail:
        undo.append(faults.install(faults.fail(fail, source=sealer)))

    def uninstall() -> None:
        for u in undo:
            u()

    return uninstall


def at_commit(store: Any, fn: Callable[[bool], None]) -> Callable[[], None]:
    """``fn(landed)`` right before (False) and right after (True) every COMMIT of ``store``'s
    write transactions; an exception it raises is a failure during COMMIT (an unknown
    outcome). Returns what uninstalls it."""

    def at(point: str, _key: Any) -> None:
        fn(point == "after_metadata_commit")

    return faults.install(
        faults.call(("before_metadata_commit", "after_metadata_commit"), at, source=store)
    )
