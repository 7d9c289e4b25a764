"""The process campaign's traceback check: PySpark's own noise when a JVM or a query goes away
is expected, the same exception raised through Millstream's code is not."""

from __future__ import annotations

from millstream.testing.chaos.process import ALLOWED_TRACEBACKS, _traceback_blocks

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
