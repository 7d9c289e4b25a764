"""A worker heartbeats on its own thread: a tick that waits (stopping a writer joins its
thread for up to a minute) does not make the worker look dead to the warm standbys of its
other writers, which would otherwise take over after the takeover TTL."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from millstream.catalog import Catalog
from millstream.control.controller import ControlSettings
from millstream.control.worker import Worker
from millstream.control.workers import list_workers


def _beat(catalog: Catalog) -> float:
    (w,) = list_workers(catalog.store)
    return w.heartbeat_at


def test_a_worker_whose_tick_waits_keeps_heartbeating(tmp_path: Path) -> None:
    catalog = Catalog.open(home=tmp_path / "home")
    settings = ControlSettings(tick_seconds=0.1)
    worker = Worker(catalog, None, worker_id="w", settings=settings, state_root=tmp_path / "st")
    in_tick = threading.Event()
    release = threading.Event()

    def stuck_tick() -> None:  # e.g. stopping a writer whose query takes long to stop
        in_tick.set()
        release.wait(60)

    worker.tick = stuck_tick  # type: ignore[method-assign]
    service = threading.Thread(target=worker.run_forever, daemon=True)
    service.start()
    try:
        assert in_tick.wait(30)
        first = _beat(catalog)
        deadline = time.monotonic() + 30
        while _beat(catalog) <= first + 3 * settings.tick_seconds:
            assert time.monotonic() < deadline, "no heartbeat while the tick was stuck"
            time.sleep(0.05)
    finally:
        release.set()
        worker.stop()
        service.join(30)
        catalog.close()
