"""Kafka range reads as a shared query's write tasks make them: a consumer of the topic vs any
consumer of the client config.

Run from the repository root (not part of CI; about 4 minutes)::

    .venv/bin/python bench/kafka_reads.py                 # 2 rounds of each pool, 30 s each
    .venv/bin/python bench/kafka_reads.py --rounds 3 --seconds 20 --json /tmp/reads.json

A Tansu broker with 8 topics of 4 partitions; a producer thread (``scale.Producer``) writes
generator orders into each at 1,000 records/s. Two processes (a worker's two task slots) each
loop: pick 4 of the 8 topics at random (the shared query packs members into tasks by size,
so a task's members change from batch to batch), ask their end offsets in one request
(``latest_offsets_of``), read each topic's new ranges on a thread of its own with
``KafkaReader.read_records`` (as ``GroupSink`` does), then wait 0.4 s (a trigger). Per read:
its wall time, and whether it got every record of its ranges. A process's first read of each
topic (a consumer created, or one that never read the topic) is reported apart: the figures
are of the reads after it, the steady state of a running worker.

Two pools, in alternating rounds, each in fresh processes (empty pools, as a new worker):

* **any** (the baseline, Millstream before session 18): a read leases any idle consumer of
  the client config, whatever topic it read before;
* **topic** (``ConsumerPool.lease(conf, topic)``): a read leases a consumer that last read
  its topic.

Prints per pool: reads, median / p90 / p99 / max read time, reads over 300 ms, and the ratio
of the p99s (topic / any, each the median over its rounds). Results go to
``bench/results/kafka-reads-<time>.json`` and ``--json PATH``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import statistics
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import common

TOPICS = 8
PARTITIONS = 4
PER_TASK = 4  # members a task writes
SLOW_MS = 300.0


def _pool(kind: str) -> Any:
    from millstream.ingest.sources.kafka import ConsumerPool

    class AnyTopicPool(ConsumerPool):
        """The pool before session 18: a consumer of the config, whatever its last topic."""

        def lease(self, conf: dict[str, Any], topic: str | None = None) -> Any:
            return super().lease(conf, None)

    return AnyTopicPool() if kind == "any" else ConsumerPool()


def reads(
    bootstrap: str, topics: list[str], kind: str, seconds: float, seed: int, out: Any
) -> None:
    """One task slot's loop (in its own process); puts on ``out`` a tuple per read: its
    milliseconds, whether it got every record, whether it was the process's first of its
    topic."""
    from millstream.ingest.sources.base import latest_offsets_of
    from millstream.ingest.sources.kafka import KafkaConfig, KafkaReader

    pool = _pool(kind)
    rnd = random.Random(seed)
    readers = {t: KafkaReader(KafkaConfig(bootstrap, t), consumers=pool) for t in topics}
    pos: dict[str, Any] = latest_offsets_of(readers)
    got: list[tuple[float, bool, bool]] = []
    seen: set[str] = set()

    def read(t: str, ends: dict[int, int]) -> tuple[float, bool, bool]:
        ranges = [(p, pos[t][p], hi) for p, hi in sorted(ends.items()) if hi > pos[t][p]]
        t0 = time.perf_counter()
        n = sum(b.num_rows for b in readers[t].read_records(ranges))
        first = t not in seen
        seen.add(t)
        ms = (time.perf_counter() - t0) * 1000
        return ms, n == sum(hi - lo for _, lo, hi in ranges), first

    stop = time.monotonic() + seconds
    with ThreadPoolExecutor(PER_TASK) as threads:
        while time.monotonic() < stop:
            mine = rnd.sample(topics, PER_TASK)
            ends = latest_offsets_of({t: readers[t] for t in mine})
            got.extend(threads.map(read, mine, [ends[t] for t in mine]))
            pos.update(ends)
            time.sleep(0.4)
    pool.close()
    out.put(got)


def one_round(bootstrap: str, topics: list[str], kind: str, seconds: float, r: int) -> Any:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=reads, args=(bootstrap, topics, kind, seconds, 100 * r + i, out))
        for i in range(2)
    ]
    for p in procs:
        p.start()
    got = [x for _ in procs for x in out.get(timeout=seconds + 120)]
    for p in procs:
        p.join(30)
    ms = [m for m, _, first in got if not first]
    return {
        "pool": kind,
        "round": r,
        "reads": len(ms),
        "first_reads_ms": sorted(round(m) for m, _, first in got if first),
        "incomplete": sum(1 for _, ok, _ in got if not ok),
        "median_ms": statistics.median(ms),
        "p90_ms": common.percentile(ms, 90),
        "p99_ms": common.percentile(ms, 99),
        "max_ms": max(ms),
        "slow": sum(1 for m in ms if m > SLOW_MS),
    }


@contextmanager
def broker_with_load(base: Path) -> Iterator[tuple[str, list[str]]]:
    import scale

    from millstream.local.tansu import TansuBroker

    broker = TansuBroker(base / "tansu").start()
    producer = None
    try:
        topics = [f"t{i}" for i in range(TOPICS)]
        for t in topics:
            broker.create_topic(t, PARTITIONS)
        producer = scale.Producer(broker.bootstrap, 1000.0).start()
        producer.add(topics)
        time.sleep(3)
        yield broker.bootstrap, topics
    finally:
        if producer is not None:
            producer.stop()
        broker.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2, help="rounds of each pool (alternating)")
    ap.add_argument("--seconds", type=float, default=30.0, help="seconds per round")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--no-wait", action="store_true", help="do not wait for a quiet machine")
    args = ap.parse_args(argv)
    log = common.log_stamped
    load_start, waited = (common.load(), 0.0) if args.no_wait else common.wait_for_quiet(log)
    runs: list[dict[str, Any]] = []
    with (
        common.workdir("millstream-bench-kafka-reads-", say=log) as base,
        broker_with_load(base) as (bootstrap, topics),
    ):
        for r in range(1, args.rounds + 1):
            for kind in ("any", "topic"):
                res = one_round(bootstrap, topics, kind, args.seconds, r)
                runs.append(res)
                log(
                    f"round {r} {kind:>5}: {res['reads']} reads, median "
                    f"{res['median_ms']:.0f} ms, p90 {res['p90_ms']:.0f}, p99 "
                    f"{res['p99_ms']:.0f}, max {res['max_ms']:.0f}; over {SLOW_MS:.0f} ms: "
                    f"{res['slow']}; incomplete: {res['incomplete']} (first reads of a topic, apart: "
                    f"{len(res['first_reads_ms'])}, max {max(res['first_reads_ms'], default=0)} ms)"
                )
    p99 = {
        k: statistics.median(x["p99_ms"] for x in runs if x["pool"] == k) for k in ("any", "topic")
    }
    slow = {k: sum(x["slow"] for x in runs if x["pool"] == k) for k in ("any", "topic")}
    n = {k: sum(x["reads"] for x in runs if x["pool"] == k) for k in ("any", "topic")}
    log(
        f"p99 read (median of rounds): any {p99['any']:.0f} ms, topic {p99['topic']:.0f} ms, "
        f"ratio topic/any {common.ratio(p99['topic'], p99['any']):.2f}; reads over "
        f"{SLOW_MS:.0f} ms: any {slow['any']}/{n['any']}, topic {slow['topic']}/{n['topic']}"
    )
    res_all = {
        "command": common.command_line("kafka_reads.py"),
        "machine": common.machine(),
        "load_start": load_start,
        "load_wait_s": waited,
        "runs": runs,
        "p99_ms": p99,
        "slow": slow,
        "reads": n,
        "load_end": common.load(),
    }
    common.save_results("kafka-reads", res_all, args.json, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
