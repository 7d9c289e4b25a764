"""Spark's task workers are forked from a daemon that imported Millstream's task modules
(``millstream.spark.daemon``): a worker's first read or write part of a batch no longer
imports them (1-3 s of a batch after a catch-up, docs/performance.md, "Streaming at 20,000
rows/s at K = 200,000: the cold workers"). The planners' daemons stay Spark's."""

from __future__ import annotations

import sys

from pyspark.sql import SparkSession

from millstream.spark.daemon import PRELOADED_MODULES, task_daemon


def test_every_task_worker_starts_with_the_task_modules_imported(spark: SparkSession) -> None:
    modules = PRELOADED_MODULES

    def worker_state(_: int) -> tuple[bool, list[str]]:  # pickled by value, run in a worker
        daemon = sys.modules.get("millstream.spark.daemon")
        preloaded = bool(daemon is not None and getattr(daemon, "preloaded", False))
        return preloaded, [m for m in modules if m not in sys.modules]

    # four one-element tasks on the two task slots: each runs in a worker the daemon forked
    states = spark.sparkContext.parallelize(range(4), 4).map(worker_state).collect()
    assert states == [(True, [])] * 4


def test_only_the_task_workers_daemon_preloads() -> None:
    assert task_daemon(["daemon"])  # Spark's default worker module
    assert task_daemon(["daemon", "pyspark.worker"])
    assert not task_daemon(["daemon", "pyspark.sql.worker.write_into_data_source"])
    assert not task_daemon(["daemon", "pyspark.sql.worker.python_streaming_sink_runner"])
