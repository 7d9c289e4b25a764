"""One process of bench/peers.py: a peer's batch ingest, a peer's streaming loop, a table
pre-load, or a reader. The peers (deltalake, pyiceberg, pypaimon, the pyarrow/polars ceiling)
run under the peers' venv; the reader of a Millstream table runs under the product's
interpreter. Each writes its figures as JSON (``--out``) and, streaming, a log of what it
committed or saw.

Each peer is written as a user would write it:

- deltalake: per batch, dedupe by key (the newest ``seq``), then one ``merge``: delete when
  newer and a delete, update when newer, insert when new and not a delete.
- pyiceberg: per batch, dedupe, then ``upsert`` of the rows and ``delete`` of the deleted
  keys in one transaction (``upsert`` has no "only if newer": batches come in ``seq`` order).
- pypaimon: a primary-key table with ``sequence.field: seq`` and ``rowkind.field`` (``+I`` /
  ``-D``); each batch is written as it came and committed.
- ceiling (batch only): every file read at once, sorted, deduplicated, written as one file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import peers_workload as wl
import pyarrow as pa
import pyarrow.compute as pc

TABLE = "peers"


def _dedupe(batch: pa.Table) -> pa.Table:
    """The newest record of each key in ``batch``."""
    import polars as pl

    df = pl.from_arrow(batch)
    assert isinstance(df, pl.DataFrame)
    return df.sort("seq").unique(subset=["id"], keep="last").to_arrow().cast(wl.ARROW_SCHEMA)


class Delta:
    name = "deltalake"

    def __init__(self, work: Path) -> None:
        self.path = str(work / "delta")

    def create(self, rows: pa.Table | None = None) -> None:
        from deltalake import write_deltalake

        write_deltalake(self.path, rows if rows is not None else wl.ARROW_SCHEMA.empty_table())

    def append(self, rows: pa.Table) -> None:
        from deltalake import write_deltalake

        write_deltalake(self.path, rows, mode="append")

    def merge(self, batch: pa.Table) -> None:
        from deltalake import DeltaTable

        src = _dedupe(batch)
        (
            DeltaTable(self.path)
            .merge(src, predicate="t.id = s.id", source_alias="s", target_alias="t")
            .when_matched_delete(predicate="s.seq > t.seq AND s.is_deleted")
            .when_matched_update_all(predicate="s.seq > t.seq AND NOT s.is_deleted")
            .when_not_matched_insert_all(predicate="NOT s.is_deleted")
            .execute()
        )

    def read(self) -> pa.Table:
        from deltalake import DeltaTable

        return DeltaTable(self.path).to_pyarrow_table()

    def files_dir(self) -> Path:
        return Path(self.path)


class Iceberg:
    name = "pyiceberg"

    def __init__(self, work: Path) -> None:
        from pyiceberg.catalog.sql import SqlCatalog

        (work / "warehouse").mkdir(parents=True, exist_ok=True)
        self.work = work
        self.catalog = SqlCatalog(
            "bench", uri=f"sqlite:///{work}/iceberg.db", warehouse=f"file://{work}/warehouse"
        )

    def create(self, rows: pa.Table | None = None) -> None:
        self.catalog.create_namespace_if_not_exists("bench")
        t = self.catalog.create_table("bench.peers", schema=wl.ARROW_SCHEMA)
        if rows is not None:
            t.append(rows)

    def append(self, rows: pa.Table) -> None:
        self.catalog.load_table("bench.peers").append(rows)

    def merge(self, batch: pa.Table) -> None:
        from pyiceberg.expressions import In

        src = _dedupe(batch)
        deleted = src.filter(src.column("is_deleted"))
        live = src.filter(pc.invert(src.column("is_deleted")))
        t = self.catalog.load_table("bench.peers")
        with t.transaction() as tx:
            if live.num_rows:
                tx.upsert(live, join_cols=["id"])
            if deleted.num_rows:
                tx.delete(In("id", deleted.column("id").to_pylist()))

    def read(self) -> pa.Table:
        return self.catalog.load_table("bench.peers").scan().to_arrow()

    def files_dir(self) -> Path:
        return self.work / "warehouse"


class Paimon:
    name = "pypaimon"

    def __init__(self, work: Path) -> None:
        from pypaimon import CatalogFactory

        self.work = work
        self.catalog = CatalogFactory.create({"warehouse": str(work / "paimon")})

    @staticmethod
    def _rows(batch: pa.Table) -> pa.Table:
        kind = pc.if_else(batch.column("is_deleted"), "-D", "+I")
        return batch.append_column("rowkind", kind)

    def create(self, rows: pa.Table | None = None) -> None:
        from pypaimon import Schema

        self.catalog.create_database("default", True)
        fields = [
            pa.field("id", pa.int64(), nullable=False),
            *list(wl.ARROW_SCHEMA)[1:],
            pa.field("rowkind", pa.string()),
        ]
        schema = Schema.from_pyarrow_schema(
            pa.schema(fields),
            primary_keys=["id"],
            options={"bucket": "4", "sequence.field": "seq", "rowkind.field": "rowkind"},
        )
        self.catalog.create_table("default.peers", schema, False)
        if rows is not None:
            self.merge(rows)

    def append(self, rows: pa.Table) -> None:
        self.merge(rows)

    def merge(self, batch: pa.Table) -> None:
        table = self.catalog.get_table("default.peers")
        wb = table.new_batch_write_builder()
        write, commit = wb.new_write(), wb.new_commit()
        rows = self._rows(batch)
        write.write_arrow(rows.cast(pa.schema(_paimon_schema(rows.schema))))
        commit.commit(write.prepare_commit())
        write.close()
        commit.close()

    def read(self) -> pa.Table:
        table = self.catalog.get_table("default.peers")
        rb = table.new_read_builder()
        return rb.new_read().to_arrow(rb.new_scan().plan().splits())

    def files_dir(self) -> Path:
        return self.work / "paimon"


def _paimon_schema(schema: pa.Schema) -> list[pa.Field]:
    return [f.with_nullable(False) if f.name == "id" else f for f in schema]


class MillstreamReader:
    """A reader of the Millstream table (product interpreter only). It polls, so it holds the
    read cache as a polling reader does (docs/concepts.md, "Reading again and again"): each
    read merges what was committed since the last onto that read's winning rows."""

    name = "millstream"
    #: Enough for the winning rows of a 10,000,000-key table and the files of a full read.
    READ_CACHE_MB = 4096

    def __init__(self, work: Path) -> None:
        from millstream.catalog import Catalog

        self.work = work
        self.catalog = Catalog.open(home=work / "home", read_cache_mb=self.READ_CACHE_MB)

    def read(self) -> pa.Table:
        return self.catalog.read_table(TABLE)

    def uppers(self) -> dict[int, int]:
        return {s.partition: s.upper for s in self.catalog.store.list_shards("peers")}

    def files_dir(self) -> Path:
        return self.work / "home" / "deepstore"


