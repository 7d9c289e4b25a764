"""``millstream run`` seals in the background: the sealer starts only once its table exists,
and a failed pass is retried (with backoff) instead of ending sealing for good.

The production :meth:`DatastreamRunner.run` and its sealing loop run here; only the Spark
query (``start`` creates the tables and would start the query; ``_await`` waits for it) and
the Sealer are stand-ins.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from millstream.catalog import Catalog
from millstream.datastream import DatastreamSpec
from millstream.sealing.thresholds import Thresholds
from millstream.spark import runner as runner_module
from millstream.spark.runner import DatastreamRunner
from millstream.supervise import Backoff

#: Bound for something that must happen; never used to order anything.
WAIT = 10.0
PASSES = 3


@pytest.fixture
def catalog(tmp_path: Path) -> Iterator[Catalog]:
    with Catalog.open(home=tmp_path / "home") as cat:
        yield cat


def spec(tmp_path: Path) -> DatastreamSpec:
    return DatastreamSpec.parse(
        {
            "name": "orders",
            "source": {"kind": "files", "path": str(tmp_path / "source")},
            "schema": {"id": "long", "amount": "long"},
            "table": {"mode": "upsert", "primary_key": ["id"]},
        }
    )


class Timeline:
    def __init__(self) -> None:
        self.events: list[str] = []
        self._lock = threading.Lock()
        self.sealed = threading.Event()

    def add(self, event: str) -> None:
        with self._lock:
            self.events.append(event)


def test_run_starts_sealing_once_the_table_exists_and_keeps_sealing_after_a_failed_pass(
    catalog: Catalog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    timeline = Timeline()

    class FlakySealer:
        """Fails its first pass (the metadata store was unreachable, say), then seals."""

        def __init__(
            self, cat: Catalog, table: str, *, thresholds: Thresholds, compaction: object
        ) -> None:
            self.cat, self.table, self.passes = cat, table, 0
            self.failures: dict[int, int] = {}
            self.last_error: dict[int, str] = {}
            timeline.add("sealer started")

        def seal_due(self) -> list[Any]:
            self.cat.store.get_table(self.table)  # TableNotFoundError before the table exists
            self.passes += 1
            if self.passes == 1:
                raise ConnectionError("metadata store unreachable")
            timeline.add("sealed")
            if self.passes > PASSES:
                timeline.sealed.set()
            return []

        def checkpoint(self, *, force: bool = False) -> int:
            timeline.add("checkpointed")
            return 0

        def status(self) -> dict[str, object]:
            return {"failures": {}, "last_error": {}}

    monkeypatch.setattr(runner_module, "Sealer", FlakySealer)
    runner = DatastreamRunner(
        spec(tmp_path), catalog, spark=None, writer_id="w1", background_sealing=True
    )
    runner.seal_interval = 0.001
    runner.seal_backoff = Backoff(base=0.001, cap=0.01)
    kept_sealing: list[bool] = []

    def start(*, available_now: bool) -> None:  # what Spark's start does first
        runner.ensure_tables()
        timeline.add("tables created")

    def await_query(on_tick: Any, tick: float) -> None:  # the query runs until sealed enough
        kept_sealing.append(timeline.sealed.wait(WAIT))

    monkeypatch.setattr(runner, "start", start)
    monkeypatch.setattr(runner, "_await", await_query)

    runner.run(available_now=False)

    assert timeline.events[:2] == ["tables created", "sealer started"], timeline.events
    assert kept_sealing == [True], f"sealing stopped after its failed pass: {timeline.events}"
    assert timeline.events[-1] == "checkpointed"  # on stop, for the next start
    status = runner.sealing_status()
    assert status is not None
    assert status["errors"] == 1 and status["consecutive_failures"] == 0
    assert status["runs"] >= PASSES and not status["alive"]
    assert status["last_error"] == "ConnectionError: metadata store unreachable"
    assert status["table"] == "orders"
