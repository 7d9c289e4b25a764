"""Spark's Python daemon (``spark.python.daemon.module``) with the modules of Millstream's tasks
imported before it forks a worker.

Spark's Python tasks run in workers that ``pyspark.daemon`` forks, and a worker imports what a
task's unpickled reader or sink needs at its first task of that kind: ~0.6 CPU-s for
:mod:`millstream.spark.sink`, :mod:`millstream.spark.sources` and the metadata store (pydantic,
SQLAlchemy, the decoders). A streaming batch's task uses two workers at once (the source's
range markers and the write), and which idle worker takes which part changes from batch to
batch, so after a catch-up the first batches met workers that had only ever read markers, and
their write parts waited 1-3 s on imports (docs/performance.md, "Streaming at 20,000 rows/s at
K = 200,000: the cold workers"). A worker forked from this daemon has them already, as does one
forked after Spark closed an idle one (after a minute) or, with ``spark.python.worker.reuse``
off, one forked for every task.

Only the daemon of the task workers (``pyspark.worker``) imports them; the planners' daemons
(``pyspark.sql.worker.*``) start as Spark's do. The imported modules are moved to the
collector's permanent generation (:func:`gc.freeze`) before the first fork, so no collection
in a worker walks them and their pages stay shared with the daemon.

PySpark imports nothing before forking because a thread running in the parent at ``fork()``
is absent in the child, holding whatever lock it held. The threads pyarrow starts at its
import are jemalloc's background thread and Arrow's own, both with ``pthread_atfork``
handlers (jemalloc takes its locks around a fork; Arrow re-creates its thread pools in the
child); the other modules start none (:func:`preload` checks that no Python thread runs).
"""

from __future__ import annotations

import gc
import importlib
import sys
import threading

from pyspark import daemon as spark_daemon

#: What a Millstream task imports: the data source, the stream source's reader and the sink's
#: writer as they are unpickled (with their settings), PySpark's modules of their task
#: functions, and the metadata store a write task
#: reads its table's spec from (:meth:`millstream.spark.sink.SegmentSink.current_spec`).
PRELOADED_MODULES = (
    "pyspark.sql.worker.plan_data_source_read",
    "pyspark.sql.worker.write_into_data_source",
    "millstream.spark.table_source",
    "millstream.spark.sources",
    "millstream.spark.sink",
    "millstream.config",
    "millstream.metastore.store",
)

#: True in the daemon once :func:`preload` ran, and so in every worker it forks; a worker of
#: Spark's own daemon that imports this module sees False.
preloaded = False


def task_daemon(argv: list[str]) -> bool:
    """Whether this daemon forks Spark's task workers (``pyspark.worker``, Spark's default
    when no worker module is named) rather than a planner's."""
    return len(argv) < 2 or argv[1] == "pyspark.worker"


def preload() -> None:
    """Import :data:`PRELOADED_MODULES` and freeze what the process holds."""
    global preloaded
    for name in PRELOADED_MODULES:
        importlib.import_module(name)
    if threading.active_count() != 1:  # a fork would lose a Python thread's work
        raise RuntimeError(
            f"a preloaded module started a thread: {[t.name for t in threading.enumerate()]}"
        )
    gc.freeze()
    preloaded = True


def main() -> None:
    if task_daemon(sys.argv):
        # run as ``-m``, this file is ``__main__``: the flag is set on the module a worker imports
        importlib.import_module(__spec__.name if __spec__ else __name__).preload()
    spark_daemon.manager()


if __name__ == "__main__":
    main()