SYSTEMS: dict[str, Any] = {
    "deltalake": Delta,
    "pyiceberg": Iceberg,
    "pypaimon": Paimon,
    "millstream": MillstreamReader,
}


def warm_imports(system: str) -> None:
    """Import what ``system`` needs before a timed section (imports are not the system's work)."""
    import importlib

    for m in {
        "deltalake": ["deltalake", "polars"],
        "pyiceberg": [
            "pyiceberg.catalog.sql",
            "pyiceberg.expressions",
            "pyiceberg.table",
            "polars",
        ],
        "pypaimon": ["pypaimon"],
        "ceiling": ["polars", "pyarrow.parquet"],
        "millstream": ["millstream.catalog"],
    }.get(system, []):
        importlib.import_module(m)


def millstream_warm(files: list[Path], work: Path) -> tuple[int, float]:
    """``DatastreamRunner.run(available_now=True)`` over ``files`` in a SparkSession that has
    already run a 1,000-record datastream: the catch-up alone, warm."""
    from millstream.catalog import Catalog
    from millstream.datastream import DatastreamSpec
    from millstream.spark.runner import DatastreamRunner
    from millstream.spark.session import spark_session

    catalog = Catalog.open(home=work / "home")
    spark = spark_session()

    def spec(name: str, path: Path) -> Any:
        return DatastreamSpec.parse(
            {
                "name": name,
                "source": {"kind": "files", "path": str(path)},
                "table": {
                    "name": name,
                    "primary_key": ["id"],
                    "mode": "upsert",
                    "comparison_column": "seq",
                    "delete_column": "is_deleted",
                },
                "schema": wl.SCHEMA_SPEC,
            }
        )

    warm = work / "warmup-input"
    wl.batch_files(warm, 99, 1000, 100)
    DatastreamRunner(spec("warmup", warm), catalog, spark, writer_id="warm").run(available_now=True)
    runner = DatastreamRunner(spec(TABLE, files[0].parent.parent), catalog, spark, writer_id="warm")
    t0 = time.perf_counter()
    runner.run(available_now=True)
    seconds = time.perf_counter() - t0
    rows = sum(c.get("rows") or 0 for c in runner.commits())
    spark.stop()
    return rows, seconds


