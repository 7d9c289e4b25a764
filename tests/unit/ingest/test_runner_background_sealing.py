"""``millstream run`` seals in the background: the sealer starts only once its table exists,
and a failed pass is retried (with backoff) instead of ending sealing for good; and it expires
history and collects files as a worker does.

The production :meth:`DatastreamRunner.run` and its sealing loop run here; only the Spark
query (``start`` creates the tables and would start the query; ``_await`` waits for it) and
the Sealer are stand-ins.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from millstream.catalog import Catalog
from millstream.datastream import DatastreamSpec
from millstream.sealing.thresholds import Thresholds
from millstream.spark import runner as runner_module
from millstream.spark.runner import DatastreamRunner
from millstream.supervise import Backoff
from millstream.table.writer import commit_staged, stage_rows

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

    def start() -> None:  # what Spark's start does first
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


def test_run_expires_history_and_collects_files_in_the_background(
    catalog: Catalog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A standalone ``millstream run`` maintains its tables as a worker does: versions its
    retention no longer keeps expire while the query runs (the real sealer and maintainer)."""
    base = spec(tmp_path).model_dump(by_alias=True, exclude_none=True)
    ds = DatastreamSpec.parse(
        {
            **base,
            "table": {
                "mode": "upsert",
                "primary_key": ["id"],
                "retention": {"time": "1s", "min_versions": 1},
            },
        }
    )
    runner = DatastreamRunner(
        ds, catalog, spark=None, writer_id="w1", background_sealing=True, maintenance_interval=1.0
    )
    runner.seal_interval = 0.01
    runner.ensure_tables()
    table = catalog.table("orders").spec
    for i in range(3):
        rows = pa.table(
            {
                "id": pa.array([1], pa.int64()),
                "amount": pa.array([i], pa.int64()),
                "_ms_partition": pa.array([0], pa.int32()),
                "_ms_offset": pa.array([i], pa.int64()),
                "_ms_tombstone": pa.array([False]),
            }
        )
        commit_staged(
            catalog.store,
            catalog.deep,
            "orders",
            stage_rows(catalog.deep, table, rows),
            {0: (i, i + 1)},
            {},
        )
    maintained = threading.Event()

    def await_query(on_tick: Any, tick: float) -> None:
        deadline = threading.Event()
        for _ in range(int(WAIT / 0.05)):
            report = runner.maintainer.status().get("orders")
            if report and report["versions_expired"] > 0:
                maintained.set()
                return
            deadline.wait(0.05)

    monkeypatch.setattr(runner, "start", lambda: None)
    monkeypatch.setattr(runner, "_await", await_query)
    runner.run(available_now=False)

    assert maintained.is_set(), f"no expiry ran: {runner.sealing_status()}"
    assert catalog.store.oldest_kept_version("orders") > 0
    assert catalog.read_table("orders").column("amount").to_pylist() == [2]
    status = runner.sealing_status()
    assert status is not None and status["maintenance"]["orders"]["runs"] >= 1


def test_a_gc_grace_shorter_than_the_staged_file_age_limit_is_refused(
    catalog: Catalog, tmp_path: Path
) -> None:
    """GC deletes unreferenced files older than its grace; a staged file is unreferenced until
    its commit, which accepts it up to the age limit: a shorter grace could delete it first."""
    from millstream.errors import InvalidSpecError

    with pytest.raises(InvalidSpecError, match="gc_grace_seconds"):
        DatastreamRunner(
            spec(tmp_path), catalog, spark=None, max_staged_age=600.0, gc_grace_seconds=300.0
        )
    runner = DatastreamRunner(
        spec(tmp_path), catalog, spark=None, max_staged_age=300.0, gc_grace_seconds=300.0
    )
    assert runner.maintainer.grace_seconds == 300.0 and runner.max_staged_age == 300.0
    # where it publishes Iceberg views, nor one their GC could use on a snapshot a publish
    # still points at
    with pytest.raises(InvalidSpecError, match="publish age limit"):
        DatastreamRunner(
            spec(tmp_path),
            catalog,
            spark=None,
            max_staged_age=300.0,
            gc_grace_seconds=300.0,
            publish_interval=15.0,
        )


def test_a_control_settings_gc_grace_a_commit_or_a_publish_could_outlive_is_refused() -> None:
    """The workers' maintenance uses the controller's grace: one shorter than the staged-file
    age limit (which is longer than the publish age limit) is refused where it is set."""
    from millstream.control.controller import ControlSettings
    from millstream.errors import InvalidSpecError
    from millstream.table.limits import MAX_PUBLISH_AGE_SECONDS, MAX_STAGED_AGE_SECONDS

    with pytest.raises(InvalidSpecError, match="staged-file age limit"):
        ControlSettings(gc_grace_seconds=MAX_STAGED_AGE_SECONDS - 1)
    assert MAX_PUBLISH_AGE_SECONDS < MAX_STAGED_AGE_SECONDS
    assert ControlSettings(gc_grace_seconds=MAX_STAGED_AGE_SECONDS).gc_grace_seconds == (
        MAX_STAGED_AGE_SECONDS
    )
