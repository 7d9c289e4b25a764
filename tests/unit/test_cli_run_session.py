"""How ``millstream run`` sets up its writer: an ``--available-now`` run, which ends when it has
caught up, starts its JVM with the short-run settings (``BATCH_RUN_SETTINGS``) and seals all it
wrote before it exits; a continuous run starts Spark as every other process does, and seals
in the background."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import millstream.spark.runner as runner_module
import millstream.spark.session as session
from millstream.cli.app import app


@pytest.fixture(autouse=True)
def _pandas_importable_after(monkeypatch: pytest.MonkeyPatch) -> None:
    """An ``--available-now`` run installs its pandas hold-off, and one stopped here never
    lifts it: restored after each test, or every later test in this process that imports
    pandas fails."""
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))


class _Started(Exception):
    """Stands for the run: what the test checks has happened by then."""


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *flags: str) -> dict[str, Any]:
    (tmp_path / "source").mkdir()
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        f"name: orders\nsource: {{kind: files, path: {tmp_path / 'source'}}}\n"
        "schema: {id: long}\ntable: {mode: upsert, primary_key: [id]}\n"
    )
    seen: dict[str, Any] = {}

    def spark_session(**kwargs: Any) -> Any:
        seen.update(kwargs)
        return object()

    class Runner(runner_module.DatastreamRunner):
        def run(self, **kwargs: Any) -> Any:
            seen["seal_all_on_exit"] = self.seal_all_on_exit
            seen["background_sealing"] = self.background_sealing
            seen["before_final_seal"] = self.before_final_seal
            seen["register_sources"] = self.register_sources
            raise _Started

    monkeypatch.setattr(session, "spark_session", spark_session)
    monkeypatch.setenv(session.CLASS_ARCHIVE_ENV, str(tmp_path / "cache" / "jvm.jsa"))
    monkeypatch.setattr(runner_module, "DatastreamRunner", Runner)
    result = CliRunner().invoke(
        app, ["run", "-f", str(spec), "--home", str(tmp_path / "home"), *flags]
    )
    assert isinstance(result.exception, _Started), result.output
    return seen


def test_an_available_now_run_starts_spark_with_the_short_run_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _run(tmp_path, monkeypatch, "--available-now")
    config = seen["config"]
    assert {k: v for k, v in config.items() if k != "spark.driver.defaultJavaOptions"} == {
        k: v
        for k, v in session.BATCH_RUN_SETTINGS.items()
        if k != "spark.driver.defaultJavaOptions"
    }
    assert "-XX:TieredStopAtLevel=1" in config["spark.driver.defaultJavaOptions"]
    # no class archive yet: its JVM writes one as it exits, to a file of this process's own
    # (tests/integration/test_cli_run_ends_jvm.py sees it put in place)
    pending = tmp_path / "cache" / f"jvm.jsa.{os.getpid()}.tmp"
    assert f"-XX:ArchiveClassesAtExit={pending}" in config["spark.driver.defaultJavaOptions"]
    assert config["spark.python.worker.reuse"] == "false"
    assert seen["seal_all_on_exit"] is True
    # it ends its JVM before the final seal (tests/integration/test_cli_run_ends_jvm.py)
    assert seen["before_final_seal"] is not None
    # a smaller young generation (docs/performance.md, "Peak RSS under 1 GB"), which a user's
    # spark.driver.extraJavaOptions, given after these, overrides
    assert "-Xmn32m" in config["spark.driver.defaultJavaOptions"]
    assert config["spark.executorEnv.MALLOC_MMAP_THRESHOLD_"] == "1048576"
    # its jobs use no data source: no registration, whose Python daemon idled beside them
    assert seen["register_sources"] is False
    # and no SQL session: its SparkContext only (spark.session.JobsSession)
    assert seen["jobs_only"] is True


def test_a_continuous_run_starts_spark_with_the_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _run(tmp_path, monkeypatch)
    assert seen["config"] is None
    assert seen["jobs_only"] is False
    assert seen["seal_all_on_exit"] is False
    assert seen["background_sealing"] is True
    assert seen["before_final_seal"] is None
    assert seen["register_sources"] is True


def test_a_run_creates_its_tables_while_its_jvm_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session starts on a thread while the run opens the metadata store and creates the
    tables: the stand-in session start returns only once it sees the tables (it would wait
    its whole timeout, and fail the run, if the run created them only after the session)."""
    (tmp_path / "source").mkdir()
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        f"name: orders\nsource: {{kind: files, path: {tmp_path / 'source'}}}\n"
        "schema: {id: long}\ntable: {mode: upsert, primary_key: [id]}\n"
    )
    home = tmp_path / "home"
    seen: dict[str, Any] = {}

    def spark_session(**kwargs: Any) -> Any:
        seen["thread"] = threading.current_thread().name
        deadline = threading.Event()
        for _ in range(100):
            db = home / "metadata.db"
            if db.exists():
                from millstream.catalog import Catalog

                with Catalog.open(home=home) as cat:
                    try:
                        cat.table("orders")
                        cat.table("orders__dead_letter")
                    except Exception:  # not created yet
                        pass
                    else:
                        seen["tables_before_session"] = True
                        return object()
            deadline.wait(0.1)
        raise RuntimeError("the tables were not created while the session started")

    class Runner(runner_module.DatastreamRunner):
        def run(self, **kwargs: Any) -> Any:
            raise _Started

    monkeypatch.setattr(session, "spark_session", spark_session)
    monkeypatch.setattr(runner_module, "DatastreamRunner", Runner)
    monkeypatch.setenv(session.CLASS_ARCHIVE_ENV, "off")
    result = CliRunner().invoke(
        app, ["run", "-f", str(spec), "--home", str(home), "--available-now"]
    )
    assert isinstance(result.exception, _Started), result.output
    assert seen == {"thread": "spark-session-start", "tables_before_session": True}


