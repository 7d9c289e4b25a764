"""How ``millstream run`` sets up its writer: an ``--available-now`` run, which ends when it has
caught up, starts its JVM with the short-run settings (``BATCH_RUN_SETTINGS``) and seals all it
wrote before it exits; a continuous run starts Spark as every other process does, and seals
in the background."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import millstream.spark.runner as runner_module
import millstream.spark.session as session
from millstream.cli.app import app


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
    assert config == session.BATCH_RUN_SETTINGS
    assert "-XX:TieredStopAtLevel=1" in config["spark.driver.defaultJavaOptions"]
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


def test_a_continuous_run_starts_spark_with_the_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _run(tmp_path, monkeypatch)
    assert seen["config"] is None
    assert seen["seal_all_on_exit"] is False
    assert seen["background_sealing"] is True
    assert seen["before_final_seal"] is None
    assert seen["register_sources"] is True
