"""What a read costs the bundled Tansu broker as its topics fill: per produce batch, or per record?

``bench/scale.py`` (c) runs 100 one-partition topics at 10 records/s each for 10 minutes
against the bundled broker (``--storage-engine memory://``, the broker ``millstream up``
starts). Over such a run the broker's own CPU rose from 0.37 to 0.70 of a core in 4.5 minutes
on the same two cores as the worker. This bench finds what that cost follows, with the broker
alone: ``--topics`` topics are filled in ``--steps`` steps, each step adding ``--records``
records to every topic, and after each step a fixed read round (what a worker's micro-batch
asks per topic: the high watermark, then a fetch of the last ``--tail`` records) is timed in
the broker's own CPU seconds. It runs twice on fresh brokers, the records produced one per
produce request (as a producer at 10 records/s with a 20 ms linger sends them) and
``--per-batch`` per request, so the two runs hold the same records in different numbers of
produce batches.

Prints, per step, the broker's CPU-ms per topic for the watermark request and for the fetch,
and their ratio to the first step's, per run; and the ratio of the two runs at the last step.
Options: --topics N (10), --steps N (5), --records N (1500, per topic per step), --per-batch N
(10), --rounds N (5, read rounds per measurement), --tail N (10), --json PATH.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))

import common  # noqa: E402

VALUE = b'{"order_id": 123456, "customer": "c-00042", "amount": 12.5, "ts": 1795916501278}' * 2


def rss_mb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) // 1024
    return 0


def run(args: argparse.Namespace, base: Path, per_request: int, log: Any) -> list[dict[str, Any]]:
    from confluent_kafka import Consumer, Producer, TopicPartition

    from millstream.local.tansu import TansuBroker

    broker = TansuBroker(base / f"tansu-{per_request}").start()
    steps: list[dict[str, Any]] = []
    try:
        pid = broker.pid or 0
        names = [f"t{i:03d}" for i in range(args.topics)]
        for n in names:
            broker.create_topic(n, 1)
        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
        consumer = Consumer(
            {
                "bootstrap.servers": broker.bootstrap,
                "group.id": "broker-growth",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 10,
            }
        )
        held = 0
        for step in range(args.steps + 1):
            if step:
                for _ in range(args.records // per_request):
                    for n in names:  # one produce request per topic: per_request records
                        for _ in range(per_request):
                            producer.produce(n, value=VALUE)
                    producer.flush(30)
                held += args.records
            c0 = common.process_cpu_s(pid)
            for _ in range(args.rounds):
                for n in names:
                    consumer.get_watermark_offsets(TopicPartition(n, 0), timeout=10, cached=False)
            c1 = common.process_cpu_s(pid)
            for _ in range(args.rounds):
                for n in names:
                    _, hi = consumer.get_watermark_offsets(TopicPartition(n, 0), cached=True)
                    consumer.assign([TopicPartition(n, 0, max(0, hi - args.tail))])
                    got, t0 = 0, time.monotonic()
                    while got < min(args.tail, held) and time.monotonic() - t0 < 5:
                        m = consumer.poll(0.2)
                        if m is not None and m.error() is None:
                            got += 1
            c2 = common.process_cpu_s(pid)
            reads = args.rounds * args.topics
            row = {
                "records_per_topic": held,
                "batches_per_topic": held // per_request,
                "watermark_cpu_ms": 1000 * (c1 - c0) / reads,
                "fetch_cpu_ms": 1000 * (c2 - c1) / reads,
                "broker_rss_mb": rss_mb(pid),
            }
            steps.append(row)
            log(
                f"  {per_request:>2} a batch: {held:>6,} records ({row['batches_per_topic']:>6,} "
                f"batches) a topic: watermark {row['watermark_cpu_ms']:5.2f} CPU-ms, fetch "
                f"{row['fetch_cpu_ms']:5.2f} CPU-ms a topic read, broker RSS "
                f"{row['broker_rss_mb']} MB"
            )
        consumer.close()
    finally:
        broker.stop()
    return steps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--topics", type=int, default=10)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--records", type=int, default=1500, help="records per topic per step")
    ap.add_argument("--per-batch", type=int, default=10, help="records per produce request")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tail", type=int, default=10)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    def log(text: str) -> None:
        print(text, flush=True)

    log(f"machine: {common.machine('confluent_kafka')}; load {common.load()}")
    res: dict[str, Any] = {"args": vars(args) | {"json": None}, "load_start": common.load()}
    with tempfile.TemporaryDirectory(prefix="broker-growth-") as tmp:
        for per in (1, args.per_batch):
            log(f"records {per} to a produce request:")
            res[f"per_{per}"] = run(args, Path(tmp), per, log)
    res["load_end"] = common.load()
    one, many = res["per_1"], res[f"per_{args.per_batch}"]

    def total(r: dict[str, Any]) -> float:
        return float(r["watermark_cpu_ms"] + r["fetch_cpu_ms"])

    log("")
    log("a topic read's broker CPU against the first step with records (1 record a batch):")
    for r in one[1:]:
        log(
            f"  {r['batches_per_topic']:>6,} batches a topic: {total(r) / total(one[1]):.2f}x "
            f"({total(r):.2f} CPU-ms)"
        )
    ratio = total(one[-1]) / total(many[-1])
    log(
        f"at {one[-1]['records_per_topic']:,} records a topic: 1 record a batch costs "
        f"{ratio:.2f}x what {args.per_batch} a batch cost ({total(one[-1]):.2f} against "
        f"{total(many[-1]):.2f} CPU-ms a topic read)"
    )
    log(f"load average at end {res['load_end']}")
    if args.json:
        args.json.write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
