"""Ingest benchmark: catch-up throughput vs local baselines, and produce-to-visible freshness.

Catch-up throughput of the Spark ingest path against local baselines, and freshness at a
steady produce rate.

Run from the repository root::

    .venv/bin/python bench/ingest.py                 # 1,000,000 rows, ~7 min on a quiet machine
    .venv/bin/python bench/ingest.py --quick         # 100,000 rows, ~4 minutes
    .venv/bin/python bench/ingest.py --rows 400000   # any size

One run, one generated input: the orders stream of ``millstream.ingest.sources.generator``
(``ORDERS_SCHEMA``, 4 partitions, keys partition-affine), written once as JSON-lines files,
one subdirectory per partition (what the ``files`` source reads). A Kafka tombstone (null
value) cannot be a JSON line, so it is written as a delete record
(``{"order_id": k, "is_deleted": true, "updated_at": ...}``).

(a) Millstream catch-up: ``DatastreamRunner(files source -> upsert table).run(available_now=
    True)`` in a warmed SparkSession (a tiny warm-up datastream runs first, so JVM start and
    Python-worker start are excluded), rows/s over the whole input; the table is read back and
    its row count checked against ``millstream.testing.oracle.expected_table``.
(b) Local ceiling: one process, ``pyarrow.json.read_json`` + ``pyarrow.parquet.write_table``.
(c) Plain pandas upsert loop: ``pd.read_json(lines=True, chunksize=...)``, keep the last row
    per key by (updated_at, partition, offset), drop deletes, write Parquet.
(d) Spark's own ``transformWithStateInPandas`` upsert (RocksDB state store, ValueState per
    key, availableNow, noop sink) on a bounded SUBSET of the same input, with a time box.
(e) Freshness: a Tansu broker, a producer at a steady rate into a 4-partition topic, a
    DatastreamRunner on the kafka source (500 ms trigger), and a sampler that every 50 ms notes
    the last acknowledged offset per partition and the shard uppers. The latency of a sample is
    the first time a shard upper exceeds that offset minus the time the produce was acked.

Besides the figures, (a) is profiled: Spark's per-batch ``durationMs`` and the sink's
``commits.jsonl``; task times from Spark's event log (enabled through PYSPARK_SUBMIT_ARGS,
so ``spark_session()`` runs unchanged; ``--no-event-log`` turns it off); CPU seconds per
process kind from /proc; the source emitting its records into Spark's ``noop`` sink (the data
path before the sink read its own ranges, for comparison); a re-run with timed subclasses of
the files source and the sink (marker wait, read + decode, Parquet staging per task); the same
batches as plain ``mapPartitions`` jobs (read + decode + stage per task, no streaming query);
and an in-process replay of one batch through the same reader and sink code (read /
decode / Parquet stage / metadata commit timed separately, plus a cProfile of
``SegmentSink.write``).

(d) needs protobuf (pyspark's ``connect`` extra), which the project venv does not have: it is
installed once with pip into ``~/.cache/millstream-bench/site-pyXY`` (outside the venv) and
passed to Spark's Python workers on PYTHONPATH.

The script waits up to 3 minutes for the 1-minute load average to drop below 1.5 (``--no-wait``
skips that) and prints the load at start and end. It stops everything it started by handle or
PID (query, SparkSession, then the broker) and removes its temporary directory (``--keep``
keeps it).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import platform
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
import pyarrow.parquet as pq

PARTITIONS = 4
SEED = 7
TARGET_RATIO_CEILING = 0.35
TARGET_RATIO_TWS = 10.0
TARGET_ROWS_S = 300_000
TARGET_P99_S = 1.5
LOAD_LIMIT = 1.5
LOAD_WAIT_S = 180.0
#: pyspark 4.3's StateMessage_pb2 is generated with protobuf 6.33.5.
PROTOBUF_REQ = "protobuf>=6.33.5,<7"


# ---------------------------------------------------------------------------------------------
# Machine
# ---------------------------------------------------------------------------------------------


def load() -> tuple[float, float, float]:
    one, five, fifteen = os.getloadavg()
    return round(one, 2), round(five, 2), round(fifteen, 2)


def wait_for_quiet(log: Any) -> tuple[tuple[float, float, float], float]:
    """Wait (up to LOAD_WAIT_S) for the 1-minute load to drop below LOAD_LIMIT."""
    t0 = time.monotonic()
    first = load()
    if first[0] > LOAD_LIMIT:
        log(f"1-minute load {first[0]} > {LOAD_LIMIT}: waiting up to {LOAD_WAIT_S:.0f}s")
        while load()[0] > LOAD_LIMIT and time.monotonic() - t0 < LOAD_WAIT_S:
            time.sleep(5)
    return load(), time.monotonic() - t0


def ensure_protobuf(log: Any) -> str | None:
    """transformWithStateInPandas needs protobuf (pyspark's ``connect`` extra), which the project
    venv does not install. Provide it from a private directory (installed there once with pip,
    outside the venv) on PYTHONPATH, which Spark passes on to its Python workers. Returns the
    directory used, or None if protobuf is already importable."""
    try:
        import google.protobuf  # noqa: F401

        return None
    except ImportError:
        pass
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    target = cache / "millstream-bench" / f"site-py{sys.version_info[0]}{sys.version_info[1]}"
    if not (target / "google" / "protobuf").is_dir():
        cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "-q"]
        cmd += ["--target", str(target), PROTOBUF_REQ]
        log(f"(d) needs protobuf, not in the venv: {' '.join(cmd)}")
        subprocess.run(cmd, check=True)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        x for x in (str(target), os.environ.get("PYTHONPATH")) if x
    )
    sys.path.insert(0, str(target))
    return str(target)


# ---------------------------------------------------------------------------------------------
# Input
# ---------------------------------------------------------------------------------------------


@dataclass
class Input:
    root: Path
    rows: int
    #: partition -> JSON lines (offset = index)
    lines: dict[int, list[bytes]]
    #: partition -> the generator's (key, value) records (value None = Kafka tombstone)
    records: dict[int, list[tuple[bytes, bytes | None]]]
    files: dict[int, list[Path]]
    key_cardinality: int
    seconds: float


def _line(offset: int, key: bytes, value: bytes | None) -> bytes:
    if value is not None:
        return value
    from millstream.ingest.sources.generator import BASE_TIME

    ts = BASE_TIME + timedelta(milliseconds=offset * 10)
    return json.dumps(
        {
            "order_id": int(key),
            "customer": None,
            "amount": None,
            "status": None,
            "updated_at": ts.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "is_deleted": True,
        },
        separators=(",", ":"),
    ).encode()


def write_files(root: Path, lines: dict[int, list[bytes]], file_rows: int) -> dict[int, list[Path]]:
    files: dict[int, list[Path]] = {}
    for p, ls in lines.items():
        d = root / str(p)
        d.mkdir(parents=True, exist_ok=True)
        files[p] = []
        for i in range(0, max(len(ls), 1), file_rows):
            f = d / f"part-{i // file_rows:05d}.json"
            f.write_bytes(b"".join(x + b"\n" for x in ls[i : i + file_rows]))
            files[p].append(f)
    return files


def make_input(base: Path, rows: int, file_rows: int) -> Input:
    from millstream.ingest.sources.generator import GeneratorConfig, generate, partition_total

    t0 = time.perf_counter()
    cardinality = max(1000, rows // 5)
    cfg = GeneratorConfig(seed=SEED, partitions=PARTITIONS, key_cardinality=cardinality)
    records: dict[int, list[tuple[bytes, bytes | None]]] = {}
    lines: dict[int, list[bytes]] = {}
    for p in range(PARTITIONS):
        n = partition_total(rows, PARTITIONS, p)
        assert n is not None
        recs = list(generate(cfg, p, 0, n))
        records[p] = [(k, v) for _, k, v in recs]
        lines[p] = [_line(o, k, v) for o, k, v in recs]
    root = base / "input"
    files = write_files(root, lines, file_rows)
    return Input(root, rows, lines, records, files, cardinality, time.perf_counter() - t0)


# ---------------------------------------------------------------------------------------------
# (b) local ceiling and (c) pandas
# ---------------------------------------------------------------------------------------------


def _self_cpu() -> float:
    """CPU seconds of this process, all threads (pyarrow's included)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def ceiling(inp: Input, out: Path) -> dict[str, Any]:
    """Single-process vectorized decode + Parquet write of the same files."""
    out.mkdir(parents=True, exist_ok=True)
    schema = pa.schema(
        [
            ("order_id", pa.int64()),
            ("customer", pa.string()),
            ("amount", pa.float64()),
            ("status", pa.string()),
            ("updated_at", pa.string()),
            ("is_deleted", pa.bool_()),
        ]
    )
    opts = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    cpu0 = _self_cpu()
    t0 = time.perf_counter()
    rows = 0
    for p, files in inp.files.items():
        t = pa.concat_tables([pj.read_json(f, parse_options=opts) for f in files])
        i = t.schema.get_field_index("updated_at")
        t = t.set_column(
            i,
            pa.field("updated_at", pa.timestamp("us", tz="UTC")),
            t.column(i).cast(pa.timestamp("us", tz="UTC")),
        )
        t = t.append_column("_ms_partition", pa.array(np.full(t.num_rows, p, np.int32)))
        t = t.append_column("_ms_offset", pa.array(np.arange(t.num_rows, dtype=np.int64)))
        pq.write_table(t, out / f"{p}.parquet", compression="zstd")
        rows += t.num_rows
    s = time.perf_counter() - t0
    return {"rows": rows, "seconds": s, "rows_s": rows / s, "cpu_s": _self_cpu() - cpu0}


def pandas_upsert(inp: Input, out: Path, chunk: int) -> tuple[dict[str, Any], pd.DataFrame]:
    """What a plain single-process pandas job would do: read JSON lines in chunks, keep the last
    row per key by (updated_at, partition, offset), drop deletes at the end, write Parquet."""
    out.mkdir(parents=True, exist_ok=True)
    dtype = {
        "order_id": "int64",
        "customer": "object",
        "amount": "float64",
        "status": "object",
        "is_deleted": "bool",
    }
    cpu0 = _self_cpu()
    t0 = time.perf_counter()
    state: pd.DataFrame | None = None
    rows = 0
    for p, files in inp.files.items():
        offset = 0
        for f in files:
            with pd.read_json(
                f, lines=True, chunksize=chunk, dtype=dtype, convert_dates=["updated_at"]
            ) as reader:
                for df in reader:
                    n = len(df)
                    df["_p"] = p
                    df["_o"] = np.arange(offset, offset + n)
                    offset += n
                    rows += n
                    state = df if state is None else pd.concat([state, df], ignore_index=True)
                    state = state.sort_values(["updated_at", "_p", "_o"]).drop_duplicates(
                        "order_id", keep="last"
                    )
    assert state is not None
    result = state[~state["is_deleted"]].drop(columns=["_p", "_o"])
    result.to_parquet(out / "orders.parquet", index=False)
    s = time.perf_counter() - t0
    out = {"rows": rows, "seconds": s, "rows_s": rows / s, "table_rows": len(result)}
    out["cpu_s"] = _self_cpu() - cpu0
    return out, result


# ---------------------------------------------------------------------------------------------
# (a) Millstream catch-up
# ---------------------------------------------------------------------------------------------


def files_spec(name: str, path: Path, batch: int) -> Any:
    from millstream.datastream import DatastreamSpec
    from millstream.ingest.sources.generator import ORDERS_SCHEMA

    return DatastreamSpec.parse(
        {
            "name": name,
            "source": {"kind": "files", "path": str(path)},
            "table": {
                "primary_key": ["order_id"],
                "mode": "upsert",
                "comparison_column": "updated_at",
                "delete_column": "is_deleted",
            },
            "schema": ORDERS_SCHEMA,
            "max_records_per_batch": batch,
        }
    )


def _progress(query: Any) -> list[dict[str, Any]]:
    out = []
    for pr in query.recentProgress:
        d = json.loads(pr.json) if hasattr(pr, "json") else dict(pr)
        out.append(
            {
                "batch": d.get("batchId"),
                "input_rows": d.get("numInputRows"),
                "duration_ms": d.get("durationMs", {}),
            }
        )
    return out


def warm_up(spark: Any, catalog: Any, inp: Input, base: Path) -> float:
    """A tiny datastream run first, so JVM and Python-worker start are not in (a)."""
    from millstream.ingest.runner import DatastreamRunner

    root = base / "warmup-input"
    write_files(root, {p: ls[:500] for p, ls in inp.lines.items()}, 500)
    t0 = time.perf_counter()
    DatastreamRunner(files_spec("warmup", root, 1000), catalog, spark, writer_id="bench").run(
        available_now=True
    )
    return time.perf_counter() - t0


def oracle_rows(inp: Input) -> int:
    """Expected table rows from the source-side oracle (per partition: keys are
    partition-affine, so this equals the whole-input model and bounds memory)."""
    from millstream.ingest.sources.generator import ORDERS_SCHEMA
    from millstream.spec import TableSpec
    from millstream.testing.oracle import expected_table

    spec = TableSpec.parse(
        {
            "name": "orders",
            "schema": ORDERS_SCHEMA,
            "primary_key": ["order_id"],
            "mode": "upsert",
            "comparison_column": "updated_at",
            "delete_column": "is_deleted",
        }
    )
    total = 0
    for p, ls in inp.lines.items():
        rows, bad = expected_table(spec, ((p, o, None, v) for o, v in enumerate(ls)))
        assert not bad, f"the oracle found {len(bad)} bad records in partition {p}"
        total += len(rows)
    return total


def _process_kind(pid: int, cmd: str) -> str:
    if pid == os.getpid():
        return "driver (this process)"
    if "java" in cmd.split(" ")[0]:
        return "JVM"
    for key, kind in (
        ("pyspark.daemon pyspark.worker", "Python workers (read + write tasks)"),
        ("python_streaming_sink_runner", "Python sink commit runner"),
        ("python_streaming_source_runner", "Python source runner (offsets)"),
        ("pyspark.sql.worker", "Python planner workers"),
    ):
        if key in cmd:
            return kind
    if not cmd.strip():
        return "exited (zombie) processes"
    argv = cmd.split()
    return f"other ({' '.join(Path(a).name for a in argv[:3])})"


def process_cpu() -> dict[int, tuple[str, float]]:
    """CPU seconds (user + system) of this process and all its descendants, by pid."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            f = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        stats[int(d.name)] = (int(f[1]), (int(f[11]) + int(f[12])) / tick)
    mine = {os.getpid()}
    grew = True
    while grew:
        new = {pid for pid, (ppid, _) in stats.items() if ppid in mine} - mine
        grew = bool(new)
        mine |= new
    out = {}
    for pid in mine:
        try:
            cmd = (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        out[pid] = (_process_kind(pid, cmd), stats[pid][1])
    return out


def cpu_delta(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict:
    """CPU seconds used between two snapshots, by process kind (processes that exited in
    between are not counted)."""
    out: dict[str, float] = {}
    for pid, (kind, cpu) in after.items():
        prev = before.get(pid)
        used = cpu - (prev[1] if prev is not None and prev[0] == kind else 0.0)
        out[kind] = round(out.get(kind, 0.0) + used, 2)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def millstream_catch_up(spark: Any, catalog: Any, inp: Input, batch: int) -> dict[str, Any]:
    from millstream.ingest.runner import DatastreamRunner

    spec = files_spec("orders", inp.root, batch)
    runner = DatastreamRunner(spec, catalog, spark, writer_id="bench")
    cpu0 = process_cpu()
    t0 = time.perf_counter()
    started = time.time()
    runner.run(available_now=True)
    s = time.perf_counter() - t0
    cpu = cpu_delta(cpu0, process_cpu())
    progress = _progress(runner.query)
    commits = runner.commits()
    return {
        "query_id": str(runner.query.id),
        "cpu_s": cpu,
        "rows": inp.rows,
        "seconds": s,
        "rows_s": inp.rows / s,
        "batch": batch,
        "started_at": started,
        "progress": progress,
        "commits": commits,
        "stats_file": str(runner.stats_file),
    }


def source_only(spark: Any, inp: Input, base: Path, batch: int) -> dict[str, Any]:
    """The same files source and batch size into Spark's ``noop`` sink: what reading alone
    (Python source worker -> JVM rows) costs, without decode, Parquet or commits."""
    from millstream.ingest.runner import source_options
    from millstream.table.spark_source import register

    register(spark)
    fmt, opts = source_options(files_spec("orders", inp.root, batch))
    opts["tasks"] = str(max(1, int(spark.sparkContext.defaultParallelism)))
    cpu0 = process_cpu()
    t0 = time.perf_counter()
    q = (
        spark.readStream.format(fmt)
        .options(**opts)
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(base / "source-only-ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    s = time.perf_counter() - t0
    return {
        "query_id": str(q.id),
        "cpu_s": cpu_delta(cpu0, process_cpu()),
        "seconds": s,
        "rows_s": inp.rows / s,
        "progress": _progress(q),
    }


def _timed_data_sources() -> tuple[Any, Any]:
    """The files source and the Millstream sink with timestamps added around their Python work
    (subclasses; the code they run is Millstream's own). They log JSON lines to the
    ``benchLog`` option. Defined here, they travel to Spark's workers by value."""
    from millstream.ingest.sink import SegmentSink
    from millstream.ingest.sources.files import FilesDataSource, FilesStreamReader
    from millstream.options import Options
    from millstream.table.spark_source import MillstreamDataSource

    def note(path: str, entry: dict[str, Any]) -> None:
        entry["pid"] = os.getpid()
        with open(path, "a") as f:
            f.write(json.dumps(entry) + "\n")

    class TimedSink(SegmentSink):
        read_decode_s = 0.0

        def _decode(self, raw: Any) -> Any:
            t = time.time()
            out = super()._decode(raw)
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
                self.options["benchLog"],
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
            note(self.options["benchLog"], {"kind": "commit", "batch": batchId, "start": start,
                                            "done": time.time()})  # fmt: skip

    class TimedSinkSource(MillstreamDataSource):
        @classmethod
        def name(cls) -> str:
            return "millstream_timed"

        def streamWriter(self, schema: Any, overwrite: bool) -> Any:
            return TimedSink(Options(self.options))

    class TimedReader(FilesStreamReader):
        def __init__(self, options: Any) -> None:
            super().__init__(options)
            self.bench_log = options["benchLog"]

        def read(self, partition: Any) -> Any:
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

    class TimedFiles(FilesDataSource):
        @classmethod
        def name(cls) -> str:
            return "millstream_files_timed"

        def streamReader(self, schema: Any) -> Any:
            return TimedReader(Options(self.options))

    return TimedFiles, TimedSinkSource


def instrumented_run(spark: Any, inp: Input, base: Path, batch: int) -> dict[str, Any]:
    """(a) again, into a fresh catalog, with the timed source and sink: the query is built as
    DatastreamRunner.start builds it (same options, same trigger)."""
    from millstream.catalog import Catalog
    from millstream.datastream import dead_letter_spec
    from millstream.ingest.runner import source_options
    from millstream.table.spark_source import register

    register(spark)
    timed_files, timed_sink = _timed_data_sources()
    spark.dataSource.register(timed_files)
    spark.dataSource.register(timed_sink)
    bench_log = base / "timed.jsonl"
    spec = files_spec("orders", inp.root, batch)
    table_spec = spec.table_spec()
    catalog = Catalog.open(home=base / "timed-home")
    catalog.create_table(table_spec)
    catalog.create_table(dead_letter_spec(table_spec.name))
    _, src_opts = source_options(spec)
    reader_opts = dict(src_opts)  # what the sink reads its ranges with, as the runner passes it
    src_opts.update(
        startOffsets="{}",
        tasks=str(max(1, int(spark.sparkContext.defaultParallelism))),
        benchLog=str(bench_log),
        rangesOnly="true",
    )
    sink_opts = {
        **catalog.settings.as_options(),
        "table": table_spec.name,
        "tableSpec": json.dumps(table_spec.to_json_dict()),
        "epochs": "{}",
        "deadLetterEpochs": "{}",
        "writerId": "timed",
        "badRecords": spec.bad_records,
        "sourceFormat": "millstream_files",
        "sourceOptions": json.dumps(reader_opts),
        "benchLog": str(bench_log),
    }
    t0 = time.perf_counter()
    q = (
        spark.readStream.format("millstream_files_timed")
        .options(**src_opts)
        .load()
        .writeStream.format("millstream_timed")
        .options(**sink_opts)
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
        "progress": _progress(q),
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


def _fused_task(args: tuple[dict[str, str], str, Any, str]) -> dict[str, float]:
    """One write task done in ONE Python worker: read the range, decode, stage Parquet."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from millstream.ingest.decode import RAW_SCHEMA, decode_records
    from millstream.ingest.sources.files import FilesStreamReader
    from millstream.spec import TableSpec
    from millstream.storage.deepstore import DeepStore
    from millstream.table.writer import stage_rows

    opts, spec_json, task, deep_root = args
    spec = TableSpec.parse(json.loads(spec_json))
    t0 = time.perf_counter()
    batches = list(FilesStreamReader(opts).read(task))
    t1 = time.perf_counter()
    raw = pa.Table.from_batches(batches, schema=RAW_SCHEMA)
    decoded = decode_records(spec, raw.filter(pc.invert(raw.column("is_marker"))))
    t2 = time.perf_counter()
    stage_rows(DeepStore.from_uri(deep_root), spec, decoded.rows, name_hint="fused")
    t3 = time.perf_counter()
    return {"rows": decoded.rows.num_rows, "read": t1 - t0, "decode": t2 - t1, "stage": t3 - t2}


def fused_probe(spark: Any, inp: Input, base: Path, batch: int) -> dict[str, Any]:
    """What (a)'s write tasks cost when the data does not travel source worker -> JVM -> sink
    worker: the same batches and task ranges, each task read + decode + stage in one Spark
    Python worker (a plain ``mapPartitions`` job per batch; no streaming query, no commit)."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from millstream.ingest.runner import source_options
    from millstream.ingest.sources.files import FilesStreamReader

    spec = files_spec("orders", inp.root, batch)
    _, opts = source_options(spec)
    n = max(1, int(spark.sparkContext.defaultParallelism))
    opts["tasks"] = str(n)
    planner = FilesStreamReader(opts)
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
        tasks += spark.sparkContext.parallelize(work, len(work)).map(_fused_task).collect()
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


def enable_event_log(base: Path) -> Path | None:
    """Spark's event log (task launch/finish times and metrics) for the profile. Set through
    PYSPARK_SUBMIT_ARGS before the session starts, so millstream's spark_session() is used
    unchanged."""
    if os.environ.get("PYSPARK_SUBMIT_ARGS"):
        return None
    d = base / "eventlog"
    d.mkdir(parents=True, exist_ok=True)
    os.environ["PYSPARK_SUBMIT_ARGS"] = (
        f"--conf spark.eventLog.enabled=true --conf spark.eventLog.dir=file://{d} "
        "--conf spark.eventLog.compress=false pyspark-shell"
    )
    return d


def spark_jobs(event_dir: Path | None, query_id: str) -> list[dict[str, Any]]:
    """Jobs of one streaming query from the event log: per job the batch id, wall time and
    its tasks' durations and metrics (seconds)."""
    if event_dir is None:
        return []
    jobs: dict[int, dict[str, Any]] = {}
    stage_job: dict[int, int] = {}

    def order(f: Path) -> tuple[str, int]:
        index = f.name.split("_")[1] if f.name.startswith("events_") else "0"
        return (str(f.parent), int(index) if index.isdigit() else 0)

    # Spark 4 rolls the log: eventlog_v2_<app>/events_<n>_<app>.
    files = [f for f in event_dir.rglob("*") if f.is_file() and "appstatus" not in f.name]
    for f in sorted(files, key=order):
        for line in f.read_text().splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            kind = ev.get("Event")
            if kind == "SparkListenerJobStart":
                props = ev.get("Properties") or {}
                if props.get("sql.streaming.queryId") != query_id:
                    continue
                jid = ev["Job ID"]
                jobs[jid] = {
                    "job": jid,
                    "batch": props.get("streaming.sql.batchId"),
                    "submitted": ev["Submission Time"] / 1000,
                    "tasks": [],
                }
                for sid in ev.get("Stage IDs", []):
                    stage_job[sid] = jid
            elif kind == "SparkListenerJobEnd" and ev["Job ID"] in jobs:
                jobs[ev["Job ID"]]["completed"] = ev["Completion Time"] / 1000
            elif kind == "SparkListenerTaskEnd" and ev.get("Stage ID") in stage_job:
                info, m = ev["Task Info"], ev.get("Task Metrics") or {}
                jobs[stage_job[ev["Stage ID"]]]["tasks"].append(
                    {
                        "seconds": (info["Finish Time"] - info["Launch Time"]) / 1000,
                        "run_s": m.get("Executor Run Time", 0) / 1000,
                        "jvm_cpu_s": m.get("Executor CPU Time", 0) / 1e9,
                        "gc_s": m.get("JVM GC Time", 0) / 1000,
                        "deserialize_s": m.get("Executor Deserialize Time", 0) / 1000,
                    }
                )
    out = []
    for j in sorted(jobs.values(), key=lambda j: j["job"]):
        j["wall_s"] = j.get("completed", j["submitted"]) - j["submitted"]
        out.append(j)
    return out


def verify(catalog: Any, inp: Input, pandas_result: pd.DataFrame) -> dict[str, Any]:
    t0 = time.perf_counter()
    table = catalog.read_table("orders")
    read_s = time.perf_counter() - t0
    dead = catalog.read_table("orders__dead_letter").num_rows
    expected = oracle_rows(inp)
    # Cross-check against (c): the same keys with the same updated_at.
    ms = sorted(
        zip(
            table.column("order_id").to_pylist(),
            pc.cast(table.column("updated_at"), pa.int64()).to_pylist(),
            strict=True,
        )
    )
    pdv = sorted(
        zip(
            pandas_result["order_id"].tolist(),
            (pandas_result["updated_at"].astype("int64") // 1000).tolist(),
            strict=True,
        )
    )
    return {
        "table_rows": table.num_rows,
        "oracle_rows": expected,
        "dead_letter_rows": dead,
        "matches_oracle": table.num_rows == expected and dead == 0,
        "matches_pandas": ms == pdv,
        "read_seconds": read_s,
    }


# ---------------------------------------------------------------------------------------------
# (a) profile: replay one batch in this process through the same reader and sink code
# ---------------------------------------------------------------------------------------------


def _timed(f: Any, *a: Any, **k: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    r = f(*a, **k)
    return r, time.perf_counter() - t0


def profile_batch(inp: Input, base: Path, batch: int, tasks: int) -> dict[str, Any]:
    """The first batch of (a), replayed serially in this process: source reader ``read`` per
    task, then the sink's write steps (decode / stage data / stage dead letters) timed one by
    one, then ``SegmentSink.write`` under cProfile, then ``SegmentSink.commit``."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from millstream.catalog import Catalog
    from millstream.datastream import dead_letter_spec
    from millstream.ingest.decode import RAW_SCHEMA, dead_letter_rows, decode_records
    from millstream.ingest.runner import source_options
    from millstream.ingest.sink import SegmentSink, _ranges
    from millstream.ingest.sources.files import FilesStreamReader
    from millstream.table.writer import stage_rows

    home = base / "profile-home"
    spec = files_spec("orders", inp.root, batch)
    catalog = Catalog.open(home=home)
    table_spec = spec.table_spec()
    catalog.create_table(table_spec)
    catalog.create_table(dead_letter_spec(table_spec.name))
    _, src_opts = source_options(spec)
    src_opts["tasks"] = str(tasks)
    reader = FilesStreamReader(src_opts)
    start, t_initial = _timed(reader.initialOffset)
    end, t_latest = _timed(reader.latestOffset, start, ReadMaxRows(batch))
    _, t_latest_warm = _timed(reader.latestOffset, start, ReadMaxRows(batch))
    parts = reader.partitions(start, end)
    sink_opts = {
        **catalog.settings.as_options(),
        "table": table_spec.name,
        "tableSpec": json.dumps(table_spec.to_json_dict()),
        "epochs": "{}",
        "deadLetterEpochs": "{}",
        "writerId": "profile",
        "badRecords": "dead_letter",
    }
    sink = SegmentSink(sink_opts)
    deep = sink._deep()
    per_task = []
    messages = []
    prof = cProfile.Profile()
    rows = 0
    for task in parts:
        batches, t_read = _timed(lambda task=task: list(reader.read(task)))
        raw, t_table = _timed(pa.Table.from_batches, batches, schema=RAW_SCHEMA)
        _, t_ranges = _timed(_ranges, raw)
        records = raw.filter(pc.invert(raw.column("is_marker")))
        rows += records.num_rows
        decoded, t_decode = _timed(decode_records, table_spec, records)
        _, t_stage = _timed(stage_rows, deep, table_spec, decoded.rows, name_hint="profile")
        _, t_dead = _timed(
            stage_rows, deep, dead_letter_spec("orders"), dead_letter_rows(decoded.dead)
        )
        # IPC round trip: a lower bound of what moving the batch source -> JVM -> sink costs.
        sinkbuf = io.BytesIO()

        def ipc(raw: pa.Table = raw, buf: io.BytesIO = sinkbuf) -> None:
            with pa.ipc.new_stream(buf, raw.schema) as w:
                w.write_table(raw)
            pa.ipc.open_stream(buf.getvalue()).read_all()

        _, t_ipc = _timed(ipc)
        prof.enable()
        msg, t_write = _timed(sink.write, iter(batches))
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
                "ipc_roundtrip_s": t_ipc,
                "sink_write_s": t_write,
            }
        )
    _, t_commit = _timed(sink.commit, messages, 0)
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


# ---------------------------------------------------------------------------------------------
# (d) Spark transformWithStateInPandas upsert
# ---------------------------------------------------------------------------------------------

TWS_DDL = (
    "order_id bigint, customer string, amount double, status string, "
    "updated_at timestamp, is_deleted boolean"
)


def _tws_processor() -> Any:
    from pyspark.sql.streaming import StatefulProcessor
    from pyspark.sql.types import (
        BooleanType,
        DoubleType,
        LongType,
        StringType,
        StructField,
        StructType,
    )

    state_schema = StructType(
        [
            StructField("order_id", LongType()),
            StructField("customer", StringType()),
            StructField("amount", DoubleType()),
            StructField("status", StringType()),
            StructField("updated_us", LongType()),
            StructField("is_deleted", BooleanType()),
        ]
    )

    class LatestPerKey(StatefulProcessor):
        """Keeps the latest row per key (by updated_at; a delete is kept as a tombstone so a
        late older update cannot resurrect the key) and emits the row when it changes."""

        def init(self, handle: Any) -> None:
            self.latest = handle.getValueState("latest", state_schema)

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
            import pandas as pd

            df = pd.concat(list(rows), ignore_index=True)
            df["updated_us"] = df["updated_at"].astype("int64") // 1000
            last = df.sort_values("updated_us", kind="stable").iloc[-1]
            if self.latest.exists() and self.latest.get()[4] > int(last["updated_us"]):
                return
            amount = last["amount"]
            self.latest.update(
                (
                    int(last["order_id"]),
                    last["customer"],
                    None if pd.isna(amount) else float(amount),
                    last["status"],
                    int(last["updated_us"]),
                    bool(last["is_deleted"]),
                )
            )
            yield df.iloc[[-1]].drop(columns=["updated_us"])

        def close(self) -> None:
            pass

    return LatestPerKey()


def _tws_query(spark: Any, path: Path, checkpoint: Path) -> Any:
    from pyspark.sql.types import StructType

    schema = StructType.fromDDL(TWS_DDL)
    df = (
        spark.readStream.schema(schema)
        .option("maxFilesPerTrigger", PARTITIONS)
        .option("recursiveFileLookup", "true")
        .json(str(path))
    )
    return (
        df.groupBy("order_id")
        .transformWithStateInPandas(
            statefulProcessor=_tws_processor(),
            outputStructType=schema,
            outputMode="Update",
            timeMode="None",
        )
        .writeStream.format("noop")
        .outputMode("update")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )


def tws_upsert(
    spark: Any, inp: Input, base: Path, subset_rows: int, timeout: float
) -> dict[str, Any]:
    """The same upsert as a Spark user would write it, on the first ``subset_rows`` rows
    (files of 1000 lines, 4 files per micro-batch), stopped after ``timeout`` seconds."""
    spark.conf.set(
        "spark.sql.streaming.stateStore.providerClass",
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    )
    per = subset_rows // PARTITIONS
    root = base / "tws-input"
    write_files(root, {p: ls[:per] for p, ls in inp.lines.items()}, 1000)
    warm = base / "tws-warm"
    write_files(warm, {p: ls[:50] for p, ls in inp.lines.items()}, 1000)
    t0 = time.perf_counter()
    q = _tws_query(spark, warm, base / "tws-warm-ckpt")
    q.awaitTermination()
    warm_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    q = _tws_query(spark, root, base / "tws-ckpt")
    timed_out = not q.awaitTermination(timeout)
    wall = time.perf_counter() - t0
    if timed_out:
        q.stop()
    progress = [p for p in _progress(q) if p["input_rows"]]
    done_rows = sum(p["input_rows"] for p in progress)
    batch_s = sum(p["duration_ms"].get("triggerExecution", 0) for p in progress) / 1000
    spark.conf.unset("spark.sql.streaming.stateStore.providerClass")
    return {
        "subset_rows": per * PARTITIONS,
        "rows": done_rows,
        "wall_seconds": wall,
        "batch_seconds": batch_s,
        "rows_s": done_rows / wall if wall else 0.0,
        "rows_s_in_batches": done_rows / batch_s if batch_s else 0.0,
        "timed_out": timed_out,
        "batches": len(progress),
        "warm_up_seconds": warm_s,
    }


# ---------------------------------------------------------------------------------------------
# (e) freshness
# ---------------------------------------------------------------------------------------------


@dataclass
class Acks:
    lock: threading.Lock = field(default_factory=threading.Lock)
    last: dict[int, tuple[int, float]] = field(default_factory=dict)
    count: int = 0
    errors: list[str] = field(default_factory=list)


def _producer_loop(
    bootstrap: str,
    topic: str,
    inp: Input,
    rate: float,
    seconds: float,
    acks: Acks,
    stop: threading.Event,
    out: dict[str, Any],
) -> None:
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 5, "log.connection.close": False}
    )

    def on_delivery(err: Any, msg: Any) -> None:
        now = time.time()
        if err is not None:
            acks.errors.append(str(err))
            return
        with acks.lock:
            acks.count += 1
            p, o = msg.partition(), msg.offset()
            if o > acks.last.get(p, (-1, 0.0))[0]:
                acks.last[p] = (o, now)

    cursors = dict.fromkeys(range(PARTITIONS), 0)
    sent = 0
    t0 = time.time()
    while not stop.is_set():
        elapsed = time.time() - t0
        if elapsed >= seconds:
            break
        due = int(rate * elapsed)
        while sent < due:
            p = sent % PARTITIONS
            recs = inp.records[p]
            key, value = recs[cursors[p] % len(recs)]
            cursors[p] += 1
            try:
                producer.produce(topic, value=value, key=key, partition=p, on_delivery=on_delivery)
            except BufferError:
                producer.poll(0.01)
                continue
            sent += 1
        producer.poll(0)
        time.sleep(0.002)
    out["produce_seconds"] = time.time() - t0
    producer.flush(30)
    # Tansu's high watermark is the base offset of the last record batch + 1: end each
    # partition with a batch of one record so the last acknowledged offsets become readable.
    for p in range(PARTITIONS):
        key, value = inp.records[p][cursors[p] % len(inp.records[p])]
        producer.produce(topic, value=value, key=key, partition=p, on_delivery=on_delivery)
        producer.flush(30)
    out["sent"] = sent + PARTITIONS


def freshness(
    spark: Any,
    catalog: Any,
    inp: Input,
    base: Path,
    rate: float,
    seconds: float,
    after_spark: list[Any],
) -> dict[str, Any]:
    """``after_spark`` receives the broker's stop: it runs after the SparkSession stops, so
    the source's Kafka consumers (in Spark's Python workers) never outlive their broker."""
    from confluent_kafka import Producer

    from millstream.datastream import DatastreamSpec
    from millstream.ingest.runner import DatastreamRunner
    from millstream.ingest.sources.generator import ORDERS_SCHEMA
    from millstream.ingest.sources.kafka import close_consumers
    from millstream.testing.servers import TansuBroker

    topic = "fresh"
    broker = TansuBroker(base / "broker")
    runner: DatastreamRunner | None = None
    thread: threading.Thread | None = None
    errors: list[BaseException] = []
    committed: list[int] = []  # records per committed micro-batch
    try:
        broker.start()
        broker.create_topic(topic, PARTITIONS)
        spec = DatastreamSpec.parse(
            {
                "name": "fresh",
                "source": {"kind": "kafka", "bootstrap_servers": broker.bootstrap, "topic": topic},
                "table": {
                    "primary_key": ["order_id"],
                    "mode": "upsert",
                    "comparison_column": "updated_at",
                    "delete_column": "is_deleted",
                },
                "schema": ORDERS_SCHEMA,
                "max_records_per_batch": 100_000,
                "trigger_interval": "500ms",
            }
        )
        # Prime the topic so the query's first (slow) batch is not in the measurement.
        # (The last record goes alone: Tansu's high watermark only covers a whole batch.)
        prime = Producer({"bootstrap.servers": broker.bootstrap, "log.connection.close": False})
        for p in range(PARTITIONS):
            for key, value in inp.records[p][:100]:
                prime.produce(topic, value=value, key=key, partition=p)
            prime.flush(30)
            key, value = inp.records[p][100]
            prime.produce(topic, value=value, key=key, partition=p)
            prime.flush(30)
        runner = DatastreamRunner(spec, catalog, spark, writer_id="fresh")
        runner.ensure_tables()

        def _run() -> None:
            assert runner is not None
            try:
                runner.run(available_now=False)
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=_run, name="fresh-writer", daemon=True)
        t_start = time.perf_counter()
        thread.start()

        def uppers() -> dict[int, int]:
            return {s.partition: s.upper for s in catalog.store.list_shards("fresh")}

        deadline = time.monotonic() + 180
        while not all(uppers().get(p, 0) >= 101 for p in range(PARTITIONS)):
            if errors:
                raise errors[0]
            if time.monotonic() > deadline:
                raise TimeoutError("the kafka datastream did not ingest the priming records")
            time.sleep(0.1)
        start_s = time.perf_counter() - t_start

        acks = Acks()
        stop = threading.Event()
        pout: dict[str, Any] = {}
        producer = threading.Thread(
            target=_producer_loop,
            args=(broker.bootstrap, topic, inp, rate, seconds, acks, stop, pout),
            name="fresh-producer",
            daemon=True,
        )
        samples: list[tuple[float, dict[int, tuple[int, float]], dict[int, int]]] = []
        producer.start()
        while producer.is_alive():
            with acks.lock:
                last = dict(acks.last)
            samples.append((time.time(), last, uppers()))
            if errors:
                raise errors[0]
            time.sleep(0.05)
        producer.join()
        with acks.lock:
            final = dict(acks.last)
        drain_deadline = time.monotonic() + 30
        while time.monotonic() < drain_deadline:
            u = uppers()
            samples.append((time.time(), final, u))
            if all(u.get(p, 0) > o for p, (o, _) in final.items()):
                break
            time.sleep(0.05)
        progress = _progress(runner.query)
        committed = [c["rows"] for c in runner.commits() if c.get("rows")]
        runner.stop()
        thread.join(timeout=60)
    finally:
        if runner is not None:
            runner.stop()
        if thread is not None:
            thread.join(timeout=60)
        close_consumers()
        after_spark.append(broker.stop)

    latencies, unresolved = latencies_of(samples)
    lat = sorted(latencies)
    batches = [p for p in progress if p["input_rows"]]
    trig = [p["duration_ms"].get("triggerExecution", 0) / 1000 for p in batches]
    return {
        "target_rate": rate,
        "seconds": pout.get("produce_seconds", 0.0),
        "acked": acks.count,
        "produce_errors": len(acks.errors),
        "achieved_rate": acks.count / pout["produce_seconds"] if pout.get("produce_seconds") else 0,
        "samples": len(lat),
        "unresolved": unresolved,
        "p50_s": _pct(lat, 50),
        "p99_s": _pct(lat, 99),
        "max_s": lat[-1] if lat else float("nan"),
        "query_start_s": start_s,
        "batches": len(batches),
        # Spark's input rows are the source's range markers; the records are the sink's.
        "batch_rows_median": statistics.median(committed) if committed else 0,
        "batch_seconds_median": statistics.median(trig) if trig else 0.0,
        "batch_seconds_p99": _pct(sorted(trig), 99) if trig else 0.0,
        "batch_duration_ms_median": {
            k: statistics.median(p["duration_ms"].get(k, 0) for p in batches)
            for k in ("triggerExecution", "latestOffset", "walCommit", "addBatch", "commitOffsets")
        }
        if batches
        else {},
    }


def latencies_of(
    samples: list[tuple[float, dict[int, tuple[int, float]], dict[int, int]]],
) -> tuple[list[float], int]:
    """For every distinct (partition, last acked offset) seen by the sampler: the first sample
    time at which that partition's shard upper exceeds the offset, minus the ack time.
    Returns (latencies, how many never became visible)."""
    import bisect

    times = [t for t, _, _ in samples]
    seen: dict[tuple[int, int], float] = {}
    for _, last, _ in samples:
        for p, (o, t_ack) in last.items():
            seen.setdefault((p, o), t_ack)
    # Shard uppers only grow: per partition, the running maximum is sorted.
    running: dict[int, list[int]] = {}
    for p in {p for p, _ in seen}:
        best, col = -1, []
        for _, _, u in samples:
            best = max(best, u.get(p, -1))
            col.append(best)
        running[p] = col
    out: list[float] = []
    unresolved = 0
    for (p, o), t_ack in seen.items():
        i = max(bisect.bisect_right(running[p], o), bisect.bisect_left(times, t_ack))
        if i >= len(samples):
            unresolved += 1
        else:
            out.append(times[i] - t_ack)
    return out, unresolved


def _pct(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return float(np.percentile(np.asarray(sorted_values), q, method="nearest"))


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def _stage_sums(progress: list[dict[str, Any]]) -> dict[str, float]:
    keys = (
        "triggerExecution",
        "latestOffset",
        "getBatch",
        "queryPlanning",
        "walCommit",
        "addBatch",
        "commitOffsets",
    )
    return {k: sum(p["duration_ms"].get(k, 0) for p in progress) / 1000 for k in keys}


def report(res: dict[str, Any], log: Any) -> None:
    a, b, c, d, e = (res.get(k) for k in ("a", "b", "c", "d", "e"))
    m = res["machine"]
    log("")
    log(
        f"machine: {m['cores']} cores, {m['platform']}, python {m['python']}, pyspark "
        f"{m['pyspark']}, pyarrow {m['pyarrow']}, pandas {m['pandas']}"
    )
    log(
        f"load average (1/5/15 min): start {m['load_start']} (after waiting "
        f"{m['load_wait_s']:.0f}s), end {m['load_end']}"
    )
    log(
        f"input: {res['input']['rows']:,} rows, {PARTITIONS} partitions, "
        f"{res['input']['key_cardinality']:,} keys, {res['input']['files']} files, "
        f"{res['input']['mb']:.0f} MB of JSON lines"
    )
    log("")
    log(f"{'measure':58} {'rows/s':>12} {'seconds':>9}  notes")
    if a:
        v = a["verify"]
        log(
            f"{'(a) Millstream catch-up (DatastreamRunner, availableNow)':58} "
            f"{a['rows_s']:>12,.0f} {a['seconds']:>9.2f}  {sum(a['cpu_s'].values()):.1f} CPU-s, "
            f"batch {a['batch']:,}, "
            f"{len(a['progress'])} micro-batches, table {v['table_rows']:,} rows = oracle "
            f"{v['oracle_rows']:,}: {v['matches_oracle']}, = pandas: {v['matches_pandas']}"
        )
    if b:
        log(
            f"{'(b) ceiling: pyarrow.json + parquet, 1 process':58} "
            f"{b['rows_s']:>12,.0f} {b['seconds']:>9.2f}  {b['cpu_s']:.1f} CPU-s"
        )
    if c:
        log(
            f"{'(c) pandas chunked upsert loop, 1 process':58} "
            f"{c['rows_s']:>12,.0f} {c['seconds']:>9.2f}  {c['cpu_s']:.1f} CPU-s, result "
            f"{c['table_rows']:,} rows"
        )
    if d:
        log(
            f"{'(d) Spark transformWithStateInPandas (SUBSET)':58} "
            f"{d['rows_s']:>12,.0f} {d['wall_seconds']:>9.2f}  {d['rows']:,} of the first "
            f"{d['subset_rows']:,} rows{' (TIMED OUT)' if d['timed_out'] else ''}; "
            f"{d['rows_s_in_batches']:,.0f} rows/s inside batches"
        )
    if e:
        log(
            f"{'(e) freshness, produce-ack -> visible (kafka, 500 ms)':58} "
            f"{'':>12} {e['seconds']:>9.1f}  p50 {e['p50_s']:.3f} s, p99 {e['p99_s']:.3f} s, "
            f"max {e['max_s']:.3f} s; produced {e['achieved_rate']:,.0f} rows/s "
            f"(target {e['target_rate']:,.0f}); {e['samples']} samples, "
            f"{e['unresolved']} unresolved"
        )
    log("")
    log(f"{'ratio / target':58} {'value':>12} {'target':>9}  verdict")
    if a and b:
        r = a["rows_s"] / b["rows_s"]
        log(f"{'(a)/(b)':58} {r:>12.3f} {'>= 0.35':>9}  {_verdict(r >= TARGET_RATIO_CEILING)}")
    if a and d and d["rows_s"]:
        r = a["rows_s"] / d["rows_s"]
        log(f"{'(a)/(d)':58} {r:>12.1f} {'>= 10':>9}  {_verdict(r >= TARGET_RATIO_TWS)}")
    if a:
        r = a["rows_s"]
        log(
            f"{'(a) rows/s':58} {r:>12,.0f} {'300,000':>9}  {_verdict(r >= TARGET_ROWS_S)} "
            f"({r / TARGET_ROWS_S:.2f}x of target)"
        )
    if e:
        r = e["p99_s"]
        log(f"{'(e) p99 freshness, s':58} {r:>12.3f} {'<= 1.5':>9}  {_verdict(r <= TARGET_P99_S)}")
    if a:
        log("")
        log("(a) breakdown, Spark progress summed over micro-batches (seconds):")
        sums = _stage_sums(a["progress"])
        log("    " + ", ".join(f"{k} {v:.2f}" for k, v in sums.items()))
        log(
            f"    wall of runner.run: {a['seconds']:.2f}; outside triggers (query start/stop, "
            f"bootstrap): {a['seconds'] - sums['triggerExecution']:.2f}"
        )
        total_cpu = sum(a["cpu_s"].values())
        cores = os.cpu_count() or 1
        log(
            f"    CPU seconds during (a): {total_cpu:.1f} of {cores * a['seconds']:.1f} available "
            f"on {cores} cores: " + ", ".join(f"{k} {v:.1f}" for k, v in a["cpu_s"].items())
        )
        for p in a["progress"]:
            log(
                f"    batch {p['batch']}: {p['input_rows']:,} Spark input rows (range markers), "
                f"{p['duration_ms']}"
            )
        for cm in a["commits"]:
            log(
                f"    commits.jsonl batch {cm.get('batch_id')}: rows {cm.get('rows'):,}, "
                f"version {cm.get('version')}, at +{cm['at'] - a['started_at']:.2f}s"
            )
    if a and a.get("jobs"):
        log("    Spark jobs of (a) from the event log (write job of each batch):")
        for j in a["jobs"]:
            ts = j["tasks"]
            log(
                f"      batch {j['batch']} job {j['job']}: wall {j['wall_s']:.2f}s, "
                f"{len(ts)} tasks: "
                + ", ".join(
                    f"{t['seconds']:.2f}s (JVM CPU {t['jvm_cpu_s']:.2f}, GC {t['gc_s']:.2f})"
                    for t in ts
                )
            )
    so = res.get("source_only")
    if so:
        sums = _stage_sums(so["progress"])
        log(
            f"    for comparison, the source emitting its records (the previous data path) "
            f"into Spark's noop sink: {so['rows_s']:,.0f} "
            f"rows/s, {so['seconds']:.2f}s wall, addBatch {sums['addBatch']:.2f}s over "
            f"{len(so['progress'])} batches; CPU s: "
            + ", ".join(f"{k} {v:.1f}" for k, v in so["cpu_s"].items())
        )
        for j in so.get("jobs", []):
            log(
                f"      batch {j['batch']} job {j['job']}: wall {j['wall_s']:.2f}s, tasks "
                + ", ".join(f"{t['seconds']:.2f}s" for t in j["tasks"])
            )
    tm = res.get("timed")
    if tm:
        sm = tm["summary"]
        sums = _stage_sums(tm["progress"])
        log(
            f"    instrumented re-run of (a) (timed subclasses of the files source and the sink): "
            f"{tm['rows_s']:,.0f} rows/s, {tm['seconds']:.2f}s wall, table {tm['table_rows']:,}"
            f" rows; summed over {sm['write_tasks']} write tasks (2 run at a time):"
        )
        log(
            f"      Spark task time {sm['spark_task_s']:.2f}s = sink waiting for its range "
            f"markers {sm['sink_input_wait_s']:.2f}s + sink own Python "
            f"{sm['sink_own_s']:.2f}s (read its ranges + decode {sm['sink_read_decode_s']:.2f}s, "
            f"stage Parquet {sm['sink_own_s'] - sm['sink_read_decode_s']:.2f}s) + other "
            f"{sm['task_unaccounted_s']:.2f}s"
        )
        log(
            f"      the source's read() (range markers only) own Python {sm['read_own_s']:.2f}s "
            f"(read task elapsed {sm['read_elapsed_s']:.2f}s)"
        )
        jobs_s = sum(j["wall_s"] for j in tm.get("jobs", []))
        rest = (sums["triggerExecution"] - jobs_s - sm["commit_s"]) / max(1, len(tm["progress"]))
        log(
            f"      commits: {sm['commits']} in {sm['commit_s']:.2f}s (SegmentSink.commit, in "
            f"Spark's sink-runner process); per batch trigger - write job - commit = {rest:.2f}s"
        )
    fu = res.get("fused")
    if fu:
        log(
            f"    the same {fu['batches']} batches as plain Spark jobs, each task reading + "
            f"decoding + staging its ranges in ONE Python worker (no JVM round trip, no "
            f"streaming, no commit): {fu['rows_s']:,.0f} rows/s ({fu['job_seconds']:.2f}s of "
            f"jobs); summed over {fu['tasks']} tasks: read {fu['task_read_s']:.2f}s, decode "
            f"{fu['task_decode_s']:.2f}s, stage {fu['task_stage_s']:.2f}s"
        )
    prof = res.get("profile")
    if prof:
        log("")
        log(
            f"(a) in-process replay of the first batch ({prof['batch_rows']:,} rows, "
            f"{len(prof['tasks'])} tasks run one after the other):"
        )
        log(
            f"    latestOffset cold {prof['latest_offset_cold_s']:.3f}s / warm "
            f"{prof['latest_offset_warm_s']:.3f}s; commit (SegmentSink.commit) "
            f"{prof['commit_s']:.3f}s"
        )
        for i, t in enumerate(prof["tasks"]):
            log(
                f"    task {i}: {t['rows']:,} rows: read {t['read_s']:.3f}s, to-table "
                f"{t['to_table_s']:.3f}s, decode {t['decode_s']:.3f}s, stage parquet "
                f"{t['stage_parquet_s']:.3f}s, stage dead-letter {t['stage_dead_letter_s']:.3f}s"
                f", arrow IPC round trip {t['ipc_roundtrip_s']:.3f}s | SegmentSink.write "
                f"{t['sink_write_s']:.3f}s"
            )
        tot = {
            k: sum(t[k] for t in prof["tasks"])
            for k in ("rows", "read_s", "decode_s", "stage_parquet_s", "sink_write_s")
        }
        log(
            f"    per-core rates: read {tot['rows'] / tot['read_s']:,.0f} rows/s, decode "
            f"{tot['rows'] / tot['decode_s']:,.0f}, stage parquet "
            f"{tot['rows'] / tot['stage_parquet_s']:,.0f}, SegmentSink.write "
            f"{tot['rows'] / tot['sink_write_s']:,.0f}, read+write "
            f"{tot['rows'] / (tot['read_s'] + tot['sink_write_s']):,.0f}"
        )
        log("    cProfile of SegmentSink.write (top by own time):")
        for line in prof["write_profile_top"].splitlines():
            log("      " + line)
    if e:
        log("")
        log(
            f"(e) micro-batches: {e['batches']} with rows, median {e['batch_rows_median']:,.0f} "
            f"rows, median trigger {e['batch_seconds_median']:.2f}s (p99 "
            f"{e['batch_seconds_p99']:.2f}s); median durationMs {e['batch_duration_ms_median']}; "
            f"query start {e['query_start_s']:.1f}s (excluded: the topic was primed first)"
        )


def _verdict(ok: bool) -> str:
    return "MET" if ok else "NOT MET"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=None, help="input rows (default 1,000,000)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 100k rows, 20 s freshness")
    ap.add_argument("--batch", type=int, default=250_000, help="max_records_per_batch for (a)")
    ap.add_argument("--file-rows", type=int, default=50_000, help="lines per input file")
    ap.add_argument("--pandas-chunk", type=int, default=100_000)
    ap.add_argument("--tws-rows", type=int, default=None, help="subset for (d) (20k; quick 4k)")
    ap.add_argument("--tws-timeout", type=float, default=240.0)
    ap.add_argument("--fresh-rate", type=float, default=20_000.0)
    ap.add_argument("--fresh-seconds", type=float, default=None, help="60 s; quick 20 s")
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: a,b,c,d,e")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--no-wait", action="store_true", help="do not wait for a quiet machine")
    ap.add_argument("--no-event-log", action="store_true", help="no Spark event log (profile)")
    args = ap.parse_args(argv)
    rows = args.rows or (100_000 if args.quick else 1_000_000)
    tws_rows = args.tws_rows or (4_000 if args.quick else 20_000)
    fresh_s = args.fresh_seconds or (20.0 if args.quick else 60.0)
    skip = set(filter(None, args.skip.split(",")))

    def log(msg: str) -> None:
        print(msg, flush=True)

    import pyspark

    load_start, waited = (load(), 0.0) if args.no_wait else wait_for_quiet(log)
    res: dict[str, Any] = {
        "command": " ".join([".venv/bin/python", "bench/ingest.py", *sys.argv[1:]]),
        "machine": {
            "cores": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "pyspark": pyspark.__version__,
            "pyarrow": pa.__version__,
            "pandas": pd.__version__,
            "load_start": load_start,
            "load_wait_s": waited,
        },
    }
    log(f"load average at start {load_start} (waited {waited:.0f}s)")
    base = Path(tempfile.mkdtemp(prefix="millstream-bench-ingest-"))
    spark = None
    after_spark: list[Any] = []
    try:
        inp = make_input(base, rows, args.file_rows)
        res["input"] = {
            "rows": rows,
            "key_cardinality": inp.key_cardinality,
            "files": sum(len(f) for f in inp.files.values()),
            "mb": sum(f.stat().st_size for fs in inp.files.values() for f in fs) / 1e6,
            "seconds": inp.seconds,
        }
        log(f"input: {rows:,} rows in {inp.seconds:.1f}s under {inp.root}")
        if "b" not in skip:
            res["b"] = ceiling(inp, base / "ceiling")
            log(f"(b) ceiling: {res['b']['rows_s']:,.0f} rows/s")
        pandas_result = None
        if "c" not in skip or "a" not in skip:
            res["c"], pandas_result = pandas_upsert(inp, base / "pandas", args.pandas_chunk)
            log(f"(c) pandas: {res['c']['rows_s']:,.0f} rows/s")
        from millstream.catalog import Catalog
        from millstream.ingest.session import spark_session

        if "d" not in skip:
            res["protobuf_path"] = ensure_protobuf(log)
        event_dir = None if args.no_event_log else enable_event_log(base)
        t0 = time.perf_counter()
        spark = spark_session(app_name="millstream-bench-ingest")
        res["spark_start_s"] = time.perf_counter() - t0
        catalog = Catalog.open(home=base / "home")
        res["warm_up_s"] = warm_up(spark, catalog, inp, base)
        log(f"spark started in {res['spark_start_s']:.1f}s, warm-up run {res['warm_up_s']:.1f}s")
        if "a" not in skip:
            res["a"] = millstream_catch_up(spark, catalog, inp, args.batch)
            log(f"(a) millstream: {res['a']['rows_s']:,.0f} rows/s; verifying")
            assert pandas_result is not None
            res["a"]["verify"] = verify(catalog, inp, pandas_result)
            log(f"(a) verify: {res['a']['verify']}")
            tasks = max(1, int(spark.sparkContext.defaultParallelism))
            res["profile"] = profile_batch(inp, base, args.batch, tasks)
            res["source_only"] = source_only(spark, inp, base, args.batch)
            log(f"source alone into noop: {res['source_only']['rows_s']:,.0f} rows/s")
            res["a"]["jobs"] = spark_jobs(event_dir, res["a"]["query_id"])
            res["source_only"]["jobs"] = spark_jobs(event_dir, res["source_only"]["query_id"])
            res["timed"] = instrumented_run(spark, inp, base, args.batch)
            res["timed"]["jobs"] = spark_jobs(event_dir, res["timed"]["query_id"])
            res["timed"]["summary"] = summarize_timed(res["timed"])
            log(f"instrumented re-run: {res['timed']['rows_s']:,.0f} rows/s")
            res["fused"] = fused_probe(spark, inp, base, args.batch)
            log(f"fused read+decode+stage tasks: {res['fused']['rows_s']:,.0f} rows/s")
        if "d" not in skip:
            res["d"] = tws_upsert(spark, inp, base, tws_rows, args.tws_timeout)
            log(f"(d) transformWithStateInPandas: {res['d']['rows_s']:,.0f} rows/s")
        if "e" not in skip:
            res["e"] = freshness(spark, catalog, inp, base, args.fresh_rate, fresh_s, after_spark)
            log(f"(e) freshness: p50 {res['e']['p50_s']:.3f}s p99 {res['e']['p99_s']:.3f}s")
        catalog.close()
    finally:
        if spark is not None:
            spark.stop()
        for stop in after_spark:
            stop()
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
        else:
            log(f"kept {base}")
    res["machine"]["load_end"] = load()
    if "c" in skip:
        res.pop("c", None)
    report(res, log)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=2, default=str))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
