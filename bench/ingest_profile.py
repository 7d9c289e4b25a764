"""Where (a)'s time goes: variations of the catch-up run that isolate its parts.

* :func:`instrumented_run`: (a) again with timed subclasses of the stream source and the
  segment sink (marker wait, read + decode, Parquet staging per task, commit), summarized by
  :func:`summarize_timed`.
* :func:`fused_probe`: the same batches as plain ``mapPartitions`` jobs, each task reading,
  decoding and staging its ranges in one Python worker (no streaming query, no commit).
* :func:`profile_batch`: the first batch replayed in this process through the same reader and
  sink code, step by step, with a cProfile of ``SegmentSink.write``.

The timed classes and the fused task run in Spark's Python workers, which cannot import
bench/: :func:`ship` makes Spark pickle this module's code by value.
"""

from __future__ import annotations

import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
from common import ship_by_value, timed
from ingest_input import Input, files_spec, source_options
from ingest_observe import progress
from pyspark.sql.streaming.datasource import ReadMaxRows

from millstream.spark.options import Options, SinkOptions, SourceOptions
from millstream.spark.sink import SegmentSink
from millstream.spark.sources import StreamReader, StreamSource, marked_ranges
from millstream.spark.table_source import MillstreamDataSource, register

TIMED_SOURCE = "millstream_source_timed"
TIMED_SINK = "millstream_timed"


def ship() -> None:
    ship_by_value(sys.modules[__name__])


def _tasks(spark: Any) -> int:
    return max(1, int(spark.sparkContext.defaultParallelism))


# ---------------------------------------------------------------------------------------------
# The source alone
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# Timed source and sink: Millstream's own code with timestamps around its Python work, logged
# as JSON lines to the ``benchLog`` option.
# ---------------------------------------------------------------------------------------------


def note(path: str, entry: dict[str, Any]) -> None:
    entry["pid"] = os.getpid()
    with open(path, "a") as f:
        f.write(json.dumps(entry) + "\n")


class TimedSink(SegmentSink):
    def __init__(self, options: SinkOptions, bench_log: str) -> None:
        super().__init__(options)
        self.bench_log = bench_log
        self.read_decode_s = 0.0

    def _decode(self, spec: Any, raw: Any, stamps: Any) -> Any:
        t = time.time()
        out = super()._decode(spec, raw, stamps)
        self.read_decode_s = time.time() - t
        return out

    def write(self, iterator: Any) -> Any:
        start = time.time()
        batches, waited, t = [], 0.0, time.time()
        for b in iterator:
            waited += time.time() - t
            batches.append(b)
            t = time.time()
        arrived = time.time()
        msg = super().write(iter(batches))
        note(
            self.bench_log,
            {
                "kind": "write",
                "start": start,
                "arrived": arrived,
                "done": time.time(),
                "read_decode_s": self.read_decode_s,
                "rows": sum(b.num_rows for b in batches),
                "arrow_batches": len(batches),
            },
        )
        return msg

    def commit(self, messages: Any, batchId: int) -> None:
        start = time.time()
        super().commit(messages, batchId)
        note(self.bench_log, {"kind": "commit", "batch": batchId, "start": start,
                              "done": time.time()})  # fmt: skip


class TimedSinkSource(MillstreamDataSource):
    @classmethod
    def name(cls) -> str:
        return TIMED_SINK

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:
        return TimedSink(SinkOptions.from_options(self.options), Options(self.options)["benchLog"])


class TimedReader(StreamReader):
    def __init__(self, options: SourceOptions, bench_log: str) -> None:
        super().__init__(options)
        self.bench_log = bench_log

    def read(self, partition: Any) -> Iterator[pa.RecordBatch]:
        start, own, rows = time.time(), 0.0, 0
        it = super().read(partition)
        while True:
            t = time.time()
            try:
                b = next(it)
            except StopIteration:
                break
            own += time.time() - t
            rows += b.num_rows
            yield b
        note(self.bench_log, {"kind": "read", "start": start, "done": time.time(),
                              "own_s": own, "rows": rows})  # fmt: skip


class TimedSource(StreamSource):
    @classmethod
    def name(cls) -> str:
        return TIMED_SOURCE

    def streamReader(self, schema: object) -> Any:
        return TimedReader(
            SourceOptions.from_options(self.options), Options(self.options)["benchLog"]
        )


