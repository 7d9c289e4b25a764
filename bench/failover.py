"""Failover benchmark: how long a datastream stops committing when its active worker dies,
with a warm standby versus a cold restart of the same writer.

Run from the repository root (not part of CI; about 5 minutes)::

    .venv/bin/python bench/failover.py                       # SQLite metadata, default TTLs
    .venv/bin/python bench/failover.py --takeover-ttl 6      # a standby waits the worker TTL
    .venv/bin/python bench/failover.py --warm-rounds 5 --metadata-url postgresql+psycopg://...

Everything is a real process: a Tansu broker, ``millstream controller`` (default worker and
takeover TTLs: 6 s and 1.5 s, or ``--worker-ttl``/``--takeover-ttl``), and
``millstream worker`` processes (each its own Spark JVM, ``local[2]``), on one SQLite metadata
store (or ``--metadata-url``). A producer writes generator orders into a 4-partition topic at
a steady rate the whole time.

Warm standby (``replicas: 2``): once both writers run and the active is caught up, SIGKILL the
active worker's whole process group (driver, JVM, Python workers). The figure is the time from
the SIGKILL to the standby's first commit, read from ``ms_table_versions`` (the first manifest
version with ``writer_id`` = the standby's worker id and ``committed_at`` after the kill). It
is the sum of *detection* (the active's heartbeat must be older than the takeover TTL before
the standby's commit gate opens; the controller promotes the standby later, after the worker
TTL, which the "promoted" column shows) and
*resumption* (the standby's next micro-batch commits; if the standby had already read past the
shard upper, that commit finds a gap and the standby restarts its query from the upper). Each
round restarts the killed worker, which comes back as the new standby.

Cold restart (``replicas: 1``, one worker): SIGKILL the only worker and immediately start a
fresh ``millstream worker`` with the same worker id (same state directory); the figure is the
time from the SIGKILL to that writer's first commit (JVM start, query start, first batch).

The process helpers are the end-to-end tests' (``harness.cluster``), set up as
``bench/scale.py`` sets up its parts (b) and (c) (``scale.services``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import common
from common import log_stamped as log
from scale import services

from harness.cluster import (
    PARTITIONS,
    Api,
    Cluster,
    SteadyProducer,
    commits_by,
    orders_config,
    orders_spec,
    wait_until,
)
from millstream.metastore.store import MetadataStore

TARGET_WARM_S = 3.0  # issue: warm-standby failover <= 3 s at default settings
SEED = 11
JVM_START_S = 300


@dataclass
class Round:
    kind: str  # warm | cold
    killed: str
    successor: str
    seconds_to_commit: float
    #: warm: until the controller showed the standby promoted; cold: until the new worker
    #: process heartbeated again.
    seconds_to_detect: float
    first_outcomes: dict[str, str] = field(default_factory=dict)
    restarts_after_kill: int = 0


def commit_log(home: Path, worker: str, datastream: str) -> list[dict[str, Any]]:
    path = home / "workers" / worker / datastream / "commits.jsonl"
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line]
    except (OSError, ValueError):
        return []


def restarts(home: Path, worker: str, since: float) -> int:
    """Query restarts from the shard uppers the worker logged after ``since``."""
    n = 0
    for line in (home / "logs" / f"{worker}.log").read_text(errors="replace").splitlines():
        if "restarts from the shard uppers" in line:
            stamp = line[:19]
            try:
                t = time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S"))
            except ValueError:
                continue
            n += t >= int(since)
    return n


def lag(api: Api, table: str, producer: SteadyProducer) -> int:
    ends, uppers = producer.ends(), api.uppers(table)
    return sum(max(0, end - uppers.get(p, 0)) for p, end in ends.items())


def wait_caught_up(api: Api, table: str, producer: SteadyProducer, rate: float, diag: Any) -> None:
    wait_until(
        f"{table} is caught up (lag under one second of records)",
        lambda: lag(api, table, producer) <= rate,
        timeout=JVM_START_S,
        interval=0.5,
        diagnostics=diag,
    )


def warm_round(
    cluster: Cluster, api: Api, store: MetadataStore, producer: SteadyProducer, args: Any
) -> Round:
    diag = cluster.diagnostics

    active, standby = wait_until(
        "an active and a standby",
        lambda: api.active_and_standby("warm"),
        timeout=JVM_START_S,
        diagnostics=diag,
    )
    # Warm: the standby's query has run (and skipped committing) a few batches lately.
    ready_since = time.time()
    wait_until(
        f"the standby {standby} has skipped 3 batches",
        lambda: (
            sum(
                1
                for c in commit_log(cluster.home, standby, "warm")
                if c.get("skipped") and c["at"] > ready_since
            )
            >= 3
        ),
        timeout=JVM_START_S,
        interval=0.5,
        diagnostics=diag,
    )
    wait_caught_up(api, "warm", producer, args.rate, diag)
    log(f"warm: killing the active {active}; {standby} is the standby")
    killed_at = cluster.services[active].kill()
    promoted = wait_until(
        f"{standby} is promoted",
        lambda: time.time() if api.placement("warm") == {standby: "active"} else None,
        timeout=args.worker_ttl + 60,
        interval=0.05,
        diagnostics=diag,
    )
    first = wait_until(
        f"{standby} commits",
        lambda: commits_by(store, "warm", standby, after=killed_at),
        timeout=120,
        interval=0.05,
        diagnostics=diag,
    )
    after = [
        c
        for c in commit_log(cluster.home, standby, "warm")
        if c["at"] > killed_at and not c.get("skipped")
    ]
    r = Round(
        "warm",
        active,
        standby,
        round(first[0][1] - killed_at, 3),
        round(promoted - killed_at, 3),
        after[0].get("outcomes", {}) if after else {},
        restarts(cluster.home, standby, killed_at),
    )
    log(f"warm: {standby} committed {r.seconds_to_commit:.2f}s after the kill ({r})")
    return r


def cold_round(
    cluster: Cluster, api: Api, store: MetadataStore, producer: SteadyProducer, args: Any
) -> Round:
    diag = cluster.diagnostics
    placement = wait_until(
        "cold is assigned", lambda: api.placement("cold"), timeout=60, diagnostics=diag
    )
    (worker,) = placement
    wait_caught_up(api, "cold", producer, args.rate, diag)
    log(f"cold: killing {worker} and starting a fresh worker with the same id")
    killed_at = cluster.services[worker].kill()
    cluster.worker(worker, cluster.services["controller"].url)
    back = wait_until(
        f"{worker} heartbeats again",
        lambda: time.time() if api.workers()[worker]["heartbeat_at"] > killed_at else None,
        timeout=JVM_START_S,
        interval=0.1,
        diagnostics=diag,
    )
    first = wait_until(
        f"{worker} commits",
        lambda: commits_by(store, "cold", worker, after=killed_at),
        timeout=JVM_START_S,
        interval=0.1,
        diagnostics=diag,
    )
    r = Round("cold", worker, worker, round(first[0][1] - killed_at, 3), round(back - killed_at, 3))
    log(f"cold: {worker} committed {r.seconds_to_commit:.2f}s after the kill ({r})")
    return r


def run(args: Any, base: Path) -> dict[str, Any]:
    producer: SteadyProducer | None = None
    rounds: list[Round] = []
    with services(base, metadata_url=args.metadata_url) as svc:
        url, broker, cluster, store = svc.url, svc.broker, svc.cluster, svc.store
        load_at_start = list(common.load(1))
        try:
            diag = cluster.diagnostics
            ctl = cluster.controller(worker_ttl=args.worker_ttl, takeover_ttl=args.takeover_ttl)
            api = Api(ctl.url)
            wait_until("the controller leads", lambda: api.get("/health")["leader"], timeout=60)
            workers = ["w1", "w2"]
            for w in workers:
                cluster.worker(w, ctl.url)
            wait_until(
                "both workers heartbeat",
                lambda: all(api.workers().get(w, {}).get("alive") for w in workers),
                timeout=JVM_START_S,
                diagnostics=diag,
            )
            broker.create_topic("orders", PARTITIONS)
            producer = SteadyProducer(
                broker.bootstrap, "orders", orders_config(SEED), rate=args.rate, rounds_s=0.25
            ).start()
            spec = orders_spec("warm", broker.bootstrap, "orders", replicas=2)
            assert api.post("/datastreams", spec).status_code == 201
            log("warm: datastream created (replicas: 2)")
            for i in range(args.warm_rounds):
                r = warm_round(cluster, api, store, producer, args)
                rounds.append(r)
                if i + 1 < args.warm_rounds:
                    cluster.worker(r.killed, ctl.url)  # it comes back as the standby

            # Cold: one worker only, replicas 1.
            assert api.post("/datastreams/warm/stop").status_code == 200
            wait_until("warm is STOPPED", lambda: api.state("warm") == "STOPPED", timeout=60)
            assert api.delete("/datastreams/warm").status_code == 202
            survivor = rounds[-1].successor
            for w, svc in cluster.services.items():
                if w.startswith("w") and w != survivor and svc.running:
                    svc.terminate()
            spec = orders_spec("cold", broker.bootstrap, "orders", replicas=1)
            assert api.post("/datastreams", spec).status_code == 201
            log(f"cold: datastream created (replicas: 1) on {survivor}")
            for _ in range(args.cold_rounds):
                rounds.append(cold_round(cluster, api, store, producer, args))
            api.close()
        finally:
            if producer is not None:
                producer.stop()
    warm = [r.seconds_to_commit for r in rounds if r.kind == "warm"]
    cold = [r.seconds_to_commit for r in rounds if r.kind == "cold"]
    return {
        "machine": common.machine("pyspark"),
        "load_average_at_start": load_at_start,
        "settings": {
            "metadata": url.split(":", 1)[0],
            "worker_ttl_s": args.worker_ttl,
            "takeover_ttl_s": args.takeover_ttl,
            "rate_records_s": args.rate,
            "trigger_interval": "500ms",
            "max_records_per_batch": 5000,
            "spark_master": "local[2]",
        },
        "load_average_at_end": list(common.load(1)),
        "rounds": [asdict(r) for r in rounds],
        "warm_median_s": statistics.median(warm),
        "warm_max_s": max(warm),
        "cold_median_s": statistics.median(cold),
        "ratio_cold_over_warm": round(
            common.ratio(statistics.median(cold), statistics.median(warm)), 1
        ),
        "target_warm_s": TARGET_WARM_S,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker-ttl", type=float, default=6.0, help="controller --worker-ttl")
    ap.add_argument(
        "--takeover-ttl", type=float, default=1.5, help="controller --takeover-ttl (its default)"
    )
    ap.add_argument("--rate", type=float, default=400, help="records/s produced")
    ap.add_argument("--warm-rounds", type=int, default=3)
    ap.add_argument("--cold-rounds", type=int, default=1)
    ap.add_argument("--metadata-url", default=None, help="default: SQLite under a temp home")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (logs, store)")
    args = ap.parse_args()
    with common.workdir("millstream-failover-", keep=args.keep, say=log) as base:
        log(f"working in {base}; load average {os.getloadavg()}")
        res = run(args, base)
    out = common.write_json(common.RESULTS / f"failover-{time.strftime('%H%M%S')}.json", res)
    print()
    print(f"{'round':<6} {'killed':<7} {'successor':<10} {'to commit':>10} {'promoted':>9}  path")
    for r in res["rounds"]:
        path = ",".join(sorted(set(r["first_outcomes"].values()))) or "-"
        if r["restarts_after_kill"]:
            path += f" (+{r['restarts_after_kill']} query restart)"
        print(
            f"{r['kind']:<6} {r['killed']:<7} {r['successor']:<10} "
            f"{r['seconds_to_commit']:>9.2f}s {r['seconds_to_detect']:>8.2f}s  {path}"
        )
    verdict = "meets" if res["warm_median_s"] <= TARGET_WARM_S else "MISSES"
    print(
        f"\nload average {res['load_average_at_start']} at the start, "
        f"{res['load_average_at_end']} at the end, on {res['machine']['cores']} CPUs"
    )
    print(
        f"warm standby: median {res['warm_median_s']:.2f}s, max {res['warm_max_s']:.2f}s "
        f"({verdict} the {TARGET_WARM_S:.0f}s target for the median); cold restart: median "
        f"{res['cold_median_s']:.2f}s; cold/warm {res['ratio_cold_over_warm']}x "
        f"(worker TTL {args.worker_ttl}s, takeover TTL {args.takeover_ttl}s). Results: {out.relative_to(common.REPO)}"
    )


if __name__ == "__main__":
    main()
