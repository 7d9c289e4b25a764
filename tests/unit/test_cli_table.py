"""``millstream table maintain``: what it prints, what it removes, and what it refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
from typer.testing import CliRunner

from millstream.catalog import Catalog
from millstream.cli import table as cli_table
from millstream.cli.app import app
from millstream.clock import ManualClock
from millstream.table import gc
from millstream.table.writer import commit_staged, stage_rows

T0 = 1_700_000_000.0


def _history(home: Path) -> None:
    """Table t: three versions committed long ago (retention 1h, 1 version kept)."""
    with Catalog.open(home=home) as cat:
        cat.store.clock = ManualClock(T0)
        cat.create_table(
            {"name": "t", "schema": {"id": "long"}, "retention": {"time": "1h", "min_versions": 1}}
        )
        spec = cat.table("t").spec
        for i in range(3):
            rows = pa.table(
                {
                    "id": pa.array([i], pa.int64()),
                    "_ms_partition": pa.array([0], pa.int32()),
                    "_ms_offset": pa.array([i], pa.int64()),
                    "_ms_tombstone": pa.array([False]),
                }
            )
            commit_staged(
                cat.store, cat.deep, "t", stage_rows(cat.deep, spec, rows), {0: (i, i + 1)}, {}
            )


def test_a_dry_run_says_what_would_expire_and_removes_nothing(tmp_path: Path) -> None:
    _history(tmp_path)
    result = CliRunner().invoke(
        app, ["table", "maintain", "t", "--home", str(tmp_path), "--dry-run"]
    )
    assert result.exit_code == 0, result.output
    assert "t: would expire versions 0..2 (3 versions" in result.output
    with Catalog.open(home=tmp_path) as cat:
        assert cat.store.oldest_kept_version("t") == 0

    result = CliRunner().invoke(app, ["table", "maintain", "--home", str(tmp_path), "-o", "json"])
    assert result.exit_code == 0, result.output
    (report,) = json.loads(result.output)
    assert report["expired"]["floor"] == 3 and report["dry_run"] is False
    with Catalog.open(home=tmp_path) as cat:
        assert cat.store.oldest_kept_version("t") == 3
        assert cat.read_table("t").num_rows == 3


def test_an_unknown_table_exits_3_and_a_short_grace_is_refused_with_2(tmp_path: Path) -> None:
    _history(tmp_path)
    result = CliRunner().invoke(app, ["table", "maintain", "nope", "--home", str(tmp_path)])
    assert result.exit_code == 3
    assert "table 'nope' does not exist" in result.output
    result = CliRunner().invoke(
        app, ["table", "maintain", "t", "--home", str(tmp_path), "--grace", "60"]
    )
    assert result.exit_code == 2
    assert "invalid --grace" in result.output


def test_the_cli_defaults_are_the_garbage_collectors() -> None:
    """The CLI copies them to keep `millstream --help` fast; they must not drift."""
    assert cli_table.DEFAULT_GRACE_SECONDS == gc.DEFAULT_GRACE_SECONDS
    assert cli_table.MIN_GRACE_SECONDS == gc.MAX_STAGED_AGE_SECONDS
