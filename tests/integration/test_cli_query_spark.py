"""``millstream query --engine spark`` (Spark SQL over the ``millstream`` data source), as a
user runs it: the answer, and a missing table as one sentence with exit 3, no Java stack."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa

from millstream.catalog import Catalog
from millstream.table.writer import commit_staged, stage_rows

CLI = [sys.executable, "-c", "from millstream.cli.app import main; main()", "query"]


def test_spark_engine_answers_and_names_a_missing_table(tmp_path: Path) -> None:
    with Catalog.open(home=tmp_path) as cat:
        cat.create_table({"name": "t", "schema": {"id": "long"}})
        spec = cat.table("t").spec
        rows = pa.table(
            {
                "id": pa.array([1, 2, 3], pa.int64()),
                "_ms_partition": pa.array([0, 0, 0], pa.int32()),
                "_ms_offset": pa.array([0, 1, 2], pa.int64()),
                "_ms_tombstone": pa.array([False] * 3),
            }
        )
        commit_staged(cat.store, cat.deep, "t", stage_rows(cat.deep, spec, rows), {0: (0, 3)}, {})
    args = ["--home", str(tmp_path), "--engine", "spark", "--master", "local[1]"]
    done = subprocess.run(
        [*CLI, "SELECT sum(id) AS s FROM t", *args, "-o", "json"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [{"s": 6}]
    missing = subprocess.run(
        [*CLI, "SELECT * FROM ordrs", *args], capture_output=True, text=True, timeout=900
    )
    assert missing.returncode == 3, missing.stderr
    assert "error: table 'ordrs' does not exist" in missing.stderr
    for noise in ("Traceback", "\tat org.apache", "py4j"):
        assert noise not in missing.stdout + missing.stderr
