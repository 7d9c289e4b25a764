"""``millstream controller | worker | up``: the control-plane services, each stopped cleanly by
Ctrl-C or SIGTERM (exit 0). A service that dies on its own stops the others and exits 1."""

from __future__ import annotations

import logging
from typing import Annotated, Any

import typer
from rich.markup import escape

from millstream.cli.client import DEFAULT_CONTROLLER, ControllerClient
from millstream.cli.output import (
    HomeOpt,
    OutputFormat,
    OutputOpt,
    console,
    emit_json,
    err_console,
    handle_errors,
)
from millstream.cli.services import ServiceGroup, serve_api

PortOpt = Annotated[int, typer.Option("--port", help="Port of the REST API.")]
HostOpt = Annotated[str, typer.Option("--host", help="Interface of the REST API.")]
MasterOpt = Annotated[str | None, typer.Option(help="Spark master (default local[2]).")]
ApiTokenOpt = Annotated[
    str | None,
    typer.Option(
        "--api-token",
        envvar="MILLSTREAM_API_TOKEN",
        help="Require 'Authorization: Bearer <token>' on every mutating REST call.",
        show_default=False,
    ),
]
ReadTokenOpt = Annotated[
    str | None,
    typer.Option(
        "--read-token",
        envvar="MILLSTREAM_API_READ_TOKEN",
        help="Require a bearer token on reads too (this one or the API token); /health and "
        "the console's pages stay open. Default: reads are open.",
        show_default=False,
    ),
]
#: The codes of :data:`millstream.errors.EXIT_FAMILIES` a service process exits with.
SERVICE_EXIT_HELP = (
    "Exit codes: 0 stopped by Ctrl-C/SIGTERM; 1 a service failed (or could not start, or the "
    "controller cannot be reached); 2 bad option."
)


def _logging() -> None:
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("millstream").setLevel(logging.INFO)


def _announce(output: OutputFormat, info: dict[str, Any], text: str) -> None:
    if output is OutputFormat.json:
        emit_json(info)
    else:
        console.print(text, highlight=False)


def _finish(group: ServiceGroup) -> None:
    if group.failures:
        for failure in group.failures:
            err_console.print(f"[bold red]error:[/] {failure}", highlight=False)
        raise typer.Exit(1)
    err_console.print("stopped")


def controller(
    port: PortOpt = 8600,
    host: HostOpt = "127.0.0.1",
    home: HomeOpt = None,
    metadata_url: Annotated[
        str | None,
        typer.Option(help="Metadata store URL (env MILLSTREAM_METADATA_URL; default SQLite)."),
    ] = None,
    deep_store: Annotated[
        str | None, typer.Option(help="Deep store: a directory or s3://bucket/prefix.")
    ] = None,
    api_token: ApiTokenOpt = None,
    read_token: ReadTokenOpt = None,
    controller_id: Annotated[str | None, typer.Option(help="Stable id of this controller.")] = None,
    lease_ttl: Annotated[
        float,
        typer.Option(
            "--lease-ttl", min=0.1, help="Seconds a leader holds its lease without renewing it."
        ),
    ] = 6.0,  # ControlSettings' defaults (not imported here: the CLI starts fast)
    worker_ttl: Annotated[
        float,
        typer.Option(
            "--worker-ttl",
            min=0.1,
            help="Seconds without a heartbeat after which a worker is dead (its writers move; "
            "a warm standby may commit). Workers learn it from GET /settings.",
        ),
    ] = 6.0,
    takeover_ttl: Annotated[
        float,
        typer.Option(
            "--takeover-ttl",
            min=0.1,
            help="Seconds without a heartbeat of an active writer's worker after which its warm "
            "standby commits (before the worker TTL moves anything). A takeover that was not "
            "needed is two writers racing through compare-and-append: nothing is lost.",
        ),
    ] = 1.5,
    stall_seconds: Annotated[
        float,
        typer.Option(
            "--stall-seconds",
            min=10.0,
            max=86400.0,
            help="A datastream whose shard upper has not moved for this long while its source "
            "holds newer records is stalled: reported (health, metric, alert) and its writer "
            "restarted with backoff. Workers learn it from GET /settings.",
        ),
    ] = 300.0,
    auto_repair: Annotated[
        bool,
        typer.Option(
            "--auto-repair/--no-auto-repair",
            help="The leader re-ingests segments whose data file is missing or unreadable "
            "(durable jobs in GET /reingestJobs), with backoff per segment.",
        ),
    ] = True,
    iceberg_publish_interval: Annotated[
        float,
        typer.Option(
            "--iceberg-publish-interval",
            min=0.0,
            help="Workers publish each table's Iceberg view this often (seconds; 0 turns it "
            "off). Workers learn it from GET /settings.",
        ),
    ] = 15.0,  # DEFAULT_PUBLISH_INTERVAL, literal: the CLI imports the engine lazily
    output: OutputOpt = OutputFormat.text,
) -> None:
    """Run a controller (leader election, lifecycle, assignment, automatic repair) and serve
    the REST API."""
    # lazy: only the command that runs needs it; keeps `millstream --help` fast
    from millstream.api import create_app
    from millstream.api.console import console_url
    from millstream.catalog import Catalog
    from millstream.control.controller import Controller, ControlSettings
    from millstream.metastore.engine import public_url

    _logging()
    with handle_errors(output):
        catalog = Catalog.open(home=home, metadata_url=metadata_url, deep_store=deep_store)
        settings = ControlSettings(
            lease_ttl=lease_ttl,
            worker_ttl=worker_ttl,
            takeover_ttl=takeover_ttl,
            stall_seconds=stall_seconds,
            auto_repair=auto_repair,
            iceberg_publish_interval=iceberg_publish_interval or None,
        )
        ctl = Controller(catalog, controller_id=controller_id, settings=settings)
        app = create_app(catalog, controller=ctl, api_token=api_token, read_token=read_token)
        with ServiceGroup() as group:
            group.handle_signals()
            group.start("controller", ctl.run_forever, ctl.stop)
            url = serve_api(group, app, host=host, port=port)
            _announce(
                output,
                {
                    "api": url,
                    "console": console_url(url),
                    "controller_id": ctl.id,
                    "metadata_url": public_url(catalog.settings.metadata_url),
                },
                f"controller {ctl.id}: REST API on {url} (OpenAPI at {url}/docs); "
                f"metadata {public_url(catalog.settings.metadata_url)}. Ctrl-C stops.\n"
                f"console: {console_url(url)}",
            )
            group.wait()
        catalog.close()
        _finish(group)


