"""The ``millstream`` command line. Every command takes ``--output text|json``; its exit
code is the one :data:`millstream.errors.EXIT_CODES` gives the error (``millstream --help``
lists them all, from :func:`millstream.cli.output.exit_codes_help`).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from millstream.cli import control, datastream, table
from millstream.cli.output import (
    HomeOpt,
    OutputFormat,
    OutputOpt,
    console,
    emit_json,
    err_console,
    exit_codes_help,
    handle_errors,
    open_catalog,
    table_text,
)

app = typer.Typer(
    name="millstream",
    help="Reliable nearline ingestion on Apache Spark.",
    epilog=exit_codes_help(rest_client=True),
    no_args_is_help=True,
    # click's plain help: option names whole, descriptions rewrapped, flags without a metavar
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.command(short_help="Ingest one datastream without any service.")
def run(
    file: Annotated[Path, typer.Option("--file", "-f", help="Datastream spec (YAML).")],
    available_now: Annotated[
        bool, typer.Option("--available-now", help="Ingest everything available, then exit 0.")
    ] = False,
    writer_id: Annotated[
        str | None, typer.Option(help="Stable id of this writer (checkpoint dir).")
    ] = None,
    home: HomeOpt = None,
    output: OutputOpt = OutputFormat.text,
    master: Annotated[str | None, typer.Option(help="Spark master (default local[2]).")] = None,
    maintenance_interval: Annotated[
        float,
        typer.Option(
            min=1.0,
            metavar="SECONDS",
            help="Seconds (+-20% jitter) between two runs of expiry and garbage collection of "
            "the table and its dead-letter table, beside the background sealer.",
        ),
    ] = 600.0,
    iceberg_publish_interval: Annotated[
        float,
        typer.Option(
            "--iceberg-publish-interval",
            min=0.0,
            metavar="SECONDS",
            help="Publish the Iceberg view of the table and its dead-letter table this often "
            "(seconds; 0 turns it off), by a publisher process of this run; an --available-now "
            "run publishes once, before it exits. The controller's default.",
        ),
    ] = 15.0,  # DEFAULT_PUBLISH_INTERVAL, literal: the CLI imports the engine lazily
) -> None:
    """Ingest one datastream without any service. Ctrl-C (or SIGTERM) stops at a batch
    boundary, prints a summary and exits 0. In the background (not with --available-now) it
    seals, compacts sealed segments, and expires history and collects unreferenced files per
    the table's retention. It publishes the tables' Iceberg views every
    --iceberg-publish-interval seconds, an --available-now run once, before it exits (the
    summary prints where: `iceberg_scan` and pyiceberg read it). An --available-now run ends
    its Spark JVM before its final seal, which needs no Spark."""
    # lazy: only the command that runs needs it; keeps `millstream --help` fast
    from millstream.datastream import DatastreamSpec

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    stop = GracefulStop()
    stop.install()  # before Spark starts: a Ctrl-C while it starts stops as cleanly
    with handle_errors(output):
        spec = DatastreamSpec.from_file(file)
        # lazy: only the command that runs needs them; keeps `millstream --help` fast
        from millstream.cli.query import hold_off_pandas
        from millstream.spark.session import (
            ClassArchive,
            SessionStart,
            batch_run_settings,
            end_jvm,
        )

        # until the JVM has ended (end_spark)
        allow_pandas = hold_off_pandas() if available_now else None
        # The JVM starts on a thread while this one does what needs no Spark: the imports
        # below, opening the metadata store and creating the tables (docs/performance.md,
        # "The batch run's fixed cost"). A run that ends starts it from the class archive.
        archive = ClassArchive.default() if available_now else None
        # A run that ends starts no SQL session: its batches are plain Spark jobs.
        starting = SessionStart(
            master=master,
            config=batch_run_settings(archive) if available_now else None,
            jobs_only=available_now,
        )
        # lazy: imported while the JVM starts on its thread (above), not before it
        from millstream.cli.progress import ProgressView
        from millstream.spark.runner import DatastreamRunner

        # What is loaded now (~130k objects: PySpark, pyarrow, SQLAlchemy, numpy, the
        # runner) lives as long as the process: out of the collector's way, so that its full
        # collections later (one in the publish's pyiceberg import, during the final seal)
        # scan what the run made since, not every module (docs/performance.md, "The batch
        # run's end: the process exits when its work is durable").
        gc.freeze()
        catalog = open_catalog(home, create=True)
        runner = DatastreamRunner(
            spec,
            catalog,
            None,  # the session, once started (below)
            writer_id=writer_id,
            background_sealing=not available_now,
            maintenance_interval=maintenance_interval,
            publish_interval=iceberg_publish_interval or None,
        )
        runner.seal_all_on_exit = available_now  # no sealer outlives the run
        runner.ensure_tables()  # while the JVM starts
        spark = runner.spark = starting.result()
        stop.install()  # again, in case starting Spark took SIGINT
        jvm_ended = [False]

        def end_spark() -> None:
            # The final seal and merged copy need no Spark: not beside an idle JVM.
            jvm_ended[0] = True
            if allow_pandas is not None:
                # The final seal's key index hashes keys with pandas (~0.3 s to import, on
                # the seal's path before): imported on a thread while this one waits for the
                # JVM to exit. The write tasks' workers have exited with their tasks, so it
                # no longer adds to the run's peak memory.
                allow_pandas()
                threading.Thread(
                    target=importlib.import_module, args=("pandas",), name="import-pandas"
                ).start()
            try:
                # the first run writes the class archive as its JVM exits: a few seconds
                end_jvm(spark, archive=archive, timeout=120.0)
            except Exception as exc:  # it ends with this process instead
                logging.getLogger(__name__).warning("could not end the Spark JVM: %s", exc)

        if available_now:
            runner.before_final_seal = end_spark
            runner.register_sources = False  # its jobs use none, and nothing runs after them
        stop.attach(runner, spark)
        view = ProgressView(runner)
        stats = None
        try:
            if output is OutputFormat.text and sys.stdout.isatty():
                # lazy: only `run` shows a live display
                from rich.live import Live

                with Live(console=console, refresh_per_second=2) as live:
                    stats = runner.run(
                        available_now=available_now,
                        on_tick=lambda _r: live.update(view.render()),
                    )
            else:
                last = [0.0]

                def tick_plain(r: DatastreamRunner) -> None:
                    if output is OutputFormat.text and time.time() - last[0] > 5:
                        last[0] = time.time()
                        s = view.snapshot()
                        lag = sum((v["lag"] or 0) for v in s["partitions"].values())
                        sealing = r.sealing_summary(time.time())
                        err_console.print(
                            f"{s['rows_committed']} rows committed, {s['rows_per_second']:.0f} rows/s, "
                            f"offset lag {lag}" + (f"; {sealing}" if sealing else ""),
                            highlight=False,
                            soft_wrap=True,
                        )

                stats = runner.run(available_now=available_now, on_tick=tick_plain)
        except Exception as exc:
            if not stop.requested:
                raise
            # the batch the stop cut short: nothing of it was committed
            logging.getLogger(__name__).debug("stopping: %r", exc)
        stop.finish()
        summary = view.snapshot()
        if stats is not None:
            # restarts from the shard uppers: after fenced, gapped or expired commits (in all,
            # and the last row of them without a commit between), and after Spark's transient
            # failures
            summary["restarts"] = stats.restarts
            summary["restarts_in_a_row"] = stats.restarts_in_a_row
            summary["transient_restarts"] = stats.transient_restarts
            summary["discarded_checkpoints"] = stats.discarded_checkpoints
        summary["dead_letter_rows"] = catalog.read_table(spec.dead_letter_table).num_rows
        summary["stopped"] = stop.requested
        if stats is not None and stats.sealing is not None:
            summary["seal_before_exit"] = stats.sealing
        if stats is not None and stats.iceberg is not None:
            summary["iceberg"] = stats.iceberg
        if not jvm_ended[0]:
            if archive is not None:
                end_spark()  # a stopped run: its JVM may be writing the class archive
            else:
                spark.stop()
        if output is OutputFormat.json:
            emit_json(summary)
        else:
            uppers = ", ".join(
                f"{p}: {v['upper']}" for p, v in summary["partitions"].items() if v["upper"]
            )
            console.print(
                f"[green]{'stopped' if stop.requested else 'done'}[/]: "
                f"{summary['rows_committed']} rows committed to {spec.table_name} in "
                f"{summary['batches']} batches; {summary['dead_letter_rows']} rows in "
                f"{spec.dead_letter_table}; last offsets {{{uppers}}}",
                highlight=False,
                soft_wrap=True,
            )
            if stats is not None and stats.sealing is not None:
                console.print(_seal_report(stats.sealing), highlight=False)
            if stats is not None and stats.iceberg is not None:
                console.print(_iceberg_report(stats.iceberg), highlight=False, soft_wrap=True)
        if available_now:
            # Done: every batch committed, the final seal and the publish returned, the JVM
            # ended. The process ends without tearing its interpreter down (main()).
            exit_when_done(catalog.close)


#: What :func:`main` runs before it ends the process at once (:func:`exit_when_done`).
_WHEN_DONE: list[Callable[[], None]] = []
#: Threads a finished command may leave behind that hold no work: the read pools' workers
#: (``table.read``), whose every task the reads waited for.
IDLE_THREAD_PREFIXES = ("millstream-read-",)


def exit_when_done(close: Callable[[], None]) -> None:
    """Have :func:`main` end this process with ``os._exit`` once the command returned
    successfully, after ``close`` (the metadata store's connections: SQLite moves its
    write-ahead log into the database file as the last one closes), the log handlers and
    the standard streams are flushed. A finished ``run --available-now`` has nothing left
    that an interpreter's exit would do for it: its commits, seals and publish are durable
    (files fsynced before the COMMIT that names them), its JVM has ended and no thread of
    its own runs; the exit's collection and module teardown took ~0.3 s of CPU
    (docs/performance.md, "The batch run's end: the process exits when its work is
    durable"). A command run in process (a test's ``CliRunner``) never reaches it."""
    _WHEN_DONE.append(close)


def _busy_threads() -> list[str]:
    """The threads an interpreter's exit would wait for: not daemons, not the main thread,
    not an idle pool's (:data:`IDLE_THREAD_PREFIXES`)."""
    return [
        t.name
        for t in threading.enumerate()
        if not t.daemon
        and t is not threading.main_thread()
        and not t.name.startswith(IDLE_THREAD_PREFIXES)
    ]


def _end_when_done(code: int) -> None:
    """End the process now (:func:`exit_when_done`) if a command asked for it and exits with
    ``code`` 0; else return, and the interpreter exits as usual."""
    if not _WHEN_DONE or code != 0:
        return
    busy = _busy_threads()
    if busy:
        logging.getLogger(__name__).debug("threads still at work, a normal exit: %s", busy)
        return
    try:
        for close in _WHEN_DONE:
            close()
    except Exception as exc:  # the interpreter's exit closes what is left, as before
        logging.getLogger(__name__).warning("closing before the exit: %s", exc)
        return
    _exit_now(code)


def _exit_now(code: int) -> NoReturn:
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe (`| head`)
            stream.flush()
    os._exit(code)


class GracefulStop:
    """SIGINT and SIGTERM of ``millstream run``: the first stops the writer at a batch boundary
    (:meth:`~millstream.spark.runner.DatastreamRunner.stop_after_batch`, on a thread: a signal
    handler must not wait on Spark) and silences what Spark and py4j log about the query it
    stops; the run then ends normally with its summary. A signal before the runner exists
    stops it as soon as it does. A second signal stops without waiting for the batch."""

    def __init__(self, timeout: float = 30.0) -> None:
        self.requested = False
        self.timeout = timeout
        self._runner: Any = None
        self._spark: Any = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def attach(self, runner: Any, spark: Any) -> None:
        with self._lock:
            self._runner, self._spark = runner, spark
            requested = self.requested
        if requested:
            self._stop(force=False)

    def _handle(self, _signum: int, _frame: object) -> None:
        with self._lock:
            again, self.requested = self.requested, True
            attached = self._runner is not None
        if attached:
            self._thread = threading.Thread(
                target=self._stop, kwargs={"force": again}, name="stop", daemon=True
            )
            self._thread.start()
        elif again:  # still starting, asked twice: leave now
            os._exit(130)

    def _stop(self, *, force: bool) -> None:
        # lazy: only a run imports Spark's session module (loaded by now: Spark runs)
        from millstream.spark.session import quiet_jvm_log

        logging.getLogger("py4j").setLevel(logging.CRITICAL)
        try:
            quiet_jvm_log(self._spark)
            if force:
                self._runner.stop()
            else:
                self._runner.stop_after_batch(self.timeout)
        except Exception as exc:  # the run ended meanwhile (its query, or Spark, stopped)
            logging.getLogger(__name__).debug("stopping: %r", exc)

    def finish(self) -> None:
        """Wait for a stop under way (before Spark stops under it)."""
        thread = self._thread
        if thread is not None:
            thread.join(self.timeout + 30.0)


def _seal_report(report: dict[str, Any]) -> str:
    """One line per outcome of the final seal pass of an ``--available-now`` run."""
    parts = []
    if report["sealed"]:
        parts.append(
            "sealed "
            + ", ".join(
                f"partition {p} ({s['segments']} segments, {s['rows']} rows)"
                for p, s in sorted(report["sealed"].items())
            )
        )
    if report.get("compacted"):
        parts.append(
            "compacted "
            + ", ".join(
                f"partition {p} ({s['segments']} sealed segments into one of {s['rows']} rows)"
                for p, s in sorted(report["compacted"].items())
            )
        )
    for p, why in sorted(report["not_due"].items()):
        parts.append(f"partition {p} not sealed: {why}")
    for p, err in sorted(report["failed"].items()):
        parts.append(f"partition {p} seal failed (the next run retries it): {err}")
    copy = report.get("merged_copy")
    if copy is not None and ("failed" in copy or "skipped" in copy):
        why = copy.get("failed") or copy["skipped"]
        parts.append(f"merged copy not written (reads merge instead): {why}")
    elif copy is not None:
        parts.append(f"merged copy of version {copy['version']} written ({copy['rows']} rows)")
    return "\n".join(parts) if parts else "nothing to seal"


def _iceberg_report(report: dict[str, Any]) -> str:
    """One line per table published by an ``--available-now`` run before it exited."""
    lines = [
        f"Iceberg view of {name}: version {v['manifest_version']} at {v['metadata_location']}"
        for name, v in sorted(report.items())
        if name != "error"
    ]
    if "error" in report:
        lines.append(f"Iceberg publish failed (the next run publishes): {report['error']}")
    return "\n".join(lines) if lines else "nothing to publish"


class Engine(StrEnum):
    duckdb = "duckdb"
    spark = "spark"


@app.command(short_help="SQL over the tables' current rows (DuckDB or Spark).")
def query(
    sql: Annotated[
        str,
        typer.Argument(help="SQL; every table is known by its name.", show_default=False),
    ],
    engine: Annotated[
        Engine,
        typer.Option(
            help="duckdb: in this process, about a second, for tables that fit in memory. "
            "spark: Spark SQL on a local Spark (10-30 s to start), for Spark-only SQL or "
            "larger tables.",
        ),
    ] = Engine.duckdb,
    home: HomeOpt = None,
    output: OutputOpt = OutputFormat.text,
    limit: Annotated[int, typer.Option(help="Rows to print at most.")] = 1000,
    master: Annotated[
        str | None, typer.Option(help="Spark master with --engine spark (default local[2]).")
    ] = None,
) -> None:
    """Run SQL over the tables' current rows (DuckDB by default; only the tables the SQL names
    are read). A missing table exits 3 naming it."""
    with handle_errors(output):
        # lazy: only the command that runs needs it; keeps `millstream --help` fast
        from millstream.cli.query import duckdb_query, spark_query

        with open_catalog(home) as catalog:
            if engine is Engine.spark:
                rows = spark_query(catalog, sql, limit, master)
            else:
                rows = duckdb_query(catalog, sql, limit)
        if output is OutputFormat.json:
            emit_json(rows)
        elif rows:
            table_text(rows)
        else:
            console.print("(no rows)")


@app.command(short_help="Broker, generator, ingestion and a check against the model.")
def demo(
    home: HomeOpt = None,
    records: Annotated[int, typer.Option(help="Records to produce.")] = 50_000,
    seed: Annotated[int, typer.Option(help="Generator seed.")] = 7,
    output: OutputOpt = OutputFormat.text,
) -> None:
    """Embedded broker + generator + ingestion + live status + a final check against the model."""
    # lazy: only the command that runs needs it; keeps `millstream --help` fast
    from millstream.cli.demo import run_demo

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    with handle_errors(output):
        ok = run_demo(home=home, records=records, seed=seed, output=output)
        if not ok:
            raise typer.Exit(1)


control.register(app)
app.add_typer(
    datastream.app,
    name="datastream",
    short_help="Create and manage datastreams (REST API client).",
)
app.add_typer(table.app, name="table", short_help="List, describe and maintain tables.")
# The exit codes are listed once, in `millstream --help`.
app.command("segments", short_help="A table's segments by partition (REST API client).")(
    datastream.segments
)
app.command("rollback", short_help="Move a partition back: remove its newest segments.")(
    datastream.rollback
)
app.command("reingest", short_help="Rebuild a lost or corrupt segment from its source.")(
    datastream.reingest
)


#: The commands whose process never needs pandas (no Spark in it): pyarrow would import it
#: on its first ``pa.array()``, which costs these commands more than all they do.
WITHOUT_PANDAS = (("query",), ("table", "list"), ("table", "describe"))


def main() -> None:
    args = sys.argv[1:]
    spark = {"spark", "--engine=spark"} & set(args)
    if any(tuple(args[: len(c)]) == c for c in WITHOUT_PANDAS) and not spark:
        # lazy: the module is light; only the commands above need it
        from millstream.cli.query import skip_pandas

        skip_pandas()
    try:
        app()
    except SystemExit as exc:
        _end_when_done(exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1))
        raise
    _end_when_done(0)
