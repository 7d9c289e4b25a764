"""What a running datastream's idleness costs, and how soon records that reach it are committed.

Run from the repository root (not part of CI; about a minute per tree)::

    .venv/bin/python bench/idle_tick.py [--interval 500ms] [--idle-seconds 30] [--wakes 8]

One Spark session (``spark_session``), one ``DatastreamRunner`` on a files source with no
records, its streaming query running (``run(available_now=False)``) at ``trigger_interval``
``--interval``. After 10 s of warm-up:

* **idle**: CPU seconds of this process and all its descendants (the JVM, the query's Python
  source process, Spark's Python workers; /proc, ``ingest_observe.process_cpu``) over
  ``--idle-seconds`` with no records: what the query's empty triggers (ticks) cost, per second;
* **wake**: ``--wakes`` times, after a random pause (1 to 3 intervals), one file of 10 JSON
  lines is renamed into place and the clock runs until the datastream's shard upper covers it
  (polled every 10 ms): a record's time from reaching an idle datastream to being committed,
  which is the wait for the query's next trigger plus the batch; the two apart from the
  query's progress (its batch's trigger start after the file appeared, and its
  ``triggerExecution``).

Run it in two trees (``PYTHONPATH=<tree>/src``, from each tree) for an A/B; the tree and the
load average are printed beside the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common  # noqa: F401  (puts the test harness on sys.path)
from ingest_observe import cpu_delta, process_cpu, progress, progress_seconds


def _batch_after(query: Any, wall: float) -> tuple[float, float, dict[str, Any]] | None:
    """The first batch with records whose trigger started after ``wall`` (Spark's progress,
    millisecond timestamps; a tenth of a second of slack for the clocks): when it triggered,
    in seconds after ``wall``, its ``triggerExecution`` in seconds and all its durations."""
    for b in progress(query):
        start = progress_seconds(b["timestamp"])
        if start >= wall - 0.1 and b["input_rows"] > 0:
            d = b["duration_ms"]
            return start - wall, d.get("triggerExecution", 0) / 1000, dict(d)
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--interval", default="500ms", help="the datastream's trigger_interval")
    ap.add_argument("--idle-seconds", type=float, default=30.0)
    ap.add_argument("--wakes", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)

    import millstream
    from harness.ingest_support import writer_in_background
    from millstream.catalog import Catalog
    from millstream.datastream import DatastreamSpec
    from millstream.spark.runner import DatastreamRunner
    from millstream.spark.session import spark_session

    rng = random.Random(args.seed)
    print(f"tree {Path(millstream.__file__).parent.parent}; load {os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="millstream-bench-idle-") as tmp:
        base = Path(tmp)
        source = base / "source"
        (source / "0").mkdir(parents=True)
        spec = DatastreamSpec.parse(
            {
                "name": "idle",
                "source": {"kind": "files", "path": str(source)},
                "schema": {"id": "long"},
                "table": {"mode": "append"},
                "trigger_interval": args.interval,
            }
        )
        interval = spec.trigger_seconds
        spark = spark_session(app_name="millstream-bench-idle")
        catalog = Catalog.open(home=base / "home")
        runner = DatastreamRunner(spec, catalog, spark, writer_id="bench")

        def upper() -> int:
            try:
                return max((s.upper for s in catalog.store.list_shards("idle")), default=0)
            except Exception:  # no table yet
                return 0

        out: dict[str, Any] = {"interval_s": interval, "load_start": os.getloadavg()}
        try:
            with writer_in_background(runner, "idle-query") as errors:
                while runner.query is None or runner.query.lastProgress is None:
                    if errors:
                        raise errors[0]
                    time.sleep(0.1)
                time.sleep(10)  # warm: the source process and several empty triggers
                cpu0, t0 = process_cpu(), time.perf_counter()
                time.sleep(args.idle_seconds)
                used = cpu_delta(cpu0, process_cpu())
                wall = time.perf_counter() - t0
                out["idle_cpu_per_s"] = round(sum(used.values()) / wall, 4)
                out["idle_cpu_by_kind_per_s"] = {k: round(v / wall, 4) for k, v in used.items()}
                waits: list[float] = []
                triggers: list[float] = []  # from the records' appearance to their batch's trigger
                batches: list[float] = []  # that batch's triggerExecution
                durations: list[dict[str, Any]] = []  # and its durationMs
                lines = 0
                for i in range(args.wakes):
                    time.sleep(rng.uniform(0, 2 * interval) + interval)  # idle again after a batch
                    tmp_file = source / "0" / f".{i:05d}.jsonl"
                    tmp_file.write_text("".join(f'{{"id": {lines + j}}}\n' for j in range(10)))
                    lines += 10
                    began, wall = time.perf_counter(), time.time()
                    tmp_file.rename(source / "0" / f"{i:05d}.jsonl")
                    while upper() < lines:
                        if errors:
                            raise errors[0]
                        if time.perf_counter() - began > 120:
                            raise TimeoutError("records not committed within 120 s")
                        time.sleep(0.01)
                    waits.append(time.perf_counter() - began)
                    batch = None
                    for _ in range(100):  # Spark reports a batch's progress after its commit
                        batch = _batch_after(runner.query, wall)
                        if batch is not None:
                            break
                        time.sleep(0.05)
                    if batch is not None:
                        triggers.append(batch[0])
                        batches.append(batch[1])
                        durations.append(batch[2])
                out["wake_s"] = [round(w, 3) for w in waits]
                out["wake_median_s"] = round(statistics.median(waits), 3)
                out["wake_max_s"] = round(max(waits), 3)
                out["trigger_after_s"] = [round(t, 3) for t in triggers]
                out["batch_s"] = [round(b, 3) for b in batches]
                if triggers:
                    out["trigger_after_median_s"] = round(statistics.median(triggers), 3)
                    out["batch_median_s"] = round(statistics.median(batches), 3)
                    out["batch_median_ms"] = {
                        k: statistics.median(d.get(k, 0) for d in durations)
                        for k in sorted({k for d in durations for k in d})
                    }
                out["load_end"] = os.getloadavg()
        finally:
            catalog.close()
            spark.stop()
    print(json.dumps(out), flush=True)
    print(
        f"interval {interval} s: idle {out['idle_cpu_per_s']:.3f} CPU-s a second; records "
        f"reaching the idle datastream committed after median {out['wake_median_s']:.2f} s, "
        f"max {out['wake_max_s']:.2f} s; their batch triggered after median "
        f"{out.get('trigger_after_median_s', float('nan')):.3f} s and took median "
        f"{out.get('batch_median_s', float('nan')):.3f} s (load {out['load_start']} -> "
        f"{out['load_end']})",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
