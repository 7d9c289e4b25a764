"""``millstream run --available-now`` ends its Spark JVM once its last batch has committed,
before the final seal pass: the seal and the merged copy need no Spark, and beside an idle
JVM (~0.35 GB) they made the run's peak memory (docs/performance.md, "Peak RSS under 1 GB"). It
starts no Iceberg publisher process: it publishes once, after the seal, in its own process.

The run is the real CLI in a session of its own; a fault point (``MILLSTREAM_FAULTS``) holds
its final seal at the start of partition 0's build, and the test looks at what is left of
its process group there: the driver, and no JVM. Everything it read is committed by then, and
the JVM, the first to run with its class archive, has written it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.ingest_support import kill_group, start_cli, wait_for_marker, write_spec
from millstream.catalog import Catalog

pytestmark = [pytest.mark.spark]


def _group(pgid: int) -> dict[int, str]:
    """pid -> command line of every live process of process group ``pgid``."""
    found: dict[int, str] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except (OSError, IndexError):
            continue
        if int(stat[2]) == pgid and stat[0] != "Z" and cmdline:
            found[int(d.name)] = cmdline
    return found


def _children(parent: int, marker: str) -> dict[int, str]:
    """pid -> command line of the live children of ``parent`` whose command line holds
    ``marker``."""
    found: dict[int, str] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except (OSError, IndexError):
            continue
        if int(stat[1]) == parent and stat[0] != "Z" and marker in cmdline:
            found[int(d.name)] = cmdline
    return found


def test_an_available_now_run_ends_its_jvm_before_the_final_seal(tmp_path: Path) -> None:
    source, home, faults = tmp_path / "source", tmp_path / "home", tmp_path / "faults"
    archive = tmp_path / "cache" / "jvm.jsa"
    (source / "0").mkdir(parents=True)
    rows = [{"id": i % 50, "status": f"s{i}"} for i in range(200)]
    (source / "0" / "00000.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = write_spec(
        tmp_path / "shop.yaml",
        {
            "name": "shop",
            "source": {"kind": "files", "path": str(source)},
            "schema": {"id": "long", "status": "string"},
            "table": {"mode": "upsert", "primary_key": ["id"]},
        },
    )
    proc = start_cli(
        spec,
        home,
        "w",
        tmp_path / "logs",
        MILLSTREAM_FAULTS="before_build@0=hang",
        MILLSTREAM_FAULT_DIR=str(faults),
        MILLSTREAM_JVM_CLASS_ARCHIVE=str(archive),
    )
    try:
        wait_for_marker(proc, faults / "before_build-0")
        left = _group(proc.pid)
        assert proc.pid in left, left
        jvms = {pid: cmd for pid, cmd in left.items() if cmd.split(" ")[0].endswith("java")}
        assert jvms == {}, f"the Spark JVM still runs beside the final seal: {jvms}"
        # The run's JVM, the first with this class archive, wrote it as it exited, and the
        # run put it in place for the next runs' JVMs to start from (session.ClassArchive).
        assert archive.stat().st_size > 1_000_000, sorted(archive.parent.iterdir())
        assert list(archive.parent.glob("*.tmp")) == []
        # Nor does an Iceberg publisher process (a session of its own) run: the run publishes
        # once, after the seal, in its own process.
        publishers = _children(proc.pid, "millstream.sealing.publishing")
        assert publishers == {}, f"a publisher process runs before the final seal: {publishers}"
        with Catalog.open(home=home) as cat:  # all it read is committed, not yet sealed
            assert cat.manifest("shop").row_count == 200
            assert cat.read_table("shop").num_rows == 50
    finally:
        kill_group(proc)
