"""A finished ``millstream run --available-now`` ends its process at once (``os._exit``)
instead of tearing its interpreter down: before it does, the metadata store's connections are
closed (SQLite moves its write-ahead log into the database file as the last one closes) and
the summary is flushed. What a user sees is what a normal exit gave: the whole summary on a
pipe, and every commit in the database file itself, so a power loss that takes the page
cache's write-ahead log with it loses none of the run's commits.

The run is the real CLI in a process of its own (``main()``, as the ``millstream`` script runs
it), its output on pipes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.cli_run import run_available_now
from millstream.catalog import Catalog
from millstream.metastore.models import SegmentState
from millstream.reference.model import canonical

pytestmark = [pytest.mark.spark]


def _run(spec: Path, home: Path) -> subprocess.CompletedProcess[str]:
    # stdout on a pipe is block-buffered, as under `millstream run ... | jq`
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    return run_available_now(spec, home, env=env)


def test_a_finished_run_leaves_its_whole_summary_and_its_commits_in_the_database_file(
    tmp_path: Path,
) -> None:
    source, home = tmp_path / "source", tmp_path / "home"
    for p in (0, 1):
        (source / str(p)).mkdir(parents=True)
    rows: list[dict[str, Any]] = [{"id": i, "status": "new"} for i in range(60)]
    rows += [{"id": i, "status": "paid"} for i in range(0, 60, 4)]  # upserts
    (source / "0" / "00000.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:40]))
    (source / "1" / "00000.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[40:]))
    spec = tmp_path / "shop.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "shop",
                "source": {"kind": "files", "path": str(source)},
                "schema": {"id": "long", "status": "string"},
                "table": {"mode": "upsert", "primary_key": ["id"]},
            }
        )
    )

    proc = _run(spec, home)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    # The whole summary reached the pipe (flushed before the process ended).
    summary = json.loads(proc.stdout)
    assert summary["rows_committed"] == len(rows)
    assert summary["seal_before_exit"]["failed"] == {}
    assert summary["iceberg"]["shop"]["manifest_version"] >= 1

    # The page cache's write-ahead log lost (a power loss right after the run): the database
    # file alone holds every commit, the seals and the publish's pointer.
    lost = tmp_path / "after-a-power-loss"
    shutil.copytree(home, lost, ignore=shutil.ignore_patterns("metadata.db-*"))
    expected = {r["id"]: r["status"] for r in rows}
    with Catalog.open(home=lost) as cat:
        table = cat.read_table("shop").select(["id", "status"]).to_pylist()
        assert canonical(table) == canonical({"id": k, "status": v} for k, v in expected.items())
        assert {e.state for e in cat.manifest("shop").entries} == {SegmentState.ONLINE}
        pointer = cat.store.read_pointer("shop")
        assert pointer is not None
        assert pointer.manifest_version == summary["iceberg"]["shop"]["manifest_version"]