def files_and_bytes(root: Path) -> tuple[int, int]:
    n = b = 0
    for p in root.rglob("*.parquet"):
        n += 1
        b += p.stat().st_size
    return n, b


def _done(out: Path, payload: dict[str, Any]) -> None:
    out.write_text(json.dumps(payload, default=str))
    sys.stdout.flush()
    # deltalake can abort at interpreter exit after a read (rc 134): the result is written.
    os._exit(0)


# ---------------------------------------------------------------------------------------------
# Batch
# ---------------------------------------------------------------------------------------------


def batch(args: argparse.Namespace) -> None:
    files = [Path(f) for f in json.loads(Path(args.files).read_text())]
    work = Path(args.work)
    rows = 0
    warm_imports(args.system)
    if args.system == "millstream-warm":
        rows, seconds = millstream_warm(files, work)
    elif args.system == "ceiling":
        import polars as pl
        import pyarrow.parquet as pq

        t0 = time.perf_counter()
        table = pa.concat_tables(wl.decode(f.read_bytes()) for f in files)
        rows = table.num_rows
        df = pl.from_arrow(table)
        assert isinstance(df, pl.DataFrame)
        df = df.sort("seq").unique(subset=["id"], keep="last").filter(~pl.col("is_deleted"))
        (work / "ceiling").mkdir(parents=True, exist_ok=True)
        pq.write_table(df.to_arrow(), work / "ceiling" / "part-0.parquet")
        seconds = time.perf_counter() - t0
    else:
        system = SYSTEMS[args.system](work)
        t0 = time.perf_counter()
        system.create()
        for f in files:
            b = wl.decode(f.read_bytes())
            rows += b.num_rows
            system.merge(b)
        seconds = time.perf_counter() - t0
    _done(Path(args.out), {"rows": rows, "seconds": seconds, "rows_s": rows / seconds})


def read_check(args: argparse.Namespace) -> None:
    """Open and read the current table three times in a fresh process (each timed: the first
    pays the libraries' lazy start-up, the best of the other two is the read), then check it
    against the model."""
    work = Path(args.work)
    warm_imports(args.system)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        if args.system == "ceiling":
            import pyarrow.parquet as pq

            table = pq.read_table(work / "ceiling")
            root = work / "ceiling"
        else:
            system = SYSTEMS[args.system](work)
            table = system.read()
            root = system.files_dir()
        times.append(time.perf_counter() - t0)
    expected = wl.model([wl.records(args.seed, args.keys, 0, args.rows)])
    n, b = files_and_bytes(root)
    _done(
        Path(args.out),
        {
            "read_first_s": times[0],
            "read_s": min(times[1:]),
            "check": wl.check(table, expected),
            "files": n,
            "bytes": b,
        },
    )


# ---------------------------------------------------------------------------------------------
# Streaming
# ---------------------------------------------------------------------------------------------


def preload(args: argparse.Namespace) -> None:
    """Create the table with keys 0 .. K-1 (seq = key), in slices of a million rows."""
    system = SYSTEMS[args.system](Path(args.work))
    t0 = time.perf_counter()
    step = 1_000_000
    first = wl.to_arrow(wl.preload(args.keys, 0, step))
    system.create(first)
    for lo in range(step, args.keys, step):
        system.append(wl.to_arrow(wl.preload(args.keys, lo, step)))
    _done(Path(args.out), {"seconds": time.perf_counter() - t0})