def test_the_class_archive_is_used_once_written_and_written_once(tmp_path: Path) -> None:
    """The first run writes the archive to a file of its own and puts it in place when its JVM
    exited cleanly; later runs map it. A JVM that died while writing leaves nothing; one that
    wrote nothing (a class path it cannot archive) leaves a marker, and no run tries again."""
    archive = session.ClassArchive(tmp_path / "cache" / "jvm.jsa")
    writing = archive.java_options()
    assert writing.startswith(f"-XX:ArchiveClassesAtExit={archive.pending} ")
    # the JVM died while writing it: nothing is put in place, the next run writes it again
    archive.pending.write_bytes(b"half")
    archive.settle(137)
    assert not archive.pending.exists() and not archive.path.exists()
    assert archive.java_options() == writing
    # written, exited cleanly: in place, and the next run maps it
    archive.pending.write_bytes(b"archive")
    archive.settle(0)
    assert archive.path.read_bytes() == b"archive" and not archive.pending.exists()
    assert archive.java_options().startswith(f"-XX:SharedArchiveFile={archive.path} ")
    settings = session.batch_run_settings(archive)
    assert f"-XX:SharedArchiveFile={archive.path}" in settings["spark.driver.defaultJavaOptions"]
    assert settings["spark.driver.defaultJavaOptions"].startswith(
        session.BATCH_RUN_SETTINGS["spark.driver.defaultJavaOptions"]
    )
    # a JVM that exited cleanly without writing one: no run pays for writing it again
    other = session.ClassArchive(tmp_path / "cache" / "other.jsa")
    assert other.java_options().startswith("-XX:ArchiveClassesAtExit=")
    other.settle(0)
    assert other.failed.exists() and other.java_options() == ""


def test_a_new_class_archive_removes_the_others_no_run_used_for_a_day(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each Java, Spark or pyspark install (a fresh virtualenv) writes an archive of its own,
    ~116 MB: the one put in place removes the others no run used for a day, and keeps one
    a run used lately (it may be mapping it), the marker of an install a run used lately (no
    archive to write for it) and files not its own."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(session.CLASS_ARCHIVE_ENV, raising=False)
    archive = session.ClassArchive.default()
    assert archive is not None, "no java on this machine"
    cache = archive.path.parent
    cache.mkdir(parents=True)
    day_ago = time.time() - session.STALE_ARCHIVE_SECONDS - 60

    def made(name: str, *, at: float | None = None) -> Path:
        path = cache / name
        path.write_bytes(b"archive")
        if at is not None:
            os.utime(path, (at, at))
        return path

    unused = made("spark-4.0.0-jvm-0123456789abcdef.jsa", at=day_ago)
    unused_marker = made("spark-4.0.0-jvm-fedcba9876543210.jsa.failed", at=day_ago)
    in_use = made("spark-4.0.0-jvm-1111111111111111.jsa", at=day_ago)
    used_marker = made("spark-4.0.0-jvm-2222222222222222.jsa.failed", at=day_ago)
    not_ours = made("notes.txt", at=day_ago)
    # a run of that install maps its archive now: marked used
    assert session.ClassArchive(in_use).java_options().startswith("-XX:SharedArchiveFile=")
    # a run of an install whose JVM wrote no archive: it runs without, and writes none again
    assert session.ClassArchive(cache / "spark-4.0.0-jvm-2222222222222222.jsa").java_options() == ""

    assert archive.java_options().startswith("-XX:ArchiveClassesAtExit=")
    archive.pending.write_bytes(b"new archive")
    archive.settle(0)

    assert archive.path.read_bytes() == b"new archive"
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        [archive.path.name, in_use.name, used_marker.name, not_ours.name]
    )
    assert not unused.exists() and not unused_marker.exists()
    # the archive in place is used from then on, and the next one written keeps it
    assert archive.java_options().startswith(f"-XX:SharedArchiveFile={archive.path} ")


def test_the_class_archive_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(session.CLASS_ARCHIVE_ENV, "off")
    assert session.ClassArchive.default() is None
    assert session.batch_run_settings(None) == session.BATCH_RUN_SETTINGS


def test_ending_the_jvm_does_not_wait_for_the_accumulator_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``end_jvm`` does not wait for PySpark's accumulator server to stop (its stop() waits for
    the server's loop to see the shutdown, ~0.9 s of a run's end): the server is still told to
    stop, on a thread of its own. The stand-ins do what PySpark's do: ``stop()`` shuts the
    context's accumulator server down, if it still has one, and waits for it."""
    released, asked = threading.Event(), threading.Event()

    class Server:
        def shutdown(self) -> None:
            asked.set()
            released.wait(30)

    class Context:
        _accumulatorServer: Any = Server()

    class Spark:
        sparkContext = Context()

        def stop(self) -> None:
            server = self.sparkContext._accumulatorServer
            if server is not None:
                server.shutdown()

    # No JVM to end: the suite's own session (a process-wide gateway) must outlive this test.
    monkeypatch.setattr(session.SparkContext, "_gateway", None)
    ended = threading.Event()
    thread = threading.Thread(target=lambda: (session.end_jvm(Spark()), ended.set()), daemon=True)
    thread.start()
    try:
        assert ended.wait(20), "end_jvm waited for the accumulator server's shutdown"
        assert asked.wait(20), "the accumulator server was never told to stop"
    finally:
        released.set()
