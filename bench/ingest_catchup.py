"""(a) Millstream catch-up: ``DatastreamRunner(files source -> upsert table).run(available_now=
True)`` in a warmed SparkSession, rows/s over the whole input, and the table read back and
checked against the oracle and against (c)'s pandas result."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from ingest_input import Input, files_spec, oracle_rows, write_files
from ingest_observe import cpu_delta, peak_rss_mb, process_cpu, progress, progress_seconds


def warm_up(spark: Any, catalog: Any, inp: Input, base: Path) -> float:
    """Two tiny datastreams run first, so JVM and Python-worker start are not in (a) or (a2):
    one as (a) runs (``available_now``: Spark jobs), one as a streaming query, as (a2) and
    every running datastream run. The first streaming query of a process costs 12-15 s more
    than later ones (its source, planner and commit-runner processes start)."""
    from millstream.spark.runner import DatastreamRunner

    root = base / "warmup-input"
    write_files(root, {p: ls[:500] for p, ls in inp.lines.items()}, 500)
    t0 = time.perf_counter()
    DatastreamRunner(files_spec("warmup", root, 1000), catalog, spark, writer_id="bench").run(
        available_now=True
    )
    stream = DatastreamRunner(
        files_spec("warmup-stream", root, 1000), catalog, spark, writer_id="bench"
    )
    run_until_caught_up(stream)
    return time.perf_counter() - t0


def run_until_caught_up(runner: Any) -> None:
    """``runner.run()`` (the running writer's streaming query), stopped at a batch boundary
    once the shards reach the source's latest offsets as they were when called."""
    from millstream.ingest.sources import spec_reader

    target = spec_reader(runner.spec.source).latest_offsets()

    def tick(r: Any) -> None:
        uppers = {s.partition: s.upper for s in r.catalog.store.list_shards(r.spec.table_name)}
        if all(uppers.get(p, -1) >= o for p, o in target.items()):
            r.stop_after_batch()

    runner.run(available_now=False, on_tick=tick, tick_seconds=0.2)


def millstream_catch_up(spark: Any, catalog: Any, inp: Input, batch: int | None) -> dict[str, Any]:
    from millstream.spark.runner import DatastreamRunner

    spec = files_spec("orders", inp.root, batch)
    runner = DatastreamRunner(spec, catalog, spark, writer_id="bench")
    cpu0 = process_cpu()
    t0 = time.perf_counter()
    started = time.time()
    runner.run(available_now=True)
    s = time.perf_counter() - t0
    cpu = cpu_delta(cpu0, process_cpu())
    return {
        "job_group": runner.job_group,  # its batches run as Spark jobs, not a query
        "cpu_s": cpu,
        "rows": inp.rows,
        "seconds": s,
        "rows_s": inp.rows / s,
        "batch": batch,
        "started_at": started,
        "commits": runner.commits(),
        "stats_file": str(runner.stats_file),
    }


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


def _timeline(query: Any, wall0: float) -> list[dict[str, Any]]:
    """The micro-batches that read the backlog, from the query's progress: each one's trigger
    start (seconds after the backlog appeared; Spark's progress timestamps are milliseconds)
    and its durations (``latestOffset``, ``addBatch``, ``walCommit``, ``commitOffsets``,
    ``triggerExecution``), so (a2)'s time splits into the wait for a trigger and the batches."""
    out = []
    for b in progress(query) if query is not None else []:
        start = progress_seconds(b["timestamp"])
        if start < wall0 - 1:
            continue
        if b["batch"] < 0 or "addBatch" not in b["duration_ms"]:
            continue
        d = b["duration_ms"]
        out.append(
            {
                "start_s": round(start - wall0, 3),
                "batch_id": b["batch"],
                "rows": b["input_rows"],
                **{
                    k: d.get(k, 0) / 1000
                    for k in (
                        "latestOffset",
                        "addBatch",
                        "walCommit",
                        "commitOffsets",
                        "triggerExecution",
                    )
                },
            }
        )
    return out


def running_catch_up(
    spark: Any, catalog: Any, inp: Input, base: Path, batch: int | None
) -> dict[str, Any]:
    """(a2) A running datastream falls ``inp.rows`` records behind: the query runs on an
    empty input (500 ms trigger, the default) until it is warm, then the whole input appears
    at once (each file written under a hidden name and renamed into place), and the clock runs
    from then until the shard uppers cover every record. The query start that (a) pays is
    paid once per run, not per backlog; this is the catch-up of a datastream that is behind."""
    import threading

    from millstream.spark.runner import DatastreamRunner

    root = base / "running-input"
    for p in inp.lines:
        (root / str(p)).mkdir(parents=True)
    spec = files_spec("running", root, batch)
    runner = DatastreamRunner(spec, catalog, spark, writer_id="bench")
    runner.ensure_tables()
    errors: list[BaseException] = []

    def _run() -> None:
        try:
            runner.run(available_now=False)
        except BaseException as exc:
            errors.append(exc)

    def uppers() -> dict[int, int]:
        return {s.partition: s.upper for s in catalog.store.list_shards("running")}

    thread = threading.Thread(target=_run, name="running-catch-up", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 120
        while runner.query is None or not runner.query.isActive:
            if errors:
                raise errors[0]
            if time.monotonic() > deadline:
                raise TimeoutError("(a2): the query did not start")
            time.sleep(0.05)
        time.sleep(5)  # the query's source process started, several empty triggers passed
        staged = []
        for p, files in inp.files.items():
            for f in files:
                hidden = root / str(p) / f".{f.name}"
                hidden.write_bytes(f.read_bytes())
                staged.append((hidden, root / str(p) / f.name))
        want = {p: len(ls) for p, ls in inp.lines.items()}
        cpu0 = process_cpu()
        t0, wall0 = time.perf_counter(), time.time()
        for hidden, final in staged:
            hidden.rename(final)
        deadline = time.monotonic() + 300
        while True:
            u = uppers()
            if all(u.get(p, 0) >= n for p, n in want.items()):
                break
            if errors:
                raise errors[0]
            if time.monotonic() > deadline:
                raise TimeoutError(f"(a2): uppers {u} after 300 s, want {want}")
            time.sleep(0.02)
        s = time.perf_counter() - t0
        cpu = cpu_delta(cpu0, process_cpu())
        commits = [c for c in runner.commits() if c.get("rows")]
        query = runner.query
        time.sleep(1)  # the last batch's progress is posted after its commit
    finally:
        runner.stop()
        thread.join(timeout=60)
    timeline = _timeline(query, wall0)
    table = catalog.read_table("running").num_rows
    expected = oracle_rows(inp)
    assert table == expected, f"(a2): {table} rows, the oracle {expected}"
    return {
        "rows": inp.rows,
        "seconds": s,
        "rows_s": inp.rows / s,
        "cpu_s": cpu,
        "batch": batch,
        "batches": [c["rows"] for c in commits],
        "table_rows": table,
        "timeline": timeline,
        "peak_task_worker_rss_mb": peak_rss_mb("Python workers (read + write tasks)"),
    }
