"""``millstream datastream ...`` and ``millstream segments``: clients of the REST API."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from millstream.cli.client import DEFAULT_CONTROLLER, ControllerClient, segment
from millstream.cli.output import (
    OutputFormat,
    OutputOpt,
    console,
    emit_json,
    err_console,
    exit_codes_help,
    handle_errors,
    table_text,
)
from millstream.errors import InvalidSpecError

EXIT_CODES_HELP = exit_codes_help(rest_client=True)

app = typer.Typer(
    name="datastream",
    help="Create, list, show, update, pause, resume, stop and delete datastreams (REST API "
    "client).",
    epilog="Exit codes: see millstream --help.",
    no_args_is_help=True,
    rich_markup_mode=None,
)

ControllerOpt = Annotated[
    str,
    typer.Option(
        "--controller", envvar="MILLSTREAM_CONTROLLER", help="URL of the controller's REST API."
    ),
]
TokenOpt = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar="MILLSTREAM_API_TOKEN",
        help="Bearer token, if the controller requires one.",
        show_default=False,
    ),
]
NameArg = Annotated[str, typer.Argument(help="Datastream name.", show_default=False)]
TableOpt = Annotated[
    str | None,
    typer.Option(
        "--table",
        help="Only this table of a datastream that writes a table per topic (the others run on).",
        show_default=False,
    ),
]


def _when(ts: float | None) -> str:
    if ts is None:
        return ""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _source(spec: dict[str, Any]) -> str:
    src = spec.get("source", {})
    kind = src.get("kind")
    if kind == "kafka":
        topics = (
            ", ".join(src["topics"])
            if src.get("topics")
            else f"/{src['topic_pattern']}/"
            if src.get("topic_pattern")
            else src.get("topic")
        )
        return f"kafka {topics} @ {src.get('bootstrap_servers')}"
    if kind == "files":
        return f"files {src.get('path')}"
    return str(kind)


def _ago(ts: float | None) -> str:
    if ts is None:
        return ""
    s = max(0.0, time.time() - ts)
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.1f} h"


def health_text(health: dict[str, Any] | None) -> str:
    """A writer's health in a few words: ``running``, ``retrying for 2 min (3 failures):
    <error>``, ``stalled for 6 min: <what>``, ``not running``; empty when the record has none
    (a datastream that is not READY: its state says it)."""
    if not health:
        return ""
    status = str(health.get("status"))
    if status in ("running", "starting", "not running"):
        return status if status != "not running" else "not running (no live worker runs it)"
    since = _ago(health.get("since"))
    text = status + (f" for {since}" if since else "")
    failures = int(health.get("failures") or 0)
    if status == "retrying" and failures:
        text += f" ({failures} failure{'s' if failures != 1 else ''})"
    if health.get("error"):
        text += f": {health['error']}"
    return text


def _show_record(rec: dict[str, Any], verb: str | None = None) -> None:
    head = f"datastream [bold]{rec['name']}[/] is {rec['state']}"
    console.print(head + (f" ({verb})" if verb else ""), highlight=False)
    spec = rec.get("spec", {})
    tables = rec.get("tables") or []
    lines = [
        ("table", rec.get("table"))
        if rec.get("table") is not None
        else (f"tables ({len(tables)})", ", ".join(tables) or "(none yet)"),
        ("source", _source(spec)),
        ("mode", spec.get("table", {}).get("mode")),
        ("replicas", spec.get("replicas")),
        ("version", rec.get("version")),
        ("created", _when(rec.get("created_at"))),
        ("updated", _when(rec.get("updated_at"))),
    ]
    if rec.get("paused_tables"):
        lines.append(("paused", ", ".join(rec["paused_tables"])))
    if rec.get("health"):
        lines.append(("writer", health_text(rec["health"])))
    if rec.get("last_error"):
        lines.append(("last error", rec["last_error"]))
    for key, value in lines:
        console.print(f"  {key + ':':<12}{value}", highlight=False, markup=False)


def _command(
    name: str,
    action: str,
    controller: str,
    token: str | None,
    output: OutputFormat,
    table: str | None = None,
) -> None:
    path = f"/datastreams/{segment(name)}"
    if table is not None:
        path += f"/tables/{segment(table)}"
    with handle_errors(output), ControllerClient(controller, token=token) as client:
        rec = client.post(f"{path}/{action}")
        if output is OutputFormat.json:
            emit_json(rec)
        else:
            _show_record(rec, f"table {table} {action}d" if table is not None else None)


@app.command("create")
def create(
    file: Annotated[Path, typer.Option("--file", "-f", help="Datastream spec (YAML).")],
    controller: ControllerOpt = DEFAULT_CONTROLLER,
    token: TokenOpt = None,
    output: OutputOpt = OutputFormat.text,
) -> None:
    """Create a datastream from a YAML spec.

    The controller validates the spec and names any bad field. The datastream starts
    INITIALIZING; the controller makes it READY once its table exists."""
    with handle_errors(output):
        body = _spec_file(file)
        with ControllerClient(controller, token=token) as client:
            rec = client.post("/datastreams", body)
        if output is OutputFormat.json:
            emit_json(rec)
        else:
            _show_record(rec, "created")
            for warning in rec.get("warnings") or []:
                err_console.print(f"[bold yellow]warning:[/] {escape(warning)}", highlight=False)


@app.command("update", short_help="Evolve a datastream's schema from a YAML spec.")
def update(
    file: Annotated[Path, typer.Option("--file", "-f", help="Datastream spec (YAML).")],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Check and list the changes; change nothing.")
    ] = False,
    controller: ControllerOpt = DEFAULT_CONTROLLER,
    token: TokenOpt = None,
    output: OutputOpt = OutputFormat.text,
) -> None:
    """Evolve a datastream's schema from a YAML spec (the whole spec, as for create).

    Compatible changes are applied without downtime: a column added at the end (rows written
    before read it as null), int -> long or int -> double, a decimal's precision raised, and
    table.retention. The running writer picks them up at its next batch. Anything else is
    refused, naming the column and the rule, and nothing changes (exit 4)."""
    with handle_errors(output):
        body = _spec_file(file)
        name = body.get("name") if isinstance(body, dict) else None
        if not isinstance(name, str) or not name:
            raise InvalidSpecError("name", "the spec names no datastream")
        path = f"/datastreams/{segment(name)}" + ("?dry_run=true" if dry_run else "")
        with ControllerClient(controller, token=token) as client:
            result = client.patch(path, body)
        if output is OutputFormat.json:
            emit_json(result)
            return
        changes = result["changes"]
        rec = result["datastream"]
        if not changes:
            console.print(f"datastream {rec['name']}: no changes", highlight=False)
            return
        verb = "would change" if result["dry_run"] else "changed"
        version = result.get("schema_version")
        at = f" (table schema version {version})" if version is not None else ""
        console.print(f"datastream {rec['name']} {verb}{at}:", highlight=False, markup=False)
        for change in changes:
            console.print(f"  {change['description']}", highlight=False, markup=False)


def _spec_file(file: Path) -> Any:
    if not file.is_file():
        raise InvalidSpecError("file", f"{str(file)!r} does not exist")
    # lazy: only the commands that read a spec file need it; `millstream query` doesn't
    import yaml

    try:
        return yaml.safe_load(file.read_text())
    except yaml.YAMLError as exc:
        raise InvalidSpecError("spec", f"is not valid YAML: {exc}") from None


@app.command("list")
def list_(
    controller: ControllerOpt = DEFAULT_CONTROLLER,
    token: TokenOpt = None,
    output: OutputOpt = OutputFormat.text,
) -> None:
    """List every datastream with its state and its writer's health."""
    with handle_errors(output), ControllerClient(controller, token=token) as client:
        recs = client.get("/datastreams")
        if output is OutputFormat.json:
            emit_json(recs)
        elif not recs:
            console.print("(no datastreams)")
        else:
            table_text(
                [
                    {
                        "name": r["name"],
                        "state": r["state"],
                        "table": r["table"]
                        if r.get("table") is not None
                        else f"{len(r.get('tables') or [])} tables",
                        "source": _source(r["spec"]),
                        "version": r["version"],
                        "updated": _when(r["updated_at"]),
                        "writer": health_text(r.get("health")),
                        "last error": r["last_error"],
                    }
                    for r in recs
                ]
            )


