"""Supervision of background loops: a loop that survives its errors, backs off, and says so.

A background thread without a supervisor dies on its first exception and nobody knows: the
sealer of ``millstream run`` did, and its table was never sealed again. Here:

* :class:`Supervisor` runs the steps of one task (a loop, or one table inside a loop). It
  catches every ``Exception``, logs it with the ids involved (loop, table, and the partition
  when the error names one; the first failure of a streak with its traceback), counts it, and
  schedules the next attempt after a capped exponential backoff with jitter. A success resets
  the backoff. :meth:`Supervisor.status` is what an operator sees: in the worker heartbeat,
  ``/tables/{t}/debugInfo``, the ``millstream_background_errors_total`` metric and the progress
  of ``millstream run``.
* :class:`SupervisedLoop` runs a step on its own daemon thread every ``interval`` seconds under
  a supervisor; after a failure it waits the backoff instead of the interval.

``BaseException`` (``KeyboardInterrupt``, ``SystemExit``) is not caught: the loop ends and its
status says ``alive: false``.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ParamSpec

from millstream.clock import SYSTEM_CLOCK, Clock
from millstream.errors import InvalidSpecError, MillstreamError

log = logging.getLogger(__name__)

P = ParamSpec("P")


@dataclass(frozen=True, slots=True)
class Backoff:
    """Capped exponential backoff with jitter: after the n-th failure in a row the next attempt
    waits ``min(cap, base * 2**(n-1))`` seconds, scaled by a random factor in
    ``[1 - jitter, 1]`` so that loops failing together do not retry together."""

    base: float = 1.0
    cap: float = 60.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if not 0 < self.base <= self.cap:
            raise InvalidSpecError("backoff", f"need 0 < base <= cap, got {self.base}, {self.cap}")
        if not 0 <= self.jitter < 1:
            raise InvalidSpecError("backoff", f"jitter must be in [0, 1), got {self.jitter}")

    def delay(self, failures: int, rng: random.Random) -> float:
        """Seconds to wait after ``failures`` consecutive failures (``failures >= 1``)."""
        capped = min(self.cap, self.base * 2.0 ** min(max(0, failures - 1), 62))
        return capped * (1.0 - self.jitter * rng.random())


@dataclass(frozen=True, slots=True)
class LoopStatus:
    """A supervised task as an operator sees it. Times are the supervisor clock's seconds."""

    loop: str
    table: str | None
    #: Whether the thread running the task is alive.
    alive: bool
    #: Successful steps.
    runs: int
    #: Failed steps, in all.
    errors: int
    #: Failed steps since the last success (0 when healthy).
    consecutive_failures: int
    last_error: str | None
    last_error_at: float | None
    last_success_at: float | None
    #: When the next attempt is due while backing off; None when healthy.
    next_attempt_at: float | None

    def to_dict(self) -> dict[str, Any]:
        # Its fields are plain values: ``dataclasses.asdict`` copied each one deeply, a fifth
        # of building a worker's status at 100 tables (issue 38)
        return {
            "loop": self.loop,
            "table": self.table,
            "alive": self.alive,
            "runs": self.runs,
            "errors": self.errors,
            "consecutive_failures": self.consecutive_failures,
            "last_error": self.last_error,
            "last_error_at": self.last_error_at,
            "last_success_at": self.last_success_at,
            "next_attempt_at": self.next_attempt_at,
        }

    def describe(self, now: float) -> str:
        """One line: ``sealer of orders: ok, last success 3s ago`` or what is failing."""
        name = self.loop if self.table is None else f"{self.loop} of {self.table}"
        if self.consecutive_failures:
            retry = max(0.0, (self.next_attempt_at or now) - now)
            state = (
                f"failing ({self.consecutive_failures} in a row, {self.errors} errors in all; "
                f"retry in {retry:.0f}s): {self.last_error}"
            )
        else:
            if self.last_success_at is None:
                state = "no pass yet"
            else:
                state = f"ok, last success {max(0.0, now - self.last_success_at):.0f}s ago"
            if self.errors:
                state += f" ({self.errors} errors so far, last: {self.last_error})"
        return f"{name}: {state if self.alive else 'STOPPED, ' + state}"


