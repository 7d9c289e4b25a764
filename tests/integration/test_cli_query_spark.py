"""Spark from the venv's interpreter, the venv not activated (no PYSPARK_PYTHON, the venv's bin
not on PATH), as a user runs it: a read of a Millstream table through ``millstream.read_table``
and through the ``millstream`` data source directly, then ``millstream query --engine spark``
(Spark SQL over the data source): the answer, and a missing table as one sentence with exit 3,
no Java stack.

Spark's Python workers must run the driver's interpreter, and reading again registers the data
source once (no "replaced a previously registered data source" warnings). One process runs it
all, so one JVM starts: the reads, then the CLI's entry point (``main``, what the
``millstream`` script runs) once per command, each starting its own Spark session on it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa

from millstream.catalog import Catalog
from millstream.table.writer import commit_staged, stage_rows

SCRIPT = """
import sys
import millstream
from millstream.cli.app import main
from millstream.spark.session import spark_session

home = sys.argv[1]
spark = spark_session(master="local[1]", log_level="WARN")
first = millstream.read_table(spark, "t", home=home).count()
again = millstream.read_table(spark, "t", home=home).count()
direct = spark.read.format("millstream").option("home", home).load("t").count()
print("rows", first, again, direct, flush=True)
spark.stop()

for label, sql, *out in (
    ("answer", "SELECT sum(id) AS s FROM t", "-o", "json"),
    ("missing", "SELECT * FROM ordrs"),
):
    for stream in (sys.stdout, sys.stderr):
        print(f"=== {label}", file=stream, flush=True)
    sys.argv = ["millstream", "query", sql, "--home", home, "--engine", "spark"]
    sys.argv += ["--master", "local[1]", *out]
    try:
        main()
    except SystemExit as exc:
        code = exc.code
    else:
        code = 0
    for stream in (sys.stdout, sys.stderr):
        print(f"=== exit {code}", file=stream, flush=True)
"""


def _part(text: str, label: str) -> tuple[str, int]:
    """What one command printed on a stream, and its exit code."""
    body = text.split(f"=== {label}\n", 1)[1].split("=== exit ", 1)
    return body[0], int(body[1].split("\n", 1)[0])


def test_spark_from_the_venv_python_reads_and_the_cli_answers_and_names_a_missing_table(
    tmp_path: Path,
) -> None:
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
    venv_bin = str(Path(sys.executable).parent)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV")
    }
    env["PATH"] = os.pathsep.join(
        p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != venv_bin
    )
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    assert "rows 3 3 3" in done.stdout
    assert "No module named" not in said
    assert "replaced a previously registered data source" not in said

    answer, code = _part(done.stdout, "answer")
    assert code == 0, said
    assert json.loads(answer) == [{"s": 6}]
    missing, code = _part(done.stderr, "missing")
    assert code == 3, said
    assert "error: table 'ordrs' does not exist" in missing
    for noise in ("Traceback", "\tat org.apache", "py4j"):
        assert noise not in said
