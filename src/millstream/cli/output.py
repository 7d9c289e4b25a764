"""Output and error handling shared by every command: ``--output text|json``, exit codes."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import date, datetime
from enum import StrEnum
from typing import Any

import typer
from rich.console import Console

from millstream.errors import MillstreamError, exit_code

err_console = Console(stderr=True)
console = Console()


class OutputFormat(StrEnum):
    text = "text"
    json = "json"


def _default(o: Any) -> Any:
    if isinstance(o, datetime | date):
        return o.isoformat()
    if isinstance(o, bytes):
        return o.decode("utf-8", errors="replace")
    return str(o)


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, default=_default, indent=2) + "\n")


class SparkQueryError(MillstreamError):
    """One of our errors, raised inside a Spark Python worker, as the driver saw it."""

    def __init__(self, kind: str, message: str, **fields: Any) -> None:
        super().__init__(message, **fields)
        self.kind = kind

    def to_dict(self) -> dict[str, Any]:
        return {"error": self.kind, "message": self.message, **self.fields}


def spark_error_to_millstream(exc: BaseException) -> MillstreamError | None:
    """A Spark query failed because of one of our errors (raised in a Python worker): find it,
    keeping its name and, for a bad record, the partition and offset."""
    import re

    text = str(exc)
    from millstream import errors
    from millstream.ingest.sink import BadRecordError

    for cls in (
        BadRecordError,
        errors.WriterFencedError,
        errors.ShardGapError,
        errors.SegmentUnavailableError,
    ):
        marker = f"{cls.__name__}: "
        if marker in text:
            line = text.split(marker, 1)[1].splitlines()[0]
            fields: dict[str, Any] = {}
            m = re.search(r"partition (\d+) offset (\d+)", line)
            if m:
                fields = {"partition": int(m.group(1)), "offset": int(m.group(2))}
            return SparkQueryError(cls.__name__, line, **fields)
    return None


@contextmanager
def handle_errors(output: OutputFormat = OutputFormat.text) -> Iterator[None]:
    """Turn MillstreamError (or a Spark failure carrying one) into a message and exit code."""
    try:
        yield
    except MillstreamError as exc:
        _fail(exc, exit_code(exc), output)
    except Exception as exc:  # a Spark/py4j error wrapping one of ours
        ours = spark_error_to_millstream(exc)
        if ours is None:
            raise
        _fail(ours, 9, output)


def _fail(exc: MillstreamError, code: int, output: OutputFormat) -> None:
    if output is OutputFormat.json:
        emit_json(exc.to_dict())
    else:
        err_console.print(f"[bold red]error:[/] {exc.message}", highlight=False)
    raise typer.Exit(code)


def table_text(
    rows: list[dict[str, Any]], title: str | None = None, limit: int | None = None
) -> None:
    from rich.table import Table

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
