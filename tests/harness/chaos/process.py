"""The process-level fault campaign: a real cluster (a Tansu broker, one controller, two
workers each with its own Spark JVM) ingests a topic that a producer keeps writing (about 200
records/s over 4 partitions) into two datastreams at once, both ``replicas: 2``:
``orders_sb`` (an active and a warm standby) and ``orders_aa`` (active-active); ``modes``
selects one of them alone where two JVMs on two cores cannot afford four queries. A third,
``orders_mt`` (mode ``multi-table``, standby), reads a ``topic_pattern`` of 3 topics (2
partitions each, a producer each), a table per topic, and a 4th topic is created while
schedule 0 runs: its table must appear and catch up without a restart. A seeded
schedule of faults hits the cluster while records flow, and a checker verifies what must hold.

**A schedule** is a window of faults, then a recovery. It takes one fault from each *lane*
(each lane deals its kinds from a deck: a seeded shuffle per pass, so a run covers every kind
once per pass; the first pass opens with the lane's core kind), with its parameters drawn
from ``random.Random(f"{seed}/{schedule}")``:

* **process** - ``kill_active`` (SIGKILL the process group of a datastream's active worker,
  check that the other replica becomes the one active and commits, restart the worker),
  ``kill_worker`` (the worker of another role), ``freeze_worker`` (SIGSTOP/SIGCONT, shorter
  or longer than the worker TTL), ``kill_controller`` (restart on the same port),
  ``freeze_controller`` (shorter or longer than the leader lease). Both workers start with
  seal faults armed (``MILLSTREAM_FAULTS``: seals fail at the sealer's named points, and
  each one the workers log counts as a fault); a restarted worker may have more.
* **rest** - ``pause_hold`` (pause; once no writer runs, nothing may commit although records
  keep arriving; resume), ``storm`` (3-6 pause/resume/stop commands in quick succession),
  ``rollback`` (pause, roll a partition back 1-3 segments, resume), ``reingest`` (re-ingest
  1-2 segments). With two datastreams a *side storm* hits the other one at the same time. On
  ``orders_mt`` the pause of ``pause_hold`` and ``rollback`` is one table's alone: that table
  commits nothing while its topic grows, and (``pause_hold``) another of its tables commits
  meanwhile; ``reingest`` picks a table; ``storm`` commands the whole datastream.
* **network** (PostgreSQL + S3 only) - ``cut_pg``/``cut_s3`` (a
  :class:`~harness.chaos.proxy.TcpProxy` in front of PostgreSQL or moto resets
  every connection and refuses new ones for a few seconds) and ``stall_pg``/``stall_s3``
  (it forwards nothing for 1-8 s).

The lanes strike at once, each after a drawn delay; a controller fault goes first (the REST
lanes need it back), and lanes touching the datastream of a ``kill_active`` wait for its
failover check. Every fault is logged with its time. The same seed draws the same schedules
(kinds, roles, commands, durations, in the same order); timing, and which worker a role
resolves to, may differ.

**The checker.** After each schedule (a recovery that does not come back ends the run):

* every lifecycle command's answer fits the lifecycle table (:mod:`millstream.core.lifecycle`)
  and each datastream settles in the state its last command implies (READY after resume,
  PAUSED after pause, STOPPED after stop; an unknown outcome allows either);
* a service that exits on its own is an anomaly; both workers heartbeat and run every writer
  again, and every shard upper reaches the producer's end offsets of that moment (no wedged
  frontier);
* no service logged an unexpected Python traceback (:data:`ALLOWED_TRACEBACKS` lists the
  expected ones, each with why and which injected fault it needs).

At the end the producers stop, and: the uppers equal the topics' end offsets; each table
(each of ``orders_mt``'s, against its own topic) equals the oracle's model of every
acknowledged record and its dead-letter table holds exactly the
bad records (:func:`~harness.cluster.table_vs_source`); no segment is COMMITTING
past its claim's expiry; stop brings each datastream to STOPPED with no live worker running
its writer, and delete removes it (404). Every failure goes to :meth:`CampaignLog.anomaly`;
nothing is raised mid-run.

Entry points: :func:`run_process_campaign`, which starts the servers it needs itself unless
given them (:func:`campaign_servers` starts a broker, and PostgreSQL and moto for the
``postgresql`` backend, in a directory)::

    log = run_process_campaign(
        seed=7, log=CampaignLog(LAYER, 7), metadata="postgresql", minutes=10, min_faults=0
    )
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import re
import signal
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal

import httpx
from sqlalchemy import select

from harness.chaos.log import CampaignLog
from harness.chaos.proxy import TcpProxy
from harness.cluster import (
    PARTITIONS,
    Api,
    Cluster,
    Service,
    SteadyProducer,
    all_reached,
    commits_by,
    orders_config,
    orders_spec,
    table_vs_source,
    wait_until,
)
from harness.servers import MotoS3Server, PostgresServer
from millstream.catalog import Catalog
from millstream.control.registry import Registry
from millstream.control.workers import WorkerInfo, list_workers
from millstream.core.lifecycle import COMMAND_TARGETS, Command, State
from millstream.datastream import DatastreamSpec
from millstream.faults import COMPACTION_POINTS, SEAL_POINTS
from millstream.faults import ENV as FAULTS_ENV
from millstream.local.process import free_port
from millstream.local.tansu import TansuBroker
from millstream.metastore import schema as s
from millstream.metastore.models import SegmentState
from millstream.spec import dead_letter_name

__all__ = [
    "ALLOWED_TRACEBACKS",
    "ALL_MODES",
    "LANES",
    "LAYER",
    "MODES",
    "Metadata",
    "Mode",
    "Servers",
    "campaign_servers",
    "draw_schedule",
    "fault_counts",
    "run_process_campaign",
    "service_log_tails",
    "struck",
]

Metadata = Literal["sqlite", "postgresql"]

#: The layer name of this campaign in its CampaignLog.
LAYER = "process"
WORKERS = ("w1", "w2")
CONTROLLER = "controller"
#: Workers heartbeat every 0.5 s; one silent this long is dead (its standby takes over).
WORKER_TTL = 5.0
#: The controller's leader lease (its default).
LEASE_TTL = 6.0
RATE = 200.0  # records/s over the topic's 4 partitions
#: Two JVMs on two cores run four queries (two datastreams, two replicas each): a micro-batch
#: every 2 s keeps them from starving each other.
TRIGGER = "2s"
#: Segments seal every ~15 s (so do the seal faults armed in the workers).
SEGMENTS = {"flush_rows": 50_000, "flush_seconds": 15}
#: Two JVMs start at once on a small machine; their first queries take a while too.
START_S = 240.0
#: Bounds of recovery once a schedule's faults stop (generous: 2 cores, 2 JVMs).
SETTLE_S = 60.0
RECOVER_S = 180.0
FRONTIER_S = 120.0
HTTP_TIMEOUT_S = 20.0


Mode = Literal["standby", "active-active", "multi-table"]


@dataclass(frozen=True, slots=True)
class Stream:
    key: str
    name: str
    mode: Mode

    @property
    def multi(self) -> bool:
        """A ``topic_pattern`` datastream, a table per topic (``orders_mt``)."""
        return self.mode == "multi-table"


STREAMS = (
    Stream("sb", "orders_sb", "standby"),
    Stream("aa", "orders_aa", "active-active"),
    Stream("mt", "orders_mt", "multi-table"),
)
#: The single-table datastreams' modes (the PostgreSQL run in CI).
MODES: tuple[Mode, ...] = ("standby", "active-active")
#: Every datastream (``make chaos``).
ALL_MODES: tuple[Mode, ...] = (*MODES, "multi-table")
BY_KEY = {st.key: st for st in STREAMS}
#: orders_mt: its topics when the cluster starts, the one schedule 0 creates, their partitions
#: and each one's producer rate (records/s).
MT_TOPICS = ("t0", "t1", "t2")
MT_NEW_TOPIC = "t3"
MT_PARTITIONS = 2
MT_RATE = 16.0

#: Each lane's kinds; the first is the lane's core kind, dealt first in a run.
LANES: dict[str, tuple[str, ...]] = {
    "process": (
        "kill_active",
        "kill_worker",
        "freeze_worker",
        "kill_controller",
        "freeze_controller",
    ),
    "rest": ("pause_hold", "storm", "rollback", "reingest"),
    "network": ("cut_pg", "stall_pg", "cut_s3", "stall_s3"),
}


# -- servers -------------------------------------------------------------------------------


@dataclass
class Servers:
    """What a campaign needs outside the cluster: the broker; PostgreSQL and moto (S3) for the
    ``postgresql`` backend."""

    broker: TansuBroker
    postgres: PostgresServer | None = None
    s3: MotoS3Server | None = None


@contextlib.contextmanager
def campaign_servers(base_dir: Path, metadata: Metadata = "sqlite") -> Iterator[Servers]:
    """Start a Tansu broker (and, for ``postgresql``, a PostgreSQL server and a moto S3 server)
    under ``base_dir``, each on 127.0.0.1; stop each by its PID on exit."""
    with contextlib.ExitStack() as stack:
        broker = stack.enter_context(TansuBroker(base_dir / "tansu"))
        servers = Servers(broker)
        if metadata == "postgresql":
            servers.postgres = stack.enter_context(PostgresServer(base_dir / "postgres"))
            servers.s3 = stack.enter_context(MotoS3Server(base_dir / "moto"))
        yield servers


# -- the plan ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Action:
    """One fault of a schedule, fully drawn before it runs."""

    lane: str
    kind: str
    delay: float  # seconds after its lane starts
    params: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        p = self.params
        if self.kind in ("kill_active", "kill_worker"):
            armed = f", seal faults {p['seal_faults']}" if p.get("seal_faults") else ""
            what = f"{p['role'][1]} of {BY_KEY[p['role'][0]].name}"
            return f"{self.kind}({what}, restart after {p['restart_after']:.1f}s{armed})"
        if self.kind == "freeze_worker":
            what = f"{p['role'][1]} of {BY_KEY[p['role'][0]].name}"
            return f"freeze_worker({what}, {p['seconds']:.1f}s)"
        if self.kind == "kill_controller":
            return f"kill_controller(restart after {p['restart_after']:.1f}s)"
        if self.kind == "freeze_controller":
            return f"freeze_controller({p['seconds']:.1f}s)"
        if self.kind == "storm":
            cmds = ", ".join(f"{c} {BY_KEY[k].name}" for k, c, _ in p["commands"])
            return f"{'side ' if self.lane == 'side' else ''}storm({cmds})"
        table = f" table {p['table']}" if "table" in p else ""
        if self.kind == "pause_hold":
            return f"pause_hold({BY_KEY[p['stream']].name}{table}, {p['hold']:.1f}s)"
        if self.kind == "rollback":
            name = BY_KEY[p["stream"]].name
            return f"rollback({name}{table} p{p['partition']}, last {p['depth']} segments)"
        if self.kind == "reingest":
            return f"reingest({BY_KEY[p['stream']].name}, {len(p['picks'])} segments)"
        if self.kind.startswith("cut_"):
            return f"{self.kind}({', '.join(f'{d:.1f}s' for d, _ in p['outages'])})"
        return f"{self.kind}({p['seconds']:.1f}s)"


def _deal(seed: int, lane: str, index: int) -> str:
    """The kind lane ``lane`` deals to schedule ``index``: the deck is a seeded shuffle of the
    lane's kinds per pass; the first pass opens with the lane's core kind."""
    kinds = LANES[lane]
    n, pos = divmod(index, len(kinds))
    rng = random.Random(f"{seed}/deck/{lane}/{n}")
    if n == 0:
        rest = list(kinds[1:])
        rng.shuffle(rest)
        return [kinds[0], *rest][pos]
    deck = list(kinds)
    rng.shuffle(deck)
    return deck[pos]


#: Where a worker's seals and compactions may be made to fail.
FAULT_POINTS = SEAL_POINTS + COMPACTION_POINTS


def _seal_faults(rng: random.Random) -> str:
    """1-2 seal fault points with 1-3 failures each, as ``MILLSTREAM_FAULTS``."""
    points = rng.sample(FAULT_POINTS, rng.randint(1, 2))
    return ",".join(f"{p}=fail*{rng.randint(1, 3)}" for p in sorted(points))


def _storm(rng: random.Random, streams: list[str], n: int) -> list[tuple[str, str, float]]:
    """``n`` lifecycle commands: (datastream key, command, seconds to wait after it)."""
    return [
        (
            rng.choice(streams),
            rng.choices(["pause", "resume", "stop"], weights=[4, 4, 2])[0],
            rng.uniform(0.0, 1.2),
        )
        for _ in range(n)
    ]


def draw_schedule(
    seed: int, index: int, *, network: bool, streams: Sequence[str] = ("sb", "aa")
) -> list[Action]:
    """Schedule ``index`` of campaign ``seed`` over the datastreams ``streams`` (keys of
    :data:`STREAMS`): one action per lane (no network lane without the proxies) and a side
    storm. A pure function of its arguments."""
    rng = random.Random(f"{seed}/{index}")
    actions: list[Action] = []
    streams = list(streams)
    roles = [(k, r) for k in streams for r in ("active", "standby")]

    kind = _deal(seed, "process", index)
    params: dict[str, Any] = {}
    if kind in ("kill_active", "kill_worker"):
        params["role"] = roles[0] if kind == "kill_active" else rng.choice(roles[1:])
        params["restart_after"] = rng.uniform(0.0, 6.0)
        params["seal_faults"] = _seal_faults(rng) if rng.random() < 0.5 else ""
    elif kind == "freeze_worker":
        params["role"] = rng.choice(roles)
        short = rng.random() < 0.5
        params["seconds"] = (
            rng.uniform(0.5, WORKER_TTL - 2.0)
            if short
            else rng.uniform(WORKER_TTL + 1, WORKER_TTL + 5)
        )
    elif kind == "kill_controller":
        params["restart_after"] = rng.uniform(0.0, 4.0)
    else:  # freeze_controller
        short = rng.random() < 0.5
        params["seconds"] = (
            rng.uniform(0.5, 3.0) if short else rng.uniform(LEASE_TTL + 1, LEASE_TTL + 4)
        )
    actions.append(Action("process", kind, rng.uniform(0.0, 2.0), params))

    kind = _deal(seed, "rest", index)
    params = {"stream": rng.choice(streams)}
    if params["stream"] == "mt" and kind in ("pause_hold", "rollback"):
        params["table"] = rng.choice(MT_TOPICS)  # paused (and rolled back) alone
    if kind == "pause_hold":
        params["hold"] = rng.uniform(2.0, 4.0)
    elif kind == "storm":
        params["commands"] = _storm(rng, streams, rng.randint(3, 6))
    elif kind == "rollback":
        params["partition"] = rng.randrange(PARTITIONS)
        params["depth"] = rng.randint(1, 3)
        params["paused_for"] = rng.uniform(0.5, 2.0)
    else:  # reingest
        params["picks"] = [rng.random() for _ in range(rng.randint(1, 2))]
    if "table" in params and "partition" in params:
        params["partition"] %= MT_PARTITIONS
    actions.append(Action("rest", kind, rng.uniform(0.0, 2.0), params))
    # A side storm on the other datastream, at the same time (unless the lane's action is a
    # storm of both already).
    others = [k for k in streams if k != params["stream"]]
    if kind != "storm" and others:
        side = {"stream": others[0], "commands": _storm(rng, others, rng.randint(2, 4))}
        actions.append(Action("side", "storm", rng.uniform(0.0, 3.0), side))

    if network:
        kind = _deal(seed, "network", index)
        if kind.startswith("cut_"):
            n = rng.randint(1, 2)
            params = {"outages": [(rng.uniform(0.5, 3.0), rng.uniform(0.3, 2.0)) for _ in range(n)]}
        else:
            params = {"seconds": rng.uniform(1.0, 8.0)}
        actions.append(Action("network", kind, rng.uniform(0.0, 3.0), params))
    return actions


# -- the lifecycle model -------------------------------------------------------------------


def _targets(command: Command, states: set[State]) -> set[State]:
    out = {COMMAND_TARGETS[command][st] for st in states if st in COMMAND_TARGETS[command]}
    return out | ({State.STOPPED} if State.STOPPING in out else set())


@dataclass
class LifecycleModel:
    """The states a datastream may be in after the commands sent to it (STOPPING completes to
    STOPPED on its own, so it always comes with STOPPED)."""

    possible: set[State] = field(default_factory=lambda: {State.READY})
    last: str = "create"

    def apply(self, command: Command, status: int | None, state: str | None) -> str:
        """Fold one command's answer in (``status`` None: the outcome is unknown); returns
        what contradicts the lifecycle table, or ''."""
        allowed = {st for st in self.possible if st in COMMAND_TARGETS[command]}
        problem = ""
        if status == 200:
            targets = _targets(command, allowed)
            if state is None or State(state) not in targets:
                problem = (
                    f"{command.value} answered 200 {state} but from {sorted(self.possible)} "
                    f"it may only lead to {sorted(targets)}"
                )
            got = State(state) if state is not None else State.ERROR
            self.possible = {got} | ({State.STOPPED} if got is State.STOPPING else set())
            self.last = command.value
        elif status == 409:
            refused = self.possible - allowed
            if not refused:
                problem = f"{command.value} refused (409) although {sorted(self.possible)} allow it"
            self.possible = refused or self.possible
            if State.STOPPING in self.possible:  # it completes on its own meanwhile
                self.possible.add(State.STOPPED)
        else:
            self.possible |= _targets(command, allowed)
            self.last = f"{command.value}?"
        return problem

    def settled(self) -> set[State]:
        return {State.STOPPED if st is State.STOPPING else st for st in self.possible}


# -- tracebacks ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AllowedTraceback:
    name: str
    pattern: re.Pattern[str]
    #: Allowed only in a run that injected one of these fault kinds (None: always).
    needs: frozenset[str] | None
    why: str


def _allow(name: str, pattern: str, needs: set[str] | None, why: str) -> AllowedTraceback:
    return AllowedTraceback(
        name, re.compile(pattern, re.S), None if needs is None else frozenset(needs), why
    )


_KILLS = {"kill_active", "kill_worker", "kill_controller"}
_STOPS = {"storm", "pause_hold", "rollback", *_KILLS}

#: Python tracebacks a campaign expects in the service logs; any other is an anomaly.
ALLOWED_TRACEBACKS: tuple[AllowedTraceback, ...] = (
    _allow(
        "pyspark accumulator connection closed",
        r"\A(?:(?!/millstream/).)*pyspark/accumulators\.py(?:(?!/millstream/).)*\n"
        r"(?:EOFError|ConnectionResetError: \[Errno 104\] Connection reset by peer)\s*\Z",
        None,
        # The driver's accumulator server reads updates from each Python worker; a Python
        # worker that ends while connected (its task's query stopped by pause/stop/rollback
        # or a restart, or its process group killed) makes it log EOFError, or
        # ConnectionResetError when the connection ended with a reset (the fifth long run). PySpark's own
        # noise: the update is re-sent by the task's retry or no longer needed.
        "PySpark logs it when a Python worker's connection closes mid-update",
    ),
    _allow(
        "pyspark stream source runner's connection closed",
        r"\A(?:(?!/millstream/).)*python_streaming_source_runner\.py(?:(?!/millstream/).)*\n"
        r"(?:EOFError|BrokenPipeError: \[Errno 32\] Broken pipe)\s*\Z",
        None,
        # Spark runs a Python stream source in a process of its own that the driver's JVM
        # talks to over a socket; a query that stops (paused, stopped, rolled back, restarted
        # after a failure, or its JVM killed) closes the socket, and the runner logs EOFError
        # (and BrokenPipeError answering it). PySpark's own noise; no Millstream frame in it.
        "PySpark logs it when a stopping query closes its stream source's socket",
    ),
    _allow(
        "pyspark traceback cut short by a kill",
        r"\A(?:(?!/millstream/).)*/pyspark/(?:(?!/millstream/).)*\n  File \"[^\"\n]*\", line \d+, "
        r"in [^\n]*\n?\Z",
        _KILLS,
        # A PySpark process (the stream source runner, whose socket to the JVM closed) was
        # still writing its traceback when the campaign SIGKILLed the worker's process group:
        # the log ends at a frame, with no exception line (a CI run of session 8, seed
        # 1501053509: the runner's EOFError then socket.py's write). Only PySpark and standard
        # library frames; one through Millstream's code stays an anomaly.
        "PySpark was writing a traceback when its process group was killed",
    ),
    _allow(
        "pyspark daemon's pipe to its JVM broken",
        r"\A(?:(?!/millstream/).)*pyspark/daemon\.py(?:(?!/millstream/).)*\n"
        r"BrokenPipeError: \[Errno 32\] Broken pipe\s*\Z",
        None,
        # PySpark's daemon forks the Python workers of a JVM and reports each one's exit to
        # the JVM over a pipe; when the JVM is gone (its worker process group killed, or the
        # query torn down), the daemon's write fails with BrokenPipeError. PySpark's own
        # noise; no Millstream frame in it.
        "PySpark logs it when its JVM went away under the daemon",
    ),
    _allow(
        "pyspark Python process timed out connecting back to its JVM",
        r"\[CANNOT_OPEN_SOCKET\] Can not open socket: .*timed out",
        None,
        # Spark starts a Python process per streaming source (and Python workers for tasks)
        # and gives each a few seconds to connect back. On two cores running two JVMs, a
        # restarting JVM and a broker, that can time out: the query fails and the worker
        # restarts the writer from the shard uppers (the campaign's checks cover the rest).
        "an overloaded machine; the writer restarts",
    ),
    _allow(
        "writer fenced or gapped by a rollback",
        r"millstream\.errors\.(?:WriterFencedError|ShardGapError)",
        {"rollback"},
        # A rollback bumps the shard's epoch and moves its upper back: a writer that
        # bootstrapped before it is fenced (or finds a gap) at its next commit, and its runner
        # restarts the query from the shard uppers. Spark prints the sink's traceback.
        "the designed restart after a rollback",
    ),
    _allow(
        "metadata store connection cut",
        r"(?:OperationalError|InterfaceError)[^\n]*(?:Connection reset by peer|server closed the "
        r"connection|consuming input failed|connection failed|connection is (?:closed|lost)|"
        r"terminating connection|timeout expired)",
        {"cut_pg", "stall_pg"},
        # A writer's read (its standby gate) or commit, or a REST request, failed on a
        # connection the campaign cut: the query fails and the worker restarts the writer
        # from the shard uppers; a commit with an unknown outcome is reconciled by re-reading.
        "a metadata store connection the campaign cut",
    ),
    _allow(
        "metadata store unreachable when a process opens it",
        r"MetadataStoreUnavailableError: could not reach the metadata store",
        {"cut_pg", "stall_pg"},
        # A process opening the store (a sink's first commit in a new Python worker, a
        # worker starting) while the campaign refuses connections: migrate() retries 5 times
        # in 0.25 s, then says the store is unreachable. The batch fails and the writer
        # restarts.
        "the store refused connections while a process opened it",
    ),
    _allow(
        "deep store (S3) connection cut",
        r"OSError[^\n]*(?:AWS Error|curlCode|Connection reset|Couldn't connect|timed out|"
        r"Timeout was reached)",
        {"cut_s3", "stall_s3"},
        # A staged file's upload, a seal or a read failed on an S3 connection the campaign cut
        # or stalled: the batch or seal fails and is retried.
        "an S3 connection the campaign cut",
    ),
)


#: A line the JVM wrote: a Spark log line, a Java stack frame, a Java exception's header.
_JVM_LINE = re.compile(
    r"\d\d/\d\d/\d\d \d\d:\d\d:\d\d [A-Z]+ |\t(?:at |\.\.\. )|Caused by: |\s+Suppressed: |"
    r"(?:org|java|javax|scala|com)\.[\w.$]+(?:Exception|Error|Throwable)\b"
)


def _traceback_blocks(text: str) -> list[tuple[str, str]]:
    """Every Python traceback in ``text`` (one quoted in a Spark error too), as (the whole
    block, its exception line): from the ``Traceback`` line through its frames (indented by
    two spaces) and chained exceptions to the final exception line. A ``Traceback`` line with
    no frame after it (a log message quoting an error's first line) is not one."""
    # A JVM and its Python processes write to the same log: drop the JVM's lines first, so one
    # landing in the middle of a Python traceback does not cut it short (a quoted Python
    # traceback in a Java exception's message is kept).
    lines = [
        line
        for line in text.splitlines()
        if not _JVM_LINE.match(line) or "Traceback (most recent call last)" in line
    ]
    blocks: list[tuple[str, str]] = []
    i = 0
    while i < len(lines):
        if "Traceback (most recent call last):" not in lines[i]:
            i += 1
            continue
        j = i + 1
        while True:
            while j < len(lines) and lines[j].startswith("  "):
                j += 1
            chained = (
                j + 2 < len(lines)
                and not lines[j + 1].strip()
                and lines[j + 2].startswith(("During handling of", "The above exception"))
            )
            if not chained:
                break
            j += 3
            while j < len(lines) and (not lines[j].strip() or lines[j].startswith("Traceback (")):
                j += 1
        block = lines[i : j + 1]
        if any(line.startswith("  File ") for line in block):
            blocks.append(("\n".join(block), lines[j] if j < len(lines) else ""))
        i = j + 1
    return blocks


def _summary(block: str, exception: str) -> str:
    frames = [ln.strip() for ln in block.splitlines() if ln.startswith("  File ")]
    return f"{exception.strip()[:300]} ({frames[-1][:200] if frames else ''})"


# -- the campaign --------------------------------------------------------------------------


class _Abort(Exception):
    """The cluster did not recover: the run goes straight to its final checks."""


#: Why a re-ingestion may fail without anything being wrong: the segment was sealed, rolled
#: back or re-ingested meanwhile (its compare-and-set refuses), or a connection the campaign
#: cut or stalled failed it.
_EXPECTED_REINGEST_FAILURE = re.compile(
    r"changed|conflict|not found|no longer|compare-and-set|connection|timed out|timeout|"
    r"AWS Error|unavailable|OperationalError",
    re.I,
)
#: A worker starting a writer whose previous query still runs in its SparkSession: that query
#: outlived the writer's stop (the worker gave up joining it and released its state directory).
_ZOMBIE_QUERY_RE = re.compile(
    r"Cannot start query with name (\S+) as a query with that name is already active"
)
_SEAL_FAULT_RE = re.compile(
    r"(?:seal of|cleanup of) (\S+) partition (\d+).*fault injected at (\w+) \(\d+\)"
)
_STARTED_MARKERS = {
    "worker": "joined the controller",
    "controller": "REST API on",
}


def service_log_tails(home: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of every service log of the cluster under ``home``."""
    parts = []
    for path in sorted((home / "logs").glob("*.log")):
        text = [
            line
            for line in path.read_text(errors="replace").splitlines()
            if not line.startswith(("\tat ", "\t... "))  # Java stack frames
        ]
        parts.append(f"--- {path}:\n" + "\n".join(text[-lines:]))
    return "\n".join(parts)


class _Campaign:
    def __init__(
        self,
        *,
        seed: int,
        servers: Servers,
        home: Path,
        metadata: Metadata,
        log: CampaignLog,
        rate: float,
        master: str,
        proxies: bool,
        modes: Sequence[Mode],
    ) -> None:
        self.seed = seed
        self.servers = servers
        self.home = home
        self.metadata = metadata
        self.log = log
        self.rate = rate
        self.master = master
        self.stack = contextlib.ExitStack()
        self.proxies: dict[str, TcpProxy] = {}
        self.streams = tuple(st for st in STREAMS if st.mode in modes)
        if not self.streams:
            raise ValueError(f"no datastream mode among {modes!r}; choose from {ALL_MODES}")
        self.models = {st.key: LifecycleModel() for st in self.streams}
        #: Set once a schedule's failover check is done (lanes touching its datastream wait).
        self.failover_checked = threading.Event()
        self.specs: dict[str, DatastreamSpec] = {}
        self.injected: set[str] = set()
        #: Services the campaign took down on purpose and has not restarted yet.
        self.down: set[str] = set()
        self.down_lock = threading.Lock()
        self.scanned: dict[Path, int] = {}
        self.ctl_port = free_port()
        self.producer: SteadyProducer | None = None
        #: orders_mt: its topics' producers and the single-topic spec of each one's table, by
        #: table (the topic schedule 0 creates joins them then); its topic name prefix
        self.mt_producers: dict[str, SteadyProducer] = {}
        self.mt_members: dict[str, DatastreamSpec] = {}
        self.mt_prefix = ""
        self.mt_lock = threading.Lock()
        self.failover_stream: str | None = None
        self._setup_backend(proxies)
        self.api = Api(f"http://127.0.0.1:{self.ctl_port}")
        self.api.http.timeout = httpx.Timeout(HTTP_TIMEOUT_S)

    # -- setup -------------------------------------------------------------------------------

    def _setup_backend(self, proxies: bool) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        env: dict[str, str] = {}
        if self.metadata == "sqlite":
            url = f"sqlite:///{self.home / 'metadata.db'}"
            self.check_url, self.deep_store, self.s3_endpoint = (
                url,
                str(self.home / "deepstore"),
                None,
            )
        else:
            pg, s3 = self.servers.postgres, self.servers.s3
            if pg is None or s3 is None:
                raise ValueError("the postgresql backend needs servers.postgres and servers.s3")
            db = f"chaos_{self.seed % 10**8}_{uuid.uuid4().hex[:6]}"
            self.check_url = pg.create_database(db)
            bucket = f"chaos-{uuid.uuid4().hex[:12]}"
            s3.create_bucket(bucket)
            self.deep_store, self.s3_endpoint = f"s3://{bucket}/warehouse", s3.endpoint
            url, endpoint = self.check_url, s3.endpoint
            if proxies:
                pg_proxy = self.stack.enter_context(TcpProxy(pg.port, name="postgres"))
                s3_proxy = self.stack.enter_context(TcpProxy(s3.port, name="s3"))
                self.proxies = {"pg": pg_proxy, "s3": s3_proxy}
                url = pg.database_url(db).replace(f":{pg.port}/", f":{pg_proxy.port}/")
                endpoint = f"http://{s3_proxy.address}"
            for k, v in (
                ("AWS_ACCESS_KEY_ID", s3.access_key),
                ("AWS_SECRET_ACCESS_KEY", s3.secret_key),
                ("AWS_DEFAULT_REGION", s3.region),
            ):
                os.environ.setdefault(k, v)  # this process's checker reads the deep store too
                env[k] = os.environ[k]
            env.update(MILLSTREAM_DEEP_STORE=self.deep_store, MILLSTREAM_S3_ENDPOINT=endpoint)
        self.cluster = Cluster(home=self.home, metadata_url=url, env=env)
        self.stack.callback(self.cluster.close)

    def setup(self) -> None:
        broker = self.servers.broker
        topic = f"chaos-orders-{self.seed % 10**8}-{uuid.uuid4().hex[:6]}"
        broker.create_topic(topic, PARTITIONS)
        self._start_controller()
        self._wait("the controller leads", self._leader, 60)
        rng = random.Random(f"{self.seed}/setup")
        for w in WORKERS:
            armed = _seal_faults(rng)
            self._start_worker(w, armed)
            self.log.out(f"  {w} starts with {FAULTS_ENV}={armed}")
        self.cat = self.stack.enter_context(
            Catalog.open(
                home=self.home,
                metadata_url=self.check_url,
                deep_store=self.deep_store,
                s3_endpoint=self.s3_endpoint,
            )
        )
        self.producer = SteadyProducer(
            broker.bootstrap, topic, orders_config(self.seed), rate=self.rate, rounds_s=0.25
        ).start()
        self.mt_prefix = f"chaos-mt-{self.seed % 10**8}-{uuid.uuid4().hex[:6]}"
        for st in self.streams:
            body = orders_spec(
                st.name,
                broker.bootstrap,
                topic,
                trigger_interval=TRIGGER,
                replicas=2,
                replica_mode="standby" if st.multi else st.mode,
                segments=SEGMENTS,
            )
            if st.multi:
                del body["source"]["topic"]
                body["source"]["topic_pattern"] = re.escape(self.mt_prefix) + r"\.t\d+"
                body["source"]["topic_poll_interval"] = "2s"
            self.specs[st.key] = DatastreamSpec.parse(body)
            if st.multi:
                for t in MT_TOPICS:
                    self._new_mt_topic(t)
            r = self.api.post("/datastreams", body)
            if r.status_code != 201 or r.json().get("state") != "INITIALIZING":
                raise _Abort(f"creating {st.name}: {r.status_code} {r.text}")
        # The JVMs start meanwhile: the writers start as soon as they heartbeat.
        self._wait("both workers heartbeat", lambda: self._alive() == set(WORKERS), START_S)
        self.log.out(f"  +{self.log.elapsed():.1f}s both workers heartbeat")
        for st in self.streams:
            self._wait(f"{st.name} is READY", partial(self._in_state, st, {State.READY}), 60)
            self._wait(
                f"{st.name} has an active and a standby, one per worker",
                partial(self._placed, st),
                60,
            )
        self._wait(
            "rows appear in every table",
            lambda: all(self._has_rows(st) for st in self.streams),
            START_S,
        )
        self._wait("both workers run every writer", self._all_running, START_S)

    def _new_mt_topic(self, table: str) -> None:
        """Create orders_mt's topic of ``table`` and start producing into it."""
        topic = f"{self.mt_prefix}.{table}"
        self.servers.broker.create_topic(topic, MT_PARTITIONS)
        cfg = dataclasses.replace(  # 2% bad records: every table's dead-letter check counts
            orders_config(self.seed + 1 + int(table[1:])),
            partitions=MT_PARTITIONS,
            malformed_fraction=0.02,
        )
        producer = SteadyProducer(
            self.servers.broker.bootstrap, topic, cfg, rate=MT_RATE, rounds_s=0.25
        )
        spec = self.specs.get("mt")
        with self.mt_lock:
            self.mt_producers[table] = producer.start()
            if spec is not None:
                self.mt_members[table] = spec.table_for(topic)

    def _mt_topic_created(self, i: int, delay: float) -> None:
        """Schedule ``i`` (0): orders_mt's 4th topic appears ``delay`` seconds in; its table
        must be found, made and caught up like the others, with no restart."""
        time.sleep(delay)
        try:
            self._new_mt_topic(MT_NEW_TOPIC)
        except Exception as exc:
            self.log.anomaly(i, "campaign", f"creating orders_mt's topic {MT_NEW_TOPIC}: {exc!r}")
            return
        self.log.out(
            f"  +{self.log.elapsed():.1f}s schedule {i}: topic {self.mt_prefix}.{MT_NEW_TOPIC} "
            "created (orders_mt gets a table for it)"
        )

    def _tables(self, st: Stream) -> list[str]:
        """The tables ``st`` writes: its one table, or orders_mt's topics' so far."""
        if not st.multi:
            return [st.name]
        with self.mt_lock:
            return sorted(self.mt_producers)

    def _producers(self, st: Stream) -> dict[str, SteadyProducer]:
        """Per table of ``st``: the producer of its topic."""
        if not st.multi:
            assert self.producer is not None
            return {st.name: self.producer}
        with self.mt_lock:
            return dict(self.mt_producers)

    def _ends(self, st: Stream) -> dict[Any, int]:
        """The end offsets of ``st``'s topics, keyed as :meth:`_uppers`."""
        if not st.multi:
            assert self.producer is not None
            return self.producer.ends()
        return {
            (t, p): end for t, prod in self._producers(st).items() for p, end in prod.ends().items()
        }

    def _has_rows(self, st: Stream) -> bool:
        uppers = self._uppers(st)
        if not st.multi:
            return sum(uppers.values()) > 0
        return all(
            any(uppers.get((t, p), 0) for p in range(MT_PARTITIONS)) for t in self._tables(st)
        )

    # -- reading the cluster (directly from the metadata store: the checks must not depend on
    #    the controller or the proxies the faults hit) -------------------------------------------

    def _state(self, st: Stream) -> State | None:
        rec = Registry(self.cat.store).find(st.name)
        return None if rec is None else rec.state

    def _last_error(self, st: Stream) -> str | None:
        rec = Registry(self.cat.store).find(st.name)
        return None if rec is None else rec.last_error

    def _in_state(self, st: Stream, states: set[State]) -> bool:
        return self._state(st) in states

    def _placed(self, st: Stream) -> bool:
        """An active and a standby, one on each worker."""
        placement = self._placement(st)
        return sorted(placement) == sorted(WORKERS) and sorted(placement.values()) == [
            "active",
            "standby",
        ]

    def _all_running(self) -> bool:
        """Both workers heartbeat and run a writer of every datastream (of each table of
        orders_mt)."""
        return self._alive() == set(WORKERS) and all(
            self._writing(st, alive_only=True, table=t) == set(WORKERS)
            for st in self.streams
            for t in (self._tables(st) if st.multi else [None])
        )

    def _reached(self, st: Stream, ends: dict[int, int]) -> bool:
        return all_reached(self._uppers(st), ends)

    def _gone(self, st: Stream) -> bool:
        return self.api.http.get(f"/datastreams/{st.name}").status_code == 404

    @staticmethod
    def _job_done(api: Api, job: str) -> dict[str, Any] | None:
        """Re-ingestion job ``job`` once it is no longer RUNNING."""
        return next(
            (j for j in api.get("/reingestJobs") if j["id"] == job and j["state"] != "RUNNING"),
            None,
        )

    def _placement(self, st: Stream) -> dict[str, str]:
        return {w: role for w, role in self.cat.store.read_assignments().get(st.name, [])}

    def _current(self, w: WorkerInfo) -> bool:
        """Whether ``w``'s last heartbeat came from its running process (not from one that was
        killed, nor from the one a restart replaced)."""
        svc = self.cluster.services.get(w.id)
        return svc is not None and svc.running and w.heartbeat_at >= svc.started_at

    def _alive(self) -> set[str]:
        """Workers heartbeating within the worker TTL from their running process."""
        now = time.time()
        return {
            w.id
            for w in list_workers(self.cat.store)
            if w.alive(now, WORKER_TTL) and self._current(w)
        }

    def _writing(self, st: Stream, *, alive_only: bool, table: str | None = None) -> set[str]:
        """Workers whose last heartbeat, from their running process, reports a writer of
        ``st`` running: within the worker TTL, or (without ``alive_only``) older too (a frozen
        or blocked worker may resume and commit). A heartbeat from a process that is gone
        (killed, or replaced by a restart that has not heartbeaten yet) does not count."""
        return {w for w, _ in self._writer_reports(st, alive_only=alive_only, table=table)}

    def _writer_reports(
        self, st: Stream, *, alive_only: bool, table: str | None = None
    ) -> list[tuple[str, str]]:
        """(worker, what its heartbeat says) for :meth:`_writing` (of ``table`` alone: one
        table of orders_mt)."""
        now = time.time()
        out = []
        for w in list_workers(self.cat.store):
            writers = [
                x
                for x in w.info.get("writers", [])
                if x.get("datastream") == st.name
                and x.get("running")
                and (table is None or x.get("table") == table)
            ]
            alive = w.alive(now, WORKER_TTL)
            if writers and self._current(w) and (alive or not alive_only):
                age = now - w.heartbeat_at
                out.append((w.id, f"{w.id}: heartbeat {age:.1f}s ago, alive {alive}, {writers}"))
        return out

    def _uppers(self, st: Stream) -> dict[Any, int]:
        """The shard uppers of ``st``'s table by partition (orders_mt: by (table, partition);
        a table not made yet has none)."""
        if not st.multi:
            try:
                return {sh.partition: sh.upper for sh in self.cat.store.list_shards(st.name)}
            except Exception:
                return {}
        out: dict[Any, int] = {}
        for t in self._tables(st):
            with contextlib.suppress(Exception):
                out.update({(t, sh.partition): sh.upper for sh in self.cat.store.list_shards(t)})
        return out

    def _leader(self) -> bool:
        try:
            return bool(self.api.get("/health")["leader"])
        except (httpx.HTTPError, KeyError, ValueError):
            return False

    def _appends_since(
        self, st: Stream, t0: float, tables: Sequence[str] | None = None
    ) -> list[tuple[int, str | None]]:
        tv = s.table_versions
        with self.cat.store.read() as conn:
            rows = conn.execute(
                select(tv.c.manifest_version, tv.c.writer_id).where(
                    tv.c.table_name.in_(list(tables if tables is not None else self._tables(st))),
                    tv.c.operation == "append",
                    tv.c.committed_at > t0,
                )
            ).all()
        return [(int(v), w) for v, w in rows]

    def _wait(self, what: str, probe: Callable[[], Any], timeout: float) -> Any:
        """Poll ``probe`` until truthy; on timeout raise :class:`_Abort` naming ``what``. Any
        error counts as not yet (a store read during a fault: look again)."""
        return wait_until(what, probe, timeout=timeout, retry_on=(Exception,), failure=_Abort)

    # -- services ------------------------------------------------------------------------------

    def _start_controller(self) -> Service:
        return self.cluster.controller(
            CONTROLLER, lease_ttl=LEASE_TTL, worker_ttl=WORKER_TTL, port=self.ctl_port
        )

    def _start_worker(self, w: str, seal_faults: str = "") -> Service:
        env = {FAULTS_ENV: seal_faults} if seal_faults else {}
        return self.cluster.worker(
            w, f"http://127.0.0.1:{self.ctl_port}", master=self.master, env=env
        )

    def _service_started(self, svc: Service) -> bool:
        """Whether the service's latest start got as far as serving (its log says so)."""
        marker = _STARTED_MARKERS["controller" if svc.name == CONTROLLER else "worker"]
        try:
            text = svc.log_path.read_text(errors="replace")
        except OSError:
            return False
        return marker in text[text.rfind("\n=== ") :]

    def _ensure_services(self, i: int) -> None:
        """Restart every service that is not running (recovery, not a fault); one that exited on
        its own after it had started is an anomaly."""
        for name in (CONTROLLER, *WORKERS):
            svc = self.cluster.services.get(name)
            if svc is None or svc.running:
                continue
            with self.down_lock:
                expected = name in self.down
                self.down.discard(name)
            code = svc.proc.returncode if svc.proc is not None else None
            if not expected and self._service_started(svc):
                self.log.anomaly(
                    i, "service exited", f"{name} exited on its own (code {code}); restarting it"
                )
            else:
                self.log.out(f"  recovery: {name} is not running (code {code}); restarting it")
            if name == CONTROLLER:
                self._start_controller()
                self._wait("the controller leads again", self._leader, 60)
            else:
                self._start_worker(name)

    # -- lanes ---------------------------------------------------------------------------------

    def _resolve(self, role: tuple[str, str]) -> str | None:
        placement = self._placement(BY_KEY[role[0]])
        return next((w for w, r in placement.items() if r == role[1]), None)

    def _process(self, i: int, a: Action) -> None:
        p = a.params
        if a.kind in ("kill_controller", "freeze_controller"):
            svc = self.cluster.services[CONTROLLER]
            if a.kind == "kill_controller":
                with self.down_lock:
                    self.down.add(CONTROLLER)
                svc.kill()
                self.log.fault(i, "kill", CONTROLLER, "SIGKILL of its process group")
                time.sleep(p["restart_after"])
                with self.down_lock:
                    self.down.discard(CONTROLLER)
                self._start_controller()
            else:
                svc.freeze()
                longer = "longer" if p["seconds"] > LEASE_TTL else "shorter"
                self.log.fault(
                    i,
                    "freeze",
                    CONTROLLER,
                    f"SIGSTOP {p['seconds']:.1f}s ({longer} than the lease TTL)",
                )
                time.sleep(p["seconds"])
                self._thaw(i, svc)
            self._wait("the controller leads again", self._leader, 60)
            return
        w = self._resolve(p["role"])
        st = BY_KEY[p["role"][0]]
        role = f"{p['role'][1]} of {st.name}"
        if w is None or not self.cluster.services[w].running:
            self.log.out(
                f"  schedule {i}: no running worker is the {role} (placement "
                f"{self._placement(st)}); {a.kind} skipped"
            )
            return
        svc = self.cluster.services[w]
        if a.kind == "freeze_worker":
            svc.freeze()
            longer = "longer" if p["seconds"] > WORKER_TTL else "shorter"
            self.log.fault(
                i,
                "freeze",
                w,
                f"SIGSTOP {p['seconds']:.1f}s, {role} ({longer} than the worker TTL)",
            )
            time.sleep(p["seconds"])
            self._thaw(i, svc)
            return
        # kill_active / kill_worker
        other = next(x for x in WORKERS if x != w)
        check = a.kind == "kill_active" and other in self._writing(st, alive_only=True)
        uppers = self._uppers(st)
        with self.down_lock:
            self.down.add(w)
        killed_at = svc.kill()
        self.log.fault(i, "kill", w, f"SIGKILL of its process group, {role}")
        restart_at = time.monotonic() + p["restart_after"]
        if check:
            self._check_failover(i, st, w, other, killed_at, uppers)
        elif a.kind == "kill_active":
            self.log.out(f"  schedule {i}: {other} ran no writer of {st.name}: no failover check")
        self.failover_checked.set()
        time.sleep(max(0.0, restart_at - time.monotonic()))
        with self.down_lock:
            self.down.discard(w)
        restarted = time.time()
        self._start_worker(w, p["seal_faults"])
        if check:
            late = [
                v
                for v, t in commits_by(self.cat.store, st.name, w, after=killed_at)
                if t < restarted
            ]
            if late:
                self.log.anomaly(
                    i, "failover", f"{w} committed to {st.name} after its SIGKILL: versions {late}"
                )

    def _thaw(self, i: int, svc: Service) -> None:
        stopped = svc.thaw()
        if stopped:  # the campaign's own failure: say so, and try again
            self.log.anomaly(
                i, "campaign", f"{svc.name}: PIDs {stopped} still stopped after SIGCONT"
            )
            svc.signal(signal.SIGCONT, also=stopped)

    def _check_failover(
        self, i: int, st: Stream, dead: str, standby: str, killed_at: float, uppers: dict[int, int]
    ) -> None:
        """Once ``dead`` stops heartbeating, the other replica of ``st`` (its standby, or the
        other active) is the one active left, and commits."""
        try:
            self._wait(
                f"{standby} is promoted to active of {st.name} once {dead} stops heartbeating",
                lambda: self._placement(st) == {standby: "active"},
                WORKER_TTL + 30,
            )
            self._wait(
                f"{standby} commits to {st.name} and its uppers advance past {uppers}",
                lambda: (
                    commits_by(self.cat.store, st.name, standby, after=killed_at)
                    and any(self._uppers(st).get(q, 0) > u for q, u in uppers.items())
                ),
                90,
            )
            self.log.out(f"  schedule {i}: {standby} took over {st.name} and commits")
        except _Abort as exc:
            self.log.anomaly(i, "failover", str(exc))

    def _command(self, i: int, api: Api, st: Stream, cmd: str) -> int | None:
        """Send a lifecycle command (a fault), check its answer against the lifecycle model;
        returns the status (None: no answer, or a 5xx: the outcome is unknown)."""
        try:
            r = api.post(f"/datastreams/{st.name}/{cmd}")
        except httpx.HTTPError as exc:
            status: int | None = None
            state, detail = None, f"-> no answer ({type(exc).__name__})"
        else:
            status, body = r.status_code, _json(r)
            state = body.get("state") if status == 200 else None
            detail = f"-> {status} {state or body.get('error', r.text[:80])}".rstrip()
        unchanged = status == 503 and _json(r).get("error") == "MetadataStoreUnavailableError"
        if status is not None and status >= 500:
            status = None  # the outcome is unknown
        # A lifecycle command is one transaction: one the store did not answer changed nothing.
        problem = "" if unchanged else self.models[st.key].apply(Command(cmd), status, state)
        self.log.fault(i, cmd, st.name, detail)
        if problem:
            self.log.anomaly(i, "lifecycle", f"{st.name}: {problem}")
        return status

    def _rest(self, i: int, a: Action, api: Api) -> None:
        p = a.params
        st = BY_KEY[p["stream"]]
        if a.kind == "storm":
            for key, cmd, gap in p["commands"]:
                self._command(i, api, BY_KEY[key], cmd)
                time.sleep(gap)
        elif a.kind == "pause_hold" and "table" in p:
            self._pause_hold_table(i, api, st, p["table"], p["hold"])
        elif a.kind == "pause_hold":
            self._pause_hold(i, api, st, p["hold"])
        elif a.kind == "rollback":
            self._rollback(
                i, api, st, p["partition"], p["depth"], p["paused_for"], table=p.get("table")
            )
        else:
            self._reingest(i, api, st, p["picks"])

    def _paused_tables(self, st: Stream) -> tuple[str, ...]:
        rec = Registry(self.cat.store).find(st.name)
        return () if rec is None else rec.paused_tables

    def _table_command(self, i: int, api: Api, st: Stream, table: str, cmd: str) -> int | None:
        """Pause or resume one table of orders_mt (a fault); its status (None: no answer, or a
        5xx). A 200 whose record does not say what was asked is an anomaly."""
        try:
            r = api.post(f"/datastreams/{st.name}/tables/{table}/{cmd}")
        except httpx.HTTPError as exc:
            self.log.fault(i, f"table {cmd}", f"{st.name}.{table}", f"-> no answer ({exc!r})")
            return None
        body = _json(r)
        self.log.fault(
            i, f"table {cmd}", f"{st.name}.{table}", f"-> {r.status_code} {body.get('error', '')}"
        )
        if r.status_code == 200 and (table in body.get("paused_tables", [])) != (cmd == "pause"):
            self.log.anomaly(i, "lifecycle", f"{cmd} of {st.name} table {table} answered {body}")
        return r.status_code if r.status_code < 500 else None

    def _pause_table(self, i: int, api: Api, st: Stream, table: str) -> bool:
        """Pause one table of ``st``; whether it is paused (an answer lost to a cut connection
        is looked up in the store, and the command sent again for up to 20 s)."""
        deadline = time.monotonic() + 20.0
        while time.monotonic() < deadline:
            status = self._table_command(i, api, st, table, "pause")
            if status is not None:
                return table in self._paused_tables(st)
            time.sleep(1.0)
            with contextlib.suppress(Exception):
                if table in self._paused_tables(st):
                    return True
        return False

    def _table_uppers(self, table: str) -> dict[int, int]:
        try:
            return {sh.partition: sh.upper for sh in self.cat.store.list_shards(table)}
        except Exception:
            return {}

    def _pause_hold_table(self, i: int, api: Api, st: Stream, table: str, hold: float) -> None:
        """Pause one table of orders_mt; once no worker runs its writer, it commits nothing
        although its topic grows, while another table of the datastream commits; resume."""
        if not self._pause_table(i, api, st, table):
            return
        try:
            self._wait(
                f"no worker runs the writer of {st.name} table {table} while it is paused",
                lambda: not self._writing(st, alive_only=False, table=table),
                90,
            )
        except _Abort as exc:
            self.log.anomaly(i, "pause", str(exc))
        else:
            producer = self._producers(st)[table]
            others = [t for t in self._tables(st) if t != table]
            t0, uppers, produced = time.time(), self._table_uppers(table), producer.count()
            before = {t: self._table_uppers(t) for t in others}
            time.sleep(hold)
            try:  # the others are not held back (a standby takes over within the worker TTL)
                moved = self._wait(
                    f"another table of {st.name} commits while table {table} is paused",
                    lambda: [t for t in others if self._table_uppers(t) != before[t]],
                    WORKER_TTL + 60,
                )
            except _Abort as exc:
                moved = []
                if self._state(st) is State.READY:
                    self.log.anomaly(i, "pause", str(exc))
            appends, now = self._appends_since(st, t0, [table]), self._table_uppers(table)
            if producer.count() <= produced:
                self.log.out(f"  schedule {i}: the producer stalled; the pause check is void")
            elif appends or now != uppers:
                self.log.anomaly(
                    i,
                    "pause",
                    f"{st.name} table {table} committed while paused: versions {appends}, "
                    f"uppers {uppers} -> {now}",
                )
            else:
                self.log.out(
                    f"  schedule {i}: {st.name} table {table} PAUSED, nothing committed in "
                    f"{hold:.1f}s; tables {moved} committed meanwhile"
                )
        self._table_command(i, api, st, table, "resume")

    def _pause(self, i: int, api: Api, st: Stream) -> bool:
        """Pause ``st``; whether it is PAUSED. An answer lost to a cut connection is looked up
        in the store, and the command sent again (for up to 20 s) if it did not land."""
        deadline = time.monotonic() + 20.0  # outlasts a schedule's cuts of the store
        while time.monotonic() < deadline:
            status = self._command(i, api, st, "pause")
            if status == 200:
                return True
            if status is not None:
                return self._state(st) is State.PAUSED
            time.sleep(1.0)
            with contextlib.suppress(Exception):
                if self._state(st) is State.PAUSED:
                    return True
        return False

    def _pause_hold(self, i: int, api: Api, st: Stream, hold: float) -> None:
        """Pause; once no writer runs, nothing commits although records keep arriving."""
        if not self._pause(i, api, st):
            return
        try:
            self._wait(
                f"no worker runs a writer of {st.name} while it is PAUSED",
                lambda: not self._writing(st, alive_only=False),
                90,
            )
        except _Abort as exc:
            self.log.anomaly(i, "pause", str(exc))
        else:
            assert self.producer is not None
            t0, uppers, produced = time.time(), self._uppers(st), self.producer.count()
            time.sleep(hold)
            appends, now = self._appends_since(st, t0), self._uppers(st)
            if self.producer.count() <= produced:
                self.log.out(f"  schedule {i}: the producer stalled; the pause check is void")
            elif appends or now != uppers:
                self.log.anomaly(
                    i,
                    "pause",
                    f"{st.name} committed while PAUSED: versions {appends}, uppers {uppers} -> {now}",
                )
            else:
                self.log.out(f"  schedule {i}: {st.name} PAUSED, nothing committed in {hold:.1f}s")
        self._command(i, api, st, "resume")

    def _rollback(
        self,
        i: int,
        api: Api,
        st: Stream,
        partition: int,
        depth: int,
        paused_for: float,
        *,
        table: str | None = None,
    ) -> None:
        """Pause (orders_mt: ``table`` alone), roll ``partition`` back ``depth`` segments,
        resume."""
        name = table or st.name
        if not (self._pause_table(i, api, st, name) if table else self._pause(i, api, st)):
            return
        for _ in range(3):  # a seal finishing meanwhile renumbers the tail: look again
            try:
                segs = api.get(f"/tables/{name}/segments")["partitions"]
                seqs = sorted(
                    sg["seq"]
                    for pp in segs
                    if pp["partition"] == partition
                    for sg in pp["segments"]
                )
            except (httpx.HTTPError, KeyError, ValueError) as exc:
                self.log.out(f"  schedule {i}: listing segments failed ({exc!r})")
                time.sleep(1)
                continue
            if not seqs:
                self.log.out(f"  schedule {i}: {name} p{partition} has no segment; no rollback")
                break
            seq = seqs[-min(depth, len(seqs))]
            try:
                r = api.delete(
                    f"/tables/{name}/segments?partition={partition}&fromSequence={seq}&dryRun=false"
                )
            except httpx.HTTPError as exc:
                self.log.fault(
                    i, "rollback", name, f"p{partition} from seq {seq}: no answer ({exc!r})"
                )
                break
            if r.status_code == 200:
                plan = r.json()
                self.log.fault(i, "rollback", name, f"p{partition} from seq {seq}: {_plan(plan)}")
                break
            if r.status_code != 404:
                self.log.out(
                    f"  schedule {i}: rollback {name} p{partition}: {r.status_code} {r.text[:300]}"
                )
                break
        time.sleep(paused_for)
        if table:
            self._table_command(i, api, st, table, "resume")
        else:
            self._command(i, api, st, "resume")

    def _reingest(self, i: int, api: Api, st: Stream, picks: list[float]) -> None:
        for pick in picks:
            # orders_mt: the pick chooses a table, then one of its segments
            tables = self._tables(st)
            scaled = pick * len(tables)
            table, pick = tables[int(scaled)], scaled - int(scaled)
            try:
                segs = api.get(f"/tables/{table}/segments")["partitions"]
                names = sorted(
                    (sg["name"] for pp in segs for sg in pp["segments"]), key=_segment_order
                )
                if not names:
                    self.log.out(f"  schedule {i}: {table} has no segment to re-ingest")
                    return
                name = names[int(pick * len(names))]
                r = api.post(f"/segments/{name}/reingest")
            except (httpx.HTTPError, KeyError, ValueError) as exc:
                self.log.out(f"  schedule {i}: re-ingest request failed ({exc!r})")
                continue
            if r.status_code != 202:
                self.log.out(f"  schedule {i}: re-ingest {name}: {r.status_code} {r.text[:300]}")
                continue
            job = r.json()["id"]
            self.log.fault(i, "reingest", name)
            try:
                done = self._wait(
                    f"re-ingestion job {job} of {name} finishes",
                    partial(self._job_done, api, job),
                    90,
                )
            except _Abort as exc:
                self.log.anomaly(i, "reingest", str(exc))
                continue
            if done["state"] == "FAILED" and not _EXPECTED_REINGEST_FAILURE.search(done["error"]):
                self.log.anomaly(i, "reingest", f"re-ingestion of {name} failed: {done['error']}")
            elif done["state"] == "FAILED":
                self.log.out(f"  schedule {i}: re-ingest of {name} FAILED: {done['error']}")
            else:
                self.log.out(f"  schedule {i}: re-ingested {name} ({done['result']})")

    def _network(self, i: int, a: Action) -> None:
        p = a.params
        which = "pg" if a.kind.endswith("_pg") else "s3"
        proxy = self.proxies[which]
        target = "postgresql" if which == "pg" else "s3"
        if a.kind.startswith("cut_"):
            for seconds, gap in p["outages"]:
                refused = proxy.refused
                live = proxy.down(seconds)
                self.log.fault(
                    i,
                    "cut",
                    target,
                    f"reset {live} live connections, refusing new ones {seconds:.1f}s",
                )
                time.sleep(seconds)
                self.log.out(
                    f"  schedule {i}: {target} refused {proxy.refused - refused} connections"
                )
                time.sleep(gap)
        else:
            proxy.stall()
            self.log.fault(i, "stall", target, f"no byte forwarded for {p['seconds']:.1f}s")
            time.sleep(p["seconds"])
            proxy.resume()

    # -- one schedule --------------------------------------------------------------------------

    def schedule(self, i: int) -> None:
        actions = draw_schedule(
            self.seed, i, network=bool(self.proxies), streams=[st.key for st in self.streams]
        )
        self.log.schedule(i, " | ".join(a.describe() for a in actions))
        self.injected |= {a.kind for a in actions}
        by_lane = {a.lane: a for a in actions}
        process = by_lane["process"]
        self.failover_stream = process.params["role"][0] if process.kind == "kill_active" else None
        if self.failover_stream is None:
            self.failover_checked.set()
        else:
            self.failover_checked.clear()
        first = by_lane.pop("process") if "controller" in by_lane["process"].kind else None
        if first is not None:
            self._lane(i, first)
        threads = [
            threading.Thread(target=self._lane, args=(i, a), name=f"lane-{a.lane}", daemon=True)
            for a in by_lane.values()
        ]
        if i == 0 and any(st.multi for st in self.streams):  # a topic appears mid-schedule
            delay = random.Random(f"{self.seed}/{i}/topic").uniform(1.0, 6.0)
            threads.append(
                threading.Thread(
                    target=self._mt_topic_created, args=(i, delay), name="new-topic", daemon=True
                )
            )
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
            if t.is_alive():
                self.log.anomaly(i, "campaign", f"{t.name} did not finish within 300 s")
        self.recover(i)

    def _lane(self, i: int, a: Action) -> None:
        time.sleep(a.delay)
        touches = {a.params.get("stream")} | {k for k, _, _ in a.params.get("commands", [])}
        if a.lane != "process" and self.failover_stream in touches:
            # The failover check needs that datastream READY: strike once it is done.
            self.failover_checked.wait(180)
        api = Api(f"http://127.0.0.1:{self.ctl_port}")
        api.http.timeout = httpx.Timeout(HTTP_TIMEOUT_S)
        try:
            if a.lane == "process":
                self._process(i, a)
            elif a.lane in ("rest", "side"):
                self._rest(i, a, api)
            else:
                self._network(i, a)
        except _Abort as exc:
            self.log.anomaly(i, a.kind, str(exc))
        except Exception as exc:  # a campaign bug, or a fault the campaign did not expect
            self.log.anomaly(i, "campaign", f"{a.describe()} raised {exc!r}")
        finally:
            api.close()
            if a.lane == "process":
                self.failover_checked.set()

    def recover(self, i: int) -> None:
        """Bring the cluster back (services, lifecycle) and check what must hold after each
        schedule. Raises :class:`_Abort` if it does not come back."""
        began = time.monotonic()
        for proxy in self.proxies.values():
            proxy.resume()
        self._ensure_services(i)
        self._wait("the controller leads", self._leader, 60)
        for st in self.streams:
            model = self.models[st.key]
            want = model.settled()
            try:
                self._wait(
                    f"{st.name} settles in {sorted(want)} (last command: {model.last})",
                    partial(self._in_state, st, want),
                    SETTLE_S,
                )
            except _Abort as exc:
                self.log.anomaly(i, "lifecycle", f"{exc} (last error: {self._last_error(st)})")
            if self._state(st) is not State.READY:
                r = self.api.post(f"/datastreams/{st.name}/resume")
                if r.status_code != 200:
                    raise _Abort(f"recovery could not resume {st.name}: {r.status_code} {r.text}")
            model.possible, model.last = {State.READY}, "resume"
            for table in self._paused_tables(st):  # a table pause whose resume did not land
                r = self.api.post(f"/datastreams/{st.name}/tables/{table}/resume")
                if r.status_code != 200:
                    raise _Abort(
                        f"recovery could not resume {st.name} table {table}: {r.status_code} "
                        f"{r.text}"
                    )
        settled = time.monotonic()
        self._ensure_services(i)
        self._wait("both workers heartbeat and run every writer", self._all_running, RECOVER_S)
        running = time.monotonic()
        ends = {st.key: self._ends(st) for st in self.streams}
        self._catch_up(i, ends)
        done = time.monotonic()
        self.log.out(
            f"  schedule {i}: recovered in {done - began:.0f}s (lifecycle settled "
            f"{settled - began:.0f}s, writers running {running - settled:.0f}s, caught up "
            f"{done - running:.0f}s)"
        )
        self.scan_logs(i)

    def _lag(self, ends: dict[str, dict[Any, int]]) -> str:
        """How far each table's uppers are behind ``ends`` (per datastream), and what the
        workers report."""
        lags = []
        for st in self.streams:
            uppers = self._uppers(st)
            lag = {
                p: end - uppers.get(p, 0)
                for p, end in ends[st.key].items()
                if uppers.get(p, 0) < end
            }
            lags.append(f"{st.name} behind by {lag}")
        now = time.time()
        for w in list_workers(self.cat.store):
            writers = [
                f"{x['datastream']}:{x['role']}{'' if x.get('running') else ' (stopped)'}"
                + (f" error {x['error'][:120]!r}" if x.get("error") else "")
                for x in w.info.get("writers", [])
            ]
            lags.append(f"{w.id} heartbeat {now - w.heartbeat_at:.0f}s ago: {writers}")
        return "; ".join(lags)

    def _catch_up(self, i: int, ends: dict[str, dict[Any, int]]) -> None:
        """Wait until every shard upper reaches ``ends`` (per datastream); say how far behind
        every 20 s."""
        began = time.monotonic()
        said = began
        while not all(all_reached(self._uppers(st), ends[st.key]) for st in self.streams):
            now = time.monotonic()
            if now - began > FRONTIER_S:
                raise _Abort(
                    f"the shard uppers did not reach the end offsets {ends} within "
                    f"{FRONTIER_S:.0f}s (a wedged frontier): {self._lag(ends)}"
                )
            if now - said >= 20:
                said = now
                self.log.out(
                    f"  schedule {i}: catching up for {now - began:.0f}s: {self._lag(ends)}"
                )
            time.sleep(0.25)

    # -- logs ----------------------------------------------------------------------------------

    def scan_logs(self, i: int) -> None:
        """In what the service logs gained since the last scan: count the seal faults the
        workers hit; flag unexpected tracebacks, and writers whose query outlived their stop."""
        for path in sorted(self.cluster.logs.glob("*.log")):
            try:
                with path.open("rb") as fh:
                    fh.seek(self.scanned.get(path, 0))
                    data = fh.read()
            except OSError:
                continue
            cut = data.rfind(b"\n") + 1  # whole lines only; the rest next time
            self.scanned[path] = self.scanned.get(path, 0) + cut
            text = data[:cut].decode("utf-8", errors="replace")
            for m in _SEAL_FAULT_RE.finditer(text):
                self.log.fault(i, SEAL_FAULT, path.stem, f"{m.group(3)} {m.group(1)} p{m.group(2)}")
            for m in _ZOMBIE_QUERY_RE.finditer(text):
                self.log.anomaly(
                    i,
                    "zombie query",
                    f"{path.name}: {m.group(0)!r}: the query of a writer the worker stopped is "
                    "still running (a stop that lands while the runner (re)starts its query "
                    "does not stop the new one)",
                )
            for block, exception in _traceback_blocks(text):
                allowed = next(
                    (
                        a
                        for a in ALLOWED_TRACEBACKS
                        if a.pattern.search(block) and (a.needs is None or a.needs & self.injected)
                    ),
                    None,
                )
                if allowed is None:
                    self.log.anomaly(i, "traceback", f"{path.name}: {_summary(block, exception)}")

    # -- the end -------------------------------------------------------------------------------

    def final(self, i: int, recovered: bool) -> None:
        """Stop producing; check the frontier, the tables, the manifest and the lifecycle."""
        if not recovered:
            with contextlib.suppress(_Abort):
                self._ensure_services(i)
        assert self.producer is not None
        for producer in [self.producer, *self.mt_producers.values()]:
            try:
                producer.stop()
            except AssertionError as exc:
                self.log.anomaly(i, "producer", f"{producer.topic}: {exc}")
        records = list(self.producer.records)
        self.log.out(
            f"final checks: {len(records)} records produced, end offsets {self.producer.ends()}"
        )
        for st in self.streams:
            ends = self._ends(st)
            try:
                self._wait(
                    f"the uppers of {st.name} reach the end offsets {ends}",
                    partial(self._reached, st, ends),
                    FRONTIER_S,
                )
            except _Abort as exc:
                self.log.anomaly(i, "frontier", str(exc))
                continue
            uppers = self._uppers(st)
            if uppers != ends:
                self.log.anomaly(i, "frontier", f"{st.name}: uppers {uppers} != end offsets {ends}")
            checks = (
                [
                    (t, self.mt_members[t], list(prod.records))
                    for t, prod in self._producers(st).items()
                ]
                if st.multi
                else [(st.name, self.specs[st.key], records)]
            )
            problems = []
            for table, spec, recs in checks:
                try:
                    problem = table_vs_source(self.cat, spec, recs)
                except Exception as exc:
                    problem = f"reading the tables failed: {exc!r}"
                if problem:
                    problems.append(f"{table}: {problem} ({len(recs)} records)")
            total = sum(len(recs) for _, _, recs in checks)
            if problems:
                self.log.anomaly(i, "table", f"{st.name}: {'; '.join(problems)}")
            elif st.multi:
                self.log.out(
                    f"  {st.name} equals the model of its {len(checks)} topics ({total} "
                    "records), a table each"
                )
            else:
                self.log.out(f"  {st.name} equals the model of {total} records")
        self._check_claims(i)
        self._stop_and_delete(i)
        self.scan_logs(i)
        for name, svc in self.cluster.services.items():
            if not svc.running and name not in self.down:
                self.log.anomaly(i, "service exited", f"{name} is not running at the end")

    def _check_claims(self, i: int) -> None:
        now = time.time()
        for st in self.streams:
            for table in (t for base in self._tables(st) for t in (base, dead_letter_name(base))):
                stuck = [
                    e.name
                    for e in self.cat.manifest(table).entries
                    if e.state is SegmentState.COMMITTING and not e.claim_held(now)
                ]
                if stuck:
                    self.log.anomaly(
                        i, "claims", f"{table}: COMMITTING past the claim's expiry: {stuck}"
                    )

    def _stop_and_delete(self, i: int) -> None:
        for st in self.streams:
            try:
                r = self.api.post(f"/datastreams/{st.name}/stop")
                if r.status_code != 200 or r.json()["state"] != "STOPPING":
                    self.log.anomaly(i, "stop", f"{st.name}: {r.status_code} {r.text}")
                    continue
                self._wait(
                    f"{st.name} is STOPPED", partial(self._in_state, st, {State.STOPPED}), 90
                )
                live = self._writer_reports(st, alive_only=True)
                if live:
                    self.log.anomaly(
                        i,
                        "stop",
                        f"{st.name} STOPPED while a live worker reports its writer running: "
                        + "; ".join(r for _, r in live),
                    )
                silent = [r for r in self._writer_reports(st, alive_only=False) if r not in live]
                if silent:
                    # STOPPED means no *live* worker runs a writer; a worker silent for longer
                    # than the worker TTL counts as dead. Its process may still be stopping the
                    # writer (its reconcile loop, which also heartbeats, blocks on the query's
                    # stop): worth seeing, not a broken contract.
                    self.log.out(
                        f"  note: {st.name} STOPPED while a worker silent for longer than the "
                        "worker TTL still reports its writer running: "
                        + "; ".join(r for _, r in silent)
                    )
                r = self.api.delete(f"/datastreams/{st.name}")
                if r.status_code != 202 or r.json()["state"] != "DELETING":
                    self.log.anomaly(i, "delete", f"{st.name}: {r.status_code} {r.text}")
                    continue
                self._wait(
                    f"{st.name} is gone (404)",
                    partial(self._gone, st),
                    60,
                )
                if self._placement(st):
                    self.log.anomaly(i, "delete", f"{st.name} still placed: {self._placement(st)}")
                self.log.out(f"  {st.name}: STOPPED, then deleted (404)")
            except (_Abort, httpx.HTTPError, KeyError, ValueError) as exc:
                self.log.anomaly(i, "stop/delete", f"{st.name}: {exc}")

    def close(self) -> None:
        for producer in [*([self.producer] if self.producer else []), *self.mt_producers.values()]:
            with contextlib.suppress(AssertionError):
                producer.stop()
        self.api.close()
        self.stack.close()


def _json(r: httpx.Response) -> dict[str, Any]:
    """The response's JSON object, or {} (a 500 from the server's own handler is text)."""
    try:
        body = r.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _plan(plan: dict[str, Any]) -> str:
    upper, epoch = plan["upper"], plan["epoch"]
    return (
        f"{len(plan['removed_segments'])} segments removed, upper {upper['from']} -> "
        f"{upper['to']}, epoch {epoch['from']} -> {epoch['to']}"
    )


def _segment_order(name: str) -> tuple[int, int]:
    _, partition, seq = name.rsplit("__", 2)
    return int(partition), int(seq)


#: Faults the workers hit at the sealer's armed points (``MILLSTREAM_FAULTS``), counted
#: apart from the ones the campaign strikes itself.
SEAL_FAULT = "seal-fault"


def fault_counts(log: CampaignLog) -> str:
    """``kind count`` of every fault kind in ``log``, most frequent first."""
    counts: dict[str, int] = {}
    for f in log.faults:
        counts[f.kind] = counts.get(f.kind, 0) + 1
    return ", ".join(f"{k} {n}" for k, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def struck(log: CampaignLog) -> int:
    """Faults the campaign struck itself (every one but the seal faults the workers hit)."""
    return sum(1 for f in log.faults if f.kind != SEAL_FAULT)


def run_process_campaign(
    *,
    seed: int,
    log: CampaignLog,
    metadata: Metadata = "sqlite",
    minutes: float | None = None,
    min_faults: int = 30,
    min_schedules: int = 1,
    max_schedules: int | None = None,
    servers: Servers | None = None,
    home: Path | None = None,
    rate: float = RATE,
    master: str = "local[1]",
    proxies: bool = True,
    modes: Sequence[Mode] = ALL_MODES,
) -> CampaignLog:
    """Run the process-level campaign ``seed`` and check its outcome; every fault and anomaly
    goes to ``log`` (returned, finished). Schedules run until ``min_faults`` faults were
    injected, ``min_schedules`` ran and, if given, ``minutes`` have passed (or
    ``max_schedules`` ran, or the cluster did not recover from one).

    ``metadata``: ``sqlite`` (a SQLite file and a local deep store under ``home``) or
    ``postgresql`` (a database of ``servers.postgres`` and a bucket of ``servers.s3``, reached
    through :class:`TcpProxy` proxies unless ``proxies`` is false, which leaves out the network
    lane). ``servers``: started under ``home/servers`` by :func:`campaign_servers` if not given.
    ``home``: the cluster's home (service logs under ``home/logs``); a new temporary directory
    if not given. Every process the campaign started is stopped by its PID before it returns.
    """
    home = home or Path(tempfile.mkdtemp(prefix="millstream-chaos-"))
    with contextlib.ExitStack() as stack:
        if servers is None:
            servers = stack.enter_context(campaign_servers(home / "servers", metadata))
        backend = "SQLite + local deep store" if metadata == "sqlite" else "PostgreSQL + S3 (moto)"
        log.begin(
            f"{backend}; a controller and workers {', '.join(WORKERS)} ({master}); datastreams "
            f"{', '.join(f'{st.name} ({st.mode})' for st in STREAMS if st.mode in modes)}, "
            "replicas 2; "
            f"{rate:.0f} records/s over {PARTITIONS} partitions; logs under {home / 'logs'}"
        )
        campaign = _Campaign(
            seed=seed,
            servers=servers,
            home=home,
            metadata=metadata,
            log=log,
            rate=rate,
            master=master,
            proxies=proxies,
            modes=modes,
        )
        stack.callback(campaign.close)
        i, recovered = 0, True
        try:
            campaign.setup()
        except Exception as exc:
            log.anomaly(0, "setup", f"the cluster did not come up: {exc}")
            log.finish()
            return log
        log.out(f"cluster up after {log.elapsed():.0f}s")
        try:
            while max_schedules is None or i < max_schedules:
                if (
                    len(log.faults) >= min_faults
                    and i >= min_schedules
                    and (minutes is None or log.elapsed() >= minutes * 60)
                ):
                    break
                campaign.schedule(i)
                i += 1
        except _Abort as exc:
            recovered = False
            log.anomaly(i, "recovery", f"{exc}; no further schedules")
        except Exception as exc:  # a campaign bug: still run the final checks
            recovered = False
            log.anomaly(i, "campaign", f"schedule {i} raised {exc!r}; no further schedules")
        try:
            campaign.final(i, recovered)
        except Exception as exc:
            log.anomaly(i, "final checks", f"raised {exc!r}")
        log.out(f"faults by kind: {fault_counts(log)}")
        log.finish()
    return log
