"""What one streaming ``availableNow`` query with a Python source and sink costs beyond its
work, against a batch job of the same tasks: the fixed cost a cold ``run(available_now=True)``
pays (docs/performance.md, "Ingest", the cold run (a)).

Run from the repository root (not part of CI; about 1 minute)::

    .venv/bin/python bench/query_overhead.py              # 5 of each after 2 warm-ups
    .venv/bin/python bench/query_overhead.py --runs 10 --json /tmp/overhead.json

In one warmed SparkSession (``millstream.spark.session.spark_session``, ``local[2]``), both do
nothing but start two Python tasks of one row each:

* **stream**: a Python data source (``DataSourceStreamReader``, one batch of 2 partitions)
  into a Python streaming sink (``DataSourceStreamArrowWriter``, an empty commit), with
  ``trigger(availableNow=True)`` and a fresh checkpoint, started and awaited: what Millstream's
  ``DatastreamRunner.run(available_now=True)`` starts, without Millstream's code;
* **batch**: ``createDataFrame`` of 2 rows, ``repartition(2).mapInArrow(...)``, ``collect()``.

Prints each run's wall time, the medians and their ratio (stream / batch). Results go to
``bench/results/query-overhead-<time>.json`` and ``--json PATH``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import common
import pyarrow as pa


def sources() -> Any:
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceStreamArrowWriter,
        DataSourceStreamReader,
        InputPartition,
        WriterCommitMessage,
    )

    class Reader(DataSourceStreamReader):
        def initialOffset(self) -> dict[str, int]:
            return {"o": 0}

        def latestOffset(self, start: Any = None, limit: Any = None) -> dict[str, int]:
            return {"o": 1}

        def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
            return [InputPartition(i) for i in range(2)] if start["o"] < end["o"] else []

        def read(self, partition: InputPartition) -> Iterator[tuple[int]]:
            yield (partition.value,)

        def commit(self, end: dict[str, int]) -> None:
            pass

    class Writer(DataSourceStreamArrowWriter):
        def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
            for _ in iterator:
                pass
            return WriterCommitMessage()

        def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
            pass

        def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
            pass

    class Source(DataSource):
        @classmethod
        def name(cls) -> str:
            return "overhead"

        def schema(self) -> str:
            return "x int"

        def streamReader(self, schema: Any) -> DataSourceStreamReader:
            return Reader()

        def streamWriter(self, schema: Any, overwrite: bool) -> Writer:
            return Writer()

    return Source


def stream(spark: Any) -> float:
    checkpoint = tempfile.mkdtemp(prefix="millstream-bench-overhead-")
    t0 = time.perf_counter()
    q = (
        spark.readStream.format("overhead")
        .load()
        .writeStream.format("overhead")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    return time.perf_counter() - t0


def batch(spark: Any) -> float:
    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            yield pa.RecordBatch.from_pydict({"x": [b.num_rows]})

    t0 = time.perf_counter()
    spark.createDataFrame([(0,), (1,)], "x int").repartition(2).mapInArrow(task, "x long").collect()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--no-wait", action="store_true", help="do not wait for a quiet machine")
    args = ap.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    log = common.log_stamped
    load_start, waited = (common.load(), 0.0) if args.no_wait else common.wait_for_quiet(log)
    from millstream.spark.session import spark_session

    spark = spark_session(app_name="millstream-bench-overhead")
    try:
        spark.dataSource.register(sources())
        for _ in range(2):  # warm-ups: Python workers, the JVM's code paths
            stream(spark)
            batch(spark)
        streams = [stream(spark) for _ in range(args.runs)]
        batches = [batch(spark) for _ in range(args.runs)]
    finally:
        spark.stop()
    s, b = statistics.median(streams), statistics.median(batches)
    log(f"stream availableNow, 1 batch of 2 tasks: {', '.join(f'{x:.2f}' for x in streams)} s")
    log(f"batch mapInArrow, 2 tasks, collect:      {', '.join(f'{x:.2f}' for x in batches)} s")
    log(f"median: stream {s:.2f} s, batch {b:.2f} s, ratio stream/batch {common.ratio(s, b):.1f}")
    res = {
        "command": common.command_line("query_overhead.py"),
        "machine": common.machine("pyspark", "pyarrow"),
        "load_start": load_start,
        "load_wait_s": waited,
        "stream_s": streams,
        "batch_s": batches,
        "stream_median_s": s,
        "batch_median_s": b,
        "load_end": common.load(),
    }
    common.save_results("query-overhead", res, args.json, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