def stream(args: argparse.Namespace) -> None:
    """Consume what arrived each second and merge it; log (commit end, newest seq, rows,
    merge seconds) per batch until the stop file appears and the topic is drained."""
    from confluent_kafka import Consumer, TopicPartition

    system = SYSTEMS[args.system](Path(args.work))
    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": f"bench-{args.system}",
            "enable.auto.commit": False,
            "log.connection.close": False,
            "fetch.wait.max.ms": 50,
        }
    )
    consumer.assign([TopicPartition(args.topic, p, 0) for p in range(args.partitions)])
    stop = Path(args.stop)
    log = open(args.log, "a")  # noqa: SIM115
    idle_since: float | None = None
    while True:
        t_start = time.time()
        values: list[bytes] = []
        deadline = t_start + args.interval
        while True:
            msgs = consumer.consume(50_000, timeout=max(0.0, deadline - time.time()))
            values.extend(m.value() for m in msgs if m.error() is None and m.value())
            if time.time() >= deadline:
                break
        if not values:
            if stop.exists():
                idle_since = idle_since or time.time()
                if time.time() - idle_since > 3:
                    break
            continue
        idle_since = None
        batch_t = wl.decode(b"\n".join(values))
        t0 = time.time()
        system.merge(batch_t)
        t1 = time.time()
        newest = int(pc.max(batch_t.column("seq")).as_py())
        log.write(json.dumps([t1, newest, batch_t.num_rows, t1 - t0, t0 - t_start]) + "\n")
        log.flush()
    consumer.close()
    _done(Path(args.out), {"ok": True})


def reader(args: argparse.Namespace) -> None:
    """Read the whole current table in a loop; log (end of read, newest seq seen, read
    seconds, rows, the read's CPU seconds in this process[, Millstream's shard uppers]) until
    the stop file appears."""
    system = SYSTEMS[args.system](Path(args.work))
    stop = Path(args.stop)
    log = open(args.log, "a")  # noqa: SIM115
    while not stop.exists():
        t0, c0 = time.time(), time.process_time()
        try:
            table = system.read()
        except Exception as exc:  # a table being created, a file a commit just replaced
            log.write(json.dumps({"error": repr(exc)[:200], "t": t0}) + "\n")
            time.sleep(0.2)
            continue
        t1, c1 = time.time(), time.process_time()
        newest = int(pc.max(table.column("seq")).as_py()) if table.num_rows else -1
        rec: list[Any] = [t1, newest, t1 - t0, table.num_rows, c1 - c0]
        if isinstance(system, MillstreamReader):
            rec.append(system.uppers())
        log.write(json.dumps(rec) + "\n")
        log.flush()
        time.sleep(args.pause)
    _done(Path(args.out), {"ok": True})


def final_check(args: argparse.Namespace) -> None:
    """The table after a streaming run against the model: the pre-load and the first
    ``--rows`` stream records."""
    warm_imports(args.system)
    t0 = time.perf_counter()
    system = SYSTEMS[args.system](Path(args.work))
    table = system.read()
    seconds = time.perf_counter() - t0
    parts = [wl.preload(args.keys, 0, args.keys)]
    parts.append(wl.records(args.seed, args.keys, 0, args.rows, wl.STREAM_SEQ_BASE))
    n, b = files_and_bytes(system.files_dir())
    _done(
        Path(args.out),
        {"read_s": seconds, "check": wl.check(table, wl.model(parts)), "files": n, "bytes": b},
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("role", choices=["batch", "read", "preload", "stream", "reader", "final"])
    ap.add_argument("system")
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--files")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rows", type=int, default=0)
    ap.add_argument("--keys", type=int, default=0)
    ap.add_argument("--bootstrap")
    ap.add_argument("--topic")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--stop")
    ap.add_argument("--log")
    ap.add_argument("--pause", type=float, default=0.0)
    args = ap.parse_args()
    {
        "batch": batch,
        "read": read_check,
        "preload": preload,
        "stream": stream,
        "reader": reader,
        "final": final_check,
    }[args.role](args)


if __name__ == "__main__":
    main()
