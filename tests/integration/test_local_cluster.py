"""Issue 3 acceptance: ingestion is correct on a real cluster topology, not only in local
mode. ``local-cluster[2,1,1024]`` runs two executor JVMs, each with its own Python workers,
so the sink's staged files, commit messages and options must cross process boundaries.

Re-runs the upsert case of the engine test in a child pytest whose session fixture uses that
master (one SparkSession per process, so it cannot share this process's session).
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

MASTER = "local-cluster[2,1,1024]"
REPO = Path(__file__).resolve().parents[2]
ENGINE_TEST = Path(__file__).with_name("test_kafka_ingest_engines.py")


@pytest.mark.skipif(
    os.environ.get("MILLSTREAM_TEST_SPARK_MASTER", "").startswith("local-cluster"),
    reason="already running under local-cluster",
)
def test_kafka_ingest_equals_model_on_a_local_cluster(tmp_path: Path) -> None:
    env = {**os.environ, "MILLSTREAM_TEST_SPARK_MASTER": MASTER}
    env.pop("PYTEST_ADDOPTS", None)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(ENGINE_TEST.relative_to(REPO)),
            "-k",
            "upsert",
            "-p",
            "no:cacheprovider",
            "-q",
            "--basetemp",
            str(tmp_path / "basetemp"),
            "--junitxml",
            str(tmp_path / "report.xml"),
            "-o",
            "junit_family=xunit1",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-8000:]
    assert "1 passed" in result.stdout, output[-8000:]
    props = {
        p.get("name"): p.get("value") for p in ET.parse(tmp_path / "report.xml").iter("property")
    }
    assert props["spark_master"] == MASTER
    assert int(props["block_managers"]) == 3  # the driver and two executors
