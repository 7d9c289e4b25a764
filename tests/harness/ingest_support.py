"""Helpers shared by the integration tests: produce generator records into the real broker,
run ``millstream run`` as a subprocess, and compare a table with the source-side oracle.

The oracle (:func:`millstream.reference.oracle.expected_table`) decodes every acknowledged
record on its own with ``json.loads`` and applies the sequential model, so it shares no code
path with the vectorized decoder, the sink or the merge engines under test.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from millstream.catalog import Catalog
from millstream.clock import SYSTEM_CLOCK
from millstream.control.controller import Controller, ControlSettings
from millstream.control.worker import Worker
from millstream.control.workers import heartbeat, list_workers
from millstream.datastream import DatastreamSpec
from millstream.errors import TableNotFoundError
from millstream.ingest.sources import spec_reader
from millstream.ingest.sources.generator import ORDERS_SCHEMA, GeneratorConfig, generate
from millstream.reference.model import Row
from millstream.reference.oracle import RawRecord, expected_table
from millstream.spark.runner import DatastreamRunner, RunStats

PARTITIONS = 4
MILLSTREAM_BIN = Path(sys.executable).parent / "millstream"
SPARK_MASTER = os.environ.get("MILLSTREAM_TEST_SPARK_MASTER", "local[2]")

#: How each merge engine is configured over the generator's orders schema.
TABLE_SECTIONS: dict[str, dict[str, Any]] = {
    "append": {"mode": "append"},
    "dedup": {"mode": "dedup", "primary_key": ["order_id"], "delete_column": "is_deleted"},
    "upsert": {
        "mode": "upsert",
        "primary_key": ["order_id"],
        "comparison_column": "updated_at",
        "delete_column": "is_deleted",
    },
    "partial": {
        "mode": "partial",
        "primary_key": ["order_id"],
        "comparison_column": "updated_at",
        "delete_column": "is_deleted",
        "partial": {"amount": "sum", "status": "overwrite", "customer": "ignore_null"},
    },
}


def orders_config(seed: int, *, key_cardinality: int = 10_000) -> GeneratorConfig:
    return GeneratorConfig(
        seed=seed,
        partitions=PARTITIONS,
        key_cardinality=key_cardinality,
        update_fraction=0.3,
        delete_fraction=0.03,
        duplicate_fraction=0.03,
        malformed_fraction=0.002,
    )


@dataclass
class Topic:
    """A topic on the test broker and every record the broker acknowledged, with offsets."""

    bootstrap: str
    name: str
    cfg: GeneratorConfig
    records: list[RawRecord] = field(default_factory=list)
    produced_per_partition: int = 0

    def produce(self, per_partition: int) -> list[RawRecord]:
        """Produce the generator's next ``per_partition`` records of every partition."""
        lo = self.produced_per_partition
        rows = {
            p: [(key, value) for _, key, value in generate(self.cfg, p, lo, lo + per_partition)]
            for p in range(self.cfg.partitions)
        }
        acked = produce_exact(self.bootstrap, self.name, rows)
        self.records.extend(acked)
        self.produced_per_partition += per_partition
        return acked

    def ends(self) -> dict[int, int]:
        """One past the last acknowledged offset of every partition."""
        return ends_of(self.records)


def ends_of(records: Iterable[RawRecord]) -> dict[int, int]:
    """One past the last offset of ``records`` in every partition they are in."""
    out: dict[int, int] = {}
    for p, o, _, _ in records:
        out[p] = max(out.get(p, 0), o + 1)
    return out


def produce_exact(
    bootstrap: str, topic: str, rows: dict[int, list[tuple[bytes | None, bytes | None]]]
) -> list[RawRecord]:
    """Produce ``{partition: [(key, value)]}`` and return what the broker acknowledged.

    Tansu's high watermark is exact only when the last batch of a partition holds a single
    record: flush everything but the last record, then produce the last one alone.
    """
    from confluent_kafka import Producer

    acked: list[RawRecord] = []
    failures: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            failures.append(str(err))
            return
        acked.append((msg.partition(), msg.offset(), msg.key(), msg.value()))

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 5,
            "acks": "all",
            "log.connection.close": False,
        }
    )
    for p, recs in sorted(rows.items()):
        if not recs:
            continue
        for key, value in recs[:-1]:
            producer.produce(topic, value=value, key=key, partition=p, on_delivery=on_delivery)
            producer.poll(0)
        producer.flush(60)
        key, value = recs[-1]
        producer.produce(topic, value=value, key=key, partition=p, on_delivery=on_delivery)
        producer.flush(60)
    assert not failures, f"the broker refused records: {failures[:3]}"
    assert len(acked) == sum(len(r) for r in rows.values()), "some records were never acked"
    return acked


# -- specs ---------------------------------------------------------------------------------