def describe_error(exc: BaseException) -> str:
    """``TypeName: first line of the message`` (bounded), for logs and statuses."""
    text = str(exc).splitlines()[0][:1000] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Supervisor:
    """Runs the steps of one task, survives their errors and keeps its status. Thread-safe:
    steps run on one thread, :meth:`status` may be read from any."""

    def __init__(
        self,
        loop: str,
        *,
        table: str | None = None,
        clock: Clock = SYSTEM_CLOCK,
        backoff: Backoff | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.loop = loop
        self.table = table
        self.clock = clock
        self.backoff = backoff or Backoff()
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._runs = 0
        self._errors = 0
        self._consecutive = 0
        self._last_error: str | None = None
        self._last_error_at: float | None = None
        self._last_success_at: float | None = None
        self._next_attempt_at: float | None = None

    def due(self) -> bool:
        """Whether the next attempt may run (not backing off, or the backoff has passed)."""
        with self._lock:
            return self._next_attempt_at is None or self.clock.now() >= self._next_attempt_at

    def retry_in(self) -> float:
        """Seconds until the next attempt is due (0 when it is)."""
        with self._lock:
            if self._next_attempt_at is None:
                return 0.0
            return max(0.0, self._next_attempt_at - self.clock.now())

    def attempt(self, step: Callable[P, object], *args: P.args, **kwargs: P.kwargs) -> bool:
        """Run ``step(*args, **kwargs)``; whether it succeeded. Never raises an ``Exception``."""
        try:
            step(*args, **kwargs)
        except Exception as exc:  # supervision: every error is recorded, none ends the loop
            self._failed(exc)
            return False
        self._succeeded()
        return True

    def status(self, *, alive: bool) -> LoopStatus:
        with self._lock:
            return LoopStatus(
                loop=self.loop,
                table=self.table,
                alive=alive,
                runs=self._runs,
                errors=self._errors,
                consecutive_failures=self._consecutive,
                last_error=self._last_error,
                last_error_at=self._last_error_at,
                last_success_at=self._last_success_at,
                next_attempt_at=self._next_attempt_at,
            )

    def _succeeded(self) -> None:
        with self._lock:
            recovered = self._consecutive
            self._runs += 1
            self._consecutive = 0
            self._next_attempt_at = None
            self._last_success_at = self.clock.now()
        if recovered:
            log.info("background loop %s recovered after %d failures", self._ids(None), recovered)

    def _failed(self, exc: Exception) -> None:
        reason = describe_error(exc)
        with self._lock:
            now = self.clock.now()
            self._errors += 1
            self._consecutive += 1
            self._last_error = reason
            self._last_error_at = now
            delay = self.backoff.delay(self._consecutive, self._rng)
            self._next_attempt_at = now + delay
            consecutive, errors = self._consecutive, self._errors
        log.warning(
            "background loop %s failed (%d in a row, %d errors in all); retrying in %.1fs: %s",
            self._ids(exc),
            consecutive,
            errors,
            delay,
            reason,
            exc_info=exc if consecutive == 1 else None,  # the traceback once per streak
        )

    def _ids(self, exc: Exception | None) -> str:
        fields = exc.fields if isinstance(exc, MillstreamError) else {}
        parts = [repr(self.loop)]
        table = self.table or fields.get("table")
        if table is not None:
            parts.append(f"table {table!r}")
        if fields.get("partition") is not None:
            parts.append(f"partition {fields['partition']}")
        return ", ".join(parts)


class SupervisedLoop:
    """Runs ``step`` every ``interval`` seconds on a daemon thread, under a :class:`Supervisor`:
    an error is logged, counted and followed by a backoff, never the end of the loop.
    ``on_stop`` runs (supervised too) once the loop is stopped."""

    def __init__(
        self,
        loop: str,
        step: Callable[[], object],
        *,
        interval: float,
        table: str | None = None,
        clock: Clock = SYSTEM_CLOCK,
        backoff: Backoff | None = None,
        rng: random.Random | None = None,
        on_stop: Callable[[], object] | None = None,
        thread_name: str | None = None,
    ) -> None:
        if interval <= 0:
            raise InvalidSpecError("interval", f"must be positive, got {interval}")
        self.step = step
        self.interval = interval
        self.on_stop = on_stop
        self.supervisor = Supervisor(loop, table=table, clock=clock, backoff=backoff, rng=rng)
        self.thread_name = thread_name or (loop if table is None else f"{loop}-{table}")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def status(self) -> LoopStatus:
        return self.supervisor.status(alive=self.alive)

    def run_once(self) -> float:
        """One supervised step; the seconds to wait before the next (the interval, or the
        backoff after a failure)."""
        if self.supervisor.attempt(self.step):
            return self.interval
        return self.supervisor.retry_in()

    def start(self) -> SupervisedLoop:
        if self._thread is not None:
            raise RuntimeError(
                f"background loop {self.thread_name!r} was already started; a loop runs once "
                "(create a new one to run it again)"
            )
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()
        return self

    def stop(self, *, timeout: float | None = 60.0) -> None:
        """Stop after the current step (and ``on_stop``); wait up to ``timeout`` seconds."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _run(self) -> None:
        delay = self.interval
        while not self._stop.wait(delay):
            delay = self.run_once()
        if self.on_stop is not None:
            self.supervisor.attempt(self.on_stop)
