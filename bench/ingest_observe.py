"""What the ingest benchmark reads about a Spark run besides its wall time: the streaming
query's per-batch progress, CPU seconds per process kind from /proc, and the jobs and tasks of
one query from Spark's event log."""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path
from typing import Any


def progress(query: Any) -> list[dict[str, Any]]:
    """Per micro-batch: its id, Spark's input rows, ``durationMs`` and ``timestamp`` (when its
    trigger started: :func:`progress_seconds` reads it)."""
    out = []
    for pr in query.recentProgress:
        d = json.loads(pr.json) if hasattr(pr, "json") else dict(pr)
        out.append(
            {
                "batch": d.get("batchId"),
                "input_rows": d.get("numInputRows"),
                "duration_ms": d.get("durationMs", {}),
                "timestamp": d.get("timestamp"),
            }
        )
    return out


def progress_seconds(stamp: str) -> float:
    """A progress ``timestamp`` (Spark's ISO 8601 in UTC, ``2026-11-29T14:00:00.123Z``: to the
    millisecond) in seconds since the epoch, as ``time.time()``."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


# ---------------------------------------------------------------------------------------------
# CPU seconds per process kind
# ---------------------------------------------------------------------------------------------


def _process_kind(pid: int, cmd: str) -> str:
    if pid == os.getpid():
        return "driver (this process)"
    if "java" in cmd.split(" ")[0]:
        return "JVM"
    for key, kind in (
        ("pyspark.daemon pyspark.worker", "Python workers (read + write tasks)"),
        ("python_streaming_sink_runner", "Python sink commit runner"),
        ("python_streaming_source_runner", "Python source runner (offsets)"),
        ("pyspark.sql.worker", "Python planner workers"),
    ):
        if key in cmd:
            return kind
    if not cmd.strip():
        return "exited (zombie) processes"
    argv = cmd.split()
    return f"other ({' '.join(Path(a).name for a in argv[:3])})"


def process_cpu() -> dict[int, tuple[str, float]]:
    """CPU seconds (user + system) of this process and all its descendants, by pid."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            f = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        stats[int(d.name)] = (int(f[1]), (int(f[11]) + int(f[12])) / tick)
    mine = {os.getpid()}
    grew = True
    while grew:
        new = {pid for pid, (ppid, _) in stats.items() if ppid in mine} - mine
        grew = bool(new)
        mine |= new
    out = {}
    for pid in mine:
        try:
            cmd = (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        out[pid] = (_process_kind(pid, cmd), stats[pid][1])
    return out


def peak_rss_mb(kind: str) -> float | None:
    """The largest peak RSS (``VmHWM``) in MiB among this process's descendants of ``kind``
    (a :func:`_process_kind` name), None if there is none. Spark reuses its Python workers,
    so a worker's peak is that of the largest task it ran."""
    peaks = []
    for pid, (k, _) in process_cpu().items():
        if k != kind:
            continue
        try:
            status = (Path("/proc") / str(pid) / "status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                peaks.append(int(line.split()[1]) / 1024)
    return max(peaks) if peaks else None


def cpu_delta(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]
) -> dict[str, float]:
    """CPU seconds used between two snapshots, by process kind (processes that exited in
    between are not counted)."""
    out: dict[str, float] = {}
    for pid, (kind, cpu) in after.items():
        prev = before.get(pid)
        used = cpu - (prev[1] if prev is not None and prev[0] == kind else 0.0)
        out[kind] = round(out.get(kind, 0.0) + used, 2)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


# ---------------------------------------------------------------------------------------------
# Spark's event log
# ---------------------------------------------------------------------------------------------


def event_log_config(base: Path) -> tuple[Path, dict[str, str]]:
    """A directory for Spark's event log (task launch/finish times and metrics) and the
    session settings that write it there (for ``spark_session(config=...)``)."""
    d = base / "eventlog"
    d.mkdir(parents=True, exist_ok=True)
    return d, {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": f"file://{d}",
        "spark.eventLog.compress": "false",
    }


def spark_jobs(
    event_dir: Path | None, query_id: str | None = None, job_group: str | None = None
) -> list[dict[str, Any]]:
    """Jobs of one streaming query (``query_id``) or of one job group (an available-now run's
    batch jobs) from the event log: per job the batch id, wall time and its tasks' durations
    and metrics (seconds)."""
    if event_dir is None:
        return []
    jobs: dict[int, dict[str, Any]] = {}
    stage_job: dict[int, int] = {}

    def order(f: Path) -> tuple[str, int]:
        index = f.name.split("_")[1] if f.name.startswith("events_") else "0"
        return (str(f.parent), int(index) if index.isdigit() else 0)

    # Spark 4 rolls the log: eventlog_v2_<app>/events_<n>_<app>.
    files = [f for f in event_dir.rglob("*") if f.is_file() and "appstatus" not in f.name]
    for f in sorted(files, key=order):
        for line in f.read_text().splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            kind = ev.get("Event")
            if kind == "SparkListenerJobStart":
                props = ev.get("Properties") or {}
                if (query_id is not None and props.get("sql.streaming.queryId") != query_id) or (
                    job_group is not None and props.get("spark.jobGroup.id") != job_group
                ):
                    continue
                jid = ev["Job ID"]
                desc = props.get("spark.job.description") or ""
                jobs[jid] = {
                    "job": jid,
                    "batch": props.get("streaming.sql.batchId") or desc.rpartition(" ")[2],
                    "submitted": ev["Submission Time"] / 1000,
                    "tasks": [],
                }
                for sid in ev.get("Stage IDs", []):
                    stage_job[sid] = jid
            elif kind == "SparkListenerJobEnd" and ev["Job ID"] in jobs:
                jobs[ev["Job ID"]]["completed"] = ev["Completion Time"] / 1000
            elif kind == "SparkListenerTaskEnd" and ev.get("Stage ID") in stage_job:
                info, m = ev["Task Info"], ev.get("Task Metrics") or {}
                jobs[stage_job[ev["Stage ID"]]]["tasks"].append(
                    {
                        "seconds": (info["Finish Time"] - info["Launch Time"]) / 1000,
                        "run_s": m.get("Executor Run Time", 0) / 1000,
                        "jvm_cpu_s": m.get("Executor CPU Time", 0) / 1e9,
                        "gc_s": m.get("JVM GC Time", 0) / 1000,
                        "deserialize_s": m.get("Executor Deserialize Time", 0) / 1000,
                    }
                )
    out = []
    for j in sorted(jobs.values(), key=lambda j: j["job"]):
        j["wall_s"] = j.get("completed", j["submitted"]) - j["submitted"]
        out.append(j)
    return out
