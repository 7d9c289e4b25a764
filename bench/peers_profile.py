"""Where a running Millstream datastream's time goes per micro-batch, at K pre-loaded keys:
bench/peers.py's streaming workload, with the datastream run in this process as ``millstream
run`` runs it (``DatastreamRunner`` on the kafka source, defaults, background sealing on), so
Spark's progress of every batch is at hand.

Per batch, from Spark's ``durationMs`` and the writer's commit log:

- plan: ``latestOffset`` (the source asks the broker for the partitions' ends) and
  ``queryPlanning``;
- tasks: ``addBatch`` less the commit: the write tasks read their ranges from the broker,
  decode and stage the Parquet files;
- commit: the metadata transaction (``commit_s`` in the commit log);
- Spark's own bookkeeping: ``walCommit`` and ``commitOffsets`` (the checkpoint's files);
- the gap: from the end of one batch to the start of the next (the trigger, and whatever held
  the driver).

And beside the batches, what the background sealer and compactor did in the same window (from
their log lines: how many passes, their seconds), and one read of the table at the end.

    .venv/bin/python bench/peers_profile.py --keys 2000000 --rate 20000 --seconds 60
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import statistics
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import peers
from common import load_text, log, percentile, workdir, write_json
from ingest_observe import progress

STEPS = (
    "latestOffset",
    "queryPlanning",
    "addBatch",
    "walCommit",
    "commitOffsets",
    "triggerExecution",
)


class Captured(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[tuple[float, str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.created, record.name, record.getMessage()))


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--keys", type=int, default=2_000_000)
    ap.add_argument("--rate", type=int, default=20_000)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--settle", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    from millstream.catalog import Catalog
    from millstream.datastream import DatastreamSpec
    from millstream.ingest.sources.kafka import CONSUMERS
    from millstream.local.tansu import TansuBroker
    from millstream.spark.runner import DatastreamRunner
    from millstream.spark.session import spark_session

    captured = Captured()
    logging.getLogger("millstream").addHandler(captured)
    logging.getLogger("millstream").setLevel(logging.INFO)
    with workdir("peers-profile-") as base:
        broker = TansuBroker(base / "broker")
        broker.start()
        spark = None
        try:
            broker.create_topic(peers.TOPIC, peers.PARTITIONS)
            t0 = time.perf_counter()
            per = peers.produce_preload(broker.bootstrap, args.keys)
            log(f"pre-load produced in {time.perf_counter() - t0:.0f} s (load {load_text()})")
            spec_path = peers.millstream_spec(
                base, {"kind": "kafka", "bootstrap_servers": broker.bootstrap, "topic": peers.TOPIC}
            )
            spec = DatastreamSpec.from_file(spec_path)
            catalog = Catalog.open(home=base / "home")
            spark = spark_session()
            runner = DatastreamRunner(
                spec, catalog, spark, writer_id="profile", background_sealing=True
            )
            errors: list[BaseException] = []

            def run() -> None:
                try:
                    runner.run(available_now=False)
                except BaseException as exc:
                    errors.append(exc)

            thread = threading.Thread(target=run, daemon=True)
            thread.start()

            def caught_up() -> bool:
                if errors:
                    raise errors[0]
                try:
                    shards = {s.partition: s.upper for s in catalog.store.list_shards("peers")}
                except Exception:
                    return False
                return all(shards.get(p, 0) >= per - 1 for p in range(peers.PARTITIONS))

            peers.wait_until(caught_up, 1800, "the pre-load's catch-up")
            log(f"caught up {time.perf_counter() - t0:.0f} s; settling {args.settle:.0f} s")
            time.sleep(args.settle)
            prod: dict[str, Any] = {}
            load0 = load_text()
            sealer = runner.sealer
            seals0 = len(sealer.durations) if sealer is not None else 0
            compactions0 = len(sealer.compactions) if sealer is not None else 0
            w0 = time.time()
            peers.producer_loop(
                broker.bootstrap, args.seed, args.keys, [args.rate], args.seconds, prod
            )
            w1 = time.time()
            time.sleep(5)
            load1 = load_text()
            batches = [
                b
                for b in progress(runner.query)
                if b.get("timestamp")
                and w0
                <= datetime.fromisoformat(b["timestamp"].replace("Z", "+00:00")).timestamp()
                <= w1
            ]
            commits = [
                c for c in runner.commits() if w0 <= c.get("at", 0) <= w1 + 5 and c.get("rows")
            ]
            seals = list(sealer.durations[seals0:]) if sealer is not None else []
            compactions = [c.seconds for c in sealer.compactions[compactions0:]] if sealer else []
            segments = len(catalog.manifest("peers").entries)
            t_read = time.perf_counter()
            rows = catalog.read_table("peers").num_rows
            read_s = time.perf_counter() - t_read
            runner.stop()
            thread.join(60)
        finally:
            CONSUMERS.close()
            if spark is not None:
                spark.stop()
            broker.stop()
    out = summarize(batches, commits, captured.records, w0, w1)
    out.update(
        seals_in_window=[round(x, 2) for x in seals],
        compactions_in_window=[round(x, 2) for x in compactions],
        manifest_entries=segments,
        all_steps_median_s={
            k: round(statistics.median(b["duration_ms"].get(k, 0) / 1000 for b in batches), 3)
            for k in sorted({k for b in batches for k in b["duration_ms"]})
        }
        if batches
        else {},
    )
    out.update(
        keys=args.keys,
        rate=args.rate,
        seconds=args.seconds,
        load_start=load0,
        load_end=load1,
        read_s=read_s,
        table_rows=rows,
        sent=prod.get("sent"),
    )
    print_summary(out)
    if args.json:
        write_json(args.json, out)
    write_json(peers.RESULTS / f"peers-profile-{time.strftime('%H%M%S')}.json", out)


def summarize(
    batches: list[dict[str, Any]],
    commits: list[dict[str, Any]],
    logs: list[tuple[float, str, str]],
    w0: float,
    w1: float,
) -> dict[str, Any]:
    def med(xs: list[float]) -> float:
        return statistics.median(xs) if xs else float("nan")

    steps = {k: [b["duration_ms"].get(k, 0) / 1000 for b in batches] for k in STEPS}
    commit_s = [c["commit_s"] for c in commits if c.get("commit_s") is not None]
    starts = [
        datetime.fromisoformat(b["timestamp"].replace("Z", "+00:00")).timestamp() for b in batches
    ]
    gaps = [
        s2 - (s1 + d)
        for s1, s2, d in zip(starts, starts[1:], steps["triggerExecution"], strict=False)
    ]
    took = re.compile(r"in ([0-9.]+)s")
    sealing = [
        (t, msg)
        for t, name, msg in logs
        if w0 <= t <= w1 and ("seal" in name or "sealing" in name) and took.search(msg)
    ]
    seal_s = [float(took.search(m).group(1)) for _, m in sealing]  # type: ignore[union-attr]
    window = w1 - w0
    return {
        "batches": len(batches),
        "rows_per_batch_median": med([c["rows"] for c in commits]),
        "median_s": {k: round(med(v), 3) for k, v in steps.items()},
        "p90_s": {k: round(percentile(v, 90), 3) for k, v in steps.items()},
        "commit_s_median": round(med(commit_s), 3),
        "commit_s_p90": round(percentile(commit_s, 90), 3),
        "tasks_s_median": round(med(steps["addBatch"]) - med(commit_s), 3),
        "gap_s_median": round(med(gaps), 3),
        "busy_fraction": round(sum(steps["triggerExecution"]) / window, 3) if window else None,
        "seal_passes": len(sealing),
        "seal_s_total": round(sum(seal_s), 2),
        "seal_s_max": round(max(seal_s), 2) if seal_s else 0.0,
        "seal_lines": [m[:200] for _, m in sealing[:20]],
    }


def print_summary(s: dict[str, Any]) -> None:
    log(json.dumps({k: v for k, v in s.items() if k != "seal_lines"}, indent=1))
    for line in s["seal_lines"]:
        log(f"  {line}")


if __name__ == "__main__":
    main()
