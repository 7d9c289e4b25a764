"""The rows/s of ``millstream run``'s and the demo's progress: rows committed per second over a
recent window, from the writer's commit log (not Spark's count of a batch's input, which for a
writer that reads its own ranges is a few range markers)."""

from __future__ import annotations

import json
from pathlib import Path

from millstream.catalog import Catalog
from millstream.cli.progress import ProgressView
from millstream.datastream import DatastreamSpec
from millstream.spark.runner import DatastreamRunner

SPEC = {
    "name": "gen",
    "source": {"kind": "generator", "partitions": 2},
    "schema": {"order_id": "long", "status": "string"},
}


def test_progress_rows_per_second_is_committed_rows_over_the_last_ten_seconds(
    tmp_path: Path,
) -> None:
    with Catalog.open(home=tmp_path) as cat:
        runner = DatastreamRunner(DatastreamSpec.parse(SPEC), cat, None, writer_id="w")
        runner.ensure_tables()
        view = ProgressView(runner)
        now = view.started + 60.0
        runner.stats_file.parent.mkdir(parents=True, exist_ok=True)
        commits = [(now - 30, 50_000), (now - 8, 9_000), (now - 4, 10_000), (now - 1, 0)]
        runner.stats_file.write_text(
            "".join(json.dumps({"at": at, "rows": rows}) + "\n" for at, rows in commits)
        )
        s = view.snapshot(now)
        assert s["rows_committed"] == 69_000
        assert s["rows_per_second"] == 1_900.0  # 19,000 rows in the last 10 s
        assert "1900 rows/s" in str(view.render(now).title)

        # A view started 2 s ago counts those 2 s only.
        fresh = ProgressView(runner)
        assert fresh.snapshot(fresh.started + 2.0)["rows_per_second"] == 0.0
        with runner.stats_file.open("a") as f:
            f.write(json.dumps({"at": fresh.started + 1.0, "rows": 3_000}) + "\n")
        assert fresh.snapshot(fresh.started + 2.0)["rows_per_second"] == 1_500.0
