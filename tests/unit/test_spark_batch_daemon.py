"""An ``--available-now`` run's Python daemon (``millstream.spark.batch_daemon``) is Spark's
own with pandas unimportable in its task workers: pyarrow imported pandas at a write task's
first ``pa.array()`` only to ask whether its argument was a DataFrame (~0.2 s and ~35 MiB of
each of the run's two write tasks, beside each other at the run's peak memory)."""

from __future__ import annotations

import subprocess
import sys

from millstream.spark.session import BATCH_DAEMON_MODULE, BATCH_RUN_SETTINGS

# The daemon's main() up to Spark's manager, then what a write task's worker meets: pyarrow
# building arrays from Python objects (it asks for pandas there), and pandas itself.
PROBE = """
import sys
sys.argv = ["daemon", *sys.argv[1:]]
from millstream.spark import batch_daemon
batch_daemon.spark_daemon.manager = lambda: None
batch_daemon.main()
import pyarrow as pa
assert pa.array([1, 2], pa.int64()).to_pylist() == [1, 2]
assert pa.scalar(b"x").as_py() == b"x"
try:
    import pandas
except ModuleNotFoundError:
    print("no pandas")
else:
    print("pandas")
"""


def _probe(*argv: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_batch_runs_task_workers_load_no_pandas_and_pyarrow_works_without_it() -> None:
    assert BATCH_RUN_SETTINGS["spark.python.daemon.module"] == BATCH_DAEMON_MODULE
    assert _probe() == "no pandas"  # Spark's default worker module
    assert _probe("pyspark.worker") == "no pandas"


def test_a_planners_daemon_keeps_pandas() -> None:
    assert _probe("pyspark.sql.worker.plan_data_source_read") == "pandas"
