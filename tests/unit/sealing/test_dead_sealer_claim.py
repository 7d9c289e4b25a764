"""A sealer killed after claiming a run (SIGKILL: no cleanup runs) leaves the run COMMITTING
with its claim. Another sealer leaves a live claim alone, and takes the run over once the
claim has expired, so the partition seals again (before claims had an owner and an expiry,
nothing ever released such a run)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow as pa

from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.metastore.claims import DEFAULT_CLAIM_TTL
from millstream.metastore.models import SegmentState
from millstream.sealing.sealer import Sealer
from millstream.spec import TableSpec
from millstream.table.writer import commit_staged, stage_rows

SPEC = TableSpec.parse({"name": "t", "schema": {"id": "long"}})

DIE_IN_BUILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from millstream.catalog import Catalog
    from millstream import faults
    from millstream.sealing.sealer import Sealer

    home, marker = sys.argv[1], Path(sys.argv[2])

    def hook(point, partition):
        marker.write_text("claimed")
        time.sleep(3600)  # killed here, holding the claim

    faults.install(faults.call("before_build", hook))
    Sealer(Catalog.open(home=home), "t").seal_partition(0, force=True)
    """
)


def _ingest(cat: Catalog) -> list[int]:
    ids = []
    for lo in range(0, 30, 10):
        rows = pa.table(
            {
                "id": pa.array(range(lo, lo + 10), pa.int64()),
                "_ms_partition": pa.array([0] * 10, pa.int32()),
                "_ms_offset": pa.array(range(lo, lo + 10), pa.int64()),
                "_ms_tombstone": pa.array([False] * 10),
            }
        )
        staged = stage_rows(cat.deep, SPEC, rows)
        commit_staged(cat.store, cat.deep, "t", staged, {0: (lo, lo + 10)}, {0: 0})
        ids += range(lo, lo + 10)
    return ids


def _kill_a_sealer_after_its_claim(home: Path) -> None:
    marker = home / "claimed"
    proc = subprocess.Popen(
        [sys.executable, "-c", DIE_IN_BUILD, str(home), str(marker)], start_new_session=True
    )
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None, "the sealer process exited before claiming"
            assert time.monotonic() < deadline, "the sealer process never claimed the run"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def test_a_run_claimed_by_a_killed_sealer_is_taken_over_once_the_claim_expires(
    tmp_path: Path,
) -> None:
    cat = Catalog.open(home=tmp_path)
    cat.create_table(SPEC)
    ids = _ingest(cat)
    _kill_a_sealer_after_its_claim(tmp_path)
    run = cat.manifest("t").entries
    assert {e.state for e in run} == {SegmentState.COMMITTING}
    assert all(e.claimed_by and e.claim_expires_at for e in run), "a claim names its owner"

    assert Sealer(cat, "t").seal_partition(0, force=True) is None, "a live claim is respected"

    # Claims are judged on the metadata store's clock: move it past the dead sealer's claim.
    cat.store.clock = ManualClock(max(e.claim_expires_at or 0 for e in run) + 1)
    result = Sealer(cat, "t").seal_partition(0, force=True)
    assert result is not None
    assert [(e.seq, e.state) for e in cat.manifest("t").entries] == [(0, SegmentState.ONLINE)]
    assert sorted(cat.read_table("t").column("id").to_pylist()) == ids
    assert DEFAULT_CLAIM_TTL >= 60, "a claim outlives any reasonable seal"