def orders_spec(
    name: str,
    topic: Topic,
    mode: str,
    *,
    max_records_per_batch: int,
    table: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    section = dict(TABLE_SECTIONS[mode])
    if table is not None:
        section["name"] = table
    return {
        "name": name,
        "source": {"kind": "kafka", "bootstrap_servers": topic.bootstrap, "topic": topic.name},
        "table": section,
        "schema": dict(ORDERS_SCHEMA),
        "max_records_per_batch": max_records_per_batch,
        **extra,
    }


def write_spec(path: Path, spec: dict[str, Any]) -> Path:
    DatastreamSpec.parse(spec)  # fail here, not in the subprocess, on a typo
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


# -- comparing with the oracle -------------------------------------------------------------


def _norm(v: Any) -> Any:
    # Exact values (no float tolerance): timestamps only get one tzinfo so messages read alike.
    return v.astimezone(UTC) if isinstance(v, datetime) else v


def _key(row: Row) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, _norm(v)) for k, v in row.items()))


def assert_same_rows(got: Iterable[Row], expected: Iterable[Row], *, what: str) -> None:
    """Multiset equality (like comparing :func:`millstream.reference.model.canonical`), with the
    first few differences in the message."""
    g, e = Counter(map(_key, got)), Counter(map(_key, expected))
    if g == e:
        return
    extra, missing = g - e, e - g
    raise AssertionError(
        f"{what}: table has {sum(g.values())} rows, the model {sum(e.values())}; "
        f"{sum(extra.values())} unexpected (first: {list(extra)[:3]}), "
        f"{sum(missing.values())} missing (first: {list(missing)[:3]})"
    )


def assert_table_matches_source(cat: Catalog, spec: DatastreamSpec, records: Sequence[RawRecord]):
    """The table equals the oracle's model of ``records``, and its dead-letter table holds
    exactly the bad records, once each, with their raw bytes."""
    expected, bad = expected_table(spec.table_spec(), records)
    got = cat.read_table(spec.table_name).to_pylist()
    assert_same_rows(got, expected, what=spec.table_name)
    raw_of = {(p, o): value for p, o, _, value in records}
    dead = cat.read_table(spec.dead_letter_table).to_pylist()
    dead_got = Counter((r["partition"], r["offset"], r["raw"]) for r in dead)
    dead_expected = Counter((p, o, raw_of[(p, o)]) for p, o in bad)
    assert dead_got == dead_expected, (
        f"dead letters differ: unexpected {list((dead_got - dead_expected).elements())[:3]}, "
        f"missing {list((dead_expected - dead_got).elements())[:3]}"
    )
    return expected, bad


def shard_uppers(cat: Catalog, table: str) -> dict[int, int]:
    return {s.partition: s.upper for s in cat.store.list_shards(table)}


def run_until_caught_up(runner: DatastreamRunner, *, timeout: float = 600.0) -> RunStats:
    """``runner.run()`` as a running writer runs it (its streaming query, resuming from its
    checkpoint: what ``millstream run`` and a worker run), stopped at a batch boundary once the
    table's shards reach the source's latest offsets as they were when called. Fails the test
    if they do not within ``timeout`` seconds (the writer is stopped all the same)."""
    target = spec_reader(runner.spec.source).latest_offsets()
    deadline = time.monotonic() + timeout
    late: list[dict[int, int]] = []

    def tick(r: DatastreamRunner) -> None:
        uppers = uppers_or_empty(r.catalog, r.spec.table_name)
        if all(uppers.get(p, -1) >= o for p, o in target.items()):
            r.stop_after_batch()
        elif time.monotonic() > deadline:
            late.append(uppers)
            r.stop_after_batch()

    stats = runner.run(available_now=False, on_tick=tick, tick_seconds=0.2)
    assert not late, f"the writer reached {late[0]}, not {target}, in {timeout:.0f} s"
    return stats


def uppers_or_empty(cat: Catalog, table: str) -> dict[int, int]:
    """The shard uppers, {} until the writer has created the table."""
    try:
        return shard_uppers(cat, table)
    except TableNotFoundError:
        return {}


