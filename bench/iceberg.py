"""Iceberg view benchmark: what publishing a table's view costs, and what reading it costs
DuckDB and pyiceberg against the same live rows as one plain Parquet file.

Run from the repository root::

    .venv/bin/python bench/iceberg.py            # 1M rows, 200k keys (issue 34's table)
    .venv/bin/python bench/iceberg.py --quick    # 200k rows, 40k keys

The table is an upsert table of N rows over N/5 keys in one partition, written as 10 commits
of random keys (so every file holds superseded rows), each published as the worker's publisher
does (incrementally, through one ``PublishCache``); then one more commit of 5,000 rows (a
second at 5,000 rows/s) is published, then the table is sealed and published again. For each
of those two publishes it prints the incremental publish's time against what a publish that
is not incremental computes (``full_view``: every data file read) and against pyarrow reading
the live rows from one plain Parquet file. Each read is the median of the repetitions, page
cache warm:

* DuckDB ``SELECT sum(...)`` over ``iceberg_scan`` of the current snapshot, against DuckDB's
  ``read_parquet`` of one zstd Parquet file holding the same live rows;
* pyiceberg's ``StaticTable.scan().to_arrow()``, against ``pyarrow.parquet.read_table`` of
  that file.

Extensions load from the ``duckdb-extension-avro`` / ``-iceberg`` packages' files; nothing is
downloaded.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import duckdb
import duckdb_extension_avro
import duckdb_extension_iceberg
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.table import StaticTable

from millstream.catalog import Catalog
from millstream.sealing.keyindex import IndexCache
from millstream.sealing.sealer import Sealer
from millstream.table.iceberg import PublishCache, full_view, location, publish
from millstream.table.writer import commit_staged, stage_rows


def duckdb_connection() -> duckdb.DuckDBPyConnection:
    """DuckDB with its avro, then iceberg, extension loaded from their packages' files."""
    con = duckdb.connect(config={"autoinstall_known_extensions": False})
    for module, name in ((duckdb_extension_avro, "avro"), (duckdb_extension_iceberg, "iceberg")):
        folder = Path(module.__file__).parent / "extensions" / f"v{duckdb.__version__}"
        con.execute(f"LOAD '{folder / f'{name}.duckdb_extension'}'")
    return con


def median_seconds(fn: Callable[[], object], reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    rows = 200_000 if args.quick else 1_000_000
    keys, commits = rows // 5, 10
    home = Path(tempfile.mkdtemp(prefix="ms-iceberg-bench-"))
    cat = Catalog.open(home=home)
    spec = cat.create_table(
        {
            "name": "kv",
            "schema": {"k": "long", "v": "double", "s": "string"},
            "mode": "upsert",
            "primary_key": ["k"],
        }
    ).spec
    rng = np.random.default_rng(0)
    n = rows // commits
    cache = PublishCache()

    def commit(lo: int, count: int) -> None:
        table = pa.table(
            {
                "k": pa.array(rng.integers(0, keys, count), pa.int64()),
                "v": pa.array(rng.random(count)),
                "s": pa.array([f"value-{i}" for i in range(lo, lo + count)]),
                "_ms_partition": pa.array(np.zeros(count, np.int32)),
                "_ms_offset": pa.array(np.arange(lo, lo + count, dtype=np.int64)),
                "_ms_tombstone": pa.array(np.zeros(count, bool)),
            }
        )
        staged = stage_rows(cat.deep, spec, table)
        commit_staged(cat.store, cat.deep, "kv", staged, {0: (lo, lo + count)}, {})

    publishes = []
    for c in range(commits):
        commit(c * n, n)
        t0 = time.perf_counter()
        publish(cat.store, cat.deep, "kv", cache=cache)
        publishes.append(time.perf_counter() - t0)
    con = duckdb_connection()
    print(
        f"upsert table: {rows} rows, {keys} keys, {commits} commits, each published: "
        f"{sum(publishes):.2f} s in all (first, in full: {publishes[0]:.2f} s)"
    )
    commit(rows, 5_000)  # one second at 5,000 rows/s
    for state in ("unsealed", "sealed"):
        if state == "sealed":
            Sealer(cat, "kv", index_cache=IndexCache()).seal_partition(0, force=True)
        measure(cat, con, home, state, args.reps, cache)


def measure(
    cat: Catalog,
    con: duckdb.DuckDBPyConnection,
    home: Path,
    state: str,
    reps: int,
    cache: PublishCache,
) -> None:
    t0 = time.perf_counter()
    result = publish(cat.store, cat.deep, "kv", cache=cache)
    published = time.perf_counter() - t0
    assert result.pointer is not None and result.stats["incremental"] == 1
    t0 = time.perf_counter()
    full_view(cat.deep, cat.manifest("kv"))
    full = time.perf_counter() - t0
    metadata = location(cat.deep, result.pointer.metadata_location)
    live = cat.read_table("kv")
    plain = home / f"plain-{state}.parquet"
    pq.write_table(live, plain, compression="zstd")
    q = "SELECT count(*), sum(v), sum(length(s)) FROM {}"
    view_answer = con.execute(q.format("iceberg_scan(?)"), [metadata]).fetchone()
    plain_answer = con.execute(q.format("read_parquet(?)"), [str(plain)]).fetchone()
    assert view_answer is not None and plain_answer is not None
    assert view_answer[0] == plain_answer[0] == live.num_rows
    duck_view = median_seconds(
        lambda: con.execute(q.format("iceberg_scan(?)"), [metadata]).fetchone(), reps
    )
    duck_plain = median_seconds(
        lambda: con.execute(q.format("read_parquet(?)"), [str(plain)]).fetchone(), reps
    )
    table = StaticTable.from_metadata(metadata)
    pyice = median_seconds(lambda: table.scan().to_arrow(), reps)
    arrow = median_seconds(lambda: pq.read_table(plain), reps)
    read_plain = median_seconds(lambda: pq.read_table(plain), 1)
    print(
        f"{state:9s} publish {published:6.2f} s incremental vs {full:6.2f} s in full "
        f"(plain read {read_plain:5.2f} s) | live rows {live.num_rows} | "
        f"DuckDB view {duck_view * 1000:7.1f} ms vs plain {duck_plain * 1000:7.1f} ms "
        f"= {duck_view / duck_plain:4.2f}x | pyiceberg {pyice * 1000:7.1f} ms vs pyarrow "
        f"{arrow * 1000:7.1f} ms = {pyice / arrow:4.2f}x"
    )


if __name__ == "__main__":
    main()
