"""The ``millstream`` command line. Every command takes ``--output text|json``; its exit
code is the one :data:`millstream.errors.EXIT_CODES` gives the error (``millstream --help``
lists them all, from :func:`millstream.cli.output.exit_codes_help`).
"""

from __future__ import annotations

import logging
import signal
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.live import Live

from millstream.cli import chaos, control, datastream, table
from millstream.cli.output import (
    HomeOpt,
    OutputFormat,
    OutputOpt,
    console,
    emit_json,
    err_console,
    exit_codes_help,
    handle_errors,
    table_text,
)

app = typer.Typer(
    name="millstream",
    help="Reliable nearline ingestion on Apache Spark.",
    epilog=exit_codes_help(),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _catalog(home: Path | None) -> Any:
    # lazy: only the command that runs needs it; keeps `millstream --help` fast
    from millstream.catalog import Catalog

    return Catalog.open(home=home)


@app.command()
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
            help="Seconds (+-20% jitter) between two runs of expiry and garbage collection of "
            "the table and its dead-letter table, beside the background sealer.",
        ),
    ] = 600.0,
) -> None:
    """Ingest one datastream without any service. Ctrl-C stops cleanly. In the background
    (not with --available-now) it seals, compacts sealed segments, and expires history and
    collects unreferenced files per the table's retention."""
    # lazy: only the command that runs needs it; keeps `millstream --help` fast
    from millstream.datastream import DatastreamSpec

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    with handle_errors(output):
        spec = DatastreamSpec.from_file(file)
        # lazy: only the command that runs needs it; keeps `millstream --help` fast
        from millstream.cli.progress import ProgressView
        from millstream.spark.runner import DatastreamRunner
        from millstream.spark.session import spark_session

        catalog = _catalog(home)
        spark = spark_session(master=master)
        runner = DatastreamRunner(
            spec,
            catalog,
            spark,
            writer_id=writer_id,
            background_sealing=not available_now,
            maintenance_interval=maintenance_interval,
        )

        def _sigterm(*_: object) -> None:
            runner.stop()

        signal.signal(signal.SIGTERM, _sigterm)
        view: ProgressView | None = None
        try:
            if output is OutputFormat.text and sys.stdout.isatty():
                with Live(console=console, refresh_per_second=2) as live:

                    def tick(r: DatastreamRunner) -> None:
                        nonlocal view
                        view = view or ProgressView(r)
                        live.update(view.render())

                    stats = runner.run(available_now=available_now, on_tick=tick)
            else:
                last = [0.0]

                def tick_plain(r: DatastreamRunner) -> None:
                    nonlocal view
                    view = view or ProgressView(r)
                    if output is OutputFormat.text and time.time() - last[0] > 5:
                        last[0] = time.time()
                        s = view.snapshot()
                        lag = sum((v["lag"] or 0) for v in s["partitions"].values())
                        sealing = r.sealing_summary(time.time())
                        err_console.print(
                            f"{s['rows_committed']} rows committed, {s['rows_per_second']:.0f} rows/s, "
                            f"offset lag {lag}" + (f"; {sealing}" if sealing else ""),
                            highlight=False,
                        )

                stats = runner.run(available_now=available_now, on_tick=tick_plain)
        except KeyboardInterrupt:
            runner.stop()
            err_console.print("stopped")
            raise typer.Exit(130) from None
        summary = (view or ProgressView(runner)).snapshot()
        summary["restarts"] = stats.restarts
        summary["discarded_checkpoints"] = stats.discarded_checkpoints
        summary["dead_letter_rows"] = catalog.read_table(spec.dead_letter_table).num_rows
        if stats.sealing is not None:
            summary["seal_before_exit"] = stats.sealing
        if output is OutputFormat.json:
            emit_json(summary)
        else:
            console.print(
                f"[green]done[/]: {summary['rows_committed']} rows committed to "
                f"{spec.table_name} in {summary['batches']} batches; "
                f"{summary['dead_letter_rows']} rows in {spec.dead_letter_table}",
                highlight=False,
            )
            if stats.sealing is not None:
                console.print(_seal_report(stats.sealing), highlight=False)
        spark.stop()


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
    for p, why in sorted(report["not_due"].items()):
        parts.append(f"partition {p} not sealed: {why}")
    for p, err in sorted(report["failed"].items()):
        parts.append(f"partition {p} seal failed (the next run retries it): {err}")
    return "\n".join(parts) if parts else "nothing to seal"


@app.command()
def query(
    sql: Annotated[str, typer.Argument(help="Spark SQL; every table is registered as a view.")],
    home: HomeOpt = None,
    output: OutputOpt = OutputFormat.text,
    limit: Annotated[int, typer.Option(help="Rows to print at most.")] = 1000,
    master: Annotated[str | None, typer.Option(help="Spark master (default local[2]).")] = None,
) -> None:
    """Run Spark SQL over every Millstream table."""
    with handle_errors(output):
        # lazy: only the command that runs needs it; keeps `millstream --help` fast
        from millstream.spark.session import spark_session
        from millstream.spark.table_source import read_dataframe

        catalog = _catalog(home)
        spark = spark_session(master=master)
        for info in catalog.store.list_tables():
            read_dataframe(spark, info.name, settings=catalog.settings).createOrReplaceTempView(
                info.name
            )
        rows = [r.asDict(recursive=True) for r in spark.sql(sql).limit(limit).collect()]
        if output is OutputFormat.json:
            emit_json(rows)
        elif rows:
            table_text(rows)
        else:
            console.print("(no rows)")
        spark.stop()


@app.command()
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
app.add_typer(datastream.app, name="datastream")
app.add_typer(table.app, name="table")
app.command("segments", epilog=datastream.EXIT_CODES_HELP)(datastream.segments)
app.command("rollback", epilog=datastream.EXIT_CODES_HELP)(datastream.rollback)
app.command("reingest", epilog=datastream.EXIT_CODES_HELP)(datastream.reingest)
app.command("chaos", epilog=chaos.EPILOG)(chaos.chaos)


def main() -> None:
    app()
