"""End-to-end clusters of real ``millstream controller`` and ``millstream worker`` processes
(each started from the ``millstream`` executable next to this interpreter), a producer writing
generator orders into a Kafka-protocol broker at a steady rate, a REST client of the
controller's API, and the checks the end-to-end tests and the failover benchmark share.

Every service runs in its own session (process group), so SIGKILL takes the Python driver, its
JVM and the JVM's Python workers (which PySpark puts in a process group of their own; we find
them by walking ``/proc`` from the service's PID). Nothing is ever killed by name.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx
from confluent_kafka import Producer
from sqlalchemy import select

from millstream.catalog import Catalog
from millstream.datastream import DatastreamSpec
from millstream.ingest.sources.generator import ORDERS_SCHEMA, GeneratorConfig, generate
from millstream.local.process import free_port
from millstream.metastore import schema as s
from millstream.metastore.store import MetadataStore
from millstream.reference.model import Row
from millstream.reference.oracle import RawRecord, expected_table

T = TypeVar("T")
MILLSTREAM_BIN = Path(sys.executable).parent / "millstream"
PARTITIONS = 4
LOG_TAIL_LINES = 30


# -- processes -----------------------------------------------------------------------------


def _children() -> dict[int, list[int]]:
    """ppid -> child PIDs, from /proc."""
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read().decode(errors="replace")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 1:
            out.setdefault(int(fields[1]), []).append(int(entry))
    return out


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (children, grandchildren ...)."""
    tree, found, todo = _children(), [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _state(pid: int) -> str:
    """A process's state letter (``T``: stopped), or '' if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().decode(errors="replace").rsplit(")", 1)[-1].split()[0]
    except (OSError, IndexError):
        return ""


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


@dataclass
class Service:
    """One ``millstream`` service process, in its own session, logging to a file."""

    name: str
    args: list[str]
    log_path: Path
    env: dict[str, str]
    url: str = ""  # a controller's REST API
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    _frozen: set[int] = field(default_factory=set, init=False, repr=False)

    def start(self) -> Service:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"\n=== {time.strftime('%H:%M:%S')} $ {' '.join(self.args)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        self.started_at = time.time()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} was never started"
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int, *, also: Iterable[int] = ()) -> set[int]:
        """Send ``sig`` to the service's process group and every descendant (and their own
        process groups), as :meth:`kill` does, without waiting, and to the PIDs ``also``.
        Returns the PIDs signalled (pass them as ``also`` to reach the same ones again)."""
        if self.proc is None or self.proc.poll() is not None:
            return set(also)
        pids = {self.proc.pid, *descendants(self.proc.pid), *also}
        groups = {g for g in (_pgid(p) for p in pids) if g is not None}
        groups.discard(os.getpgid(0))  # never our own group
        for g in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(g, sig)
        for p in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, sig)
        return pids

    def freeze(self) -> None:
        """SIGSTOP the whole service (the driver, its JVM, the JVM's Python workers)."""
        self._frozen = self.signal(signal.SIGSTOP)

    def thaw(self) -> list[int]:
        """SIGCONT every process :meth:`freeze` stopped and every descendant; returns the PIDs
        of the service that are still stopped afterwards (none, normally)."""
        pids = self.signal(signal.SIGCONT, also=self._frozen)
        self._frozen = set()
        time.sleep(0.2)
        return [p for p in sorted(pids) if _state(p) == "T"]

    def kill(self) -> float:
        """SIGKILL the service's process group and every descendant (by PID and by their
        own process groups); wait until the service's PID is reaped. Returns when the
        signal was sent (time.time())."""
        if self.proc is None:
            return time.time()
        pids = descendants(self.proc.pid)
        groups = {g for g in (_pgid(p) for p in [self.proc.pid, *pids]) if g is not None}
        groups.discard(os.getpgid(0))  # never our own group
        sent = time.time()
        for g in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(g, signal.SIGKILL)
        for p in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait(30)
        return sent

    def terminate(self, timeout: float = 30) -> None:
        """SIGTERM (a clean stop), then :meth:`kill` whatever is left after ``timeout``."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout)
        self.kill()

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as exc:
            return f"<no log: {exc}>"
        return "\n".join(deque(text.splitlines(), maxlen=lines))


def service_env(home: Path, metadata_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MILLSTREAM_")}
    env.update(
        MILLSTREAM_HOME=str(home),
        MILLSTREAM_METADATA_URL=metadata_url,
        MILLSTREAM_DEEP_STORE=str(home / "deepstore"),
        PYTHONUNBUFFERED="1",
        NO_COLOR="1",
        COLUMNS="200",
    )
    env.update(extra)
    return env


@dataclass
class Cluster:
    """The services of one test, all stopped (SIGKILL, by PID) by :meth:`close`."""

    home: Path
    metadata_url: str
    services: dict[str, Service] = field(default_factory=dict)
    #: Extra environment of every service (an S3 deep store, its endpoint and credentials).
    env: dict[str, str] = field(default_factory=dict)

    @property
    def logs(self) -> Path:
        return self.home / "logs"

    def controller(
        self,
        name: str = "controller",
        *,
        lease_ttl: float | None = None,
        worker_ttl: float | None = None,
        takeover_ttl: float | None = None,
        port: int | None = None,
    ) -> Service:
        port = port or free_port()
        args = [str(MILLSTREAM_BIN), "controller", "--port", str(port), "--controller-id", name]
        if lease_ttl is not None:
            args += ["--lease-ttl", str(lease_ttl)]
        if worker_ttl is not None:
            args += ["--worker-ttl", str(worker_ttl)]
        if takeover_ttl is not None:
            args += ["--takeover-ttl", str(takeover_ttl)]
        svc = Service(
            name,
            args,
            self.logs / f"{name}.log",
            service_env(self.home, self.metadata_url, **self.env),
            url=f"http://127.0.0.1:{port}",
        )
        self.services[name] = svc.start()
        return svc

    def worker(
        self,
        worker_id: str,
        controller_url: str,
        *,
        master: str = "local[2]",
        env: dict[str, str] | None = None,
        extra_args: list[str] | None = None,
    ) -> Service:
        """Start worker ``worker_id`` (again: same log file, appended); ``env`` is added to
        its environment (``MILLSTREAM_FAULTS`` ...), ``extra_args`` to its command line
        (``--home`` ...)."""
        args = [
            str(MILLSTREAM_BIN),
            "worker",
            "--controller",
            controller_url,
            "--worker-id",
            worker_id,
            "--master",
            master,
            *(extra_args or []),
        ]
        svc = Service(
            worker_id,
            args,
            self.logs / f"{worker_id}.log",
            service_env(self.home, self.metadata_url, **{**self.env, **(env or {})}),
        )
        self.services[worker_id] = svc.start()
        return svc

    def diagnostics(self) -> str:
        parts = []
        for svc in self.services.values():
            state = "running" if svc.running else f"exited {svc.proc and svc.proc.returncode}"
            parts.append(f"--- {svc.name} ({state}; {svc.log_path}):\n{svc.tail()}")
        return "\n".join(parts)

    def close(self) -> None:
        for svc in reversed(list(self.services.values())):
            with contextlib.suppress(Exception):
                svc.kill()


# -- waiting -------------------------------------------------------------------------------


def wait_until(
    what: str,
    probe: Callable[[], T],
    *,
    timeout: float,
    interval: float = 0.25,
    diagnostics: Callable[[], str] | None = None,
    retry_on: tuple[type[BaseException], ...] = (
        httpx.HTTPError,
        AssertionError,
        KeyError,
        ValueError,
    ),
    failure: Callable[[str], BaseException] = AssertionError,
) -> T:
    """Poll ``probe`` until it returns something truthy; return that. A ``retry_on`` error
    counts as not yet. On timeout, raise ``failure(message)`` naming ``what``, the last value
    or error, and ``diagnostics()`` (the services' log tails)."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = probe()
            if value:
                return value
            last = value
        except retry_on as exc:
            last = exc
        if time.monotonic() >= deadline:
            extra = f"\n{diagnostics()}" if diagnostics else ""
            raise failure(
                f"timed out after {timeout:.0f}s waiting until {what}; last: {last!r}{extra}"
            )
        time.sleep(interval)


# -- the REST API --------------------------------------------------------------------------


class Api:
    """A thin httpx client of the controller's REST API."""

    def __init__(self, url: str) -> None:
        self.http = httpx.Client(base_url=url, timeout=15)

    def get(self, path: str) -> Any:
        r = self.http.get(path)
        r.raise_for_status()
        return r.json()

    def post(self, path: str, body: Any = None) -> httpx.Response:
        return self.http.post(path, json=body)

    def delete(self, path: str) -> httpx.Response:
        return self.http.delete(path)

    def state(self, name: str) -> str:
        return str(self.get(f"/datastreams/{name}")["state"])

    def uppers(self, table: str) -> dict[int, int]:
        """The shard uppers (``current_offset``) by partition; partitions without a shard
        yet are left out."""
        info = self.get(f"/tables/{table}/consumingSegmentsInfo")
        return {
            p["partition"]: p["current_offset"]
            for p in info["partitions"]
            if p["current_offset"] is not None
        }

    def manifest_version(self, table: str) -> int:
        return int(self.get(f"/tables/{table}/segments")["manifest_version"])

    def workers(self) -> dict[str, dict[str, Any]]:
        return {w["id"]: w for w in self.get("/workers")}

    def placement(self, datastream: str) -> dict[str, str]:
        """worker id -> role, from GET /workers."""
        return {
            wid: a["role"]
            for wid, w in self.workers().items()
            for a in w["assignments"]
            if a["datastream"] == datastream
        }

    def active_and_standby(self, datastream: str) -> tuple[str, str] | None:
        """(active worker, standby worker) if exactly those two are assigned, else None."""
        roles = {r: w for w, r in self.placement(datastream).items()}
        if len(roles) != 2 or set(roles) != {"active", "standby"}:
            return None
        return roles["active"], roles["standby"]

    def running_writers(self, datastream: str, *, alive_only: bool = True) -> set[str]:
        """Workers whose last heartbeat reports a writer of ``datastream`` running (only
        those heartbeating within the worker TTL, unless ``alive_only`` is false: a worker
        that is merely slow to heartbeat may still be running its writer)."""
        return {
            wid
            for wid, w in self.workers().items()
            if (w["alive"] or not alive_only)
            and any(x["datastream"] == datastream and x["running"] for x in w["writers"])
        }

    def close(self) -> None:
        self.http.close()


# -- producing -----------------------------------------------------------------------------


def orders_config(seed: int, *, key_cardinality: int = 2_000) -> GeneratorConfig:
    """Generator orders with updates, deletes (tombstones too), duplicates and ~0.5% bad
    records."""
    return GeneratorConfig(
        seed=seed,
        partitions=PARTITIONS,
        key_cardinality=key_cardinality,
        update_fraction=0.3,
        delete_fraction=0.03,
        duplicate_fraction=0.03,
        malformed_fraction=0.005,
    )


class SteadyProducer:
    """Produces the generator's records into ``topic`` in small rounds at about ``rate``
    records/s (over all partitions) from a background thread, keeping every record the broker
    acknowledged with its offset.

    Each round ends every partition with a batch of one record, flushed on its own: Tansu's
    high watermark counts a batch by its first offset, so it is exact only then. After
    :meth:`stop`, :meth:`ends` is therefore exactly the topic's end offsets.
    """

    def __init__(
        self, bootstrap: str, topic: str, cfg: GeneratorConfig, *, rate: float, rounds_s: float
    ) -> None:
        self.topic = topic
        self.cfg = cfg
        self.per_round = max(2, round(rate * rounds_s / cfg.partitions))
        self.rounds_s = rounds_s
        self.records: list[RawRecord] = []
        self.failures: list[str] = []
        self.produced = 0  # per partition
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "linger.ms": 5,
                "acks": "all",
                "log.connection.close": False,
            }
        )
        self._thread = threading.Thread(target=self._run, name=f"produce-{topic}", daemon=True)

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.failures.append(str(err))
            return
        with self._lock:
            self.records.append((msg.partition(), msg.offset(), msg.key(), msg.value()))

    def produce_round(self) -> None:
        lo, hi = self.produced, self.produced + self.per_round
        for p in range(self.cfg.partitions):
            recs = [(k, v) for _, k, v in generate(self.cfg, p, lo, hi)]
            for key, value in recs[:-1]:
                self._producer.produce(
                    self.topic, value=value, key=key, partition=p, on_delivery=self._on_delivery
                )
            self._producer.flush(30)
            key, value = recs[-1]
            self._producer.produce(
                self.topic, value=value, key=key, partition=p, on_delivery=self._on_delivery
            )
            self._producer.flush(30)
        self.produced = hi

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            self.produce_round()
            next_at += self.rounds_s
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def start(self) -> SteadyProducer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        assert not self._thread.is_alive(), "the producer did not stop"
        assert not self.failures, f"the broker refused records: {self.failures[:3]}"
        assert len(self.records) == self.produced * self.cfg.partitions, (
            f"{self.produced * self.cfg.partitions} records produced, "
            f"{len(self.records)} acknowledged"
        )

    def count(self) -> int:
        with self._lock:
            return len(self.records)

    def ends(self) -> dict[int, int]:
        """One past the last acknowledged offset of every partition."""
        with self._lock:
            out: dict[int, int] = {}
            for p, o, _, _ in self.records:
                out[p] = max(out.get(p, 0), o + 1)
            return out


