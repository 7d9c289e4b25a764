"""``millstream table iceberg NAME``: publishes the table's current version and prints the
metadata location that DuckDB's ``iceberg_scan`` and pyiceberg's ``StaticTable`` read."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
from typer.testing import CliRunner

from harness.iceberg_readers import duckdb_connection, duckdb_rows, pyiceberg_rows
from millstream.catalog import Catalog
from millstream.cli.app import app
from millstream.reference.model import canonical
from millstream.table.writer import commit_staged, stage_rows


def _commit(home: Path, keys: list[int], value: str, lo: int) -> None:
    with Catalog.open(home=home) as cat:
        spec = cat.create_table(
            {
                "name": "kv",
                "schema": {"k": "long", "v": "string"},
                "mode": "upsert",
                "primary_key": ["k"],
            }
        ).spec
        rows = pa.Table.from_pylist(
            [
                {
                    "k": k,
                    "v": value,
                    "_ms_partition": 0,
                    "_ms_offset": lo + i,
                    "_ms_tombstone": False,
                }
                for i, k in enumerate(keys)
            ],
            schema=spec.arrow_schema(system_columns=True),
        )
        staged = stage_rows(cat.deep, spec, rows)
        commit_staged(cat.store, cat.deep, "kv", staged, {0: (lo, lo + len(keys))}, {})


def _current(home: Path) -> list[object]:
    with Catalog.open(home=home) as cat:
        return canonical(cat.read_table("kv").to_pylist())


def test_the_printed_location_reads_in_duckdb_and_pyiceberg_as_the_tables_current_rows(
    tmp_path: Path,
) -> None:
    runner = CliRunner()
    _commit(tmp_path, [1, 2, 3], "a", 0)
    result = runner.invoke(app, ["table", "iceberg", "kv", "--home", str(tmp_path)])
    assert result.exit_code == 0, result.output
    first = result.output.strip()
    assert first.endswith(".metadata.json")
    assert duckdb_rows(duckdb_connection(), first) == _current(tmp_path)

    _commit(tmp_path, [2, 4], "b", 3)
    # Without publishing, the location still shows the version published before.
    result = runner.invoke(app, ["table", "iceberg", "kv", "--no-publish", "--home", str(tmp_path)])
    assert result.exit_code == 0 and result.output.strip() == first
    result = runner.invoke(app, ["table", "iceberg", "kv", "--home", str(tmp_path), "-o", "json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown["manifest_version"] == shown["snapshot_id"] == 2
    assert shown["metadata_location"] != first
    assert pyiceberg_rows(shown["metadata_location"]) == _current(tmp_path)
    assert pyiceberg_rows(shown["metadata_location"]) == canonical(
        {"k": k, "v": v} for k, v in [(1, "a"), (2, "b"), (3, "a"), (4, "b")]
    )


def test_a_table_with_no_view_or_no_such_table_is_an_error_naming_it(tmp_path: Path) -> None:
    runner = CliRunner()
    with Catalog.open(home=tmp_path) as cat:
        cat.create_table({"name": "empty", "schema": {"k": "long"}})
    result = runner.invoke(app, ["table", "iceberg", "empty", "--home", str(tmp_path)])
    assert result.exit_code != 0 and "empty" in result.output
    result = runner.invoke(app, ["table", "iceberg", "nope", "--home", str(tmp_path)])
    assert result.exit_code != 0 and "nope" in result.output
