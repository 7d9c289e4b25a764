"""A writer whose Spark query meets one of Spark's transient failures restarts and commits.

On a loaded machine Spark's Python processes do not connect back to the JVM in time: the JVM
waits a fixed 10 s for a fresh Python process (``PythonWorkerFactory.createSimpleWorker``) and
then fails with ``SparkException: Python worker failed to connect back``. These tests make
that happen for real in local mode: the Python processes of a fresh session (its own data
source registrations, so their environment) find a ``sitecustomize`` on their path that holds
the first process of a chosen Python module past the JVM's wait, as an overloaded machine
does. Nothing in Millstream is stood in for: the streaming runner and a shared query of three
members run their real queries, must restart from the shard uppers after a backoff, and must
commit every record exactly once (append tables: a duplicate is a second row), without
failing a member. The available-now path's jobs meet PySpark's own ``[CANNOT_OPEN_SOCKET]``
error, raised in the driver where its jobs' results are read.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import PySparkRuntimeError

from harness.shared_query import append_files_spec, members_as_a_worker_holds_them
from millstream import faults
from millstream.catalog import Catalog
from millstream.datastream import DatastreamSpec
from millstream.spark.runner import DatastreamRunner
from millstream.spark.shared import SharedQueryRunner
from millstream.spark.table_source import register
from millstream.storage.statedir import StateDirectory

pytestmark = pytest.mark.spark

PARTITIONS = 2
LINES = 30  # per partition
#: The module Spark runs for a streaming query's Python source: a process of its own, started
#: when the query starts, which the JVM waits a fixed 10 s for.
SOURCE_RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"

SITECUSTOMIZE = """
import os, sys, time
_dir = os.environ.get("MILLSTREAM_TEST_SLOW_DIR")
_module = os.environ.get("MILLSTREAM_TEST_SLOW_MODULE")
if _dir and _module and _module in sys.orig_argv:
    try:  # the first such process only
        _fd = os.open(os.path.join(_dir, "slowed"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        pass
    else:
        os.write(_fd, str(os.getpid()).encode())
        os.close(_fd)
        time.sleep(13)  # past the JVM's fixed 10 s wait for it to connect back
"""


def _spec(root: Path, name: str) -> DatastreamSpec:
    return append_files_spec(
        root, name, partitions=PARTITIONS, lines=LINES, max_records_per_batch=20, trigger="200ms"
    )


def _expected(name: str) -> list[tuple[int, str]]:
    return sorted((p * 1000 + i, f"{name}{i}") for p in range(PARTITIONS) for i in range(LINES))


def _rows(catalog: Catalog, spec: DatastreamSpec) -> list[tuple[int, str]]:
    return sorted((r["id"], r["v"]) for r in catalog.read_table(spec.table_name).to_pylist())


def _uppers(catalog: Catalog, spec: DatastreamSpec) -> dict[int, int]:
    try:
        return {s.partition: s.upper for s in catalog.store.list_shards(spec.table_name)}
    except Exception:  # no table yet
        return {}


@pytest.fixture
def slowed_session(spark: Any, tmp_path: Path) -> Iterator[tuple[Any, Path]]:
    """A fresh session of the test SparkContext whose data sources' Python processes find the
    ``sitecustomize`` above; yields it and the directory where the slowed process leaves its
    marker. Set ``MILLSTREAM_TEST_SLOW_MODULE`` in ``sc.environment`` before registering."""
    sc = spark.sparkContext
    hook, marks = tmp_path / "slow-start", tmp_path / "slow-marks"
    hook.mkdir()
    marks.mkdir()
    (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
    saved = dict(sc.environment)
    sc.environment["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(hook), sc.environment.get("PYTHONPATH")) if p
    )
    sc.environment["MILLSTREAM_TEST_SLOW_DIR"] = str(marks)
    session = spark.newSession()
    try:
        yield session, marks
    finally:
        sc.environment.clear()
        sc.environment.update(saved)
        spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)


def _slow(session: Any, module: str) -> None:
    """From now on, the first Python process of ``module`` this session's data sources start
    is held past the JVM's wait (the data sources are registered here, with that
    environment)."""
    session.sparkContext.environment["MILLSTREAM_TEST_SLOW_MODULE"] = module
    # Spark resolves the name being registered through the active session's data sources:
    # the suite's session, which an earlier test may have registered them in.
    session._jvm.org.apache.spark.sql.SparkSession.setActiveSession(session._jsparkSession)
    register(session)


def test_a_writer_whose_source_process_does_not_connect_back_restarts_and_commits_once(
    slowed_session: tuple[Any, Path], tmp_path: Path
) -> None:
    session, marks = slowed_session
    _slow(session, SOURCE_RUNNER)
    spec = _spec(tmp_path / "sources", "tr")
    with Catalog.open(home=tmp_path / "home") as catalog:
        runner = DatastreamRunner(spec, catalog, session, writer_id="w1")
        deadline = time.monotonic() + 300

        def tick(r: DatastreamRunner) -> None:
            caught_up = _uppers(catalog, spec) == {p: LINES for p in range(PARTITIONS)}
            if caught_up or time.monotonic() > deadline:
                r.stop_after_batch()

        stats = runner.run(available_now=False, on_tick=tick, tick_seconds=0.2)

        assert (marks / "slowed").exists(), "no Python process was held: nothing was tested"
        # The query failed once on Spark's error and was restarted, not raised, and not
        # counted against the restarts of fenced or gapped commits.
        assert stats.transient_restarts == 1, stats
        assert stats.restarts == 0
        assert runner.transient.last_error is not None
        assert runner.transient.last_error.startswith("PYTHON_WORKER_CONNECT_BACK: ")
        assert "Python worker failed to connect back" in runner.transient.last_error
        assert _uppers(catalog, spec) == {p: LINES for p in range(PARTITIONS)}
        assert _rows(catalog, spec) == _expected("tr")


def test_a_shared_query_restarts_its_members_on_a_transient_failure_and_commits_each_once(
    slowed_session: tuple[Any, Path], tmp_path: Path
) -> None:
    session, marks = slowed_session
    _slow(session, SOURCE_RUNNER)
    specs = [_spec(tmp_path / "sources", n) for n in ("sa", "sb", "sc")]
    done = {p: LINES for p in range(PARTITIONS)}
    with Catalog.open(home=tmp_path / "home") as catalog:
        members = members_as_a_worker_holds_them(specs, catalog, session, tmp_path / "state")
        restarted: list[tuple[list[str], str]] = []
        shared = SharedQueryRunner(
            members,
            session,
            StateDirectory(tmp_path / "state", "_shared-query"),
            on_transient=lambda names, error: restarted.append((list(names), error)),
        )
        errors: list[BaseException] = []

        def run() -> None:
            try:
                shared.run()
            except BaseException as exc:  # the worker would fail every member with it
                errors.append(exc)

        thread = threading.Thread(target=run, name="test-shared-query")
        thread.start()
        deadline = time.monotonic() + 300
        try:
            while thread.is_alive() and time.monotonic() < deadline:
                if all(_uppers(catalog, s) == done for s in specs):
                    break
                time.sleep(0.2)
        finally:
            shared.stop()
            thread.join(120)
        assert not errors, f"the shared query raised (every member would fail): {errors[0]!r}"
        assert (marks / "slowed").exists(), "no Python process was held: nothing was tested"
        # One restart of the query with the same members: none left, none failed.
        assert restarted == [(["sa", "sb", "sc"], restarted[0][1])], restarted
        assert restarted[0][1].startswith("PYTHON_WORKER_CONNECT_BACK: ")
        assert shared.transient.total == 1
        assert sorted(shared.members) == ["sa", "sb", "sc"]
        assert shared.status()["transient_restarts"] == 1
        for s in specs:
            assert _uppers(catalog, s) == done, s.name
            assert _rows(catalog, s) == _expected(s.name), s.name
        for m in members:
            m.state_dir.unlock()


def test_an_available_now_run_restarts_when_its_results_socket_cannot_be_opened(
    spark: Any, tmp_path: Path
) -> None:
    """PySpark raises ``PySparkRuntimeError`` of class ``CANNOT_OPEN_SOCKET`` in the driver
    when it cannot open the socket its job's results come on within
    ``spark.python.authenticate.socketTimeout``; here at the first batch's commit point, in
    the driver, right after the job's results were read."""
    spec = _spec(tmp_path / "sources", "an")
    failures = [0]

    def socket_timeout(point: str, key: Any) -> None:
        if point == "before_commit" and failures[0] == 0:
            failures[0] += 1
            raise PySparkRuntimeError(
                errorClass="CANNOT_OPEN_SOCKET",
                messageParameters={
                    "errors": "['tried to connect to (127.0.0.1, 40000), but an error "
                    "occurred: timed out']"
                },
            )

    with Catalog.open(home=tmp_path / "home") as catalog:
        runner = DatastreamRunner(spec, catalog, spark, writer_id="w1")
        with faults.installed(faults.call("before_commit", socket_timeout)):
            stats = runner.run(available_now=True)
        assert failures == [1]
        assert stats.transient_restarts == 1
        assert stats.restarts == 0
        assert runner.transient.last_error is not None
        assert runner.transient.last_error.startswith("CANNOT_OPEN_SOCKET: ")
        assert _uppers(catalog, spec) == {p: LINES for p in range(PARTITIONS)}
        assert _rows(catalog, spec) == _expected("an")


def test_spark_python_processes_wait_a_minute_for_their_socket_to_the_jvm(spark: Any) -> None:
    """Millstream's session lengthens Spark's 15 s: what a Python process (the driver
    reading a job's results, a task's worker, a planner process's reads) waits for the JVM
    before ``[CANNOT_OPEN_SOCKET]`` (spark/session.py)."""
    assert spark.sparkContext.getConf().get("spark.python.authenticate.socketTimeout") == "60s"
    # what PySpark's local_connect_and_auth reads in this process and passes to its workers
    assert os.environ["SPARK_AUTH_SOCKET_TIMEOUT"] == "60"
