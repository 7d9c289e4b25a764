"""How long a new datastream takes to show its first rows after ``create`` on a running worker.

Run from the repository root (not part of CI; about 2 minutes)::

    .venv/bin/python bench/first_rows.py [--rounds 3] [--json PATH]

Everything is a real process: ``millstream up`` (its broker, controller and one worker, on a
fresh home). A first datastream is created and waited for, so the worker's Spark and its
shared query are warm. Then, each round, a new topic gets 100 records and a new datastream on
it is created through the REST API; from the moment ``POST /datastreams`` returns, the
benchmark polls (every 50 ms) the datastream's state (READY), its assignment (``GET
/workers``), its writer running (the worker's heartbeat) and its first commit (the table's
manifest version above 0), and prints when each happened, and after each round the worker's
shared query as its heartbeat reports it (run id, members, starts, joins and leaves).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common
from common import log_stamped as log
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from harness.cluster import MILLSTREAM_BIN, Api, Service, orders_spec, service_env
from millstream.local.process import free_port

STEPS = ("ready", "assigned", "running", "first_rows")


def _produce(bootstrap: str, topic: str, n: int = 100) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result(
        timeout=30
    )
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for i in range(n):
        value = (
            f'{{"order_id": {i}, "customer": "c", "amount": 1.0, "status": "new", '
            f'"updated_at": "2026-01-01T00:00:00Z", "is_deleted": false}}'
        )
        producer.produce(topic, key=str(i).encode(), value=value.encode(), partition=i % 2)
        producer.flush(10)  # one record a produce batch: the broker's watermark is exact


def _measure(api: Api, bootstrap: str, name: str, timeout: float = 300.0) -> dict[str, float]:
    _produce(bootstrap, name)
    spec = orders_spec(name, bootstrap, name)
    spec.pop("max_records_per_batch")
    r = api.post("/datastreams", spec)
    r.raise_for_status()
    t0 = time.monotonic()
    seen: dict[str, float] = {}
    while len(seen) < len(STEPS):
        now = time.monotonic() - t0
        if now > timeout:
            raise TimeoutError(f"{name}: only {seen} after {timeout:.0f}s")
        if "ready" not in seen and api.state(name) == "READY":
            seen["ready"] = now
        if "assigned" not in seen and api.placement(name):
            seen["assigned"] = now
        if "running" not in seen and api.running_writers(name):
            seen["running"] = now
        if "ready" in seen and "first_rows" not in seen and api.manifest_version(name) > 0:
            seen["first_rows"] = now
        time.sleep(0.05)
    return seen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    home = Path(tempfile.mkdtemp(prefix="first-rows-"))
    port, broker_port = free_port(), free_port()
    env = service_env(home, f"sqlite:///{home}/metadata.db")
    up = Service(
        "up",
        [
            str(MILLSTREAM_BIN),
            "up",
            "--port",
            str(port),
            "--broker-port",
            str(broker_port),
        ],
        home / "up.log",
        env,
    ).start()
    api = Api(f"http://127.0.0.1:{port}")
    bootstrap = f"127.0.0.1:{broker_port}"
    rounds: list[dict[str, float]] = []
    try:
        deadline = time.monotonic() + 120
        while "up: worker" not in up.log_path.read_text():
            if not up.running or time.monotonic() > deadline:
                raise RuntimeError(f"up did not start:\n{up.tail()}")
            time.sleep(0.2)
        warm = _measure(api, bootstrap, "warm")
        log(f"warm-up datastream (query start in a fresh worker): {warm}")
        for i in range(args.rounds):
            seen = _measure(api, bootstrap, f"fresh{i}")
            log(f"round {i}: " + ", ".join(f"{k} {v:.2f}s" for k, v in seen.items()))
            for w in api.workers().values():  # the shared query's starts, joins and run id
                if w.get("shared_query"):
                    log(f"  {w['id']}: shared query {w['shared_query']}")
            rounds.append(seen)
    finally:
        up.terminate()
        api.close()
    summary: dict[str, Any] = {
        step: statistics.median(r[step] for r in rounds) for step in STEPS if rounds
    }
    log("median: " + ", ".join(f"{k} {v:.2f}s" for k, v in summary.items()))
    if args.json:
        common.write_json(
            args.json,
            {
                "command": common.command_line("first_rows.py"),
                "rounds": rounds,
                "median": summary,
                "machine": common.machine(),
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
