"""Output and error handling shared by every command: ``--output text|json``, exit codes."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import date, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from millstream.errors import (
    EXIT_FAMILIES,
    HTTP_EXIT_CODES,
    HomeNotFoundError,
    MillstreamError,
    exit_code,
    from_spark_failure,
)

err_console = Console(stderr=True)
console = Console()


class OutputFormat(StrEnum):
    text = "text"
    json = "json"


#: The options every command that opens a deployment or prints results shares.
HomeOpt = Annotated[
    Path | None,
    typer.Option(
        "--home", envvar="MILLSTREAM_HOME", help="Millstream home (default ./.millstream)."
    ),
]
OutputOpt = Annotated[OutputFormat, typer.Option("--output", "-o", help="text or json.")]


def _default(o: Any) -> Any:
    if isinstance(o, datetime | date):
        return o.isoformat()
    if isinstance(o, bytes):
        return o.decode("utf-8", errors="replace")
    return str(o)


def open_catalog(home: Path | None, *, create: bool = False) -> Any:
    """The deployment's catalog (``--home`` or the ``MILLSTREAM_*`` environment). A command
    that only reads passes ``create=False``: a local home without its metadata database raises
    :class:`HomeNotFoundError` naming where it looked, rather than creating an empty one."""
    # lazy: only the command that runs needs it; keeps `millstream --help` fast
    from millstream.catalog import Catalog
    from millstream.config import Settings

    settings = Settings.load(home=home)
    prefix = "sqlite:///"
    if not create and settings.metadata_url.startswith(prefix):
        db = Path(settings.metadata_url.removeprefix(prefix))
        if not db.exists():
            raise HomeNotFoundError(str(settings.home), str(db))
    return Catalog.open(settings=settings)


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, default=_default, indent=2) + "\n")


def exit_codes_help(*, rest_client: bool = False) -> str:
    """Every exit code of the CLI with its meaning, for the commands' help texts (rendered from
    :data:`millstream.errors.EXIT_FAMILIES`, which names the code of every error). With
    ``rest_client``, also how a refused REST call exits (:data:`~millstream.errors.HTTP_EXIT_CODES`)."""
    codes = "; ".join(f"{code} {name}" for code, name in sorted(EXIT_FAMILIES.items()))
    text = f"Exit codes: {codes}."
    if rest_client:
        by_status = ", ".join(f"{s} exits {c}" for s, c in sorted(HTTP_EXIT_CODES.items()))
        text += (
            " A refused call exits as the error the controller names, else by its HTTP status "
            f"({by_status}); 1 if the controller cannot be reached."
        )
    return text


@contextmanager
def handle_errors(output: OutputFormat = OutputFormat.text) -> Iterator[None]:
    """Turn MillstreamError (or a Spark failure carrying one) into a message and exit code."""
    try:
        yield
    except MillstreamError as exc:
        _fail(exc, output)
    except Exception as exc:  # a Spark/py4j error wrapping one of ours
        ours = from_spark_failure(exc)
        if ours is None:
            raise
        _fail(ours, output)  # exits 9: the Spark query failed with one of ours


def _fail(exc: MillstreamError, output: OutputFormat) -> None:
    if output is OutputFormat.json:
        emit_json(exc.to_dict())
    else:
        err_console.print(f"[bold red]error:[/] {exc.message}", highlight=False)
    raise typer.Exit(exit_code(exc))


def table_text(
    rows: list[dict[str, Any]], title: str | None = None, limit: int | None = None
) -> None:
    t = Table(title=title, show_lines=False)
    cols = list(rows[0]) if rows else []
    for c in cols:
        t.add_column(c)
    for r in rows[:limit] if limit else rows:
        t.add_row(
            *[
                "" if r[c] is None else str(_default(r[c]) if not isinstance(r[c], str) else r[c])
                for c in cols
            ]
        )
    console.print(t)


Renderer = Callable[[Any], None]
