"""Ctrl-C of ``millstream run``, as a terminal sends it (SIGINT to the whole process group:
the CLI, its JVM and Spark's Python workers): the writer stops at a batch boundary, nothing
prints a traceback or a Java stack, one summary line says what was committed, and the exit
code is 0."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from millstream.catalog import Catalog

SPEC = {
    "name": "stopme",
    "source": {"kind": "generator", "partitions": 2, "rate": 500, "key_cardinality": 500},
    "schema": {"order_id": "long", "status": "string"},
    "trigger_interval": "500ms",
}


def _millstream(*args: str) -> list[str]:
    return [sys.executable, "-c", "from millstream.cli.app import main; main()", *args]


def test_ctrl_c_of_run_stops_cleanly_with_a_summary(tmp_path: Path) -> None:
    spec = tmp_path / "stopme.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    home = tmp_path / "home"
    proc = subprocess.Popen(
        _millstream("run", "-f", str(spec), "--home", str(home)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None:
            logs = list(home.glob("writers/stopme/*/commits.jsonl"))
            if logs and logs[0].read_text().count("\n") >= 1:
                break
            time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    said = out + err
    assert proc.returncode == 0, said
    for noise in ("Traceback", "py4j", "\tat org.apache", "ERROR", "Exception"):
        assert noise not in said, said
    summary = re.search(
        r"stopped: (\d+) rows committed to stopme in (\d+) batches; \d+ rows in "
        r"stopme__dead_letter; last offsets \{(.*)\}",
        " ".join(out.split()),
    )
    assert summary is not None, out
    with Catalog.open(home=home) as cat:
        assert int(summary.group(1)) == cat.read_table("stopme").num_rows > 0
        uppers = {s.partition: s.upper for s in cat.store.list_shards("stopme")}
    assert summary.group(3) == ", ".join(f"{p}: {u}" for p, u in sorted(uppers.items()) if u)
