"""The worker's Iceberg publisher process dies with its parent: a parent killed with SIGKILL
(no chance to close anything) leaves no publisher process behind."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

PARENT = """
import sys, time
from millstream.catalog import Catalog
from millstream.sealing.publishing import PublisherProcess

cat = Catalog.open(home=sys.argv[1])
cat.create_table({"name": "kv", "schema": {"k": "long"}, "mode": "append"})
publisher = PublisherProcess(cat, owner="a test parent")
publisher.run_due({"kv": ["kv"]})
print(publisher.pid, flush=True)
time.sleep(600)
"""


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (not gone, not a zombie waiting to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_the_publisher_process_exits_when_its_parent_is_killed(tmp_path: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path / "home")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert child != parent.pid and _running(child)
        parent.kill()  # SIGKILL
        parent.wait()
        deadline = time.monotonic() + 120  # a bound on a loaded machine, not a measurement
        while _running(child) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _running(child), f"publisher process {child} outlived its killed parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_the_publisher_process_runs_below_the_writer_in_its_own_session_too(
    tmp_path: Path,
) -> None:
    """The child runs in a session of its own; where the kernel shares the CPU by session
    (autogroup), ``os.nice`` alone would leave a publish half the cores against the writer's
    commits, so the session's priority is lowered as well."""
    from millstream.catalog import Catalog
    from millstream.sealing.publishing import CHILD_NICENESS, PublisherProcess

    cat = Catalog.open(home=tmp_path / "home")
    cat.create_table({"name": "kv", "schema": {"k": "long"}, "mode": "append"})
    publisher = PublisherProcess(cat, owner="a test parent")
    try:
        publisher.run_due({"kv": ["kv"]})
        assert publisher.pid is not None
        stat = Path(f"/proc/{publisher.pid}/stat").read_text().rsplit(")", 1)[1].split()
        mine = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        assert int(stat[16]) == int(mine[16]) + CHILD_NICENESS  # field 19: nice
        group = Path(f"/proc/{publisher.pid}/autogroup")
        if group.exists():  # a kernel with autogroups (this project's CI machine has them)
            assert group.read_text().split()[-1] == str(CHILD_NICENESS), group.read_text()
    finally:
        publisher.close()
