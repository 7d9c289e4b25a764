"""Ctrl-C of ``millstream run``: the JVM, in the terminal's process group, exits at once and
closes PySpark's accumulator connection before the driver stops; PySpark's accumulator server
then printed an ``EOFError`` traceback after the run's clean summary (seen in
tests/integration/test_cli_run_stop.py). The session Millstream starts drops that one error
and still prints any other."""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession


def test_a_connection_the_jvm_closed_prints_no_traceback_and_other_errors_still_do(
    spark: SparkSession, capsys: pytest.CaptureFixture[str]
) -> None:
    server = spark.sparkContext._accumulatorServer  # type: ignore[attr-defined]
    for closed in (EOFError(), ConnectionResetError("reset by peer")):
        try:
            raise closed
        except Exception:
            server.handle_error(None, ("127.0.0.1", 1))
    assert "Traceback" not in capsys.readouterr().err
    try:
        raise ValueError("a real failure")
    except ValueError:
        server.handle_error(None, ("127.0.0.1", 1))
    err = capsys.readouterr().err
    assert "Traceback" in err and "a real failure" in err
