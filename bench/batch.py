"""Batch benchmark: ``millstream run --available-now`` of N upserts from JSON files in a fresh
process, as a user runs it, against the single-process pyarrow ceiling in the same run.

Run from the repository root::

    .venv/bin/python bench/batch.py                  # 1,000,000 upserts, 10 files, ~1 minute
    .venv/bin/python bench/batch.py --runs 3         # the median of 3 runs of each
    .venv/bin/python bench/batch.py --rows 100000    # smoke run
    .venv/bin/python bench/batch.py --phases         # + where the CLI's time goes (one run)

The workload (the shape of Paimon's cluster-benchmark q1): ``--rows`` JSON records of ~150
bytes, keys uniform at random in ``[0, --keys)``, a monotonic comparison column
(``updated_at``), 2% deletes (``is_deleted: true``), in ``--files`` files spread over 4
partition directories of the ``files`` source. Each system runs in a process of its own:

* **ceiling**: one Python process that reads the files with ``pyarrow.json``, keeps each key's
  last row by ``updated_at``, drops deletes and writes one Parquet file (zstd);
* **millstream**: ``millstream run -f spec.yaml --available-now`` at defaults (a fresh JVM
  and SparkSession, the catch-up, the seal before exit, the summary).

Per system: the whole process's wall time, the peak RSS of its process tree (every
descendant's RSS summed, sampled every 20 ms: the JVM and Spark's Python workers included),
and a read of the resulting table right after, in another fresh process (the read call
alone is timed, median of 3; Millstream's through ``Catalog.read_table``). Every table is
checked against the model (each key's last row by ``updated_at``, deletes dropped).
``--phases`` runs the CLI once more with timers around its stages (the same ``run`` command,
in a process of its own, its functions wrapped) and prints where the time went.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import common

PARTITIONS = 4
SEED = 39
BASE_US = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z
SCHEMA = {
    "order_id": "long",
    "customer": "string",
    "amount": "double",
    "status": "string",
    "updated_at": "timestamp",
    "is_deleted": "boolean",
}
HERE = Path(__file__).resolve()


# ---------------------------------------------------------------------------------------------
# Input and model
# ---------------------------------------------------------------------------------------------


def make_input(root: Path, rows: int, keys: int, files: int) -> list[Path]:
    """``files`` JSON-lines files of ``rows`` records over the partition directories 0..3
    (file i in partition i % 4): record i has a uniform random key, ``updated_at`` i ms after
    the base (monotonic), and 2% are deletes."""
    import numpy as np
    import polars as pl

    rng = np.random.default_rng(SEED)
    key = rng.integers(0, keys, rows)
    deleted = rng.random(rows) < 0.02
    ts = (BASE_US + np.arange(rows, dtype=np.int64) * 1000).astype("datetime64[us]")
    df = pl.DataFrame(
        {
            "order_id": key,
            "customer": [f"customer-{c:06d}" for c in rng.integers(0, 50_000, rows)],
            "amount": np.round(rng.random(rows) * 1000, 2),
            "status": np.array(["new", "paid", "shipped", "delivered", "returned"])[
                rng.integers(0, 5, rows)
            ],
            "updated_at": pl.Series(ts).dt.strftime("%Y-%m-%dT%H:%M:%S%.6fZ"),
            "is_deleted": deleted,
        }
    )
    out = []
    per = -(-rows // files)
    for i in range(files):
        d = root / str(i % PARTITIONS)
        d.mkdir(parents=True, exist_ok=True)
        f = d / f"part-{i:05d}.json"
        df.slice(i * per, per).write_ndjson(f)
        out.append(f)
    return out


def read_input(files: list[Path]) -> Any:
    import pyarrow as pa
    import pyarrow.json as pj

    schema = pa.schema(
        [
            ("order_id", pa.int64()),
            ("customer", pa.string()),
            ("amount", pa.float64()),
            ("status", pa.string()),
            ("updated_at", pa.timestamp("us", tz="UTC")),
            ("is_deleted", pa.bool_()),
        ]
    )
    opts = pj.ParseOptions(explicit_schema=schema)
    return pa.concat_tables([pj.read_json(f, parse_options=opts) for f in files])


def resolve(table: Any) -> Any:
    """Each key's last row by ``updated_at``, deletes dropped."""
    import polars as pl

    df = pl.from_arrow(table)
    assert isinstance(df, pl.DataFrame)
    last = df.sort("updated_at").unique("order_id", keep="last", maintain_order=False)
    return last.filter(~pl.col("is_deleted")).drop("is_deleted").sort("order_id").to_arrow()


