"""Supervised background loops: an error is logged with its ids, counted, backed off and
visible in the loop's status; the loop lives on and the next success clears the streak."""

from __future__ import annotations

import dataclasses
import logging
import random
import threading

import pytest

from millstream.clock import ManualClock
from millstream.errors import MillstreamError
from millstream.supervise import Backoff, SupervisedLoop

JOIN = 10.0  # bound for a thread that must finish; never used to order anything


class FlakyStep:
    """Fails with ``errors`` in turn, then succeeds; counts its calls."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0
        self.succeeded = threading.Event()

    def __call__(self) -> None:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        self.succeeded.set()


def test_a_failed_step_is_logged_with_its_ids_backed_off_and_recorded_then_the_next_succeeds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock()
    step = FlakyStep(MillstreamError("seal swap lost its connection", partition=3))
    loop = SupervisedLoop(
        "sealer",
        step,
        interval=1.0,
        table="orders",
        clock=clock,
        backoff=Backoff(base=4.0, cap=60.0, jitter=0.5),
        rng=random.Random(7),
    )

    with caplog.at_level(logging.WARNING, logger="millstream.supervise"):
        wait = loop.run_once()  # survives: nothing raised

    assert 2.0 <= wait <= 4.0  # the backoff (base 4 s, jitter 50%), not the 1 s interval
    failed = loop.status()
    assert (failed.errors, failed.consecutive_failures, failed.runs) == (1, 1, 0)
    assert failed.last_error == "MillstreamError: seal swap lost its connection"
    assert failed.last_error_at == clock.now()
    assert failed.next_attempt_at == pytest.approx(clock.now() + wait)
    assert failed.last_success_at is None
    assert not loop.supervisor.due()
    [record] = caplog.records
    assert "'sealer', table 'orders', partition 3" in record.getMessage()
    assert record.exc_info is not None  # the first failure of a streak carries its traceback

    clock.advance(wait)
    assert loop.supervisor.due()
    assert loop.run_once() == 1.0  # back to the interval
    healthy = loop.status()
    assert (healthy.errors, healthy.consecutive_failures, healthy.runs) == (1, 0, 1)
    assert healthy.last_success_at == clock.now() and healthy.next_attempt_at is None
    assert healthy.last_error == failed.last_error  # the last error stays visible
    assert "ok, last success 0s ago (1 errors so far" in healthy.describe(clock.now())


def test_consecutive_failures_double_the_backoff_up_to_its_cap_and_jitter_only_shortens_it() -> (
    None
):
    clock = ManualClock()
    exact = SupervisedLoop(
        "sealer",
        FlakyStep(*(RuntimeError(f"down {i}") for i in range(8))),
        interval=1.0,
        clock=clock,
        backoff=Backoff(base=1.0, cap=30.0, jitter=0.0),
    )
    assert [exact.run_once() for _ in range(7)] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    status = exact.status()
    assert (status.errors, status.consecutive_failures) == (7, 7)
    assert "failing (7 in a row" in status.describe(clock.now())

    rng = random.Random(1)
    backoff = Backoff(base=1.0, cap=30.0, jitter=0.5)
    for failures, full in [(1, 1.0), (3, 4.0), (9, 30.0)]:
        for _ in range(50):
            assert full * 0.5 <= backoff.delay(failures, rng) <= full


def test_a_supervised_thread_outlives_an_error_and_keeps_running_until_stopped() -> None:
    step = FlakyStep(RuntimeError("first pass fails"))
    stopped = threading.Event()
    loop = SupervisedLoop(
        "sealer",
        step,
        interval=0.001,
        table="orders",
        backoff=Backoff(base=0.001, cap=0.01),
        on_stop=stopped.set,
    ).start()
    try:
        assert step.succeeded.wait(JOIN), "the loop died with its first error"
        assert loop.alive
    finally:
        loop.stop(timeout=JOIN)
    assert stopped.is_set() and not loop.alive
    status = loop.status()
    assert status.errors == 1 and status.runs >= 1 and status.consecutive_failures == 0
    assert not status.alive and status.describe(0.0).startswith("sealer of orders: STOPPED, ok")


def test_a_loop_status_as_reported_carries_every_field_of_the_status() -> None:
    """What the heartbeat, debugInfo and the metrics read of a loop: every field of its status
    (a field added to the status is reported without touching ``to_dict``'s callers)."""
    clock = ManualClock()
    loop = SupervisedLoop(
        "sealer", FlakyStep(MillstreamError("lost", partition=1)), interval=1.0, clock=clock
    )
    loop.run_once()
    status = loop.status()
    assert status.to_dict() == dataclasses.asdict(status)
    assert status.to_dict()["errors"] == 1 and status.to_dict()["last_error"]
