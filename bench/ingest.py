"""Ingest benchmark: catch-up throughput vs local baselines, and produce-to-visible freshness.

Catch-up throughput of the Spark ingest path against local baselines, and freshness at a
steady produce rate.

Run from the repository root::

    .venv/bin/python bench/ingest.py                 # 1,000,000 rows, ~7 min on a quiet machine
    .venv/bin/python bench/ingest.py --quick         # 100,000 rows, ~4 minutes
    .venv/bin/python bench/ingest.py --rows 400000   # any size

One run, one generated input (``ingest_input.py``): the orders stream of
``millstream.ingest.sources.generator`` (``ORDERS_SCHEMA``, 4 partitions, keys
partition-affine), written once as JSON-lines files, one subdirectory per partition (what the
``files`` source reads).

(a) Millstream catch-up (``ingest_catchup.py``): ``DatastreamRunner(files source -> upsert
    table).run(available_now=True)`` (its batches run as Spark jobs,
    ``millstream.spark.catch_up``) in a warmed SparkSession (two tiny warm-up datastreams run
    first, one as Spark jobs and one as a streaming query, so JVM start and Python-worker start
    are excluded from (a) and (a2)), rows/s over the whole input; the table is read back and
    its row count checked against ``millstream.reference.oracle.expected_table``.
(a2) Catch-up of a running datastream (``ingest_catchup.py``): the same datastream runs on an
    empty input until warm, then the whole input appears at once (files renamed into place);
    rows/s from then until the shard uppers cover it, the table held to the oracle.
(b) Local ceiling (``ingest_baselines.py``): one process, ``pyarrow.json.read_json`` +
    ``pyarrow.parquet.write_table``.
(c) Plain pandas upsert loop (``ingest_baselines.py``): ``pd.read_json(lines=True,
    chunksize=...)``, keep the last row per key by (updated_at, partition, offset), drop
    deletes, write Parquet.
(d) Spark's own ``transformWithStateInPandas`` upsert (``ingest_tws.py``; RocksDB state store,
    ValueState per key, availableNow, noop sink) on a bounded SUBSET of the same input, with a
    time box.
(f) Avro vs JSON (``ingest_formats.py``): the same records decoded by the sink's decoder as
    JSON and as Confluent-framed Avro (confluent-kafka's AvroSerializer, the test schema
    registry), one process, rows/s of each and the ratio; ``--formats-only`` runs just this.
(g) Catch-up through Kafka, JSON against Avro (``ingest_kafka.py``): the same records produced
    into a Tansu broker twice, as JSON and as Confluent-framed Avro, each caught up by the
    kafka source into its own upsert table at (a)'s batch, alternating over 3 rounds; medians
    of rows/s and their ratio, each table held to the oracle. ``--skip g`` leaves it out.
(e) Freshness (``ingest_freshness.py``): a Tansu broker, a producer at a steady rate into a
    4-partition topic, a DatastreamRunner on the kafka source (500 ms trigger), and a sampler
    that every 50 ms notes the last acknowledged offset per partition and the shard uppers. The
    latency of a sample is the first time a shard upper exceeds that offset minus the time the
    produce was acked.

Besides the figures, (a) is profiled (``ingest_observe.py``, ``ingest_profile.py``): Spark's
per-batch ``durationMs`` and the sink's ``commits.jsonl``; task times from Spark's event log
(enabled through ``spark_session(config=...)``; ``--no-event-log`` turns it off); CPU seconds
per process kind from /proc; the source emitting its records into Spark's ``noop`` sink (the
data path before the sink read its own ranges, for comparison); a re-run with timed subclasses
of the stream source and the sink (marker wait, read + decode, Parquet staging per task); the
same batches as plain ``mapPartitions`` jobs (read + decode + stage per task, no streaming
query); and an in-process replay of one batch through the same reader and sink code (read /
decode / Parquet stage / metadata commit timed separately, plus a cProfile of
``SegmentSink.write``). ``ingest_report.py`` prints it all.

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
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import common
from ingest_baselines import ceiling, pandas_upsert
from ingest_catchup import millstream_catch_up, running_catch_up, verify, warm_up
from ingest_formats import formats_catch_up
from ingest_freshness import freshness
from ingest_input import adaptive_batch, make_input
from ingest_kafka import kafka_catch_up
from ingest_observe import event_log_config, spark_jobs
from ingest_profile import (
    fused_probe,
    instrumented_run,
    profile_batch,
    summarize_timed,
)
from ingest_report import report
from ingest_tws import ensure_protobuf, tws_upsert


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=None, help="input rows (default 1,000,000)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 100k rows, 20 s freshness")
    ap.add_argument(
        "--batch",
        type=int,
        default=0,
        help="max_records_per_batch for (a) and (g); 0 (default): unset, the adaptive budget",
    )
    ap.add_argument("--file-rows", type=int, default=50_000, help="lines per input file")
    ap.add_argument("--pandas-chunk", type=int, default=100_000)
    ap.add_argument("--tws-rows", type=int, default=None, help="subset for (d) (20k; quick 4k)")
    ap.add_argument("--tws-timeout", type=float, default=240.0)
    ap.add_argument("--fresh-rate", type=float, default=20_000.0)
    ap.add_argument("--fresh-seconds", type=float, default=None, help="60 s; quick 20 s")
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: a,b,c,d,e,f,g")
    ap.add_argument(
        "--formats-only", action="store_true", help="only (f): Avro vs JSON decode, no Spark"
    )
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--no-wait", action="store_true", help="do not wait for a quiet machine")
    ap.add_argument("--no-event-log", action="store_true", help="no Spark event log (profile)")
    ap.add_argument(
        "--no-profile", action="store_true", help="(a) and (a2) without the profiling re-runs"
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = args.rows or (100_000 if args.quick else 1_000_000)
    skip = set(filter(None, args.skip.split(",")))
    log = common.log
    load_start, waited = (common.load(), 0.0) if args.no_wait else common.wait_for_quiet(log)
    res: dict[str, Any] = {
        "command": common.command_line("ingest.py"),
        "machine": {
            **common.machine("pyspark", "pyarrow", "pandas"),
            "load_start": load_start,
            "load_wait_s": waited,
        },
    }
    log(f"load average at start {load_start} (waited {waited:.0f}s)")
    with common.workdir("millstream-bench-ingest-", keep=args.keep) as base:
        run(args, rows, skip, base, res, log)
    res["machine"]["load_end"] = common.load()
    if "c" in skip:
        res.pop("c", None)
    if not args.formats_only:
        report(res, log)
    if args.json is not None:
        common.write_json(args.json, res)
    return 0


def run(
    args: argparse.Namespace,
    rows: int,
    skip: set[str],
    base: Path,
    res: dict[str, Any],
    log: Callable[[str], None],
) -> None:
    """Every part not skipped, in order, into ``res``."""
    from millstream.catalog import Catalog
    from millstream.spark.session import spark_session

    tws_rows = args.tws_rows or (4_000 if args.quick else 20_000)
    fresh_s = args.fresh_seconds or (20.0 if args.quick else 60.0)
    spark = None
    after_spark: list[Callable[[], Any]] = []
    try:
        inp = make_input(base, rows, args.file_rows)
        res["input"] = inp.summary()
        log(f"input: {rows:,} rows in {inp.seconds:.1f}s under {inp.root}")
        if "f" not in skip:
            res["f"] = formats_catch_up(inp)
            f = res["f"]
            log(
                f"(f) decode: avro {f['avro']['rows_s']:,.0f} rows/s, json "
                f"{f['json']['rows_s']:,.0f} rows/s: avro/json = {f['avro_over_json']:.2f}"
            )
        if args.formats_only:
            return
        if "b" not in skip:
            res["b"] = ceiling(inp, base / "ceiling")
            log(f"(b) ceiling: {res['b']['rows_s']:,.0f} rows/s")
        pandas_result = None
        if "c" not in skip or "a" not in skip:
            res["c"], pandas_result = pandas_upsert(inp, base / "pandas", args.pandas_chunk)
            log(f"(c) pandas: {res['c']['rows_s']:,.0f} rows/s")
        if "d" not in skip:
            res["protobuf_path"] = ensure_protobuf(log)
        event_dir, config = (None, {}) if args.no_event_log else event_log_config(base)
        t0 = time.perf_counter()
        spark = spark_session(app_name="millstream-bench-ingest", config=config)
        res["spark_start_s"] = time.perf_counter() - t0
        catalog = Catalog.open(home=base / "home")
        res["warm_up_s"] = warm_up(spark, catalog, inp, base)
        log(f"spark started in {res['spark_start_s']:.1f}s, warm-up run {res['warm_up_s']:.1f}s")
        tasks = max(1, int(spark.sparkContext.defaultParallelism))
        batch = args.batch or None  # None: the product's default, the adaptive budget
        planned = batch or adaptive_batch(inp, tasks)  # what (a)'s batches plan
        res["planned_batch"] = planned
        if "a" not in skip:
            res["a"] = millstream_catch_up(spark, catalog, inp, batch)
            log(f"(a) millstream: {res['a']['rows_s']:,.0f} rows/s; verifying")
            assert pandas_result is not None
            res["a"]["verify"] = verify(catalog, inp, pandas_result)
            log(f"(a) verify: {res['a']['verify']}")
            res["a2"] = running_catch_up(spark, catalog, inp, base, batch)
            log(
                f"(a2) running datastream, one backlog: {res['a2']['rows_s']:,.0f} rows/s "
                f"(batches {res['a2']['batches']})"
            )
            for b in res["a2"]["timeline"]:
                log(
                    f"    (a2) batch of {b['rows']:,} rows: trigger at +{b['start_s']:.2f}s, "
                    f"latestOffset {b['latestOffset']:.2f}s, addBatch {b['addBatch']:.2f}s, "
                    f"walCommit {b['walCommit']:.2f}s, commitOffsets {b['commitOffsets']:.2f}s, "
                    f"whole {b['triggerExecution']:.2f}s"
                )
            if not args.no_profile:
                res["profile"] = profile_batch(inp, base, planned, tasks)
                res["a"]["jobs"] = spark_jobs(event_dir, job_group=res["a"]["job_group"])
                res["timed"] = instrumented_run(spark, inp, base, batch)
                res["timed"]["jobs"] = spark_jobs(event_dir, res["timed"]["query_id"])
                res["timed"]["summary"] = summarize_timed(res["timed"])
                log(f"instrumented re-run: {res['timed']['rows_s']:,.0f} rows/s")
                res["fused"] = fused_probe(spark, inp, base, planned)
                log(f"fused read+decode+stage tasks: {res['fused']['rows_s']:,.0f} rows/s")
        if "g" not in skip:
            res["g"] = kafka_catch_up(spark, catalog, inp, base, batch, log)
            g = res["g"]
            log(
                f"(g) kafka catch-up medians: avro {g['avro']['median_rows_s']:,.0f} rows/s, "
                f"json {g['json']['median_rows_s']:,.0f} rows/s: avro/json = "
                f"{g['avro_over_json']:.2f}"
            )
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


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
