"""The DuckDB and pyiceberg snippets of docs/reading-from-other-engines.md run as written, and
read the table's rows as Millstream does: from the metadata file, and through the REST catalog
of a controller served as ``millstream controller`` serves it, with a read token (the page's
Trino and Spark settings say they are untested)."""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Any

import pyarrow as pa
from typer.testing import CliRunner

from millstream.api import create_app
from millstream.catalog import Catalog
from millstream.cli.app import app
from millstream.cli.services import ServiceGroup, serve_api
from millstream.control.controller import Controller
from millstream.reference.model import canonical
from millstream.table.writer import commit_staged, stage_rows

DOC = Path(__file__).resolve().parents[2] / "docs" / "reading-from-other-engines.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_duckdb_and_pyiceberg_snippets_read_the_tables_rows(tmp_path: Path) -> None:
    with Catalog.open(home=tmp_path) as cat:
        spec = cat.create_table(
            {
                "name": "orders",
                "schema": {"id": "long", "qty": "long"},
                "mode": "upsert",
                "primary_key": ["id"],
            }
        ).spec
        for lo in (0, 4):
            rows = pa.Table.from_pylist(
                [
                    {
                        "id": i % 3,
                        "qty": i,
                        "_ms_partition": 0,
                        "_ms_offset": i,
                        "_ms_tombstone": False,
                    }
                    for i in range(lo, lo + 4)
                ],
                schema=spec.arrow_schema(system_columns=True),
            )
            commit_staged(
                cat.store,
                cat.deep,
                "orders",
                stage_rows(cat.deep, spec, rows),
                {0: (lo, lo + 4)},
                {},
            )
            result = CliRunner().invoke(
                app, ["table", "iceberg", "orders", "--home", str(tmp_path)]
            )
            assert result.exit_code == 0, result.output
        expected = canonical(cat.read_table("orders").to_pylist())
        first_version = canonical(cat.read_table("orders", as_of=1).to_pylist())
        metadata = result.output.strip()

        duck, attach, pyice, rest = python_blocks()
        scope: dict[str, Any] = {"metadata": metadata}
        exec(compile(duck, f"{DOC.name}: DuckDB", "exec"), scope)
        assert canonical(pairs(scope["rows"])) == expected
        exec(compile(pyice, f"{DOC.name}: pyiceberg", "exec"), scope)
        assert canonical(scope["current"].to_pylist()) == expected
        assert canonical(scope["first"].to_pylist()) == first_version != expected

        # The REST catalog snippets, against the controller `millstream controller` runs.
        ctl = Controller(cat, controller_id="docs")
        with ServiceGroup() as group:
            group.start("controller", ctl.run_forever, ctl.stop)
            api = serve_api(
                group, create_app(cat, controller=ctl, read_token="s3cret"), host=HOST, port=port()
            )
            scope.update(api=api, read_token="s3cret")
            exec(compile(attach, f"{DOC.name}: DuckDB ATTACH", "exec"), scope)
            assert canonical(pairs(scope["attached"])) == expected
            exec(compile(rest, f"{DOC.name}: RestCatalog", "exec"), scope)
            assert canonical(scope["orders"].to_pylist()) == expected


HOST = "127.0.0.1"


def port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def pairs(rows: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    return [dict(zip(["id", "qty"], r, strict=True)) for r in rows]
