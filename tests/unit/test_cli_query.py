"""``millstream query`` (DuckDB over Millstream's own reader), ``table list`` / ``describe``,
and what a reading command says when the table or the home is missing."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from millstream.catalog import Catalog
from millstream.cli.app import app
from millstream.cli.query import pushdown
from millstream.spec import TableSpec
from millstream.table.writer import commit_staged, stage_rows


def _commit(
    cat: Catalog, table: str, data: dict[str, list[object]], tombstones: list[bool]
) -> None:
    spec = cat.table(table).spec
    n = len(tombstones)
    rows = pa.table(
        {
            **{c: pa.array(v, type=pa.int64() if c == "id" else None) for c, v in data.items()},
            "_ms_partition": pa.array([0] * n, pa.int32()),
            "_ms_offset": pa.array(range(n), pa.int64()),
            "_ms_tombstone": pa.array(tombstones),
        }
    )
    commit_staged(cat.store, cat.deep, table, stage_rows(cat.deep, spec, rows), {0: (0, n)}, {})


def _home(home: Path) -> None:
    """orders (upsert on id): 1 -> a then a2, 2 deleted, 3 -> c; events (append): 3 rows."""
    with Catalog.open(home=home) as cat:
        cat.create_table(
            {
                "name": "orders",
                "schema": {"id": "long", "status": "string"},
                "primary_key": ["id"],
                "mode": "upsert",
            }
        )
        _commit(
            cat,
            "orders",
            {"id": [1, 2, 3, 1, 2], "status": ["a", "b", "c", "a2", None]},
            [False, False, False, False, True],
        )
        cat.create_table({"name": "events", "schema": {"id": "long", "kind": "string"}})
        _commit(cat, "events", {"id": [1, 2, 3], "kind": ["x", "y", "x"]}, [False] * 3)


def _query(home: Path, sql: str, *args: str) -> list[dict[str, object]]:
    result = CliRunner().invoke(app, ["query", sql, "--home", str(home), "-o", "json", *args])
    assert result.exit_code == 0, result.output
    rows: list[dict[str, object]] = json.loads(result.output)
    return rows


def test_query_answers_from_the_merged_rows_without_spark(tmp_path: Path) -> None:
    _home(tmp_path)
    assert _query(tmp_path, "SELECT id, status FROM orders ORDER BY id") == [
        {"id": 1, "status": "a2"},
        {"id": 3, "status": "c"},
    ]
    assert _query(
        tmp_path, "SELECT kind, count(*) AS n FROM events GROUP BY kind ORDER BY kind"
    ) == [
        {"kind": "x", "n": 2},
        {"kind": "y", "n": 1},
    ]
    text = CliRunner().invoke(app, ["query", "SELECT * FROM orders", "--home", str(tmp_path)])
    assert text.exit_code == 0 and "a2" in text.output


def test_a_filter_on_a_key_is_applied_before_the_merge_and_one_on_a_value_after(
    tmp_path: Path,
) -> None:
    _home(tmp_path)
    # Before the merge, status = 'a' would find key 1's superseded row.
    assert _query(tmp_path, "SELECT * FROM orders WHERE status = 'a'") == []
    assert _query(tmp_path, "SELECT id FROM orders o WHERE o.id IN (1, 2) AND id >= 1") == [
        {"id": 1}
    ]
    spec = TableSpec.parse(
        {
            "name": "orders",
            "schema": {"id": "long", "s": "string"},
            "primary_key": ["id"],
            "mode": "upsert",
        }
    )
    assert pushdown(
        "SELECT * FROM orders o WHERE 2 < o.id AND s = 'x' AND id IN (3, 4)", "orders", spec
    ) == [("id", ">", 2), ("id", "in", (3, 4))]
    assert pushdown("SELECT * FROM orders WHERE id = 'x'", "orders", spec) == []  # type differs
    assert pushdown("SELECT * FROM orders WHERE id = 1 OR id = 2", "orders", spec) == []
    assert pushdown("SELECT * FROM orders JOIN b ON true WHERE id = 1", "orders", spec) == []
    append = TableSpec.parse({"name": "events", "schema": {"id": "long", "kind": "string"}})
    assert pushdown(
        "SELECT * FROM events WHERE kind IS NOT NULL AND kind = 'x'", "events", append
    ) == [("kind", "not_null", None), ("kind", "==", "x")]


def test_query_reads_only_the_tables_it_names(tmp_path: Path) -> None:
    _home(tmp_path)
    with Catalog.open(home=tmp_path) as cat:
        for entry in cat.manifest("events").entries:
            assert entry.file_path is not None
            cat.deep.delete(entry.file_path)  # events is unreadable now
    assert _query(tmp_path, "SELECT count(*) AS n FROM orders") == [{"n": 2}]


def test_a_missing_table_exits_3_with_one_sentence_naming_it(tmp_path: Path) -> None:
    _home(tmp_path)
    result = CliRunner().invoke(app, ["query", "SELECT * FROM ordrs", "--home", str(tmp_path)])
    assert result.exit_code == 3
    assert result.output.strip() == "error: table 'ordrs' does not exist"
    bad = CliRunner().invoke(app, ["query", "SELEC 1", "--home", str(tmp_path)])
    assert bad.exit_code == 2 and "invalid sql: Parser Error" in bad.output


@pytest.mark.parametrize(
    "command",
    [
        ["query", "SELECT 1"],
        ["table", "list"],
        ["table", "describe", "orders"],
        ["table", "maintain"],
    ],
)
def test_a_reading_command_without_a_home_names_it_and_creates_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    for var in ("MILLSTREAM_HOME", "MILLSTREAM_METADATA_URL", "MILLSTREAM_DEEP_STORE"):
        monkeypatch.delenv(var, raising=False)
    # wide enough that rich does not break the path (under pytest-xdist it is longer: popen-gwN)
    result = CliRunner(env={"COLUMNS": "200"}).invoke(app, command)
    assert result.exit_code == 3, result.output
    said = " ".join(result.output.split())
    assert f"no Millstream home at {tmp_path / '.millstream'}" in said
    assert "--home" in said and "MILLSTREAM_HOME" in said
    assert list(tmp_path.iterdir()) == []


def test_table_list_and_describe(tmp_path: Path) -> None:
    _home(tmp_path)
    result = CliRunner().invoke(app, ["table", "list", "--home", str(tmp_path), "-o", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == [
        {"table": "events", "mode": "append", "partitions": 1, "rows": 3, "version": 1},
        {"table": "orders", "mode": "upsert", "partitions": 1, "rows": 2, "version": 1},
    ]
    result = CliRunner().invoke(app, ["table", "describe", "orders", "--home", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "table orders: upsert, key id, comparison column (none)" in result.output
    assert "versions 0..1 kept" in result.output and "  status: string" in result.output
    assert "1 consuming" in result.output
    missing = CliRunner().invoke(app, ["table", "describe", "nope", "--home", str(tmp_path)])
    assert missing.exit_code == 3 and "table 'nope' does not exist" in missing.output


def test_query_in_a_fresh_process_as_a_user_runs_it(tmp_path: Path) -> None:
    """The console script's path (``main``), which keeps pandas out of a DuckDB query."""
    _home(tmp_path)
    cli = [sys.executable, "-c", "from millstream.cli.app import main; main()", "query"]
    done = subprocess.run(
        [*cli, "SELECT count(*) AS n FROM orders", "--home", str(tmp_path), "-o", "json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [{"n": 2}]
    missing = subprocess.run(
        [*cli, "SELECT * FROM ordrs", "--home", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert missing.returncode == 3
    assert " ".join(missing.stderr.split()) == "error: table 'ordrs' does not exist"


#: What a DuckDB query does not need, each imported by some other command or path: Spark,
#: the REST client and services, Kafka, the Iceberg view, metrics, pandas, the spec's YAML,
#: the record decoders, PostgreSQL's drivers, object stores, and the CLI's live displays.
NOT_FOR_A_QUERY = (
    "pyspark",
    "py4j",
    "httpx",
    "fastapi",
    "starlette",
    "uvicorn",
    "confluent_kafka",
    "prometheus_client",
    "pyiceberg",
    "pandas",
    "polars",
    "yaml",
    "fastavro",
    "google.protobuf",
    "psycopg",
    "psycopg2",
    "sqlalchemy.dialects.postgresql",
    "boto3",
    "botocore",
    "rich.live",
    "millstream.spark",
    "millstream.api",
    "millstream.control",
    "millstream.ingest",
    "millstream.sealing",
    "millstream.cli.progress",
    "millstream.cli.demo",
)


def _modules_after(argv: list[str]) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run the console script's ``main`` with ``argv`` in a fresh interpreter; its result and
    the modules it had imported when it exited."""
    code = (
        "import sys\n"
        f"sys.argv = ['millstream', *{argv!r}]\n"
        "from millstream.cli.app import main\n"
        "try:\n"
        "    main()\n"
        "finally:\n"
        "    print('MODULES', *sorted(sys.modules), file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    line = next(x for x in done.stderr.splitlines() if x.startswith("MODULES "))
    return done, set(line.split()[1:])


def _loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(n for n in names if n in modules or any(m.startswith(n + ".") for m in modules))


@pytest.mark.parametrize(
    ("command", "answer", "expected"),
    [
        (["query", "SELECT id FROM orders ORDER BY id"], lambda out: out, [{"id": 1}, {"id": 3}]),
        (
            ["table", "list"],
            lambda out: {t["table"]: t["rows"] for t in out},
            {"orders": 2, "events": 3},
        ),
        (
            ["table", "describe", "orders"],
            lambda out: (out["table"], out["mode"]),
            ("orders", "upsert"),
        ),
    ],
)
def test_a_reading_command_imports_only_what_it_needs(
    tmp_path: Path, command: list[str], answer: Callable[[Any], Any], expected: object
) -> None:
    """A query's wall time is mostly imports (docs/performance.md): the reading commands of
    the console script load no other command's libraries, nor pandas (pyarrow's first
    ``pa.array()`` would import it). Their answers are unchanged."""
    _home(tmp_path)
    done, modules = _modules_after([*command, "--home", str(tmp_path), "-o", "json"])
    assert done.returncode == 0, done.stderr
    assert answer(json.loads(done.stdout)) == expected
    assert "millstream.catalog" in modules and "pyarrow" in modules  # the probe sees imports
    assert _loaded(modules, NOT_FOR_A_QUERY) == []


def test_help_imports_no_engine_nor_metadata_store() -> None:
    """``millstream --help`` lists every command without loading what the commands use."""
    done, modules = _modules_after(["--help"])
    assert done.returncode == 0, done.stderr
    assert "query" in done.stdout and "table" in done.stdout
    heavy = ("duckdb", "pyarrow", "sqlalchemy", "pydantic", "numpy", "millstream.catalog")
    assert _loaded(modules, NOT_FOR_A_QUERY + heavy) == []
