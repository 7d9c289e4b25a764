"""``millstream table ...``: maintenance of a deployment's tables, straight on its metadata and
deep store (``--home`` or the ``MILLSTREAM_*`` environment), no service needed."""

from __future__ import annotations

from typing import Annotated

import typer

from millstream.cli.output import (
    HomeOpt,
    OutputFormat,
    OutputOpt,
    console,
    emit_json,
    exit_codes_help,
    handle_errors,
)
from millstream.errors import InvalidSpecError

#: millstream.table.gc.DEFAULT_GRACE_SECONDS and MAX_STAGED_AGE_SECONDS, not imported:
#: `millstream --help` stays fast (a test checks they agree).
DEFAULT_GRACE_SECONDS = 3600.0
MIN_GRACE_SECONDS = 1800.0

app = typer.Typer(
    name="table",
    help="Table maintenance: expire old versions (retention) and delete unreferenced files.",
    epilog=exit_codes_help(),
    no_args_is_help=True,
)


@app.command("maintain", epilog=exit_codes_help())
def maintain(
    tables: Annotated[
        list[str] | None,
        typer.Argument(help="Tables to maintain (default: every table).", show_default=False),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say what would be removed; remove nothing.")
    ] = False,
    grace: Annotated[
        float,
        typer.Option(
            help="Only delete unreferenced files older than this many seconds (a writer's "
            "staged files are unreferenced until its commit).",
        ),
    ] = DEFAULT_GRACE_SECONDS,
    home: HomeOpt = None,
    output: OutputOpt = OutputFormat.text,
) -> None:
    """Expire the versions each table's retention no longer keeps, then delete the files no
    kept version references. Prints one line per table."""
    # lazy: only the command that runs needs it; keeps `millstream --help` fast
    from millstream.catalog import Catalog
    from millstream.table.maintain import maintain as run_maintenance

    with handle_errors(output):
        if grace < MIN_GRACE_SECONDS:
            raise InvalidSpecError(
                "--grace",
                f"{grace:g} s is shorter than {MIN_GRACE_SECONDS:g} s: a running writer's staged "
                "files are unreferenced until its commit, which accepts files that old",
            )
    with handle_errors(output), Catalog.open(home=home) as cat:
        names = tables or [t.name for t in cat.store.list_tables()]
        reports = [
            run_maintenance(cat.store, cat.deep, name, dry_run=dry_run, grace_seconds=grace)
            for name in names
        ]
        if output is OutputFormat.json:
            emit_json([r.to_dict() for r in reports])
        else:
            for r in reports:
                console.print(r.describe(), highlight=False, soft_wrap=True)
