"""Batch-cost benchmark: what Millstream's own code costs per micro-batch of a caught-up
datastream, outside Spark.

``bench/scale.py`` (b) found a caught-up datastream's micro-batch costing about 0.6 CPU-s
whatever it holds (500 records at 1,000 rows/s and a 500 ms trigger), so N datastreams on a
worker cost N times that. This bench shows how much of it is Millstream's: in one process,
without Spark, it drives a datastream's production pieces as a micro-batch does, batch after
batch: the stream source's planning (``StreamReader.latestOffset`` and ``partitions``), each
write task's ``SegmentSink.write`` (read its ranges from the generator source, decode, stage
the data and dead-letter files) and the driver's ``SegmentSink.commit`` (one metadata
transaction for the table and its dead-letter table). The baseline, in the same run, on the
same records: reading them from the source plus ``pyarrow.json.read_json`` and
``pyarrow.parquet.write_table``, the least a batch's read, decode and staging can cost (the
generator makes its records when first read and keeps them: they are made before either is
timed). Run from the repository root::

    .venv/bin/python bench/batch_cost.py                       # 60 batches of 500 records
    .venv/bin/python bench/batch_cost.py --records 5000

It prints the median milliseconds of each piece per batch, the batch's total, and its ratio to
the baseline. SQLite metadata and a local deep store under a temporary directory.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

import common
import pyarrow as pa
import pyarrow.json as pj
import pyarrow.parquet as pq
from pyspark.sql.datasource import InputPartition
from rich.console import Console

from millstream.catalog import Catalog
from millstream.config import Settings
from millstream.datastream import DatastreamSpec, dead_letter_spec
from millstream.ingest.sources import config_for
from millstream.ingest.sources.base import PartitionReader
from millstream.ingest.sources.generator import ORDERS_SCHEMA
from millstream.spark.options import SinkOptions, SourceOptions
from millstream.spark.runner import bootstrap
from millstream.spark.sink import SegmentSink, StoreRegistry
from millstream.spark.sources import RangeTask, StreamReader

PARTITIONS = 4
TASKS = 2  # a batch's write tasks: one per core of local[2]


def _values(generator: PartitionReader, tasks: list[InputPartition]) -> list[bytes]:
    """The JSON values of the tasks' ranges, as the source reads them (tombstones left out)."""
    return [
        v
        for t in tasks
        if isinstance(t, RangeTask)
        for p, lo, hi in t.ranges
        for b in generator.read_range(p, lo, hi)
        for v in b.column("value").to_pylist()
        if v is not None
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--records", type=int, default=500, help="records a batch")
    parser.add_argument("--json", type=Path, default=None, help="save the figures here")
    args = parser.parse_args(argv)
    console = Console(soft_wrap=True)
    console.print(f"$ {common.command_line('batch_cost.py')}")
    console.print(f"load {common.load_text()}; {common.cpu_model()}")
    times: dict[str, list[float]] = {"plan": [], "write tasks": [], "commit": [], "baseline": []}
    with tempfile.TemporaryDirectory(prefix="millstream-bench-batch-") as tmp:
        home = Path(tmp) / "home"
        ds = DatastreamSpec.parse(
            {
                "name": "orders",
                "source": {
                    "kind": "generator",
                    "partitions": PARTITIONS,
                    "key_cardinality": 20_000,
                    "total": 10**9,
                },
                "table": {"primary_key": ["order_id"], "mode": "upsert"},
                "schema": ORDERS_SCHEMA,
            }
        )
        with Catalog.open(home=home) as cat:
            cat.create_table(ds.table_spec())
            cat.create_table(dead_letter_spec(ds.table_spec()))
            kind, config = config_for(ds.source)
            boot = bootstrap(ds, cat.store)
            source = SourceOptions(
                kind,
                config,
                max_records_per_batch=args.records,
                start_offsets=boot.uppers,
                tasks=TASKS,
            )
            sink = SinkOptions(
                settings=Settings.load(home=home),
                table_spec=ds.table_spec(),
                writer_id="bench",
                epochs=boot.epochs,
                dead_letter_epochs=boot.dead_letter_epochs,
                source_kind=kind,
                source_config=config,
            )
            stores = StoreRegistry()
            reader = StreamReader(source)
            generator = source.reader()
            start = reader.initialOffset()
            try:
                for i in range(args.batches + 5):  # the first 5 warm the caches: not counted
                    t0 = time.perf_counter()
                    end = reader.latestOffset(start, reader.getDefaultReadLimit())
                    tasks = reader.partitions(start, end)
                    t1 = time.perf_counter()
                    # The generator makes its records when first read and keeps them: made
                    # here, untimed, both the tasks and the baseline read them ready-made.
                    _values(generator, tasks)
                    t1b = time.perf_counter()
                    messages = [SegmentSink(sink, stores).write(reader.read(t)) for t in tasks]
                    t2 = time.perf_counter()
                    SegmentSink(sink, stores).commit(messages, i)
                    t3 = time.perf_counter()
                    # The baseline: the same records read, decoded by pyarrow, written once.
                    values = _values(generator, tasks)
                    decoded = pj.read_json(io.BytesIO(b"\n".join(values)))
                    pq.write_table(decoded, pa.BufferOutputStream(), compression="zstd")
                    t5 = time.perf_counter()
                    if i >= 5:
                        times["plan"].append((t1 - t0) * 1000)
                        times["write tasks"].append((t2 - t1b) * 1000)
                        times["commit"].append((t3 - t2) * 1000)
                        times["baseline"].append((t5 - t3) * 1000)
                    start = end
            finally:
                stores.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    total = med["plan"] + med["write tasks"] + med["commit"]
    ratio = common.ratio(total, med["baseline"])
    console.print(
        f"{args.batches} batches of {args.records:,} records over {PARTITIONS} partitions and "
        f"{TASKS} write tasks, medians: plan {med['plan']:.1f} ms, write tasks "
        f"{med['write tasks']:.1f} ms (both), commit {med['commit']:.1f} ms; Millstream's "
        f"batch {total:.1f} ms = {ratio:.2f}x the baseline (the same records read, decoded by "
        f"pyarrow and written as Parquet: {med['baseline']:.1f} ms)"
    )
    if args.json is not None:
        common.write_json(
            args.json,
            {
                "machine": common.machine("pyarrow"),
                "args": vars(args) | {"json": str(args.json)},
                "ms": times,
                "batch_vs_baseline": ratio,
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