@contextlib.contextmanager
def writer_in_background(runner: DatastreamRunner, name: str) -> Iterator[list[BaseException]]:
    """Run ``runner`` continuously on a thread named ``name``; yields the list its error (if
    it raises) lands in. On exit the runner is stopped and its thread joined."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            runner.run(available_now=False)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    try:
        yield errors
    finally:
        runner.stop()
        thread.join(timeout=120)


# -- a controller and a worker in this process ---------------------------------------------


@dataclass
class InProcessCluster:
    """A :class:`Controller` and one :class:`Worker` (``w1``, on the test's SparkSession) in
    this process, driven by :meth:`tick_until` (each tick what their loops do)."""

    catalog: Catalog
    controller: Controller
    worker: Worker

    @classmethod
    def start(cls, catalog: Catalog, spark: Any, state_root: Path) -> InProcessCluster:
        """Worker ``w1`` heartbeats first (so the controller's first tick assigns it); both
        run with a 60 s worker TTL (a worker tick may take long on a busy machine)."""
        heartbeat(catalog.store, "w1", status="RUNNING", info={}, clock=SYSTEM_CLOCK)
        settings = ControlSettings(worker_ttl=60.0)
        controller = Controller(catalog, controller_id="c1", settings=settings)
        worker = Worker(catalog, spark, worker_id="w1", settings=settings, state_root=state_root)
        return cls(catalog, controller, worker)

    def tick_until(
        self, done: Callable[[], bool], what: str, *, timeout: float, interval: float
    ) -> None:
        """Tick the controller and the worker every ``interval`` seconds until ``done()``;
        fail the test naming ``what`` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            self.controller.tick()
            self.worker.tick()
            time.sleep(interval)

    def worker_info(self) -> dict[str, Any]:
        """What ``w1``'s last heartbeat said (its writers, its shared query)."""
        return {w.id: w for w in list_workers(self.catalog.store)}["w1"].info


# -- the CLI as a subprocess ---------------------------------------------------------------


def cli_run_args(
    spec_file: Path, home: Path, writer_id: str, *, available_now: bool = True
) -> list[str]:
    return [
        str(MILLSTREAM_BIN),
        "run",
        "-f",
        str(spec_file),
        *(["--available-now"] if available_now else []),
        "--writer-id",
        writer_id,
        "--home",
        str(home),
        "--output",
        "json",
        "--master",
        SPARK_MASTER,
    ]


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MILLSTREAM_FAULT")}
    env.update(extra)
    return env


@dataclass
class Finished:
    returncode: int
    stdout: str
    stderr: str

    def summary(self) -> dict[str, Any]:
        return json.loads(self.stdout)

    def explain(self) -> str:
        return f"exit {self.returncode}\nstdout:\n{self.stdout[-4000:]}\nstderr:\n{self.stderr[-6000:]}"


def start_cli(
    spec_file: Path,
    home: Path,
    writer_id: str,
    log_dir: Path,
    *,
    streaming: bool = False,
    **env: str,
) -> subprocess.Popen[bytes]:
    """``millstream run --available-now`` in its own session, so the whole process group
    (the Python driver, its JVM and the Python workers) can be killed at once. With
    ``streaming``, ``millstream run`` (the running writer's streaming query, which runs until
    stopped)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    out = (log_dir / f"{writer_id}.out").open("ab")
    err = (log_dir / f"{writer_id}.err").open("ab")
    args = cli_run_args(spec_file, home, writer_id, available_now=not streaming)
    try:
        return subprocess.Popen(
            args,
            stdout=out,
            stderr=err,
            env=cli_env(**env),
            start_new_session=True,
        )
    finally:
        out.close()
        err.close()


def wait_cli(
    proc: subprocess.Popen[bytes], log_dir: Path, writer_id: str, timeout: float = 300
) -> Finished:
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        raise
    finally:
        _reap_group(proc.pid)
    return Finished(
        proc.returncode,
        (log_dir / f"{writer_id}.out").read_text(errors="replace"),
        (log_dir / f"{writer_id}.err").read_text(errors="replace"),
    )


def run_cli(
    spec_file: Path, home: Path, writer_id: str, log_dir: Path, timeout: float = 300, **env: str
) -> Finished:
    return wait_cli(
        start_cli(spec_file, home, writer_id, log_dir, **env), log_dir, writer_id, timeout
    )


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _reap_group(pgid: int, timeout: float = 30) -> None:
    """Make sure nothing of a finished CLI run is left (its JVM, Python workers)."""
    deadline = time.monotonic() + timeout
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _group_alive(pgid):
        os.killpg(pgid, signal.SIGKILL)


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the whole process group and wait until every member is gone."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while _group_alive(proc.pid):
        if time.monotonic() > deadline:
            raise AssertionError(f"process group {proc.pid} survived SIGKILL")
        time.sleep(0.1)


def wait_for_marker(proc: subprocess.Popen[bytes], marker: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not marker.exists():
        if proc.poll() is not None:
            raise AssertionError(
                f"the writer exited ({proc.returncode}) before reaching the fault point {marker.name}"
            )
        if time.monotonic() > deadline:
            kill_group(proc)
            raise AssertionError(f"fault point {marker.name} not reached in {timeout:.0f}s")
        time.sleep(0.1)


def writer_commits(home: Path, datastream: str, writer_id: str) -> list[dict[str, Any]]:
    path = home / "writers" / datastream / writer_id / "commits.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]
