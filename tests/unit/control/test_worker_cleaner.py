"""A worker's tick deletes state directories nobody holds once they were idle longer than
``state_cleanup_delay``, and never one a writer holds."""

from __future__ import annotations

import os
from pathlib import Path

from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.control.controller import ControlSettings
from millstream.control.worker import Worker
from millstream.storage.statedir import StateDirectory


def test_worker_tick_cleans_idle_unlocked_state_dirs_and_keeps_held_ones(tmp_path: Path) -> None:
    clock = ManualClock(start=1_800_000_000.0)
    catalog = Catalog.open(home=tmp_path / "home")
    root = tmp_path / "state"
    worker = Worker(
        catalog,
        spark=None,
        worker_id="w",
        settings=ControlSettings(state_cleanup_delay=600.0),
        clock=clock,
        state_root=root,
    )
    idle, held, fresh = (StateDirectory(root, n) for n in ("idle", "held", "fresh"))
    for sd in (idle, held, fresh):
        sd.lock()
        sd.write_checkpoint("checkpoint/millstream.json", b"{}")
    idle.unlock()
    fresh.unlock()
    old = clock.now() - 3600
    os.utime(idle.path, (old, old))
    os.utime(held.path, (old, old))
    os.utime(fresh.path, (clock.now() - 60, clock.now() - 60))

    worker.tick()

    assert not idle.path.exists()
    assert held.path.exists() and fresh.path.exists()
    held.unlock()