@app.command("show", short_help="One datastream: state, writer health, table, source, last error.")
def show(
    name: NameArg,
    controller: ControllerOpt = DEFAULT_CONTROLLER,
    token: TokenOpt = None,
    output: OutputOpt = OutputFormat.text,
) -> None:
    """Show one datastream: state, table, source, version, its writer's health (running,
    retrying with the error and since when, stalled), last error."""
    with handle_errors(output), ControllerClient(controller, token=token) as client:
        rec = client.get(f"/datastreams/{segment(name)}")
        if output is OutputFormat.json:
            emit_json(rec)
        else:
            _show_record(rec)


@app.command("pause", short_help="READY -> PAUSED: writers stop at the shard upper.")
def pause(
    name: NameArg,
    table: TableOpt = None,
    controller: ControllerOpt = DEFAULT_CONTROLLER,
    token: TokenOpt = None,
    output: OutputOpt = OutputFormat.text,
) -> None:
    """READY -> PAUSED: writers stop at the shard upper; resume continues exactly there.

    With --table, only that table of a datastream that writes a table per topic: its writer
    stops at its shard uppers while the other tables keep committing (the datastream stays
    in its state; 'paused tables' lists it)."""
    _command(name, "pause", controller, token, output, table)


@app.command("resume")
def resume(
    name: NameArg,
    table: TableOpt = None,
    controller: ControllerOpt = DEFAULT_CONTROLLER,
    token: TokenOpt = None,
    output: OutputOpt = OutputFormat.text,
) -> None:
    """PAUSED, STOPPED or ERROR -> READY.

    With --table, only that table, paused on its own: its writer rejoins at its shard
    uppers."""
    _command(name, "resume", controller, token, output, table)


