"""An error raised inside a Spark Python worker reaches the driver as Spark's text only. One
function, :func:`millstream.errors.from_spark_failure`, recovers which error of the tree it
was; the writer's restart, the worker's ERROR and the CLI's exit code all go by it."""

from __future__ import annotations

import json

import pytest
import typer

from millstream.cli.output import OutputFormat, handle_errors
from millstream.control.worker import _bad_record
from millstream.errors import (
    BadRecordError,
    NotFoundError,
    RemoteError,
    ShardGapError,
    TableNotFoundError,
    WriterFencedError,
    exit_code,
    from_spark_failure,
)
from millstream.spark.runner import _restartable


def spark_failure(*lines: str) -> Exception:
    """What a failed streaming query looks like from the driver: Spark's wrapper around the
    Python worker's traceback."""
    return Exception(
        "\n".join(
            [
                "[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: "
                "Job aborted due to stage failure",
                "Traceback (most recent call last):",
                '  File "/site-packages/millstream/spark/sink.py", line 201, in write',
                *lines,
                "\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException",
            ]
        )
    )


BAD_RECORD = spark_failure(
    "    raise BadRecordError(self.spec.name, p, o, err)",
    "millstream.errors.BadRecordError: bad record in table 'orders' at partition 2 offset 17: "
    "not JSON (bad_records: fail stops here; use bad_records: dead_letter to keep going)",
)
FENCED = spark_failure(
    "millstream.errors.WriterFencedError: writer fenced on table 'orders' partition 0: it "
    "bootstrapped at epoch 1 but the shard is at epoch 2; restart from the shard upper"
)


def test_a_bad_record_is_recovered_with_its_partition_and_offset() -> None:
    ours = from_spark_failure(BAD_RECORD)

    assert ours is not None
    assert ours.kind is BadRecordError
    assert ours.message.startswith("bad record in table 'orders' at partition 2 offset 17")
    assert ours.to_dict()["error"] == "BadRecordError"
    assert (ours.fields["partition"], ours.fields["offset"]) == (2, 17)
    assert exit_code(ours) == 9


def test_the_raised_error_wins_over_a_class_named_elsewhere_in_the_traceback() -> None:
    failure = spark_failure(
        "    raise ShardGapError(table, gaps)  # not reached",
        "millstream.errors.WriterFencedError: writer fenced on table 'orders' partition 0",
    )

    ours = from_spark_failure(failure)

    assert ours is not None and ours.kind is WriterFencedError


def test_of_a_chained_traceback_the_error_that_propagated_is_recovered() -> None:
    failure = spark_failure(
        "millstream.errors.WriterFencedError: writer fenced on table 'orders' partition 0",
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        "millstream.errors.ShardGapError: batch for table 'orders' starts above the shard upper",
    )

    ours = from_spark_failure(failure)

    assert ours is not None and ours.kind is ShardGapError
    assert ours.message.startswith("batch for table 'orders'")


def test_the_most_specific_class_is_recovered() -> None:
    failure = Exception(
        "millstream.errors.NotFoundError: a\nmillstream.errors.TableNotFoundError: table 'x'"
    )

    ours = from_spark_failure(failure)

    assert ours is not None and ours.kind is TableNotFoundError
    assert issubclass(ours.kind, NotFoundError)


def test_a_class_only_mentioned_is_recovered_with_sparks_first_line() -> None:
    ours = from_spark_failure(Exception("commit failed: ShardGapError\n(more)"))

    assert ours is not None and ours.kind is ShardGapError
    assert ours.message == "commit failed: ShardGapError"


def test_a_failure_that_names_none_of_ours_is_not_ours() -> None:
    assert from_spark_failure(Exception("java.lang.OutOfMemoryError: Java heap space")) is None
    assert from_spark_failure(Exception("MyShardGapErrors: lookalike")) is None


def test_a_fenced_writer_restarts_and_a_bad_record_does_not() -> None:
    assert _restartable(FENCED)
    assert _restartable(spark_failure("millstream.errors.ShardGapError: batch starts above"))
    assert _restartable(spark_failure("millstream.errors.StagedFileExpiredError: too old"))
    assert not _restartable(BAD_RECORD)
    assert not _restartable(Exception("java.net.ConnectException: broker down"))


def test_only_a_bad_record_puts_the_datastream_in_error() -> None:
    assert _bad_record(BAD_RECORD)
    assert not _bad_record(FENCED)
    assert not _bad_record(Exception("java.net.ConnectException: broker down"))


def test_the_cli_exits_9_naming_the_error_the_query_failed_with(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(typer.Exit) as exited, handle_errors(OutputFormat.json):
        raise BAD_RECORD

    body = json.loads(capsys.readouterr().out)
    assert exited.value.exit_code == 9
    assert body["error"] == "BadRecordError"
    assert (body["partition"], body["offset"]) == (2, 17)


def test_the_cli_lets_a_failure_that_is_not_ours_through() -> None:
    with pytest.raises(RuntimeError), handle_errors(OutputFormat.json):
        raise RuntimeError("java.lang.OutOfMemoryError: Java heap space")


def test_a_refused_rest_call_exits_as_the_error_the_controller_names() -> None:
    assert exit_code(RemoteError(404, {"error": "TableNotFoundError"})) == 3
    assert exit_code(RemoteError(409, {"error": "LeaseLostError"})) == 5
    assert exit_code(RemoteError(409, {"error": "InvalidTransitionError"})) == 4
    assert exit_code(RemoteError(413, {"error": "SomethingNewerError"})) == 2
    assert exit_code(RemoteError(500, {"error": "MillstreamError"})) == 1
    assert exit_code(RemoteError(502, {})) == 1
