"""An ``available_now`` run as plain Spark jobs: the streaming query's planning, write tasks
and commit, without the streaming query.

A streaming query of Python data sources costs about 1.1 s to start and finish on this
machine whatever it does (``bench/query_overhead.py``: one ``availableNow`` query of two
one-row tasks 1.35 s, the same tasks as a batch job 0.26 s): a cold ``millstream run
--available-now`` of a million rows spent more than a third of its time there. A run that
ends when it has caught up needs none of what the query adds (a trigger, an offset log and a
commit log to resume from): a writer always resumes at the shard uppers (the offset log is
only a cache of them, :func:`millstream.spark.runner.checkpoint_verdict`).

So each batch here is:

1. planned in this process by the stream source's own :class:`StreamReader` (the same budget,
   the target pinned at the start as ``trigger(availableNow=True)`` pins it, the same split of
   ranges into tasks);
2. written by one Spark job whose tasks each run :meth:`SegmentSink.write_batch` on their
   ranges (the same read, decode and Parquet staging as the query's write tasks), under the
   table's spec as this process read it once the batch was planned (a query's write task
   reads it itself, :meth:`SegmentSink.current_spec`);
3. committed in this process by :meth:`SegmentSink.commit` (the one commit path: the table
   and its dead-letter table in one transaction of compare-and-appends).

A batch is committed only after every one of its tasks has staged its file, and the next one
is planned from where it ended. A failed or cancelled job commits nothing; the files its
finished tasks staged are left for garbage collection (nothing references them), as a killed
query's are. A fenced or gapped commit raises, and the runner starts again from the shard
uppers (:meth:`millstream.spark.runner.DatastreamRunner.run`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

from millstream.spark.sink import SegmentSink, SinkMessage
from millstream.spark.sources import StreamReader, markers_batch
from millstream.spec import TableSpec

Ranges = list[tuple[int, int, int]]

#: The thread's local properties :meth:`pyspark.SparkContext.setJobGroup` sets.
JOB_GROUP_PROPERTIES = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")


def _write(
    sink: SegmentSink, batch_id: int, spec: TableSpec, tasks: Iterator[Ranges]
) -> Iterator[SinkMessage]:
    """A Spark task of batch ``batch_id``: stage its ranges (read by the sink itself) under
    ``spec``, the table's spec as the driver read it after planning the batch."""
    for ranges in tasks:
        yield sink.write_batch(iter([markers_batch(ranges)]), batch_id, current=spec)


@dataclass(frozen=True, slots=True)
class BatchDone:
    """A committed batch of an available-now run: its id, the source offsets it covered (its
    input records) and its wall time from planning to the end of its commit."""

    batch_id: int
    records: int
    seconds: float


def catch_up(
    spark: Any,
    reader: StreamReader,
    writer: SegmentSink,
    committer: SegmentSink,
    *,
    job_group: str,
    stopping: Callable[[], bool],
    on_batch: Callable[[BatchDone], None] | None = None,
) -> int:
    """Ingest what ``reader``'s source holds now, from ``reader``'s start offsets, one batch
    after another; returns the number of batches committed. ``writer`` is sent to the write
    tasks, ``committer`` commits in this process (the same options; it holds this process's
    metadata store). Each batch's job runs in ``job_group``, which
    :meth:`pyspark.SparkContext.cancelJobGroup` cancels; the thread's own job group is put back
    around it, so ``on_batch`` and later jobs of the thread are not in it. ``stopping`` is
    asked before each batch and again just before its job starts (after the planning, which
    may wait on a broker)."""
    sc = spark.sparkContext
    reader.prepareForTriggerAvailableNow()
    start: dict[str, Any] = reader.initialOffset()
    limit = reader.getDefaultReadLimit()
    batch_id = 0
    while not stopping():
        began = time.perf_counter()
        end = reader.latestOffset(start, limit)
        tasks = reader.plan(start, end)
        if not tasks:
            break
        callers = {k: sc.getLocalProperty(k) for k in JOB_GROUP_PROPERTIES}
        try:
            sc.setJobGroup(job_group, f"{job_group} batch {batch_id}", interruptOnCancel=True)
            if stopping():
                break
            # The table's spec as it is now, read once here rather than by every task (whose
            # worker would import the metadata store for it): after the batch's ranges were
            # planned, so a record produced after a schema change was acknowledged decodes
            # under it, as when each task read it (guard 850).
            spec = committer.current_spec()
            messages = (
                sc.parallelize(tasks, len(tasks)).mapPartitions(
                    partial(_write, writer, batch_id, spec)
                )
            ).collect()
        finally:
            for key, value in callers.items():
                sc.setLocalProperty(key, value)
        committer.commit(messages, batch_id)
        start = end
        if on_batch is not None:
            records = sum(hi - lo for ranges in tasks for _, lo, hi in ranges)
            on_batch(BatchDone(batch_id, records, time.perf_counter() - began))
        batch_id += 1
    return batch_id