def worker(
    controller: Annotated[
        str,
        typer.Option(
            "--controller", envvar="MILLSTREAM_CONTROLLER", help="URL of the controller's REST API."
        ),
    ] = DEFAULT_CONTROLLER,
    worker_id: Annotated[
        str | None, typer.Option(help="Stable id of this worker (its state directories).")
    ] = None,
    home: HomeOpt = None,
    token: Annotated[
        str | None,
        typer.Option("--token", envvar="MILLSTREAM_API_TOKEN", help="Bearer token, if needed."),
    ] = None,
    master: MasterOpt = None,
    output: OutputOpt = OutputFormat.text,
) -> None:
    """Run a worker: the writers the controller assigns to it, on one SparkSession.

    It learns the metadata store and deep store from the controller (GET /settings); a
    PostgreSQL password comes from PGPASSWORD or ~/.pgpass, never from the controller."""
    # lazy: only the command that runs needs it; keeps `millstream --help` fast
    from millstream.catalog import Catalog
    from millstream.control.controller import ControlSettings
    from millstream.control.worker import Worker
    from millstream.spark.session import quiet_jvm_log, spark_session

    _logging()
    with handle_errors(output):
        with ControllerClient(controller, token=token, timeout=10) as client:
            client.get("/health")
            remote = client.get("/settings")
        catalog = Catalog.open(
            home=home,
            metadata_url=remote["metadata_url"],
            deep_store=remote["deep_store"],
            s3_endpoint=remote["s3_endpoint"],
        )
        spark = spark_session(master=master)  # before our handlers: Spark takes SIGINT
        w = Worker(
            catalog,
            spark,
            worker_id=worker_id,
            settings=ControlSettings(**remote["control"]),
        )
        try:
            with ServiceGroup() as group:
                group.handle_signals()
                group.start("worker", w.run_forever, w.stop)
                _announce(
                    output,
                    {"worker_id": w.id, "controller": controller},
                    f"worker {w.id} joined the controller at {controller}. Ctrl-C stops.",
                )
                group.wait()
                quiet_jvm_log(spark)
        finally:
            quiet_jvm_log(spark)
            spark.stop()
            catalog.close()
        _finish(group)


