"""Live progress of a running writer: rows/s committed, offset lag per partition, last commit
age."""

from __future__ import annotations

import contextlib
import time
from typing import Any

from rich.table import Table

from millstream.ingest.sources import spec_reader
from millstream.spark.runner import RATE_WINDOW_S, CommitLogTotals, DatastreamRunner


class ProgressView:
    def __init__(self, runner: DatastreamRunner) -> None:
        self.runner = runner
        self.reader = spec_reader(runner.spec.source)
        self.started = time.time()
        self.latest: dict[int, int] = {}
        self._latest_at = 0.0
        #: the writer's commit log, read incrementally
        self.log = CommitLogTotals()

    def snapshot(self, now: float | None = None) -> dict[str, Any]:
        """The writer's figures at ``now`` (default: the time). ``rows_per_second`` is the
        rows committed per second over the last :data:`RATE_WINDOW_S` seconds (since this
        view started, if later), from the writer's commit log."""
        r = self.runner
        now = time.time() if now is None else now
        if time.time() - self._latest_at > 2.0:
            with contextlib.suppress(Exception):  # lag is advisory; never stop ingestion over it
                self.latest = self.reader.latest_offsets()
            self._latest_at = time.time()
        shards = {s.partition: s.upper for s in r.catalog.store.list_shards(r.table_spec.name)}
        log = self.log
        log.update(r.stats_file)  # only the lines added since the last refresh
        last = log.last_at
        # A writer this view saw start has committed only since then; one that committed
        # before the view existed (a view made mid-run) is measured over the whole window.
        first = log.first_at
        since = self.started if first is None or first >= self.started else None
        rate = log.rows_per_second(now, window=RATE_WINDOW_S, since=since)
        parts = sorted(set(shards) | set(self.latest))
        return {
            "datastream": r.spec.name,
            "table": r.table_spec.name,
            "writer": r.writer_id,
            "rows_committed": log.rows,
            "rows_per_second": round(float(rate), 1),
            "batches": log.batches,
            "last_commit_age_s": None if last is None else round(now - last, 1),
            "lost_races": log.lost_races,
            "sealing": r.sealing_status(),
            "partitions": {
                p: {
                    "upper": shards.get(p),
                    "latest": self.latest.get(p),
                    "lag": None
                    if p not in self.latest
                    else max(0, self.latest[p] - shards.get(p, 0)),
                }
                for p in parts
            },
        }

    def render(self, now: float | None = None) -> Table:
        s = self.snapshot(now)
        age = s["last_commit_age_s"]
        t = Table(
            title=(
                f"{s['datastream']} -> {s['table']}  |  {s['rows_per_second']:.0f} rows/s  |  "
                f"{s['rows_committed']} rows in {s['batches']} batches  |  last commit "
                f"{'never' if age is None else f'{age:.1f}s ago'}"
            )
        )
        for c in ("partition", "shard upper", "source latest", "offset lag"):
            t.add_column(c, justify="right")
        for p, v in s["partitions"].items():
            t.add_row(str(p), str(v["upper"]), str(v["latest"]), str(v["lag"]))
        t.caption = self.runner.sealing_summary(time.time() if now is None else now)
        return t
