"""The ingest benchmark's printed report: the measures, the ratios against their targets, and
(a)'s breakdown from its profile runs."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from common import verdict
from ingest_input import PARTITIONS

# issue 15 (default settings): catch-up >= 0.5x the single-process ceiling and >= 2x the
# pandas loop; p99 freshness <= 1.0 s at 20k rows/s. (a)/(d) >= 10 is the earlier target.
TARGET_RATIO_CEILING = 0.5
TARGET_RATIO_PANDAS = 2.0
TARGET_RATIO_TWS = 10.0
TARGET_P99_S = 1.0


def stage_sums(progress: list[dict[str, Any]]) -> dict[str, float]:
    """Spark's ``durationMs`` parts summed over micro-batches, in seconds."""
    keys = (
        "triggerExecution",
        "latestOffset",
        "getBatch",
        "queryPlanning",
        "walCommit",
        "addBatch",
        "commitOffsets",
    )
    return {k: sum(p["duration_ms"].get(k, 0) for p in progress) / 1000 for k in keys}


def report(res: dict[str, Any], log: Callable[[str], None]) -> None:
    a, a2, b, c, d, e = (res.get(k) for k in ("a", "a2", "b", "c", "d", "e"))
    m = res["machine"]
    log("")
    log(
        f"machine: {m['cores']} cores, {m['platform']}, python {m['python']}, pyspark "
        f"{m['pyspark']}, pyarrow {m['pyarrow']}, pandas {m['pandas']}"
    )
    log(
        f"load average (1/5/15 min): start {m['load_start']} (after waiting "
        f"{m['load_wait_s']:.0f}s), end {m['load_end']}"
    )
    log(
        f"input: {res['input']['rows']:,} rows, {PARTITIONS} partitions, "
        f"{res['input']['key_cardinality']:,} keys, {res['input']['files']} files, "
        f"{res['input']['mb']:.0f} MB of JSON lines"
    )
    log("")
    log(f"{'measure':58} {'rows/s':>12} {'seconds':>9}  notes")
    if a:
        v = a["verify"]
        log(
            f"{'(a) Millstream catch-up (DatastreamRunner, available_now)':58} "
            f"{a['rows_s']:>12,.0f} {a['seconds']:>9.2f}  {sum(a['cpu_s'].values()):.1f} CPU-s, "
            f"batch {a['batch'] or 'adaptive'}, "
            f"{len(a['commits'])} batches, table {v['table_rows']:,} rows = oracle "
            f"{v['oracle_rows']:,}: {v['matches_oracle']}, = pandas: {v['matches_pandas']}"
        )
    if a2:
        log(
            f"{'(a2) catch-up of a running datastream, one backlog':58} "
            f"{a2['rows_s']:>12,.0f} {a2['seconds']:>9.2f}  {sum(a2['cpu_s'].values()):.1f} "
            f"CPU-s, committed batches {a2['batches']}, table {a2['table_rows']:,} rows = oracle"
            f"; peak RSS of a task's Python worker {a2['peak_task_worker_rss_mb'] or 0:.0f} MiB"
        )
    if b:
        log(
            f"{'(b) ceiling: pyarrow.json + parquet, 1 process':58} "
            f"{b['rows_s']:>12,.0f} {b['seconds']:>9.2f}  {b['cpu_s']:.1f} CPU-s"
        )
    if c:
        log(
            f"{'(c) pandas chunked upsert loop, 1 process':58} "
            f"{c['rows_s']:>12,.0f} {c['seconds']:>9.2f}  {c['cpu_s']:.1f} CPU-s, result "
            f"{c['table_rows']:,} rows"
        )
    if d:
        log(
            f"{'(d) Spark transformWithStateInPandas (SUBSET)':58} "
            f"{d['rows_s']:>12,.0f} {d['wall_seconds']:>9.2f}  {d['rows']:,} of the first "
            f"{d['subset_rows']:,} rows{' (TIMED OUT)' if d['timed_out'] else ''}; "
            f"{d['rows_s_in_batches']:,.0f} rows/s inside batches"
        )
    if e:
        log(
            f"{'(e) freshness, produce-ack -> visible (kafka, 500 ms)':58} "
            f"{'':>12} {e['seconds']:>9.1f}  p50 {e['p50_s']:.3f} s, p99 {e['p99_s']:.3f} s, "
            f"max {e['max_s']:.3f} s; produced {e['achieved_rate']:,.0f} rows/s "
            f"(target {e['target_rate']:,.0f}); {e['samples']} samples, "
            f"{e['unresolved']} unresolved"
        )
    log("")
    log(f"{'ratio / target':58} {'value':>12} {'target':>9}  verdict")
    for name, x in (("(a)", a), ("(a2)", a2)):
        if x and b:
            r = x["rows_s"] / b["rows_s"]
            ok = verdict(r >= TARGET_RATIO_CEILING)
            log(f"{name + '/(b)':58} {r:>12.3f} {'>= 0.5':>9}  {ok}")
        if x and c:
            r = x["rows_s"] / c["rows_s"]
            ok = verdict(r >= TARGET_RATIO_PANDAS)
            log(f"{name + '/(c)':58} {r:>12.2f} {'>= 2':>9}  {ok}")
    if a and d and d["rows_s"]:
        r = a["rows_s"] / d["rows_s"]
        log(f"{'(a)/(d)':58} {r:>12.1f} {'>= 10':>9}  {verdict(r >= TARGET_RATIO_TWS)}")
    if e:
        r = e["p99_s"]
        log(f"{'(e) p99 freshness, s':58} {r:>12.3f} {'<= 1.0':>9}  {verdict(r <= TARGET_P99_S)}")
    if a:
        log("")
        # (a)'s batches are Spark jobs (millstream.spark.catch_up), one write job each
        in_jobs = sum(j["wall_s"] for j in a.get("jobs") or [])
        log("(a) breakdown (seconds):")
        log(
            f"    wall of runner.run: {a['seconds']:.2f}; in its write jobs (event log): "
            f"{in_jobs:.2f}; outside them (bootstrap, planning, commits, the final seal "
            f"pass): {a['seconds'] - in_jobs:.2f}"
        )
        total_cpu = sum(a["cpu_s"].values())
        cores = os.cpu_count() or 1
        log(
            f"    CPU seconds during (a): {total_cpu:.1f} of {cores * a['seconds']:.1f} available "
            f"on {cores} cores: " + ", ".join(f"{k} {v:.1f}" for k, v in a["cpu_s"].items())
        )
        for cm in a["commits"]:
            log(
                f"    commits.jsonl batch {cm.get('batch_id')}: rows {cm.get('rows'):,}, "
                f"version {cm.get('version')}, at +{cm['at'] - a['started_at']:.2f}s"
            )
    if a and a.get("jobs"):
        log("    Spark jobs of (a) from the event log (write job of each batch):")
        for j in a["jobs"]:
            ts = j["tasks"]
            log(
                f"      batch {j['batch']} job {j['job']}: wall {j['wall_s']:.2f}s, "
                f"{len(ts)} tasks: "
                + ", ".join(
                    f"{t['seconds']:.2f}s (JVM CPU {t['jvm_cpu_s']:.2f}, GC {t['gc_s']:.2f})"
                    for t in ts
                )
            )
    tm = res.get("timed")
    if tm:
        sm = tm["summary"]
        sums = stage_sums(tm["progress"])
        log(
            f"    instrumented re-run of (a) (timed subclasses of the files source and the sink): "
            f"{tm['rows_s']:,.0f} rows/s, {tm['seconds']:.2f}s wall, table {tm['table_rows']:,}"
            f" rows; summed over {sm['write_tasks']} write tasks (2 run at a time):"
        )
        log(
            f"      Spark task time {sm['spark_task_s']:.2f}s = sink waiting for its range "
            f"markers {sm['sink_input_wait_s']:.2f}s + sink own Python "
            f"{sm['sink_own_s']:.2f}s (read its ranges + decode {sm['sink_read_decode_s']:.2f}s, "
            f"stage Parquet {sm['sink_own_s'] - sm['sink_read_decode_s']:.2f}s) + other "
            f"{sm['task_unaccounted_s']:.2f}s"
        )
        log(
            f"      the source's read() (range markers only) own Python {sm['read_own_s']:.2f}s "
            f"(read task elapsed {sm['read_elapsed_s']:.2f}s)"
        )
        jobs_s = sum(j["wall_s"] for j in tm.get("jobs", []))
        rest = (sums["triggerExecution"] - jobs_s - sm["commit_s"]) / max(1, len(tm["progress"]))
        log(
            f"      commits: {sm['commits']} in {sm['commit_s']:.2f}s (SegmentSink.commit, in "
            f"Spark's sink-runner process); per batch trigger - write job - commit = {rest:.2f}s"
        )
    fu = res.get("fused")
    if fu:
        log(
            f"    the same {fu['batches']} batches as plain Spark jobs, each task reading + "
            f"decoding + staging its ranges in ONE Python worker (no JVM round trip, no "
            f"streaming, no commit): {fu['rows_s']:,.0f} rows/s ({fu['job_seconds']:.2f}s of "
            f"jobs); summed over {fu['tasks']} tasks: read {fu['task_read_s']:.2f}s, decode "
            f"{fu['task_decode_s']:.2f}s, stage {fu['task_stage_s']:.2f}s"
        )
    prof = res.get("profile")
    if prof:
        log("")
        log(
            f"(a) in-process replay of the first batch ({prof['batch_rows']:,} rows, "
            f"{len(prof['tasks'])} tasks run one after the other):"
        )
        log(
            f"    latestOffset cold {prof['latest_offset_cold_s']:.3f}s / warm "
            f"{prof['latest_offset_warm_s']:.3f}s; commit (SegmentSink.commit) "
            f"{prof['commit_s']:.3f}s"
        )
        for i, t in enumerate(prof["tasks"]):
            log(
                f"    task {i}: {t['rows']:,} rows: read {t['read_s']:.3f}s, to-table "
                f"{t['to_table_s']:.3f}s, decode {t['decode_s']:.3f}s, stage parquet "
                f"{t['stage_parquet_s']:.3f}s, stage dead-letter {t['stage_dead_letter_s']:.3f}s"
                f" | SegmentSink.write "
                f"{t['sink_write_s']:.3f}s"
            )
        tot = {
            k: sum(t[k] for t in prof["tasks"])
            for k in ("rows", "read_s", "decode_s", "stage_parquet_s", "sink_write_s")
        }
        log(
            f"    per-core rates: read {tot['rows'] / tot['read_s']:,.0f} rows/s, decode "
            f"{tot['rows'] / tot['decode_s']:,.0f}, stage parquet "
            f"{tot['rows'] / tot['stage_parquet_s']:,.0f}, SegmentSink.write "
            f"{tot['rows'] / tot['sink_write_s']:,.0f}, read+write "
            f"{tot['rows'] / (tot['read_s'] + tot['sink_write_s']):,.0f}"
        )
        log("    cProfile of SegmentSink.write (top by own time):")
        for line in prof["write_profile_top"].splitlines():
            log("      " + line)
    if e:
        log("")
        log(
            f"(e) micro-batches: {e['batches']} with rows, median {e['batch_rows_median']:,.0f} "
            f"rows, median trigger {e['batch_seconds_median']:.2f}s (p99 "
            f"{e['batch_seconds_p99']:.2f}s); median durationMs {e['batch_duration_ms_median']}; "
            f"query start {e['query_start_s']:.1f}s (excluded: the topic was primed first)"
        )
        for ep in e.get("slow_episodes", []):
            log(
                f"    records acked {ep['start']:.1f}-{ep['end']:.1f} s into the run took up to "
                f"{ep['worst']:.2f} s to become visible ({ep['acks']} samples over 1.5 s)"
            )
        for g in e.get("batch_gaps", []):
            log(
                f"    micro-batch at {g['start']:.1f} s: {g['after_previous_s']} s after the one "
                f"before, durationMs {g['duration_ms']}"
            )
