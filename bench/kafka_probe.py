"""What a batch's Kafka requests cost the bundled broker with many topics.

Run from the repository root::

    .venv/bin/python bench/kafka_probe.py                          # 100 topics, 60 s a variant
    .venv/bin/python bench/kafka_probe.py --topics 20 --seconds 20
    .venv/bin/python bench/kafka_probe.py --src before=/path/to/other/checkout/src

``--topics`` topics of one partition on the bundled Tansu broker, each produced at
``--rate`` records/s (bench/scale.py's producer: small produce batches, so Tansu's watermark
lags). Every ``--every`` seconds a "batch" does what a shared query's batch asks of Kafka,
without Spark: every topic's end offsets (``KafkaReader.latest_offsets_of``: one ListOffsets,
then the probe past the watermarks that moved) and then each topic's read of what is new
(``read_records``). Per variant, in a process of its own against the same broker and producer:
the broker's CPU seconds, the reading process's CPU seconds and the wall time per batch, for
the ends and for the reads apart. Variants: ``no-probe`` (the ends without the probe past the
watermarks: the floor), ``this`` (this checkout), and one per ``--src NAME=DIR``; the ratios
are against ``no-probe`` in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent.parent / "tests"))

import common  # noqa: E402


def _own_cpu() -> float:
    t = os.times()
    return t.user + t.system


def child(
    bootstrap: str, broker_pid: int, topics: list[str], seconds: float, every: float, probe: bool
) -> None:
    from millstream.ingest.sources.kafka import KafkaConfig, KafkaReader

    if not probe:
        KafkaReader._probe_past = lambda self, answered: None  # type: ignore[method-assign]
    readers = [KafkaReader(KafkaConfig(bootstrap, t, {}, {"kind": "json"})) for t in topics]
    pos = {}
    for r, e in zip(readers, KafkaReader.latest_offsets_of(readers), strict=True):
        assert isinstance(e, dict), e
        pos[r.topic] = e[0]
    acc = {"ends": [0.0, 0.0, 0.0], "reads": [0.0, 0.0, 0.0]}
    rows = batches = 0
    stop = time.time() + seconds
    while time.time() < stop:
        time.sleep(every)
        b0, m0, w0 = common.process_cpu_s(broker_pid), _own_cpu(), time.perf_counter()
        ends = KafkaReader.latest_offsets_of(readers)
        b1, m1, w1 = common.process_cpu_s(broker_pid), _own_cpu(), time.perf_counter()
        for r, e in zip(readers, ends, strict=True):
            assert isinstance(e, dict), e
            for batch in r.read_records([(0, pos[r.topic], e[0])]):
                rows += batch.num_rows
            pos[r.topic] = e[0]
        b2, m2, w2 = common.process_cpu_s(broker_pid), _own_cpu(), time.perf_counter()
        for k, d in {
            "ends": (b1 - b0, m1 - m0, w1 - w0),
            "reads": (b2 - b1, m2 - m1, w2 - w1),
        }.items():
            acc[k] = [a + x for a, x in zip(acc[k], d, strict=True)]
        batches += 1
    out = {
        f"{k}_{what}": v / batches
        for k, vals in acc.items()
        for what, v in zip(("broker_cpu_s", "reader_cpu_s", "wall_s"), vals, strict=True)
    }
    print(json.dumps({"batches": batches, "rows": rows, **out}))


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--topics", type=int, default=100)
    ap.add_argument("--rate", type=float, default=10.0, help="records/s per topic")
    ap.add_argument("--seconds", type=float, default=60.0, help="per variant")
    ap.add_argument("--every", type=float, default=2.5, help="seconds between two batches")
    ap.add_argument("--src", action="append", default=[], metavar="NAME=DIR")
    ap.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        bootstrap, pid, topics, seconds, every, probe = args.child
        child(bootstrap, int(pid), topics.split(","), float(seconds), float(every), probe == "1")
        return

    import common
    import scale

    from millstream.local.tansu import TansuBroker

    variants: list[tuple[str, str | None, bool]] = [("no-probe", None, False), ("this", None, True)]
    for v in args.src:
        name, _, src = v.partition("=")
        variants.append((name, src, True))
    topics = [f"p{i:03d}" for i in range(args.topics)]
    print(f"load {common.load()}; {args.topics} topics at {args.rate:g} records/s each")
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp, TansuBroker(Path(tmp) / "tansu") as broker:
        for t in topics:
            broker.create_topic(t, 1)
        producer = scale.Producer(broker.bootstrap, args.rate, partitions=1)
        producer.add(topics)
        producer.start()
        try:
            time.sleep(5)
            assert broker.pid is not None
            for name, src, probe in variants:
                env = dict(os.environ)
                if src is not None:
                    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
                cmd = [
                    sys.executable,
                    str(HERE),
                    "--child",
                    broker.bootstrap,
                    str(broker.pid),
                    ",".join(topics),
                    str(args.seconds),
                    str(args.every),
                    "1" if probe else "0",
                ]
                out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
                results[name] = json.loads(out.stdout.strip().splitlines()[-1])
                r = results[name]
                print(
                    f"{name:>10}: {r['batches']} batches; per batch: ends broker "
                    f"{r['ends_broker_cpu_s']:.3f} CPU-s, reader {r['ends_reader_cpu_s']:.3f}, "
                    f"wall {r['ends_wall_s']:.3f} s; reads broker {r['reads_broker_cpu_s']:.3f} "
                    f"CPU-s, wall {r['reads_wall_s']:.3f} s (load {common.load()[0]})"
                )
        finally:
            producer.stop()
    base = results["no-probe"]
    for name, r in results.items():
        if name == "no-probe":
            continue
        print(
            f"{name}: the ends cost the broker {r['ends_broker_cpu_s'] / base['ends_broker_cpu_s']:.1f}x "
            f"and {r['ends_wall_s'] / base['ends_wall_s']:.1f}x the wall of the ends without a probe"
        )


if __name__ == "__main__":
    main()
