"""``millstream chaos``: what a user sees from a short commit-path campaign on SQLite, and that
the same seed draws the same schedules and faults."""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from millstream.cli.app import app
from millstream.testing.chaos.commitpath import Plan


def test_chaos_prints_the_seed_each_schedule_each_fault_and_the_summary_line(
    tmp_path: Path,
) -> None:
    args = ["chaos", "--layer", "commit", "--backend", "sqlite", "--seed", "7"]
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