# -- specs and checks ----------------------------------------------------------------------


def orders_spec(name: str, bootstrap: str, topic: str, **extra: Any) -> dict[str, Any]:
    spec = {
        "name": name,
        "source": {"kind": "kafka", "bootstrap_servers": bootstrap, "topic": topic},
        "table": {
            "primary_key": ["order_id"],
            "mode": "upsert",
            "comparison_column": "updated_at",
            "delete_column": "is_deleted",
        },
        "schema": dict(ORDERS_SCHEMA),
        "trigger_interval": "500ms",
        "max_records_per_batch": 5_000,
        **extra,
    }
    DatastreamSpec.parse(spec)  # a typo fails here, not in a service
    return spec


def _norm(v: Any) -> Any:
    return v.astimezone(UTC) if isinstance(v, datetime) else v


def _row_key(row: Row) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, _norm(v)) for k, v in row.items()))


def table_vs_source(cat: Catalog, spec: DatastreamSpec, records: Sequence[RawRecord]) -> str:
    """'' if the table equals the oracle's model of ``records`` and its dead-letter table
    holds exactly the bad records (once each, with their raw bytes); else what differs."""
    expected, bad = expected_table(spec.table_spec(), records)
    got = Counter(map(_row_key, cat.read_table(spec.table_name).to_pylist()))
    want = Counter(map(_row_key, expected))
    problems = []
    if got != want:
        extra, missing = got - want, want - got
        problems.append(
            f"table has {got.total()} rows, the model {want.total()}: "
            f"{extra.total()} unexpected (first {list(extra)[:2]}), "
            f"{missing.total()} missing (first {list(missing)[:2]})"
        )
    raw_of = {(p, o): value for p, o, _, value in records}
    dead = cat.read_table(spec.dead_letter_table).to_pylist()
    dead_got = Counter((r["partition"], r["offset"], r["raw"]) for r in dead)
    dead_want = Counter((p, o, raw_of[(p, o)]) for p, o in bad)
    if dead_got != dead_want:
        problems.append(
            f"dead letters: {dead_got.total()} rows, {dead_want.total()} bad records; "
            f"unexpected {list((dead_got - dead_want).elements())[:3]}, "
            f"missing {list((dead_want - dead_got).elements())[:3]}"
        )
    if not bad:
        problems.append("the source had no bad record: the dead-letter check proves nothing")
    return "; ".join(problems)


def commits_by(
    store: MetadataStore, table: str, writer_id: str, *, after: float
) -> list[tuple[int, float]]:
    """(manifest version, committed_at) of the commits ``writer_id`` made to ``table``
    after time ``after``."""
    tv = s.table_versions
    with store.read() as conn:
        rows = conn.execute(
            select(tv.c.manifest_version, tv.c.committed_at)
            .where(
                tv.c.table_name == table,
                tv.c.writer_id == writer_id,
                tv.c.committed_at > after,
            )
            .order_by(tv.c.manifest_version)
        ).all()
    return [(int(v), float(t)) for v, t in rows]


def all_reached(uppers: dict[int, int], ends: dict[int, int]) -> bool:
    return all(uppers.get(p, 0) >= end for p, end in ends.items())


def advanced(now: dict[int, int], before: dict[int, int], partitions: Iterable[int]) -> bool:
    return any(now.get(p, 0) > before.get(p, 0) for p in partitions)
