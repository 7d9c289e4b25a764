"""Spark's Python daemon (``spark.python.daemon.module``) of a run that ends once it has caught
up (``millstream run --available-now``, :data:`millstream.spark.session.BATCH_RUN_SETTINGS`):
Spark's own daemon, with pandas made unimportable in it before it forks the task workers.

pyarrow imports pandas at a task's first ``pa.array()`` only to ask whether its argument is a
DataFrame (:mod:`millstream.core.no_pandas`), and a catch-up's write task uses nothing of it:
each of the run's two write tasks spent ~0.2 s of its start importing it, and held ~35 MiB
more beside the other's at the run's peak memory (docs/performance.md, "The whole batch run:
its timeline and cuts"). Unlike :mod:`millstream.spark.daemon`, it imports no
task module before it forks: a worker's imports stay its own, and the daemon, alive beside
the workers, stays Spark's size."""

from __future__ import annotations

import sys

from pyspark import daemon as spark_daemon

from millstream.core.no_pandas import skip_pandas
from millstream.spark.daemon import task_daemon


def main() -> None:
    if task_daemon(sys.argv):
        skip_pandas()  # before the first fork: every worker inherits the finder
    spark_daemon.manager()


if __name__ == "__main__":
    main()
