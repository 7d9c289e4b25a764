"""``make chaos`` (``python -m harness.chaos``): what a user sees from a short commit-path
campaign on SQLite, and that the same seed draws the same schedules and faults."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.chaos.cli import app
from harness.chaos.commitpath import Plan


def test_chaos_prints_the_seed_each_schedule_each_fault_and_the_summary_line(
    tmp_path: Path,
) -> None:
    args = ["--layer", "commit", "--backend", "sqlite", "--seed", "7"]
    args += ["--schedules", "3", "--parallel", "2", "--workdir", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    out = result.output
    assert result.exit_code == 0, out
    assert "chaos: seed 7" in out
    assert "re-run: the same command with --seed 7" in out
    assert len(re.findall(r"^schedule \d+ \(\+[\d.]+s\): ", out, re.M)) == 3
    faults = re.findall(r"^  \+[\d.]+s schedule \d+: [a-z-]+ \S+", out, re.M)
    last = out.strip().splitlines()[-1]
    assert last == f"{len(faults)} faults in 3 schedules, 0 anomalies"
    assert faults, "three schedules drew no fault at all"


def test_a_seed_draws_the_same_schedules_again() -> None:
    assert [Plan.draw(7, i) for i in range(20)] == [Plan.draw(7, i) for i in range(20)]
    assert [Plan.draw(7, i) for i in range(20)] != [Plan.draw(8, i) for i in range(20)]


def test_all_layers_give_a_quarter_of_the_minutes_to_the_commit_path_and_sum_both_logs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--layer all`` runs the commit path (for real, on SQLite) and then the process
    campaign, whose cluster is too slow for a unit test: it is replaced here, and gets the
    other three quarters of the minutes, the backend and the seed; the last line sums both."""
    from harness.chaos import process
    from harness.chaos.log import CampaignLog

    seen: dict[str, object] = {}

    def fake(*, seed: int, log: CampaignLog, **kwargs: object) -> CampaignLog:
        seen.update(kwargs, seed=seed)
        log.schedule(0, "kill_active(active of orders_sb)")
        log.fault(0, "kill", "w1", "SIGKILL of its process group")
        log.anomaly(0, "table", "orders_sb: 1 row missing")
        log.finish()
        return log

    monkeypatch.setattr(process, "run_process_campaign", fake)
    args = ["--seed", "5", "--minutes", "0.2", "--backend", "sqlite"]
    result = CliRunner().invoke(app, [*args, "--parallel", "2", "--workdir", str(tmp_path)])
    out = result.output

    assert result.exit_code == 1, out
    assert seen["seed"] == 5 and seen["metadata"] == "sqlite"
    assert seen["minutes"] == pytest.approx(0.15)
    commit = re.search(r"^commit-path campaign seed 5: (\d+) faults in (\d+) schedules", out, re.M)
    assert commit is not None, out
    faults, schedules = int(commit.group(1)), int(commit.group(2))
    assert schedules >= 1
    lines = out.strip().splitlines()
    assert lines[-2] == f"{faults + 1} faults in {schedules + 1} schedules, 1 anomalies"
    assert lines[-1] == "re-run: make chaos SEED=5 LAYER=all MINUTES=0.2 BACKEND=sqlite"