@app.command("stop")
def stop(
    name: NameArg,
    controller: ControllerOpt = DEFAULT_CONTROLLER,
    token: TokenOpt = None,
    output: OutputOpt = OutputFormat.text,
) -> None:
    """READY or PAUSED -> STOPPING; STOPPED once no worker runs it."""
    _command(name, "stop", controller, token, output)


@app.command("delete", short_help="Any state -> DELETING; removed once no worker runs it.")
def delete(
    name: NameArg,
    controller: ControllerOpt = DEFAULT_CONTROLLER,
    token: TokenOpt = None,
    output: OutputOpt = OutputFormat.text,
) -> None:
    """Any state -> DELETING; removed once no worker runs it (the table and data stay)."""
    with handle_errors(output), ControllerClient(controller, token=token) as client:
        rec = client.delete(f"/datastreams/{segment(name)}")
        if output is OutputFormat.json:
            emit_json(rec)
        else:
            _show_record(rec, "it is removed once no worker runs it")


def segments(
    table: Annotated[str, typer.Argument(help="Table name.", show_default=False)],
    controller: ControllerOpt = DEFAULT_CONTROLLER,
    token: TokenOpt = None,
    output: OutputOpt = OutputFormat.text,
) -> None:
    """List a table's segments (table__partition__seq) by partition, from the controller."""
    with handle_errors(output), ControllerClient(controller, token=token) as client:
        info = client.get(f"/tables/{segment(table)}/segments")
        if output is OutputFormat.json:
            emit_json(info)
            return
        rows = [
            {
                "segment": s["name"],
                "partition": s["partition"],
                "seq": s["seq"],
                "offsets": f"[{s['start_offset']}, {s['end_offset']})",
                "state": s["state"],
                "rows": s["rows"],
                "bytes": s["size_bytes"],
                "file": s["file"],
            }
            for p in info["partitions"]
            for s in p["segments"]
        ]
        deleted = info.get("deleted_rows", 0)
        title = (
            f"{info['table']}: {info['segment_count']} segments, {info['row_count']} rows"
            + (f" ({deleted} superseded rows skipped by delete vectors)" if deleted else "")
            + f" (manifest version {info['manifest_version']})"
        )
        if rows:
            table_text(rows, title=title)
        else:
            console.print(title, highlight=False)


def rollback(
    table: Annotated[str, typer.Argument(help="Table name.", show_default=False)],
    partition: Annotated[int, typer.Option("--partition", help="Partition to roll back.")],
    from_seq: Annotated[int, typer.Option("--from-seq", help="First segment sequence to remove.")],
    dry_run: Annotated[
        bool, typer.Option("--dry-run/--apply", help="Only show what would be removed (default).")
    ] = True,
    force: Annotated[bool, typer.Option(help="Roll back even if the datastream runs.")] = False,
    controller: ControllerOpt = DEFAULT_CONTROLLER,
    token: TokenOpt = None,
    output: OutputOpt = OutputFormat.text,
) -> None:
    """Remove a partition's segments from --from-seq on and move its upper back (dry run by
    default; --apply needs the datastream paused unless --force). Writers are fenced and
    re-ingest from the new upper when resumed."""
    query = f"partition={partition}&fromSequence={from_seq}&dryRun={str(dry_run).lower()}"
    query += f"&force={str(force).lower()}"
    with handle_errors(output), ControllerClient(controller, token=token) as client:
        plan = client.delete(f"/tables/{segment(table)}/segments?{query}")
        if output is OutputFormat.json:
            emit_json(plan)
            return
        verb = "would remove" if plan["dry_run"] else "removed"
        console.print(
            f"{plan['table']} partition {plan['partition']}: {verb} "
            f"{len(plan['removed_segments'])} segments; upper {plan['upper']['from']} -> "
            f"{plan['upper']['to']}, epoch {plan['epoch']['from']} -> {plan['epoch']['to']}"
            + (" (dry run: pass --apply to do it)" if plan["dry_run"] else ""),
            highlight=False,
        )
        if plan["removed_segments"]:
            table_text(plan["removed_segments"])


def reingest(
    segment_name: Annotated[str, typer.Argument(metavar="SEGMENT", help="e.g. orders__0__12")],
    wait: Annotated[bool, typer.Option(help="Wait for the job to finish.")] = True,
    controller: ControllerOpt = DEFAULT_CONTROLLER,
    token: TokenOpt = None,
    output: OutputOpt = OutputFormat.text,
) -> None:
    """Rebuild a segment whose file is lost or corrupt by re-reading its offset range from the
    source (a job on the controller; 409 if one already runs for that segment)."""
    with handle_errors(output), ControllerClient(controller, token=token) as client:
        job = client.post(f"/segments/{segment(segment_name)}/reingest")
        while wait and job["state"] == "RUNNING":
            time.sleep(0.5)
            job = next(j for j in client.get("/reingestJobs") if j["id"] == job["id"])
        if output is OutputFormat.json:
            emit_json(job)
        else:
            detail = job["error"] or (job["result"] or {})
            console.print(
                f"re-ingestion of {job['segment']}: {job['state']} {detail}", highlight=False
            )
        if job["state"] == "FAILED":
            raise typer.Exit(1)