def fingerprint(table: Any) -> list[tuple[int, int]]:
    """(key, updated_at in µs) of every row, sorted: what a table is checked by."""
    import pyarrow as pa
    import pyarrow.compute as pc

    return sorted(
        zip(
            table.column("order_id").to_pylist(),
            pc.cast(table.column("updated_at").cast(pa.timestamp("us")), pa.int64()).to_pylist(),
            strict=True,
        )
    )


# ---------------------------------------------------------------------------------------------
# Children: each runs in a process of its own
# ---------------------------------------------------------------------------------------------


def child_ceiling(input_dir: Path, out: Path) -> None:
    import pyarrow.parquet as pq

    t0 = time.perf_counter()
    files = sorted(input_dir.glob("*/*.json"))
    table = resolve(read_input(files))
    out.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out / "table.parquet", compression="zstd")
    print(json.dumps({"in_process_s": time.perf_counter() - t0, "rows": table.num_rows}))


def child_read(kind: str, where: Path, model: Path) -> None:
    """Time the read of the table (median of 3) and check it against the model."""
    import pyarrow.parquet as pq

    if kind == "ceiling":

        def read() -> Any:
            return pq.read_table(where / "table.parquet")
    else:
        from millstream.catalog import Catalog

        cat = Catalog.open(home=where)

        def read() -> Any:
            return cat.read_table("orders")

    times, table = [], None
    for _ in range(3):
        t0 = time.perf_counter()
        table = read()
        times.append(time.perf_counter() - t0)
    assert table is not None
    expected = pq.read_table(model)
    ok = fingerprint(table) == fingerprint(expected)
    extra: dict[str, Any] = {}
    if kind == "millstream":
        manifest = cat.manifest("orders")
        entries = manifest.entries
        extra = {
            "files": len({e.file_path for e in entries if e.file_path}),
            "states": sorted({str(e.state.value) for e in entries}),
            "sealed_rows": sum(e.row_count for e in entries),
            "dead_letter_rows": cat.read_table("orders__dead_letter").num_rows,
        }
        try:  # a tree from before the merged copy has none
            from millstream.table.merged import copy_path

            path = copy_path(manifest)
            extra["merged_copy"] = path is not None and cat.deep.exists(path)
        except ImportError:
            extra["merged_copy"] = None
    print(
        json.dumps(
            {
                "read_s": statistics.median(times),
                "first_read_s": times[0],
                "rows": table.num_rows,
                "matches_model": ok,
                **extra,
            }
        )
    )