def up(
    port: PortOpt = 8600,
    host: HostOpt = "127.0.0.1",
    home: HomeOpt = None,
    broker_port: Annotated[
        int | None,
        typer.Option(
            "--broker-port",
            help="Port of the embedded broker (127.0.0.1). Default: the port the home's last "
            "`up` used (HOME/broker/broker.json), else 9092 unless taken, else a free one.",
            show_default=False,
        ),
    ] = None,
    broker_storage: Annotated[
        str | None,
        typer.Option(
            "--broker-storage",
            help="Where the broker keeps topics: memory://tansu/ (the default: throwaway, "
            "lost when `up` stops) or s3://BUCKET/ (durable; endpoint from "
            "MILLSTREAM_S3_ENDPOINT, credentials from AWS_*). Recorded like the port.",
            show_default=False,
        ),
    ] = None,
    api_token: ApiTokenOpt = None,
    read_token: ReadTokenOpt = None,
    master: MasterOpt = None,
    output: OutputOpt = OutputFormat.text,
) -> None:
    """All in one process: embedded broker, controller with the REST API, one worker.

    The broker is Tansu (Kafka protocol) on 127.0.0.1:9092 by default; its port and storage
    are recorded in HOME/broker/broker.json and reused by the next `up`. By default it keeps
    topics in memory: they are lost when `up` stops (--broker-storage s3://BUCKET/ keeps
    them). Prints the API URL, the web console's URL and the broker's bootstrap address;
    Ctrl-C or SIGTERM stops everything."""
    # lazy: the API, the catalog, Spark and the broker load only when `millstream up` runs
    from millstream.api import create_app
    from millstream.api.console import console_url
    from millstream.catalog import Catalog
    from millstream.config import Settings
    from millstream.control.controller import Controller
    from millstream.control.worker import Worker
    from millstream.local.process import ServerStartError
    from millstream.local.tansu import TansuBroker, start_home_broker
    from millstream.spark.session import quiet_jvm_log, spark_session

    _logging()
    with handle_errors(output):
        settings = Settings.load(home=home)
        catalog = Catalog.open(settings=settings)
        broker: TansuBroker | None = None
        spark: Any = None
        group = ServiceGroup()
        try:
            group.handle_signals()
            try:
                broker, broker_settings = start_home_broker(
                    settings.home / "broker",
                    port=broker_port,
                    storage=broker_storage,
                    s3_endpoint=settings.s3_endpoint,
                )
            except ServerStartError as exc:  # a sentence (and the broker's log), no traceback
                err_console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
                raise typer.Exit(1) from None
            kept = (
                f"topics kept in {broker_settings.storage}"
                if broker_settings.durable
                else "topics in memory: lost when `up` stops; --broker-storage s3://BUCKET/ "
                "keeps them"
            )
            ctl = Controller(catalog)
            group.start("controller", ctl.run_forever, ctl.stop)
            url = serve_api(
                group,
                create_app(catalog, controller=ctl, api_token=api_token, read_token=read_token),
                host=host,
                port=port,
            )
            if output is OutputFormat.text:
                console.print(
                    f"REST API  {url}  (OpenAPI at {url}/docs)\n"
                    f"console   {console_url(url)}\n"
                    f"broker    {broker.bootstrap}  ({kept})\n"
                    "starting Spark for the worker (first start takes 10-20 s) ...",
                    highlight=False,
                )
            spark = spark_session(master=master)
            group.handle_signals()  # Spark replaced the SIGINT handler
            if not group.stopping:
                w = Worker(catalog, spark, settings=ctl.settings)
                group.start("worker", w.run_forever, w.stop)
                _announce(
                    output,
                    {
                        "api": url,
                        "console": console_url(url),
                        "broker": broker.bootstrap,
                        "broker_storage": broker_settings.storage,
                        "broker_durable": broker_settings.durable,
                        "controller_id": ctl.id,
                        "worker_id": w.id,
                        "home": str(settings.home),
                    },
                    f"up: worker {w.id}, controller {ctl.id}, home {settings.home}. Ctrl-C stops.",
                )
                group.wait()
        finally:
            if spark is not None:
                quiet_jvm_log(spark)
            group.close()
            if spark is not None:
                spark.stop()
            # before the broker stops: a consumer that outlives it logs reconnects forever
            # lazy: the Kafka source loads only when `millstream up` runs
            from millstream.ingest.sources.kafka import CONSUMERS

            CONSUMERS.close()
            if broker is not None:
                broker.stop()
            catalog.close()
        _finish(group)


#: One line each for `millstream --help`'s list of commands.
SHORT_HELP = {
    "controller": "Run a controller and serve the REST API.",
    "worker": "Run a worker: the writers the controller assigns to it.",
    "up": "Broker, controller, REST API and a worker in one process.",
}


def register(app: typer.Typer) -> None:
    for fn in (controller, worker, up):
        app.command(fn.__name__, epilog=SERVICE_EXIT_HELP, short_help=SHORT_HELP[fn.__name__])(fn)
