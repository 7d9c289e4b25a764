"""A running datastream that is idle starts its batch within one tick of records arriving,
not at its next ``trigger_interval``: its query triggers at the interval's tick
(:func:`~millstream.spark.sources.tick_seconds`) and its source plans an idle datastream at
every tick. A real streaming query in local Spark, over a files source.

Spark's processing-time trigger fires at multiples of its interval (wall clock); the file
appears just after a multiple of the 20 s interval, so with the query triggered at the
interval its records would wait ~19 s for the next trigger. The tick of 20 s is 4 s: they
are committed within one tick plus a small batch (the bound is wide, for a loaded machine).
A first file is committed before, without a bound, so the measured batch is not the query's
first (whose write tasks start their Python workers), and the datastream then idles for an
interval (after a batch with records it is busy for one)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.shared_query import members_as_a_worker_holds_them
from millstream.catalog import Catalog
from millstream.datastream import DatastreamSpec
from millstream.spark.runner import DatastreamRunner
from millstream.spark.shared import SharedQueryRunner
from millstream.spark.sources import tick_seconds
from millstream.storage.statedir import StateDirectory

pytestmark = pytest.mark.spark

INTERVAL = 20.0
#: What the test allows from the file's appearance to its records' commit: one tick (4 s) and
#: a batch of 5 records on a loaded machine, before the interval's next trigger (18.5-19.5 s).
BOUND = 15.0
#: Spark's trigger logger: with a tick shorter than a batch it warns at every batch.
TRIGGER_LOGGER = "org.apache.spark.sql.execution.streaming.runtime.ProcessingTimeExecutor"


def _uppers(catalog: Catalog, spec: DatastreamSpec) -> dict[int, int]:
    try:
        return {s.partition: s.upper for s in catalog.store.list_shards(spec.table_name)}
    except Exception:  # no table yet
        return {}


@pytest.mark.parametrize("query", ["alone", "shared"])
def test_an_idle_datastreams_records_are_committed_within_a_tick_not_an_interval(
    spark: Any, tmp_path: Path, query: str
) -> None:
    """``alone``: the datastream's own query (``millstream run``); ``shared``: a worker's
    query of all its datastreams (:class:`SharedQueryRunner`), here of one."""
    assert tick_seconds(INTERVAL) + 2 * 2.0 < BOUND < INTERVAL - 2.0
    source = tmp_path / "source"
    (source / "0").mkdir(parents=True)
    spec = DatastreamSpec.parse(
        {
            "name": "sparse",
            "source": {"kind": "files", "path": str(source)},
            "schema": {"id": "long"},
            "table": {"mode": "append"},
            "trigger_interval": f"{int(INTERVAL)}s",
        }
    )
    with Catalog.open(home=tmp_path / "home") as catalog:
        runner: Any
        if query == "alone":
            runner = DatastreamRunner(spec, catalog, spark, writer_id="w1")
            run_it: Callable[[], Any] = lambda: runner.run(available_now=False)  # noqa: E731
        else:
            members = members_as_a_worker_holds_them([spec], catalog, spark, tmp_path / "state")
            runner = SharedQueryRunner(
                members, spark, StateDirectory(tmp_path / "state", "_shared-query")
            )
            run_it = runner.run
        errors: list[BaseException] = []

        def run() -> None:
            try:
                run_it()
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=run, name="test-idle-wake")
        thread.start()

        def put(name: str, ids: range) -> None:
            tmp = source / "0" / f".{name}"
            tmp.write_text("".join(f'{{"id": {i}}}\n' for i in ids))
            tmp.rename(source / "0" / name)

        try:
            # A first file, committed without a bound: the query's first batch with records
            # starts its write tasks' Python workers (seconds on a loaded machine), which the
            # bound below is not about.
            put("00000.jsonl", range(5))
            deadline = time.monotonic() + 180
            while _uppers(catalog, spec) != {0: 5}:
                assert not errors, errors
                assert time.monotonic() < deadline, "the first file was never committed"
                time.sleep(0.2)
            # Idle for an interval since that batch (a datastream is busy for its interval
            # after a batch with records), then just after a multiple of the interval: with
            # the query triggered at the interval, its next trigger would be ~19 s away.
            idle_from = time.monotonic() + INTERVAL
            while time.monotonic() < idle_from or not 0.5 <= time.time() % INTERVAL < 1.5:
                assert not errors, errors
                time.sleep(0.05)
            put("00001.jsonl", range(5, 10))
            appeared = time.monotonic()
            while _uppers(catalog, spec) != {0: 10}:
                assert not errors, errors
                assert time.monotonic() - appeared < BOUND, (
                    f"not committed within {BOUND} s of the file's appearance: it waited for "
                    f"the {INTERVAL} s interval ({runner.query.lastProgress})"
                )
                time.sleep(0.1)
            assert sorted(r["id"] for r in catalog.read_table(spec.table_name).to_pylist()) == [
                *range(10)
            ]
        finally:
            runner.stop()
            thread.join(60)
        assert not thread.is_alive() and not errors, errors


def test_sparks_falling_behind_warning_is_not_logged_at_every_batch_longer_than_a_tick(
    spark: Any,
) -> None:
    """The suite's session logs at WARN (root); the trigger's logger stays at ERROR (the
    package's log4j2.properties): a batch longer than a tick is the common case now, and
    Spark's "Current batch is falling behind" would be a line per batch. The logger's class
    must exist: a Spark upgrade that moved it would bring the warning back unseen."""
    jvm = spark._jvm
    jvm.java.lang.Class.forName(TRIGGER_LOGGER)
    logger = jvm.org.apache.logging.log4j.LogManager.getLogger(TRIGGER_LOGGER)
    assert jvm.org.apache.logging.log4j.LogManager.getRootLogger().isWarnEnabled()
    assert not logger.isWarnEnabled()
    assert logger.isErrorEnabled()
