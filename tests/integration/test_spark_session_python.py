"""A Spark read of a Millstream table from the venv's interpreter, the venv not activated
(no PYSPARK_PYTHON, the venv's bin not on PATH): Spark's Python workers must run the driver's
interpreter, and reading twice registers the data source once (no "replaced a previously
registered data source" warnings)."""

from __future__ import annotations

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
from millstream.spark.session import spark_session

spark = spark_session(master="local[1]", log_level="WARN")
first = millstream.read_table(spark, "t", home=sys.argv[1]).count()
again = millstream.read_table(spark, "t", home=sys.argv[1]).count()
direct = spark.read.format("millstream").option("home", sys.argv[1]).load("t").count()
print("rows", first, again, direct, flush=True)
spark.stop()
"""


def test_a_spark_read_from_the_venv_python_without_activation(tmp_path: Path) -> None:
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
