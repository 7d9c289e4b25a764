"""A writer that fails for a reason outside the lifecycle (a broker briefly down, say) is
restarted by its worker after a backoff, with its state-directory lock released first; it is
not retried before the backoff and never stuck behind its own old lock."""

from __future__ import annotations

from pathlib import Path

from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.control.controller import Controller, ControlSettings
from millstream.control.registry import Registry
from millstream.control.worker import Worker
from millstream.control.workers import heartbeat
from millstream.datastream import DatastreamSpec


def test_a_failed_writer_is_retried_after_a_backoff_with_its_lock_released(tmp_path: Path) -> None:
    clock = ManualClock(start=1_800_000_000.0)
    catalog = Catalog.open(home=tmp_path / "home")
    src = tmp_path / "src" / "0"
    src.mkdir(parents=True)
    (src / "0.jsonl").write_text('{"id": 1}\n')
    spec = DatastreamSpec.parse(
        {
            "name": "ds",
            "source": {"kind": "files", "path": str(tmp_path / "src")},
            "schema": {"id": "long"},
            "table": {"mode": "upsert", "primary_key": ["id"]},
        }
    )
    Registry(catalog.store, clock=clock).create(spec)
    heartbeat(catalog.store, "w", status="RUNNING", info={}, clock=clock)
    Controller(catalog, controller_id="c", clock=clock).tick()  # READY, assigned to w
    # spark=None: every start fails at once, as a writer whose source is unreachable would.
    worker = Worker(
        catalog,
        None,
        worker_id="w",
        settings=ControlSettings(),
        clock=clock,
        state_root=tmp_path / "state",
    )

    worker.tick()
    first = worker.writers["ds"]
    assert first.thread is not None
    first.thread.join(10)
    assert first.error is not None and not first.running

    worker.tick()  # within the backoff: not retried
    assert worker.writers["ds"] is first

    clock.advance(6)
    worker.tick()
    second = worker.writers["ds"]
    assert second is not first and second.failures == 1
    assert second.state_dir.held and not first.state_dir.held
    assert second.thread is not None
    second.thread.join(10)
    second.state_dir.unlock()
