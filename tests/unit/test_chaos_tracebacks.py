"""The process campaign's traceback check: PySpark's own noise when a JVM or a query goes away
is expected, the same exception raised through Millstream's code is not."""

from __future__ import annotations

from harness.chaos.process import ALLOWED_TRACEBACKS, _traceback_blocks

DAEMON = """\
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/pyspark/python/lib/pyspark.zip/pyspark/daemon.py", line 264, in manager
  File "/venv/lib/python3.11/site-packages/pyspark/python/lib/pyspark.zip/pyspark/daemon.py", line 95, in worker
BrokenPipeError: [Errno 32] Broken pipe
"""
OURS = DAEMON.replace(
    '  File "/venv/lib/python3.11/site-packages/pyspark/python/lib/pyspark.zip/pyspark/daemon.py", line 95',
    '  File "/work/src/millstream/spark/sink.py", line 95',
)


def allowed(text: str) -> list[str]:
    blocks = _traceback_blocks(text)
    assert len(blocks) == 1
    return [a.name for a in ALLOWED_TRACEBACKS if a.pattern.search(blocks[0][0])]


def test_pyspark_daemon_losing_its_jvm_is_expected() -> None:
    assert allowed(DAEMON) == ["pyspark daemon's pipe to its JVM broken"]


def test_the_same_error_through_millstream_code_is_an_anomaly() -> None:
    assert allowed(OURS) == []


ACCUMULATOR_CUT_BY_THE_JVM = """\
----------------------------------------
Exception occurred during processing of request from ('127.0.0.1', 50280)
Traceback (most recent call last):
  File "/usr/lib/python3.11/socketserver.py", line 361, in finish_request
    self.RequestHandlerClass(request, client_address, self)
26/11/24 07:04:19 ERROR MicroBatchExecution: Query millstream-orders_aa-w1 terminated with error
org.apache.spark.SparkException: Writing job failed.
\tat org.apache.spark.sql.errors.QueryExecutionErrors$.writingJobFailedError(QueryExecutionErrors.scala:963)
\tat org.apache.spark.sql.execution.datasources.v2.V2TableWriteExec.writeWithV2(WriteToDataSourceV2Exec.scala:664)
  File "/venv/lib/python3.11/site-packages/pyspark/accumulators.py", line 304, in accum_updates
    num_updates = read_int(self.rfile)
  File "/venv/lib/python3.11/site-packages/pyspark/serializers.py", line 604, in read_int
    raise EOFError
EOFError
----------------------------------------
"""


def test_a_jvm_log_line_inside_a_python_traceback_does_not_cut_it_short() -> None:
    """The fourth long run (seed 20261127) flagged this: the JVM logged a query's failure in
    the middle of PySpark's accumulator traceback, and the block ended at the JVM's line."""
    assert allowed(ACCUMULATOR_CUT_BY_THE_JVM) == ["pyspark accumulator connection closed"]


ACCUMULATOR_RESET = """\
Traceback (most recent call last):
  File "/usr/lib/python3.11/socketserver.py", line 755, in __init__
    self.handle()
  File "/venv/lib/python3.11/site-packages/pyspark/accumulators.py", line 304, in accum_updates
    num_updates = read_int(self.rfile)
  File "/venv/lib/python3.11/site-packages/pyspark/serializers.py", line 602, in read_int
    length = stream.read(4)
  File "/usr/lib/python3.11/socket.py", line 706, in readinto
    return self._sock.recv_into(b)
ConnectionResetError: [Errno 104] Connection reset by peer
"""


def test_an_accumulator_connection_ended_by_a_reset_is_expected_too() -> None:
    """The fifth long run (seed 20261128, schedule 8): the same PySpark noise, ended by a
    reset instead of an orderly close."""
    assert allowed(ACCUMULATOR_RESET) == ["pyspark accumulator connection closed"]
    assert allowed(ACCUMULATOR_RESET.replace("/pyspark/serializers.py", "/millstream/x.py")) == []


CUT_SHORT_BY_A_KILL = """\
worker w1 joined the controller at http://127.0.0.1:40199. Ctrl-C stops.
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/pyspark/python/lib/pyspark.zip/pyspark/sql/streaming/python_streaming_source_runner.py", line 265, in main
  File "/venv/lib/python3.11/site-packages/pyspark/python/lib/pyspark.zip/pyspark/serializers.py", line 604, in read_int
EOFError

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/pyspark/python/lib/pyspark.zip/pyspark/worker_util.py", line 253, in get_sock_file_to_executor
  File "/venv/lib/python3.11/site-packages/pyspark/python/lib/pyspark.zip/pyspark/sql/streaming/python_streaming_source_runner.py", line 299, in main
  File "/usr/lib/python3.11/socket.py", line 724, in write

=== 14:20:47 $ /venv/bin/millstream worker --controller http://127.0.0.1:40199 --worker-id w1
"""


def test_a_pyspark_traceback_cut_short_by_a_kill_is_expected_only_after_a_kill() -> None:
    """A CI run of session 8 (seed 1501053509) flagged this: the worker's process group was
    SIGKILLed while PySpark's stream source runner wrote its traceback, so the log ends at a
    frame. Allowed only when the schedule killed something, and never through our code."""
    (rule,) = [a for a in ALLOWED_TRACEBACKS if a.name == "pyspark traceback cut short by a kill"]
    assert allowed(CUT_SHORT_BY_A_KILL) == ["pyspark traceback cut short by a kill"]
    assert rule.needs is not None and "kill_active" in rule.needs and "storm" not in rule.needs
    ours = CUT_SHORT_BY_A_KILL.replace(
        "pyspark.zip/pyspark/worker_util.py", "millstream/spark/sources.py"
    )
    assert allowed(ours) == []
    assert allowed(DAEMON.replace("BrokenPipeError: [Errno 32] Broken pipe\n", "")) == [
        "pyspark traceback cut short by a kill"
    ]
    assert allowed(DAEMON) == ["pyspark daemon's pipe to its JVM broken"]
