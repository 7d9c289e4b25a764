"""``make chaos`` (``python -m harness.chaos`` with tests/ on ``sys.path``): run the fault
campaigns (:mod:`harness.chaos`) on this machine, with servers of their own (PostgreSQL, moto's S3 server and a Tansu broker, each on
127.0.0.1 and stopped at the end), and print the seed, every schedule, every fault with its
time, every anomaly and the line ``N faults in M schedules, K anomalies``. Exits 1 when a
checker found an anomaly; re-running with the printed ``--seed`` draws the same schedules."""

from __future__ import annotations

import contextlib
import enum
import secrets
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from millstream.cli.output import console


class Layer(enum.StrEnum):
    commit = "commit"
    process = "process"
    all = "all"


class Backend(enum.StrEnum):
    postgresql = "postgresql"
    sqlite = "sqlite"


@contextlib.contextmanager
def _metadata_url(backend: Backend, url: str | None, workdir: Path) -> Iterator[str]:
    """The metadata store the commit-path campaign runs on: ``url``, a PostgreSQL server of
    its own (stopped at the end), or a SQLite file."""
    if url is not None:
        yield url
        return
    if backend is Backend.sqlite:
        yield f"sqlite:///{workdir / 'metadata.db'}"
        return
    # lazy: the servers (psycopg) are for this command only; keeps `millstream --help` fast
    from harness.servers import PostgresServer

    with PostgresServer(workdir / "postgres") as server:
        yield server.create_database("chaos")


@contextlib.contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """SIGTERM (a CI timeout, ``kill``) unwinds like Ctrl-C while the campaigns run, so every
    server and service they started is stopped by its PID on the way out."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def chaos(
    seed: Annotated[
        int | None, typer.Option(help="Seed of the campaign (default: a random one, printed).")
    ] = None,
    minutes: Annotated[float, typer.Option(help="How long to run.", min=0.1)] = 5.0,
    layer: Annotated[
        Layer,
        typer.Option(
            help="Which campaign: commit (the commit path, threads, no JVM), process (a real "
            "cluster: controller, two workers, broker), or all (a quarter of the minutes on "
            "commit, the rest on process)."
        ),
    ] = Layer.all,
    backend: Annotated[
        Backend,
        typer.Option(
            help="Metadata and deep store: postgresql (PostgreSQL, and S3 (moto) for the "
            "process campaign, with connections cut and stalled) or sqlite (a SQLite file, "
            "local files)."
        ),
    ] = Backend.postgresql,
    metadata_url: Annotated[
        str | None,
        typer.Option(help="Run the commit-path campaign on this store instead of its own."),
    ] = None,
    schedules: Annotated[
        int | None,
        typer.Option(help="Schedules to run per layer (default: as many as fit).", min=1),
    ] = None,
    min_faults: Annotated[
        int,
        typer.Option(
            help="The process campaign runs on until it injected this many faults.", min=0
        ),
    ] = 0,
    parallel: Annotated[int, typer.Option(help="Commit-path schedules run at once.", min=1)] = 4,
    workdir: Annotated[
        Path | None,
        typer.Option(help="Where servers, tables and logs go (default: a temporary directory)."),
    ] = None,
    quiet: Annotated[
        bool, typer.Option(help="Print schedules and anomalies, not each fault.")
    ] = False,
) -> None:
    """Run seeded, randomized fault campaigns against the production code paths and report
    every anomaly the checkers find."""
    # lazy: the campaigns import Spark's Python side and the whole stack; `--help` stays fast
    from harness.chaos.commitpath import run_commit_campaign
    from harness.chaos.log import CampaignLog
    from millstream.config import Settings

    seed = seed if seed is not None else secrets.randbits(32)
    root = workdir or Path(tempfile.mkdtemp(prefix="millstream-chaos-"))
    root.mkdir(parents=True, exist_ok=True)
    console.print(f"chaos: seed {seed}, {minutes:g} minutes, layer {layer}, workdir {root}")
    logs: list[CampaignLog] = []
    share = minutes / 4 if layer is Layer.all else minutes

    def out(line: str) -> None:
        # soft_wrap: a line is one line, however long (logs and pipes are read by grep)
        console.print(line, markup=False, highlight=False, soft_wrap=True)

    with _sigterm_unwinds():
        if layer in (Layer.commit, Layer.all):
            with _metadata_url(backend, metadata_url, root) as url:
                settings = Settings.load(home=root / "commit-home", metadata_url=url)
                logs.append(
                    run_commit_campaign(
                        settings,
                        seed=seed,
                        schedules=schedules,
                        minutes=None if schedules is not None else share,
                        parallel=parallel,
                        log=CampaignLog("commit-path", seed, out=out, verbose=not quiet),
                    )
                )
        if layer in (Layer.process, Layer.all):
            # lazy: the process campaign (cluster helpers, servers) only when it runs
            from harness.chaos.process import LAYER, run_process_campaign

            logs.append(
                run_process_campaign(
                    seed=seed,
                    log=CampaignLog(LAYER, seed, out=out, verbose=not quiet),
                    metadata="postgresql" if backend is Backend.postgresql else "sqlite",
                    minutes=minutes - share if layer is Layer.all else minutes,
                    min_faults=min_faults,
                    max_schedules=schedules,
                    home=root / "process",
                )
            )
    faults = sum(len(log.faults) for log in logs)
    count = sum(log.schedules for log in logs)
    anomalies = sum(len(log.anomalies) for log in logs)
    out(f"{faults} faults in {count} schedules, {anomalies} anomalies")
    if anomalies:
        out(f"re-run: make chaos SEED={seed} LAYER={layer} MINUTES={minutes:g} BACKEND={backend}")
        raise typer.Exit(1)


#: The command line of ``python -m harness.chaos`` (what ``make chaos`` runs).
app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
app.command()(chaos)
