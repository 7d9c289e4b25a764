"""Spark's transient failures of its own machinery (a Python process that did not connect back
to its JVM in time) are known in one place, :func:`millstream.errors.transient_spark_failure`,
and a writer or a shared query restarts after them with a capped exponential backoff
(:class:`millstream.spark.runner.TransientRestarts`) that never runs out within minutes. The
restarts themselves, in real Spark queries: tests/integration/test_spark_transient_failures.py.
"""

from __future__ import annotations

import random

import pytest
from pyspark.errors import PySparkRuntimeError

from millstream.errors import SparkTransientError, exit_code, transient_spark_failure
from millstream.spark.runner import TRANSIENT_BACKOFF, TransientRestarts

#: How a streaming query that failed on the JVM's wait reads from the driver (its first lines,
#: as a real one said it: tests/integration/test_spark_transient_failures.py).
CONNECT_BACK = (
    "[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: Python worker failed "
    "to connect back. SQLSTATE: XXKST\n=== Streaming Query ===\n"
    "org.apache.spark.SparkException: Python worker failed to connect back.\n"
    "\tat org.apache.spark.api.python.PythonWorkerFactory.createSimpleWorker"
)
#: A write task's Python worker whose socket to the JVM timed out, as a job's failure reads.
SOCKET_IN_A_TASK = (
    "Job aborted due to stage failure: Task 0 in stage 3.0 failed 1 times\n"
    "pyspark.errors.exceptions.base.PySparkRuntimeError: [CANNOT_OPEN_SOCKET] Can not open "
    "socket: ['tried to connect to (127.0.0.1, 41234), but an error occurred: timed out']."
)


def test_spark_errors_of_its_own_machinery_are_transient() -> None:
    found = transient_spark_failure(Exception(CONNECT_BACK))
    assert found is not None and found.condition == "PYTHON_WORKER_CONNECT_BACK"
    assert found.message.endswith("Python worker failed to connect back. SQLSTATE: XXKST")
    found = transient_spark_failure(Exception(SOCKET_IN_A_TASK))
    assert found is not None and found.condition == "CANNOT_OPEN_SOCKET"
    assert "timed out" in found.message
    # raised in this process (a job's results): known by PySpark's error class
    raised = PySparkRuntimeError(
        errorClass="CANNOT_OPEN_SOCKET", messageParameters={"errors": "['timed out']"}
    )
    found = transient_spark_failure(raised)
    assert found is not None and found.condition == "CANNOT_OPEN_SOCKET"
    assert exit_code(found) == 1


@pytest.mark.parametrize(
    "text",
    [
        # an error of ours decides, whatever else Spark's text says
        f"{CONNECT_BACK}\nmillstream.errors.WriterFencedError: writer w1 of orders was fenced",
        f"{SOCKET_IN_A_TASK}\nmillstream.errors.BadRecordError: bad record in table 't' at "
        "partition 0 offset 7: not JSON",
        "java.lang.OutOfMemoryError: Java heap space",
        "Python worker exited unexpectedly (crashed)",
    ],
)
def test_no_other_error_is_transient(text: str) -> None:
    assert transient_spark_failure(Exception(text)) is None


def test_restarts_back_off_doubling_to_a_cap_and_a_commit_ends_the_row() -> None:
    t = TransientRestarts("writer w1 of orders", rng=random.Random(7))
    error = SparkTransientError("PYTHON_WORKER_CONNECT_BACK", "Python worker failed to connect")
    t.started_at({0: 10})
    delays = [t.failed(error, Exception()) for _ in range(9)]
    for n, d in enumerate(delays, start=1):
        bound = min(TRANSIENT_BACKOFF.cap, TRANSIENT_BACKOFF.base * 2 ** (n - 1))
        assert bound * (1 - TRANSIENT_BACKOFF.jitter) <= d <= bound, (n, delays)
    assert delays[-1] >= TRANSIENT_BACKOFF.cap / 2  # not a tight loop
    assert t.in_a_row == 9 and t.total == 9
    assert t.last_error == "PYTHON_WORKER_CONNECT_BACK: Python worker failed to connect"
    # the same uppers at the next start: still in a row; moved (a batch committed): a new row
    t.started_at({0: 10})
    assert t.in_a_row == 9
    t.started_at({0: 11})
    assert t.in_a_row == 0 and t.total == 9
    assert t.failed(error, Exception()) <= TRANSIENT_BACKOFF.base


def test_a_writer_gives_up_only_after_a_long_row_without_a_commit() -> None:
    t = TransientRestarts("writer w1 of orders", rng=random.Random(3))
    error = SparkTransientError("CANNOT_OPEN_SOCKET", "Can not open socket")
    waited = sum(t.failed(error, Exception()) for _ in range(t.max_in_a_row))
    # MAX_RESTARTS (10) of them in a row would have ended the run at once; these wait out
    # more than ten minutes of backoff before it gives up
    assert t.max_in_a_row > 10 and waited > 600
    with pytest.raises(SparkTransientError, match=r"writer w1 of orders: Spark failed 31 times"):
        t.failed(error, Exception())
