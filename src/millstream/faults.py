"""Named fault points: the one seam for crash tests, fault campaigns and operators' drills.

Production code calls :func:`hit` at each point of :data:`POINTS`, with the point's key (a
batch id, a partition) and the object that reached it (a sealer, a metadata store). With no
handler installed (the default), a point costs one check of an empty tuple.

Handlers are installed two ways:

* **In process** (tests): :func:`install` / :func:`installed` a handler, called as
  ``handler(point, key, source)`` at every point reached; it may raise (the code sees a
  failure at that point), wait, or record. :func:`fail` makes a handler that fails the next
  N hits of each named point with :class:`~millstream.errors.InjectedFault`, :func:`call`
  one that calls a function at some points; either may be limited to one ``source`` object.
* **From the environment** (process campaigns, drills): ``MILLSTREAM_FAULTS``, read when a
  process imports this module, is a comma-separated list of ``point[@key]=action``:
  ``hang`` writes ``<MILLSTREAM_FAULT_DIR>/<point>-<key>`` (the pid) and waits to be killed
  (a test SIGKILLs the process at exactly that moment), ``fail`` or ``fail*N`` raises
  :class:`~millstream.errors.InjectedFault` at the next N hits (1 by default). ``@key``
  limits an item to one key; without it, any key matches. Example:
  ``MILLSTREAM_FAULTS="before_commit@3=hang,before_swap=fail*2"``. A malformed item is
  refused when the module is imported, naming it.

A fault at a seal or compaction point fails that seal (retried like any failed seal; at
``after_swap`` / ``after_compact_swap`` only the cleanup is interrupted). A fault at a
metadata commit point is a failure during COMMIT: the transaction's outcome is unknown
(:class:`~millstream.errors.CommitStateUnknownError`), whether it landed (``after``) or not.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from millstream.errors import InjectedFault, InvalidSpecError

#: Every fault point: where it is, and what its key is.
POINTS: dict[str, str] = {
    "after_stage": "a write task staged its files (executor); key: the batch id",
    "before_commit": "the sink's commit, before compare_and_append (driver); key: the batch id",
    "after_commit": "after compare_and_append, before Spark's own commit log; key: the batch id",
    "before_build": "a seal, before it reads its run; key: the partition",
    "before_upload": "a seal, before it uploads its segment; key: the partition",
    "before_swap": "a seal, before its manifest swap; key: the partition",
    "after_swap": "a seal, after its swap (cleanup only); key: the partition",
    "before_compact_build": "a compaction, before it reads its segments; key: the partition",
    "before_compact_upload": "a compaction, before it uploads; key: the partition",
    "before_compact_swap": "a compaction, before its manifest swap; key: the partition",
    "after_compact_swap": "a compaction, after its swap (cleanup only); key: the partition",
    "renew_claim": "a running seal's claim renewal (its own thread); key: the partition",
    "before_metadata_commit": "a metadata write transaction, right before its COMMIT",
    "after_metadata_commit": "a metadata write transaction, right after its COMMIT",
}
#: The points of a seal, in the order a seal reaches them.
SEAL_POINTS = ("before_build", "before_upload", "before_swap", "after_swap")
#: The points of a compaction of sealed segments, in the order it reaches them.
COMPACTION_POINTS = (
    "before_compact_build",
    "before_compact_upload",
    "before_compact_swap",
    "after_compact_swap",
)
ENV = "MILLSTREAM_FAULTS"
DIR_ENV = "MILLSTREAM_FAULT_DIR"

#: ``handler(point, key, source)``
Handler = Callable[[str, Any, Any], None]

_handlers: tuple[Handler, ...] = ()
_lock = threading.Lock()


def hit(point: str, key: Any = None, source: Any = None) -> None:
    """Reach fault point ``point`` (one of :data:`POINTS`): every installed handler runs."""
    if not _handlers:
        return
    for handler in _handlers:
        handler(point, key, source)


def armed() -> bool:
    """Whether any handler is installed."""
    return bool(_handlers)


def install(handler: Handler) -> Callable[[], None]:
    """Install ``handler`` beside any already installed; returns what uninstalls it."""
    global _handlers
    with _lock:
        _handlers = (*_handlers, handler)

    def uninstall() -> None:
        global _handlers
        with _lock:
            _handlers = tuple(h for h in _handlers if h is not handler)

    return uninstall


@contextmanager
def installed(handler: Handler) -> Iterator[None]:
    """``handler`` installed for the ``with`` block."""
    uninstall = install(handler)
    try:
        yield
    finally:
        uninstall()


def uninstall_all() -> None:
    """Remove every handler, those from the environment included (a test's teardown)."""
    global _handlers
    with _lock:
        _handlers = ()


def _check(points: Iterable[str]) -> None:
    unknown = sorted(set(points) - set(POINTS))
    if unknown:
        raise InvalidSpecError("fault point", f"{unknown[0]!r} is not one of {', '.join(POINTS)}")


def fail(counts: Mapping[str, int], *, source: Any = None, key: Any = None) -> Handler:
    """A handler that raises :class:`~millstream.errors.InjectedFault` at the next
    ``counts[point]`` hits of each point (of ``source`` only, and of ``key`` only, if given)."""
    _check(counts)
    remaining = dict(counts)
    lock = threading.Lock()

    def handler(point: str, at: Any, by: Any) -> None:
        if (source is not None and by is not source) or (key is not None and str(at) != str(key)):
            return
        with lock:
            if remaining.get(point, 0) <= 0:
                return
            remaining[point] -= 1
        raise InjectedFault(point, at)

    return handler


def call(
    points: str | Iterable[str], fn: Callable[[str, Any], None], *, source: Any = None
) -> Handler:
    """A handler that calls ``fn(point, key)`` at ``points`` (of ``source`` only, if given)."""
    wanted = {points} if isinstance(points, str) else set(points)
    _check(wanted)

    def handler(point: str, key: Any, by: Any) -> None:
        if point in wanted and (source is None or by is source):
            fn(point, key)

    return handler


def hang(point: str, key: Any) -> None:
    """Write ``<MILLSTREAM_FAULT_DIR>/<point>-<key>`` (this pid) and wait to be killed."""
    marker = Path(os.environ.get(DIR_ENV, ".")) / f"{point}-{key}"
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(str(os.getpid()))
    while True:
        time.sleep(1)


def from_environment(value: str) -> list[Handler]:
    """The handlers ``MILLSTREAM_FAULTS`` = ``value`` asks for (see the module's docstring)."""
    handlers: list[Handler] = []
    for item in (i.strip() for i in value.split(",")):
        if not item:
            continue
        target, _, action = item.partition("=")
        point, _, key = target.partition("@")
        times = action.removeprefix("fail").removeprefix("*") if action.startswith("fail") else ""
        if point not in POINTS or not (action == "hang" or action == "fail" or times.isdigit()):
            raise InvalidSpecError(
                ENV, f"{item!r} is not point[@key]=hang|fail|fail*N (points: {', '.join(POINTS)})"
            )
        if action == "hang":
            handlers.append(_hang_at(point, key or None))
        else:
            handlers.append(fail({point: int(times or 1)}, key=key or None))
    return handlers


def _hang_at(point: str, key: str | None) -> Handler:
    def handler(at_point: str, at: Any, _by: Any) -> None:
        if at_point == point and (key is None or str(at) == key):
            hang(point, at)

    return handler


for _handler in from_environment(os.environ.get(ENV, "")):
    install(_handler)
