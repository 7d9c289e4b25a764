"""The commit-path campaign in CI: 200 schedules against real PostgreSQL (see
:mod:`harness.chaos.commitpath` for the actors, the faults and the checks).

Seeded: the seed is printed first and in the failure message; re-run a failure with
``MILLSTREAM_FAULT_SEED=<seed>`` (the same schedules and faults, drawn again) or run a longer
campaign with ``make chaos LAYER=commit SEED=<seed> MINUTES=30``.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest

from harness.chaos.commitpath import run_commit_campaign
from harness.chaos.log import CampaignLog
from harness.servers import PostgresServer
from millstream.config import Settings

pytestmark = pytest.mark.postgres

SEED = int(os.environ.get("MILLSTREAM_FAULT_SEED") or secrets.randbits(32))
#: 200 schedules, as the fault-campaign issue asks of every CI run (45 took 41 s of a quiet CI
#: run; 200 about three minutes). The
#: three guards only this campaign catches (tests/mutations.py, "campaign-*") each broke a
#: schedule within the first 45 of every seed tried: the frontier and lifecycle mutants within 5, the rarest (a sealer
#: sealing past an older segment's claim, which needs two sealers, as most schedules now have)
#: at schedules 5-43 of six seeds. Longer campaigns (``make chaos``):
#: ``MILLSTREAM_COMMIT_SCHEDULES=N`` or ``make chaos LAYER=commit MINUTES=M``.
SCHEDULES = int(os.environ.get("MILLSTREAM_COMMIT_SCHEDULES") or 200)


def test_commit_path_campaign_on_postgres_finds_no_anomaly(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    url = postgres_server.create_database("commit_campaign")
    settings = Settings.load(home=tmp_path / "home", metadata_url=url)
    log = run_commit_campaign(
        settings,
        seed=SEED,
        schedules=SCHEDULES,
        parallel=4,
        stop_after=3,  # a failure is reported sooner; its first anomalies say enough
        log=CampaignLog("commit-path", SEED),  # printed; pytest shows it on failure
    )
    assert not log.anomalies, (
        f"commit-path campaign seed {SEED}: {log.summary()} "
        f"(rerun with MILLSTREAM_FAULT_SEED={SEED}):\n"
        + "\n".join(f"schedule {a.schedule} {a.check}: {a.detail}" for a in log.anomalies[:5])
    )
    kinds = {f.kind for f in log.faults}
    assert log.schedules == SCHEDULES
    # The campaign exercised what it claims to (a seed drawing none of these would prove less).
    assert {"crash", "freeze", "commit-failure", "seal-failure", "rollback", "reingest"} <= kinds
