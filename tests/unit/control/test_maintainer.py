"""A worker's automatic maintenance: each table is maintained once per jittered interval, a
failing table backs off on its own (counted, visible, never raised), and what it removed adds
up in the status the worker reports (and the metrics read)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pyarrow as pa

from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.sealing.maintenance import Maintainer
from millstream.sealing.sealer import Sealer
from millstream.table.writer import commit_staged, stage_rows

T0 = 1_800_000_000.0
SPEC = {
    "name": "t",
    "schema": {"id": "long"},
    "retention": {"time": "1h", "min_versions": 1},
}


def _commit(cat: Catalog, lo: int, hi: int) -> None:
    spec = cat.table("t").spec
    rows = pa.table(
        {
            "id": pa.array(range(lo, hi), pa.int64()),
            "_ms_partition": pa.array([0] * (hi - lo), pa.int32()),
            "_ms_offset": pa.array(range(lo, hi), pa.int64()),
            "_ms_tombstone": pa.array([False] * (hi - lo)),
        }
    )
    staged = stage_rows(cat.deep, spec, rows)
    commit_staged(cat.store, cat.deep, "t", staged, {0: (lo, hi)}, {})


def test_each_table_is_maintained_once_per_jittered_interval_and_the_totals_add_up(
    tmp_path: Path,
) -> None:
    clock = ManualClock(T0)
    with Catalog.open(home=tmp_path) as cat:
        cat.store.clock = clock
        cat.create_table(SPEC)
        for i in range(3):
            clock.advance(60)
            _commit(cat, i * 10, i * 10 + 10)
        Sealer(cat, "t", clock=clock).seal_partition(0, force=True)  # removes 3 entries
        consuming = 3
        # GC judges file ages by the deep store's clock: everything is old for a clock this late.
        late = ManualClock(4_000_000_000.0)
        maintainer = Maintainer(
            cat, interval=600, grace_seconds=0, clock=late, rng=random.Random(1)
        )

        maintainer.run_due({"ds": ["t"]})  # first sight: scheduled, not run
        assert maintainer.status() == {}
        late.advance(479)  # before 0.8 x interval nothing is due
        maintainer.run_due({"ds": ["t"]})
        assert maintainer.status() == {}
        late.advance(241)  # past 1.2 x interval it is
        maintainer.run_due({"ds": ["t"]})
        status = maintainer.status()["t"]
        assert status["runs"] == 1
        assert status["versions_expired"] == 4  # versions 0..3; 4 (the seal) is current
        assert status["files_removed"] == consuming and status["bytes_removed"] > 0

        maintainer.run_due({"ds": ["t"]})  # just ran: not again
        assert maintainer.status()["t"]["runs"] == 1
        (loop,) = maintainer.loop_statuses(alive=True)
        assert loop.loop == "maintainer" and loop.errors == 0


def test_a_failing_table_backs_off_without_raising_and_is_counted(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    with Catalog.open(home=tmp_path) as cat:
        maintainer = Maintainer(cat, interval=600, clock=clock, rng=random.Random(2))
        maintainer.run_due({"ds": ["missing"]})
        clock.advance(1000)
        maintainer.run_due({"ds": ["missing"]})  # TableNotFoundError: recorded, not raised
        (loop,) = maintainer.loop_statuses(alive=True)
        assert loop.errors == 1 and loop.table == "missing"
        assert "does not exist" in (loop.last_error or "")
        maintainer.run_due({"ds": ["missing"]})  # backing off: no second attempt yet
        (loop,) = maintainer.loop_statuses(alive=True)
        assert loop.errors == 1


_LOADS = """
import sys
from pathlib import Path

from millstream.catalog import Catalog
from millstream.control.controller import ControlSettings
from millstream.control.worker import Worker

root = Path(sys.argv[1])
with Catalog.open(home=root / "home") as cat:
    seen = []
    for publish in (None, 15.0):  # publishing off, then on (the default)
        worker = Worker(
            cat,
            spark=None,
            worker_id=f"w{publish}",
            settings=ControlSettings(iceberg_publish_interval=publish),
            state_root=root / f"state{publish}",
        )
        seen.append("millstream.table.iceberg" in sys.modules)
        worker.maintainer.run_due({"ds": ["t"]})  # as its sealing thread does
        seen.append("millstream.table.iceberg" in sys.modules)
        assert not worker.maintainer.tables  # no pass yet: its first is an interval away
print(*seen)
"""


def test_a_worker_whose_tables_have_views_loads_their_collection_when_they_show_up(
    tmp_path: Path,
) -> None:
    """The view collection's modules (pyiceberg: ~10-15 MB of RSS) load when a datastream with
    views first shows up, not at its first maintenance pass 600 s later (a step in a
    long-running worker's RSS); a worker without views does not load them."""
    out = subprocess.run(
        [sys.executable, "-c", _LOADS, str(tmp_path)],
        env=os.environ,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    assert out.stdout.split() == ["False", "False", "False", "True"]