def instrumented_run(spark: Any, inp: Input, base: Path, batch: int | None) -> dict[str, Any]:
    """(a) again, into a fresh catalog, with the timed source and sink: the query is built as
    DatastreamRunner.start builds it (same options, same trigger)."""
    from millstream.catalog import Catalog
    from millstream.datastream import dead_letter_spec

    ship()
    register(spark)
    spark.dataSource.register(TimedSource)
    spark.dataSource.register(TimedSinkSource)
    bench_log = base / "timed.jsonl"
    spec = files_spec("orders", inp.root, batch)
    table_spec = spec.table_spec()
    catalog = Catalog.open(home=base / "timed-home")
    catalog.create_table(table_spec)
    catalog.create_table(dead_letter_spec(table_spec.name))
    source = source_options(spec, tasks=_tasks(spark))
    sink = SinkOptions(
        settings=catalog.settings,
        table_spec=table_spec,
        writer_id="timed",
        bad_records=spec.bad_records,
        source_kind=source.kind,
        source_config=source.config,
    )
    t0 = time.perf_counter()
    q = (
        spark.readStream.format(TIMED_SOURCE)
        .options(**source.to_options())
        .option("benchLog", str(bench_log))
        .load()
        .writeStream.format(TIMED_SINK)
        .options(**sink.to_options())
        .option("benchLog", str(bench_log))
        .option("checkpointLocation", str(base / "timed-ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    s = time.perf_counter() - t0
    rows = catalog.read_table(table_spec.name).num_rows
    catalog.close()
    entries = [json.loads(x) for x in bench_log.read_text().splitlines() if x]
    return {
        "query_id": str(q.id),
        "seconds": s,
        "rows_s": inp.rows / s,
        "table_rows": rows,
        "progress": progress(q),
        "entries": entries,
    }


def summarize_timed(t: dict[str, Any]) -> dict[str, Any]:
    """Per write task: how long the sink waited for its input (source worker + JVM + Arrow
    transfer), how long its own Python work took; per read task its own Python time; per
    batch the commit; and the task time Spark saw that neither accounts for."""
    reads = [e for e in t["entries"] if e["kind"] == "read"]
    writes = [e for e in t["entries"] if e["kind"] == "write"]
    commits = [e for e in t["entries"] if e["kind"] == "commit"]
    tasks = [x for j in t.get("jobs", []) for x in j["tasks"]]
    rows = sum(w["rows"] for w in writes)

    def total(xs: list[float]) -> float:
        return float(sum(xs))

    out = {
        "rows": rows,
        "write_tasks": len(writes),
        "read_own_s": total([r["own_s"] for r in reads]),
        "read_elapsed_s": total([r["done"] - r["start"] for r in reads]),
        "sink_input_wait_s": total([w["arrived"] - w["start"] for w in writes]),
        "sink_own_s": total([w["done"] - w["arrived"] for w in writes]),
        "sink_read_decode_s": total([w.get("read_decode_s", 0.0) for w in writes]),
        "commit_s": total([c["done"] - c["start"] for c in commits]),
        "commits": len(commits),
        "spark_task_s": total([x["seconds"] for x in tasks]),
        "arrow_batches_per_task": statistics.median([w["arrow_batches"] for w in writes])
        if writes
        else 0,
    }
    out["task_unaccounted_s"] = out["spark_task_s"] - out["sink_input_wait_s"] - out["sink_own_s"]
    return out


# ---------------------------------------------------------------------------------------------
# Fused tasks: read + decode + stage in one Python worker
# ---------------------------------------------------------------------------------------------


def fused_task(args: tuple[dict[str, str], str, Any, str]) -> dict[str, float]:
    """One write task done in ONE Python worker: read the range, decode, stage Parquet."""
    from millstream.ingest.decode import decode_records
    from millstream.ingest.sources.base import RAW_SCHEMA
    from millstream.spec import TableSpec
    from millstream.storage.deepstore import DeepStore
    from millstream.table.writer import stage_rows

    opts, spec_json, task, deep_root = args
    spec = TableSpec.parse(json.loads(spec_json))
    t0 = time.perf_counter()
    source = SourceOptions.from_options(opts)
    markers = pa.Table.from_batches(list(StreamReader(source).read(task)), schema=RAW_SCHEMA)
    # as the sink reads them: the markers' ranges, from a reader of the source's kind/config
    raw = pa.Table.from_batches(list(source.reader().read_records(marked_ranges(markers))))
    t1 = time.perf_counter()
    decoded = decode_records(spec, raw.select(RAW_SCHEMA.names[:4]))
    t2 = time.perf_counter()
    stage_rows(DeepStore.from_uri(deep_root), spec, decoded.rows, name_hint="fused")
    t3 = time.perf_counter()
    return {"rows": decoded.rows.num_rows, "read": t1 - t0, "decode": t2 - t1, "stage": t3 - t2}


def fused_probe(spark: Any, inp: Input, base: Path, batch: int) -> dict[str, Any]:
    """What (a)'s write tasks cost when the data does not travel source worker -> JVM -> sink
    worker: the same batches and task ranges, each task read + decode + stage in one Spark
    Python worker (a plain ``mapPartitions`` job per batch; no streaming query, no commit)."""
    ship()
    spec = files_spec("orders", inp.root, batch)
    source = source_options(spec, tasks=_tasks(spark))
    opts = source.to_options()
    planner = StreamReader(source)
    start = planner.initialOffset()
    spec_json = json.dumps(spec.table_spec().to_json_dict())
    deep = str(base / "fused-deep")
    walls, tasks = [], []
    while True:
        end = planner.latestOffset(start, ReadMaxRows(batch))
        if end == start:
            break
        work = [(opts, spec_json, t, deep) for t in planner.partitions(start, end)]
        t0 = time.perf_counter()
        tasks += spark.sparkContext.parallelize(work, len(work)).map(fused_task).collect()
        walls.append(time.perf_counter() - t0)
        start = end
    rows = sum(t["rows"] for t in tasks)
    return {
        "rows": rows,
        "batches": len(walls),
        "job_seconds": sum(walls),
        "rows_s": rows / sum(walls),
        "task_read_s": sum(t["read"] for t in tasks),
        "task_decode_s": sum(t["decode"] for t in tasks),
        "task_stage_s": sum(t["stage"] for t in tasks),
        "tasks": len(tasks),
    }


# ---------------------------------------------------------------------------------------------
# One batch replayed in this process
# ---------------------------------------------------------------------------------------------


def profile_batch(inp: Input, base: Path, batch: int, tasks: int) -> dict[str, Any]:
    """The first batch of (a), replayed serially in this process: source reader ``read`` per
    task, then the sink's write steps (decode / stage data / stage dead letters) timed one by
    one, then ``SegmentSink.write`` under cProfile, then ``SegmentSink.commit``.

    The reader gets a line-index cache of its own, so ``initial_offset_s`` is what a fresh
    source process pays for its first offsets (indexing every file)."""
    from millstream.catalog import Catalog
    from millstream.datastream import dead_letter_spec
    from millstream.ingest.decode import dead_letter_rows, decode_records
    from millstream.ingest.sources.base import RAW_SCHEMA
    from millstream.ingest.sources.files import FilesConfig, FilesReader, LineIndexCache
    from millstream.spark.sink import _ranges
    from millstream.table.writer import stage_rows

    home = base / "profile-home"
    spec = files_spec("orders", inp.root, batch)
    catalog = Catalog.open(home=home)
    table_spec = spec.table_spec()
    catalog.create_table(table_spec)
    catalog.create_table(dead_letter_spec(table_spec.name))
    files = FilesReader(FilesConfig(str(inp.root)), line_indexes=LineIndexCache())
    reader = StreamReader(source_options(spec, tasks=tasks), source=files)
    start, t_initial = timed(reader.initialOffset)
    end, t_latest = timed(reader.latestOffset, start, ReadMaxRows(batch))
    _, t_latest_warm = timed(reader.latestOffset, start, ReadMaxRows(batch))
    parts = reader.partitions(start, end)
    sink = SegmentSink(
        SinkOptions(
            settings=catalog.settings,
            table_spec=table_spec,
            writer_id="profile",
            bad_records="dead_letter",
            source_kind="files",
            source_config={"path": str(inp.root)},
        )
    )
    deep = sink._deep()
    per_task = []
    messages = []
    prof = cProfile.Profile()
    rows = 0
    for task in parts:
        batches = list(reader.read(task))  # the task's range markers
        markers = pa.Table.from_batches(batches, schema=RAW_SCHEMA)
        _, t_ranges = timed(_ranges, markers)
        read, t_read = timed(lambda m=markers: list(files.read_records(marked_ranges(m))))
        raw, t_table = timed(pa.Table.from_batches, read)
        records = raw.select(RAW_SCHEMA.names[:4])
        rows += records.num_rows
        decoded, t_decode = timed(decode_records, table_spec, records)
        _, t_stage = timed(stage_rows, deep, table_spec, decoded.rows, name_hint="profile")
        _, t_dead = timed(
            stage_rows, deep, dead_letter_spec("orders"), dead_letter_rows(decoded.dead)
        )
        prof.enable()
        msg, t_write = timed(sink.write, iter(batches))
        prof.disable()
        messages.append(msg)
        per_task.append(
            {
                "rows": records.num_rows,
                "read_s": t_read,
                "to_table_s": t_table + t_ranges,
                "decode_s": t_decode,
                "stage_parquet_s": t_stage,
                "stage_dead_letter_s": t_dead,
                "sink_write_s": t_write,
            }
        )
    _, t_commit = timed(sink.commit, messages, 0)
    s = pstats.Stats(prof, stream=(buf := io.StringIO()))
    s.sort_stats("tottime").print_stats(14)
    text = buf.getvalue()
    top = text[text.find("   ncalls") :].rstrip()
    catalog.close()
    return {
        "batch_rows": rows,
        "tasks": per_task,
        "initial_offset_s": t_initial,
        "latest_offset_cold_s": t_latest,
        "latest_offset_warm_s": t_latest_warm,
        "commit_s": t_commit,
        "write_profile_top": top,
    }