def child_phases(spec: Path, home: Path) -> None:
    """``millstream run -f spec --available-now`` with timers around its stages (each mark:
    label, seconds from this function's start, seconds it took), this process's CPU seconds
    at each mark, and the epoch times of its start and end (the parent puts the interpreter's
    start and the process's exit around them)."""
    import resource

    epoch_start = time.time()
    t_start = time.perf_counter()
    marks: list[tuple[str, float, float]] = []

    def cpu() -> float:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return ru.ru_utime + ru.ru_stime

    def wrap(obj: Any, name: str, label: str) -> None:
        fn = getattr(obj, name)

        def timed(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                marks.append((label, t0 - t_start, time.perf_counter() - t0))

        setattr(obj, name, timed)

    cpu_at_start = cpu()
    import millstream.cli.app as app_mod

    marks.append(("imports: millstream.cli.app", 0.0, time.perf_counter() - t_start))
    t_imports = time.perf_counter()
    import pyspark.context as pyspark_context

    import millstream.cli.progress  # noqa: F401  (what `run` imports lazily)
    import millstream.datastream as datastream_mod
    import millstream.spark.catch_up as cu
    import millstream.spark.runner as runner_mod
    import millstream.spark.session as session_mod
    from millstream.spark.sink import SegmentSink
    from millstream.spark.sources import StreamReader

    marks.append(
        (
            "imports: run's lazy ones (runner, PySpark, ...)",
            t_imports - t_start,
            time.perf_counter() - t_imports,
        )
    )
    wrap(datastream_mod.DatastreamSpec, "from_file", "spec parse")
    wrap(app_mod, "open_catalog", "open_catalog")
    wrap(session_mod, "spark_session", "SparkSession (JVM start + session)")
    wrap(pyspark_context, "launch_gateway", "  JVM launch (launch_gateway)")
    wrap(runner_mod.DatastreamRunner, "ensure_tables", "runner.ensure_tables")
    wrap(runner_mod.DatastreamRunner, "bootstrap", "runner.bootstrap")
    wrap(runner_mod.DatastreamRunner, "_catch_up", "runner._catch_up (whole catch-up)")
    wrap(StreamReader, "plan", "  planning (StreamReader.plan)")
    wrap(StreamReader, "latestOffset", "  planning (StreamReader.latestOffset)")
    wrap(SegmentSink, "commit", "  commit (SegmentSink.commit)")
    wrap(session_mod, "end_jvm", "end_jvm (spark.stop + JVM exit)")
    wrap(runner_mod.DatastreamRunner, "_seal_before_exit", "seal before exit")
    wrap(runner_mod.DatastreamRunner, "_publish_before_exit", "Iceberg publish before exit")
    orig_collect_rdd = cu.catch_up

    def catch_up(spark: Any, *a: Any, **kw: Any) -> Any:
        from pyspark import RDD

        collect = RDD.collect

        def timed_collect(self: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return collect(self)
            finally:
                marks.append(
                    ("  Spark write job (collect)", t0 - t_start, time.perf_counter() - t0)
                )

        RDD.collect = timed_collect  # type: ignore[method-assign]
        try:
            return orig_collect_rdd(spark, *a, **kw)
        finally:
            RDD.collect = collect  # type: ignore[method-assign]

    runner_mod.catch_up = catch_up  # type: ignore[assignment]
    from pyspark.sql import SparkSession

    stop = SparkSession.stop

    def timed_stop(self: Any) -> None:
        t0 = time.perf_counter()
        stop(self)
        marks.append(("  spark.stop", t0 - t_start, time.perf_counter() - t0))

    SparkSession.stop = timed_stop  # type: ignore[method-assign]
    argv = ["run", "-f", str(spec), "--available-now", "--home", str(home), "--output", "json"]
    try:
        app_mod.app(argv, standalone_mode=False)
    finally:
        total = time.perf_counter() - t_start
        print(
            json.dumps(
                {
                    "marks": marks,
                    "total_s": total,
                    "epoch_start": epoch_start,
                    "epoch_end": time.time(),
                    "driver_cpu_s": cpu() - cpu_at_start,
                    "driver_cpu_s_before": cpu_at_start,
                }
            ),
            flush=True,
        )


def child_spark_floor() -> None:
    """What any Spark-based run pays before its first record: start the JVM and the
    SparkSession as ``millstream run --available-now`` does, run one job of two one-element
    tasks (the Python workers start), stop. With the JVM's class archive the run maps, if one
    was written (a tree without one: its settings)."""
    from millstream.spark.session import BATCH_RUN_SETTINGS, spark_session

    settings = BATCH_RUN_SETTINGS
    try:
        from millstream.spark.session import ClassArchive, batch_run_settings

        archive = ClassArchive.default()
        if archive is not None and archive.path.exists():
            settings = batch_run_settings(archive)
    except ImportError:
        pass
    t0 = time.perf_counter()
    spark = spark_session(config=settings)
    t1 = time.perf_counter()
    spark.sparkContext.parallelize([1, 2], 2).map(lambda x: x).collect()
    t2 = time.perf_counter()
    spark.stop()
    print(
        json.dumps(
            {"session_s": t1 - t0, "first_job_s": t2 - t1, "stop_s": time.perf_counter() - t2}
        )
    )


def child_warm(spec_path: Path, home: Path, warm_path: Path) -> None:
    """In one process with a warm SparkSession (a tiny run first, so the JVM and the Python
    workers have started): the production ``DatastreamRunner.run(available_now=True)`` of the
    input, timed to the end of its catch-up (its last tick) and to the end of its final seal."""
    from millstream.catalog import Catalog
    from millstream.datastream import DatastreamSpec
    from millstream.spark.runner import DatastreamRunner
    from millstream.spark.session import BATCH_RUN_SETTINGS, spark_session

    spark = spark_session(config=BATCH_RUN_SETTINGS)
    catalog = Catalog.open(home=home)
    spec = DatastreamSpec.from_file(spec_path)
    warm_spec = DatastreamSpec.from_file(warm_path)
    DatastreamRunner(warm_spec, catalog, spark, writer_id="bench").run(available_now=True)
    ticks: list[float] = []
    runner = DatastreamRunner(spec, catalog, spark, writer_id="bench")
    runner.seal_all_on_exit = True  # as `millstream run --available-now` runs it
    t0 = time.perf_counter()
    runner.run(available_now=True, on_tick=lambda _r: ticks.append(time.perf_counter()))
    total = time.perf_counter() - t0
    spark.stop()
    print(json.dumps({"catch_up_s": ticks[-1] - t0, "with_seal_s": total}))


# ---------------------------------------------------------------------------------------------
# The parent
# ---------------------------------------------------------------------------------------------


def _kind(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "gone"
    if not cmd.strip():
        return "gone"  # a zombie
    argv0 = cmd.split(" ")[0]
    if argv0.endswith("java"):
        return "JVM"
    if "pyspark.daemon" in cmd or "pyspark.worker" in cmd:
        return "Spark's Python workers"
    if "python" in Path(argv0).name or "millstream" in Path(argv0).name:
        return "driver (Python)"
    return "launch scripts"


TICK = os.sysconf("SC_CLK_TCK")


def tree_rss_mb(
    root: int,
    kinds: dict[str, float] | None = None,
    cpu: dict[int, tuple[str, float]] | None = None,
) -> float:
    """RSS of ``root`` and all its descendants, MiB (and, into ``kinds``, the peak of each
    kind of process: the JVM, Spark's Python workers, the Python driver; into ``cpu``, each
    process's CPU seconds so far, user + system)."""
    parents: dict[int, int] = {}
    cpu_now: dict[int, float] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                f = (d / "stat").read_text().rsplit(")", 1)[1].split()
                parents[int(d.name)] = int(f[1])
                cpu_now[int(d.name)] = (int(f[11]) + int(f[12])) / TICK
            except (OSError, IndexError, ValueError):
                continue
    tree, grew = {root}, True
    while grew:
        new = {p for p, pp in parents.items() if pp in tree} - tree
        grew = bool(new)
        tree |= new
    kb = 0
    by_kind: dict[str, float] = {}
    for pid in tree:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    kb += int(line.split()[1])
                    k = _kind(pid)
                    by_kind[k] = by_kind.get(k, 0.0) + int(line.split()[1]) / 1024
        except OSError:
            continue
    if kinds is not None:
        for k, v in by_kind.items():
            kinds[k] = max(kinds.get(k, 0.0), v)
    if cpu is not None:
        for pid in tree:
            if pid in cpu_now:
                kind = _kind(pid)  # its latest: a launch script execs java
                if kind == "gone":
                    kind = cpu[pid][0] if pid in cpu else kind
                cpu[pid] = (kind, cpu_now[pid])
    return kb / 1024


def run_child(
    argv: list[str], env: dict[str, str], kinds: dict[str, float] | None = None
) -> tuple[float, float, str]:
    """Run ``argv``; its wall seconds, the peak RSS of its process tree (MiB) and stdout
    (and into ``kinds`` the peak RSS of each kind of process in it, and as ``cpu_s`` the CPU
    seconds of the whole tree, as last sampled: a figure the machine's load moves less than
    the wall time)."""
    peak = [0.0]
    cpu: dict[int, tuple[str, float]] = {}
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], tree_rss_mb(proc.pid, kinds, cpu))
            done.wait(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    done.set()
    sampler.join()
    if kinds is not None:
        kinds["cpu_s"] = sum(c for _, c in cpu.values())
        for kind, c in cpu.values():
            kinds[f"cpu_s {kind}"] = kinds.get(f"cpu_s {kind}", 0.0) + c
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[:4]} exited {proc.returncode}:\n{err.decode()[-3000:]}")
    return wall, peak[0], out.decode()


def last_json(out: str) -> dict[str, Any]:
    """The last JSON document ``out`` ends with (one line, or ``--output json``'s indented
    one)."""
    lines = out.strip().splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("{"):
            try:
                loaded: dict[str, Any] = json.loads("\n".join(lines[i:]))
            except json.JSONDecodeError:
                continue
            return loaded
    raise ValueError(f"no JSON document in {out[-500:]!r}")


def write_spec(
    path: Path, source: Path, name: str = "orders", fields: dict[str, int] | None = None
) -> None:
    import yaml

    spec: dict[str, Any] = {
        **(fields or {}),
        "name": name,
        "source": {"kind": "files", "path": str(source)},
        "schema": SCHEMA,
        "table": {
            "mode": "upsert",
            "primary_key": ["order_id"],
            "comparison_column": "updated_at",
            "delete_column": "is_deleted",
        },
    }
    path.write_text(yaml.safe_dump(spec, sort_keys=False))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=200_000)
    ap.add_argument("--files", type=int, default=10)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--phases", action="store_true", help="also time the CLI's stages")
    ap.add_argument(
        "--spark-floor",
        action="store_true",
        help="also time a process that only starts Spark, runs one tiny job and stops",
    )
    ap.add_argument(
        "--warm", action="store_true", help="also time the catch-up in a warm SparkSession"
    )
    ap.add_argument("--only", choices=["ceiling", "millstream"], default=None)
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME:KEY=VALUE[;KEY=VALUE]",
        help="also run Millstream with these Spark settings (spark-defaults.conf of its own), "
        "interleaved with the defaults in every run",
    )
    ap.add_argument(
        "--spec",
        action="append",
        default=[],
        metavar="NAME:FIELD=INT",
        help="also run Millstream with this top-level spec field set (e.g. "
        "low-mem:task_memory_mb=256), interleaved with the defaults in every run",
    )
    ap.add_argument(
        "--src",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="also run (and read) Millstream from another checkout's src/ (PYTHONPATH), e.g. "
        "the commit before a change, interleaved with this one in every run",
    )
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        kind, *rest = args.child
        if kind == "ceiling":
            child_ceiling(Path(rest[0]), Path(rest[1]))
        elif kind == "read":
            child_read(rest[0], Path(rest[1]), Path(rest[2]))
        elif kind == "phases":
            child_phases(Path(rest[0]), Path(rest[1]))
        elif kind == "spark-floor":
            child_spark_floor()
        elif kind == "warm":
            child_warm(Path(rest[0]), Path(rest[1]), Path(rest[2]))
        return

    import pyarrow.parquet as pq

    py = sys.executable
    cli = str(Path(py).parent / "millstream")
    env = dict(os.environ)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    env.setdefault("PYSPARK_PYTHON", py)
    say = common.log_stamped
    results: dict[str, Any] = {
        "command": common.command_line("batch.py"),
        "machine": common.machine("pyarrow", "pyspark"),
        "load_before": common.load(),
        "rows": args.rows,
        "keys": args.keys,
        "files": args.files,
        "runs": {"ceiling": [], "millstream": []},
    }
    variants: dict[str, dict[str, str]] = {}
    for v in args.variant:
        name, _, settings = v.partition(":")
        variants[name] = dict(kv.split("=", 1) for kv in settings.split(";") if kv)
        results["runs"][name] = []
    results["variants"] = variants
    srcs: dict[str, str] = {}
    for v in args.src:
        name, _, src = v.partition("=")
        srcs[name] = str(Path(src).resolve())
        results["runs"][name] = []
    results["srcs"] = srcs
    spec_fields: dict[str, dict[str, int]] = {}
    for v in args.spec:
        name, _, kv = v.partition(":")
        key, _, value = kv.partition("=")
        spec_fields[name] = {key: int(value)}
        results["runs"][name] = []
    results["spec_fields"] = spec_fields
    with common.workdir("ms-batch-", keep=args.keep) as base:
        files = make_input(base / "input", args.rows, args.keys, args.files)
        mb = sum(f.stat().st_size for f in files) / 1e6
        model = resolve(read_input(files))
        pq.write_table(model, base / "model.parquet")
        say(
            f"input: {args.rows} records, {mb:.0f} MB in {len(files)} files; model {model.num_rows} rows"
        )
        results["input_mb"] = mb
        results["model_rows"] = model.num_rows
        kinds = [k for k in ("ceiling", "millstream") if args.only in (None, k)]
        if args.spark_floor:
            kinds.append("spark-floor")
        if args.only != "ceiling":
            kinds += list(variants) + list(srcs) + list(spec_fields)
        for r in range(args.runs):
            for kind in kinds:
                where = base / f"{kind}-{r}"
                run_env = env
                if kind in variants:
                    conf_dir = base / f"conf-{kind}"
                    conf_dir.mkdir(exist_ok=True)
                    (conf_dir / "spark-defaults.conf").write_text(
                        "".join(f"{k} {v}\n" for k, v in variants[kind].items())
                    )
                    run_env = {**env, "SPARK_CONF_DIR": str(conf_dir)}
                if kind in srcs:
                    run_env = {**env, "PYTHONPATH": srcs[kind]}
                if kind == "ceiling":
                    argv = [py, str(HERE), "--child", "ceiling", str(base / "input"), str(where)]
                elif kind == "spark-floor":
                    argv = [py, str(HERE), "--child", "spark-floor"]
                else:
                    spec = base / f"spec-{kind}.yaml"
                    write_spec(spec, base / "input", fields=spec_fields.get(kind))
                    argv = [cli, "run", "-f", str(spec), "--available-now", "--home", str(where)]
                    argv += ["--output", "json"]
                by_kind: dict[str, float] = {}
                wall, peak, out = run_child(argv, run_env, by_kind)
                child = last_json(out)
                cpu_s = by_kind.pop("cpu_s")
                cpu_by_kind = {
                    k.removeprefix("cpu_s "): round(by_kind.pop(k), 1)
                    for k in list(by_kind)
                    if k.startswith("cpu_s ")
                }
                if kind == "spark-floor":
                    row = {"wall_s": wall, "cpu_s": cpu_s, "peak_rss_mb": peak, **child}
                    row["peak_rss_by_kind_mb"] = by_kind
                    results["runs"].setdefault(kind, []).append(row)
                    say(
                        f"run {r} {kind}: {wall:.2f} s whole process ({cpu_s:.1f} CPU-s), peak "
                        f"RSS {peak:.0f} MiB; session {child['session_s']:.2f} s, first job "
                        f"{child['first_job_s']:.2f} s, stop {child['stop_s']:.2f} s; "
                        f"CPU-s by kind {cpu_by_kind}"
                    )
                    continue
                _, _, rout = run_child(
                    [
                        py,
                        str(HERE),
                        "--child",
                        "read",
                        "ceiling" if kind == "ceiling" else "millstream",
                        str(where),
                        str(base / "model.parquet"),
                    ],
                    run_env,
                )
                read = last_json(rout)
                row = {
                    "wall_s": wall,
                    "cpu_s": cpu_s,
                    "peak_rss_mb": peak,
                    "peak_rss_by_kind_mb": by_kind,
                    "cpu_s_by_kind": cpu_by_kind,
                    **read,
                }
                if kind == "ceiling":
                    row["in_process_s"] = child["in_process_s"]
                else:
                    row["seal_before_exit"] = child.get("seal_before_exit")
                results["runs"][kind].append(row)
                say(
                    f"run {r} {kind}: {wall:.2f} s whole process ({cpu_s:.1f} CPU-s), peak RSS {peak:.0f} MiB, "
                    f"read {read['read_s'] * 1000:.0f} ms (first {read['first_read_s'] * 1000:.0f}),"
                    f" {read['rows']} rows, matches model {read['matches_model']}"
                    + (
                        f", files {read.get('files')} {read.get('states')} of "
                        f"{read.get('sealed_rows')} rows, merged copy {read.get('merged_copy')}"
                        if kind != "ceiling"
                        else f", {child['in_process_s']:.2f} s in process "
                        f"({args.rows / child['in_process_s']:,.0f} rows/s)"
                    )
                    + f"; peak RSS by kind { ({k: round(v) for k, v in by_kind.items()}) }"
                    + f"; CPU-s by kind {cpu_by_kind}"
                )
                if not read["matches_model"]:
                    raise SystemExit(f"{kind}: the table does not match the model")
        if args.warm:
            spec = base / "spec.yaml"
            write_spec(spec, base / "input")
            tiny = base / "tiny"
            make_input(tiny, 1000, 100, PARTITIONS)
            write_spec(base / "warmup.yaml", tiny, "warmup")
            warm_row = []
            for _ in range(args.runs):
                home = base / f"warm-{len(warm_row)}"
                _, _, out = run_child(
                    [
                        py,
                        str(HERE),
                        "--child",
                        "warm",
                        str(spec),
                        str(home),
                        str(base / "warmup.yaml"),
                    ],
                    env,
                )
                w = last_json(out)
                w["rows_s"] = args.rows / w["catch_up_s"]
                w["rows_s_with_seal"] = args.rows / w["with_seal_s"]
                warm_row.append(w)
                say(
                    f"warm, in process: catch-up {w['catch_up_s']:.2f} s ({w['rows_s']:,.0f} "
                    f"rows/s), with the final seal {w['with_seal_s']:.2f} s "
                    f"({w['rows_s_with_seal']:,.0f} rows/s)"
                )
            results["warm"] = warm_row
        if args.phases:
            spec = base / "spec.yaml"
            write_spec(spec, base / "input")
            by_kind = {}
            launched = time.time()
            wall, peak, out = run_child(
                [py, str(HERE), "--child", "phases", str(spec), str(base / "phases")], env, by_kind
            )
            ph = last_json(out)
            ph["interpreter_start_s"] = ph["epoch_start"] - launched
            ph["exit_s"] = launched + wall - ph["epoch_end"]
            results["phases"] = {"wall_s": wall, "peak_rss_mb": peak, **ph}
            say(
                f"phases: {wall:.2f} s whole process ({ph['total_s']:.2f} s after interpreter "
                f"start); the interpreter's start and the bench's imports "
                f"{ph['interpreter_start_s']:.2f} s, the process's exit {ph['exit_s']:.2f} s; "
                f"the driver's CPU {ph['driver_cpu_s']:.1f} s "
                f"(+{ph['driver_cpu_s_before']:.1f} before); peak RSS {peak:.0f} MiB, "
                f"by kind { ({k: round(v, 1) for k, v in by_kind.items()}) }"
            )
            for label, at, s in ph["marks"]:
                say(f"  {label:45s} at {at:6.2f} s  took {s:6.2f} s")
    results["load_after"] = common.load()
    summary: dict[str, Any] = {}
    for kind, rows in results["runs"].items():
        if rows:
            summary[kind] = {
                k: statistics.median(r[k] for r in rows)
                for k in ("wall_s", "cpu_s", "peak_rss_mb", "read_s")
                if k in rows[0]
            }
    if "ceiling" in summary:
        c = summary["ceiling"]
        summary["ratios_vs_ceiling"] = {
            kind: {k: m[k] / c[k] for k in c if k in m}
            for kind, m in summary.items()
            if kind != "ceiling"
        }
    results["summary"] = summary
    say(json.dumps(summary, indent=1))
    say(f"load {results['load_before']} -> {results['load_after']}")
    common.save_results("batch", results, args.json)


if __name__ == "__main__":
    main()
