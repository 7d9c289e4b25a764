"""The commit-path campaign exercises every fault kind it claims, however slow the machine:
its operator rolls back and re-ingests in schedule 0 of every seed, and waits for a segment to
act on rather than skipping its steps while the table is still empty (seed 1626539355 drew no
rollback in 60 schedules on a loaded CI machine)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from harness.chaos.commitpath import run_commit_campaign
from harness.chaos.log import CampaignLog
from millstream.config import Settings
from millstream.spark.sink import SegmentSink

SEED = 1626539355


def test_schedule_0_rolls_back_and_reingests_even_when_the_first_commit_comes_late(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A loaded machine, compressed: no commit lands in the first 1.5 s (longer than an
    # operator's steps take when it skips them on an empty table).
    opened = time.monotonic() + 1.5
    commit = SegmentSink.commit

    def late_commit(self: SegmentSink, *args: Any, **kwargs: Any) -> Any:
        time.sleep(max(0.0, opened - time.monotonic()))
        return commit(self, *args, **kwargs)

    monkeypatch.setattr(SegmentSink, "commit", late_commit)
    url = f"sqlite:///{tmp_path / 'metadata.db'}"
    settings = Settings.load(home=tmp_path / "home", metadata_url=url)
    lines: list[str] = []
    log = run_commit_campaign(
        settings,
        seed=SEED,
        schedules=1,
        parallel=1,
        log=CampaignLog("commit-path", SEED, out=lines.append),
    )

    assert not log.anomalies, "\n".join(lines)
    kinds = {f.kind for f in log.faults if f.target == "operator"}
    assert kinds == {"rollback", "reingest"}, "\n".join(lines)
