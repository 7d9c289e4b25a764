"""The commit-path campaign: the production code that changes a table, run by several threads at
once against one metadata store, with crashes, freezes and failed commits between and inside
their steps. No Spark JVM: hundreds of schedules a minute.

One schedule is one fresh datastream (a generator source with updates, deletes, duplicates and
bad records; an append, upsert, dedup or partial table; 1-3 partitions; a short retention) and
these actors, each a thread with its own metadata-store engine (as separate processes have),
drawing its steps from ``Random(f"{seed}/{schedule}/{actor}")``:

* **writers** (1-3, replicas of one pipeline, active-active): bootstrap from the shards
  (:func:`millstream.spark.runner.bootstrap`), plan micro-batches with the stream source
  (:class:`millstream.spark.sources.StreamReader`), stage them with the segment sink's
  ``write`` and commit them with its ``commit`` (:class:`millstream.spark.sink.SegmentSink`):
  the code a Spark task and the Spark driver run, called directly. Faults: crash after staging
  (the files stay behind), crash after committing (the batch is replayed, as Spark replays a
  batch missing from its commit log), a freeze between staging and committing (sometimes past
  the staged-file age limit), and a COMMIT that fails before or after it lands (an unknown
  outcome).
* **sealers** (1-2, as a worker per replica has): :meth:`millstream.sealing.sealer.Sealer.
  seal_partition` and :meth:`~millstream.sealing.sealer.Sealer.compact_partition` (compaction
  of sealed segments) with injected failures at their named fault points and freezes at them
  (sometimes past the claim's expiry, so another sealer takes the run over and the frozen
  one's swap must be refused; a compaction past garbage collection's grace period); each with
  its own key-index cache.
* an **operator** (in schedule 0 of every seed and in most others): rollbacks of a recent
  segment (:meth:`MetadataStore.rollback_partition`) and re-ingests of a live
  segment from the source (:func:`millstream.sealing.reingest.reingest_segment`), each at least
  once, while everything else runs; a step waits for a live segment to act on.
* a **maintainer**: expiry (:meth:`MetadataStore.expire_versions`) and garbage
  collection (:func:`millstream.table.gc.collect_garbage`) with a grace period twice the
  staged-file age limit, as in production; in every other schedule (even index), every
  other round it also publishes the table's Iceberg view (:func:`millstream.table.iceberg.publish`, as table maintenance and the workers'
  publisher do) and collects the view's garbage
  (:func:`millstream.table.iceberg.collect_view_garbage`).
* a **reader**: reads the current version and an older one while the maintainer expires and
  collects; in the schedules that publish, every other round it also loads the published
  Iceberg view (pyiceberg) and reads its current snapshot and its oldest one.
* the **lifecycle**: an operator thread sending pause/resume/stop commands and two controller
  threads applying the asynchronous completions (:class:`millstream.control.registry.Registry`)
  from a state they read a moment earlier (Brooklin #974).

The checker, after every schedule (an anomaly names the check and what differed):

* **frontier**: a clean writer then reaches the source's end in both tables within a bound
  (nothing wedged);
* **claims**: a clean sealer seals every partition once the claims have expired, and no entry
  stays COMMITTING;
* **model**: the table equals the sequential model of every record of the source, and the
  dead-letter table holds exactly the bad records, once each;
* **snapshots**: every reader's read of the current version equalled the model of the source
  below that version's ends; an older version read whole or failed with VersionExpiredError;
* **history**: every version retention keeps reads without a missing file after a final
  garbage collection (a file missing before it is missing after it too), which leaves no
  unreferenced file behind;
* **view** (the schedules that publish): every Iceberg snapshot a reader loaded during the schedule equalled the model of
  the source below its version's ends (recorded when it was published); the current snapshot
  never referenced a missing file, nor one whose version is kept. At the end a publish shows
  the current version; after the final garbage collection of data and view files the newest
  :data:`VIEW_READS` retained snapshots read as their models, no retained snapshot (nor a
  kept earlier metadata file) references a missing file, and no unreferenced view file is
  left;
* **lifecycle**: the datastream ends in the state its last applied command implies;
* **errors**: no actor raised anything but the errors its step may legitimately raise.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from pyiceberg.table import StaticTable

from harness.chaos.log import CampaignLog
from harness.fault_points import at_commit, at_sealer
from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.config import Settings
from millstream.control.registry import Registry
from millstream.core.lifecycle import Command, State
from millstream.datastream import DatastreamSpec, dead_letter_spec
from millstream.errors import (
    CommitConflictError,
    CommitStateUnknownError,
    InjectedFault,
    InvalidTransitionError,
    NotFoundError,
    SegmentChangedError,
    SegmentUnavailableError,
    ShardGapError,
    StagedFileExpiredError,
    VersionExpiredError,
    WriterFencedError,
)
from millstream.faults import COMPACTION_POINTS, SEAL_POINTS
from millstream.ingest.sources import config_for
from millstream.ingest.sources.generator import ORDERS_SCHEMA, GeneratorConfig, generate
from millstream.metastore.iceberg import IcebergPointer
from millstream.metastore.models import Manifest, SegmentState
from millstream.metastore.store import StoreRegistry
from millstream.reference.model import Row, canonical
from millstream.reference.oracle import RawRecord, expected_table
from millstream.sealing.compaction import CompactionPolicy
from millstream.sealing.keyindex import IndexCache
from millstream.sealing.reingest import reingest_segment
from millstream.sealing.sealer import Sealer
from millstream.sealing.thresholds import Thresholds
from millstream.spark.options import SPLIT_MIN_RECORDS, SinkOptions, SourceOptions
from millstream.spark.runner import bootstrap
from millstream.spark.sink import SegmentSink, SinkMessage
from millstream.spark.sources import StreamReader
from millstream.storage.deepstore import table_data_prefix
from millstream.table.gc import collect_garbage
from millstream.table.iceberg import (
    DeepStoreIO,
    collect_view_garbage,
    location,
    publish,
    referenced_view_files,
    relative,
    view_prefix,
)
from millstream.table.read import read_manifest

#: How long a sealer's claim holds; a frozen sealer is taken over after this.
CLAIM_TTL = 0.6
#: The seal fault points at which the sealer holds its claim (a freeze there keeps the run
#: claimed while writers commit behind it).
CLAIMED_POINTS = ("before_build", "before_upload", "before_swap")
#: Where a seal or a compaction may be made to fail.
FAULT_POINTS = SEAL_POINTS + COMPACTION_POINTS
#: The oldest staged file a commit accepts, and garbage collection's grace period (twice that,
#: as in production: 1800 s and 3600 s).
MAX_STAGED_AGE = 0.8
GC_GRACE = 2 * MAX_STAGED_AGE
#: Bounds of the checker's recovery steps.
DRAIN_SECONDS = 60.0
ACTOR_JOIN_SECONDS = 60.0

MODES: dict[str, dict[str, Any]] = {
    "append": {"mode": "append"},
    "upsert": {
        "primary_key": ["order_id"],
        "mode": "upsert",
        "comparison_column": "updated_at",
        "delete_column": "is_deleted",
    },
    "upsert-latest": {"primary_key": ["order_id"], "mode": "upsert", "delete_column": "is_deleted"},
    "dedup": {"primary_key": ["order_id"], "mode": "dedup", "delete_column": "is_deleted"},
    "partial": {
        "primary_key": ["order_id"],
        "mode": "partial",
        "delete_column": "is_deleted",
        "partial": {"amount": "sum", "customer": "append", "updated_at": "max"},
    },
}
#: What each actor's steps may raise without it being an anomaly, and why.
WRITER_RESTARTS = (
    ShardGapError,  # a peer or a rollback moved the upper: restart from it
    WriterFencedError,  # a rollback bumped the epoch
    StagedFileExpiredError,  # frozen too long between staging and committing
    CommitStateUnknownError,  # an injected COMMIT failure a re-read could not resolve
    CommitConflictError,  # lost every compare-and-set to peers
)
SEALER_EXPECTED = (
    InjectedFault,
    SegmentChangedError,  # a peer, a rollback or a re-ingest changed the run
    CommitConflictError,
    CommitStateUnknownError,
)
OPERATOR_EXPECTED = (
    NotFoundError,
    SegmentChangedError,
    CommitConflictError,
    StagedFileExpiredError,
)


class InjectedCommitFailure(RuntimeError):
    """A COMMIT made to fail by the campaign (before or after it reached the database)."""


@dataclass(frozen=True, slots=True)
class Plan:
    """One schedule's setup, drawn from the seed."""

    index: int
    mode: str
    partitions: int
    total: int
    source_seed: int
    key_cardinality: int
    writers: int
    sealers: int
    operator: bool
    maintainer: bool
    reader: bool
    lifecycle: bool
    steps: int
    retention: str
    min_versions: int

    @classmethod
    def draw(cls, seed: int, index: int) -> Plan:
        rng = random.Random(f"{seed}/{index}/plan")
        partitions = rng.randint(1, 3)
        return cls(
            index=index,
            mode=rng.choice(sorted(MODES)),
            partitions=partitions,
            total=partitions * rng.randint(30, 120),
            source_seed=rng.randrange(2**31),
            key_cardinality=rng.choice([6, 20, 80]),
            writers=rng.randint(1, 3),
            # Two sealers in most schedules: one frozen holding its claim while the other
            # tries the same partition is the race seed 003 is about.
            sealers=rng.choice([1, 2, 2, 2]),
            # Schedule 0 of every seed has one, so every run rolls back and re-ingests.
            operator=rng.random() < 0.6 or index == 0,
            maintainer=rng.random() < 0.7,
            reader=rng.random() < 0.5,
            lifecycle=rng.random() < 0.5,
            steps=rng.randint(4, 12),
            retention=rng.choice(["1s", "2s", "1h"]),
            min_versions=rng.choice([1, 2, 5]),
        )

    def describe(self) -> str:
        extras = [
            n
            for n, on in (
                ("operator", self.operator),
                ("maintainer", self.maintainer),
                ("reader", self.reader),
                ("lifecycle", self.lifecycle),
            )
            if on
        ]
        return (
            f"{self.mode}, {self.partitions} partitions, {self.total} records "
            f"(keys {self.key_cardinality}), {self.writers} writers, {self.sealers} sealers"
            f"{', ' + ', '.join(extras) if extras else ''}; {self.steps} steps each; "
            f"retention {self.retention}/{self.min_versions}"
        )


@dataclass
class Schedule:
    """One running schedule: its tables, source, log and the actors' shared state."""

    plan: Plan
    settings: Settings
    log: CampaignLog
    name: str = ""
    spec: DatastreamSpec | None = None
    config: GeneratorConfig | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    #: set once every writer finished its steps (sealers, readers and maintenance run until)
    writers_done: threading.Event = field(default_factory=threading.Event)
    #: frozen actors wait on this; set when the schedule ends (they then resume at once)
    thaw: threading.Event = field(default_factory=threading.Event)
    lifecycle_log: list[tuple[int, Command, State]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    records: list[RawRecord] = field(default_factory=list)
    #: the ends of every manifest version a publish may have shown, by version (the model of
    #: its snapshot, once retention has expired the version itself)
    view_ends: dict[int, dict[int, int]] = field(default_factory=dict)

    @property
    def view(self) -> bool:
        """Whether this schedule publishes and reads the Iceberg view: every other one (the
        publishes and the view's reads cost about a fifth of a schedule's time)."""
        return self.plan.index % 2 == 0

    @property
    def ds(self) -> DatastreamSpec:
        assert self.spec is not None
        return self.spec

    @property
    def table(self) -> str:
        return self.ds.table_spec().name

    @property
    def dead_table(self) -> str:
        return dead_letter_spec(self.table).name

    def fault(self, kind: str, target: str, detail: str = "") -> None:
        self.log.fault(self.plan.index, kind, target, detail)

    def anomaly(self, check: str, detail: str) -> None:
        self.log.anomaly(self.plan.index, check, f"{self.name}: {detail}")

    def catalog(self) -> Catalog:
        """A catalog with its own metadata-store engine, as another process has."""
        return Catalog.open(settings=self.settings)

    def freeze(self, seconds: float) -> None:
        """A SIGSTOP'd process: nothing happens for ``seconds`` (or until the schedule is
        given up on)."""
        self.thaw.wait(seconds)


def _source(plan: Plan) -> tuple[dict[str, Any], GeneratorConfig]:
    cfg = GeneratorConfig(
        seed=plan.source_seed,
        partitions=plan.partitions,
        total=plan.total,
        key_cardinality=plan.key_cardinality,
        update_fraction=0.3,
        delete_fraction=0.08,
        duplicate_fraction=0.05,
        malformed_fraction=0.04,
    )
    return {"kind": "generator", **asdict(cfg)}, cfg


def _records(cfg: GeneratorConfig, ends: dict[int, int] | None = None) -> list[RawRecord]:
    assert cfg.total is not None
    out: list[RawRecord] = []
    for p in range(cfg.partitions):
        n = cfg.total // cfg.partitions + (1 if p < cfg.total % cfg.partitions else 0)
        hi = n if ends is None else min(n, ends.get(p, 0))
        out.extend((p, o, k, v) for o, k, v in generate(cfg, p, 0, hi))
    return out


# -- actors --------------------------------------------------------------------------------


def _writer(sch: Schedule, name: str, rng: random.Random, *, clean: bool = False) -> None:
    """A replica of the pipeline: micro-batches through the stream source and the segment
    sink, restarting from the shards whenever a commit says so (as the runner does)."""
    catalog = sch.catalog()
    stores = StoreRegistry()
    kind, config = config_for(sch.ds.source)
    steps = 0
    limit = 10_000 if clean else sch.plan.steps
    try:
        while steps < limit and not sch.stop.is_set():
            boot = bootstrap(sch.ds, catalog.store)
            source = SourceOptions(
                kind,
                config,
                max_records_per_batch=rng.choice([4, 11, 30, 90]),
                start_offsets=boot.uppers,
                tasks=rng.choice([1, 2]),
                # Small pieces: a batch of fewer partitions than tasks splits a partition's
                # range over both tasks, and the commit chains the pieces (guard 78).
                split_min_records=rng.choice([1, 3, SPLIT_MIN_RECORDS]),
            )
            sink = SinkOptions(
                settings=sch.settings,
                table_spec=sch.ds.table_spec(),
                writer_id=name,
                epochs=boot.epochs,
                dead_letter_epochs=boot.dead_letter_epochs,
                source_kind=kind,
                source_config=config,
                max_staged_age=MAX_STAGED_AGE,  # scaled with GC's grace, as in production
            )
            reader = StreamReader(source)
            start: dict[str, Any] = reader.initialOffset()
            batch_id = 0
            while steps < limit and not sch.stop.is_set():
                steps += 1
                end = reader.latestOffset(start, reader.getDefaultReadLimit())
                if end == start:
                    if clean:
                        return  # caught up with the source
                    time.sleep(0.01)
                    continue
                restart = _micro_batch(sch, name, rng, stores, reader, sink, start, end, batch_id)
                if restart:
                    break
                if not clean:
                    time.sleep(rng.uniform(0, 0.04))  # the trigger interval, compressed
                start = end
                batch_id += 1
    finally:
        stores.close()
        catalog.close()


def _micro_batch(
    sch: Schedule,
    name: str,
    rng: random.Random,
    stores: StoreRegistry,
    reader: StreamReader,
    sink: SinkOptions,
    start: dict[str, Any],
    end: dict[str, Any],
    batch_id: int,
) -> bool:
    """One micro-batch: plan, write every task, commit. Returns whether the writer restarts."""
    clean = name.startswith("drain")
    roll = 1.0 if clean else rng.random()

    def write() -> list[SinkMessage]:
        return [
            SegmentSink(sink, stores).write(reader.read(task))
            for task in reader.partitions(start, end)
        ]

    messages = write()
    if roll < 0.08:
        sch.fault("crash", name, f"after staging batch {batch_id}, before its commit")
        return True
    if roll < 0.16:
        seconds = rng.uniform(0, 2 * MAX_STAGED_AGE)
        sch.fault("freeze", name, f"{seconds:.2f}s between staging and committing")
        sch.freeze(seconds)
    store = stores.get(sch.settings.metadata_url)
    uninstall: Callable[[], None] | None = None
    if 0.16 <= roll < 0.24:
        after = rng.random() < 0.5
        sch.fault("commit-failure", name, f"COMMIT of batch {batch_id} fails {_when(after)}")
        uninstall = at_commit(store, _fail_once(after))
    try:
        SegmentSink(sink, stores).commit(list(messages), batch_id)
    except WRITER_RESTARTS:
        return True
    finally:
        if uninstall is not None:
            uninstall()
    if 0.24 <= roll < 0.32:
        sch.fault("crash", name, f"after committing batch {batch_id}; it is replayed")
        with contextlib.suppress(*WRITER_RESTARTS):
            SegmentSink(sink, stores).commit(list(write()), batch_id)  # replayed: a DROP
        return True
    return False


def _when(after: bool) -> str:
    return "after it landed" if after else "before it landed"


def _fail_once(after: bool) -> Callable[[bool], None]:
    fired = threading.Event()

    def hook(committed: bool) -> None:
        if committed == after and not fired.is_set():
            fired.set()
            raise InjectedCommitFailure(f"injected COMMIT failure ({_when(after)})")

    return hook


def _sealer(sch: Schedule, name: str, rng: random.Random) -> None:
    catalog = sch.catalog()
    frozen: dict[str, float] = {}

    def hook(point: str, partition: int) -> None:
        seconds = frozen.pop(point, None)
        if seconds is not None:
            sch.freeze(seconds)

    sealer = Sealer(
        catalog,
        sch.table,
        thresholds=Thresholds(flush_rows=rng.choice([10, 40, 150]), flush_seconds=0.3),
        claim_ttl=CLAIM_TTL,
        checkpoint_seconds=rng.choice([0.0, 60.0]),
        index_cache=IndexCache(),
        max_failures=2,
        compaction=CompactionPolicy(min_segments=rng.choice([2, 3, 4]), max_segments=6),
    )
    at_sealer(sealer, hook=hook)
    armed: list[Callable[[], None]] = []
    try:
        # Seal while the writers commit: a frozen sealer's run then grows behind its claim.
        while not sch.writers_done.is_set() and not sch.stop.is_set():
            partition = rng.randrange(sch.plan.partitions)
            roll = rng.random()
            if roll < 0.06:
                point = rng.choice(FAULT_POINTS)
                armed.append(at_sealer(sealer, fail={point: 1}))
                sch.fault("seal-failure", name, f"at {point}, partition {partition}")
            elif roll < 0.16:
                point = rng.choice(CLAIMED_POINTS)
                frozen[point] = rng.uniform(0.05, 2.5 * CLAIM_TTL)
                sch.fault("freeze", name, f"{frozen[point]:.2f}s at {point}, partition {partition}")
            elif roll < 0.19:
                # Past garbage collection's grace period: the swap must be refused, or it
                # would reference a merged file GC may already have deleted.
                point = "before_compact_swap"
                frozen[point] = rng.uniform(0.05, 2.0 * GC_GRACE)
                sch.fault("freeze", name, f"{frozen[point]:.2f}s at {point}, partition {partition}")
            with contextlib.suppress(*SEALER_EXPECTED):
                sealer.seal_partition(partition, force=rng.random() < 0.3)
            if rng.random() < 0.4:
                with contextlib.suppress(*SEALER_EXPECTED):
                    sealer.compact_partition(partition)
            while armed:
                armed.pop()()
            frozen.clear()
            time.sleep(rng.uniform(0.01, 0.06))
    finally:
        catalog.close()


#: The operator's kinds, dealt as a seeded shuffle per pass of ``len(OPERATOR_KINDS)`` steps:
#: every operator does each of them at least once.
OPERATOR_KINDS = ("rollback", "reingest")


def _operator(sch: Schedule, name: str, rng: random.Random) -> None:
    """Rollbacks and re-ingests of a recent segment while the writers commit. A step waits
    for a live segment rather than being skipped: on a loaded machine the first commit can come
    after every step would have been drawn, and the campaign would then prove nothing about
    rollbacks."""
    catalog = sch.catalog()
    try:
        steps = max(len(OPERATOR_KINDS), sch.plan.steps // 3)
        deck: list[str] = []
        for _ in range(steps):
            if not deck:
                deck = list(OPERATOR_KINDS)
                rng.shuffle(deck)
            kind = deck.pop()
            time.sleep(rng.uniform(0.02, 0.2))
            live = catalog.manifest(sch.table).entries
            while not live:
                # Nothing to roll back yet (or a rollback emptied the table); once the writers
                # are done nothing more will come, but what they left is read once more: they
                # may have committed again since the last look (a loaded machine).
                if sch.stop.is_set():
                    return
                done = sch.writers_done.wait(0.05)
                live = catalog.manifest(sch.table).entries
                if done and not live:
                    return
            if sch.stop.is_set():
                return
            entry = rng.choice(live[-4:])
            if kind == "rollback":
                sch.fault("rollback", name, f"partition {entry.partition} from seq {entry.seq}")
                with contextlib.suppress(*OPERATOR_EXPECTED):
                    catalog.store.rollback_partition(
                        sch.table, entry.partition, entry.seq, dry_run=False
                    )
            else:
                sch.fault("reingest", name, entry.name)
                with contextlib.suppress(*OPERATOR_EXPECTED):
                    reingest_segment(catalog, sch.ds, entry.name, max_staged_age=MAX_STAGED_AGE)
    finally:
        catalog.close()


def _maintainer(sch: Schedule, name: str, rng: random.Random) -> None:
    catalog = sch.catalog()
    rounds = 0
    try:
        while not sch.writers_done.is_set() and not sch.stop.is_set():
            time.sleep(rng.uniform(0.05, 0.3))
            for t in (sch.table, sch.dead_table):
                catalog.store.expire_versions(t, now=time.time())
                collect_garbage(catalog.store, catalog.deep, t, grace_seconds=GC_GRACE)
            rounds += 1
            if sch.view and rounds % 2 == 1:  # every other round: a publish reads every file
                _publish(sch, catalog)
                collect_view_garbage(
                    catalog.store, catalog.deep, sch.table, grace_seconds=GC_GRACE, now=time.time()
                )
    finally:
        catalog.close()


def _reader(sch: Schedule, name: str, rng: random.Random) -> None:
    catalog = sch.catalog()
    rounds = 0
    try:
        while not sch.writers_done.is_set() and not sch.stop.is_set():
            rounds += 1
            if sch.view and rounds % 2 == 0:
                _read_view(sch, catalog, final=False)
            time.sleep(rng.uniform(0.02, 0.15))
            manifest = catalog.manifest(sch.table)
            try:
                got = read_manifest(catalog.deep, manifest).to_pylist()
            except SegmentUnavailableError as exc:
                if manifest.version >= catalog.store.oldest_kept_version(sch.table):
                    sch.anomaly("snapshots", f"the current version lost a file: {exc}")
                continue
            want = _model_below(sch, manifest)
            if _norm(got) != _norm(want):
                sch.anomaly(
                    "snapshots",
                    f"version {manifest.version} read {len(got)} rows, its model "
                    f"{len(want)} (ends {_ends(manifest)})",
                )
            old = manifest.version - rng.randint(1, 6)
            if old >= 1:
                with contextlib.suppress(VersionExpiredError, NotFoundError):
                    catalog.read_table(sch.table, as_of=old)
    finally:
        catalog.close()


def _ends(manifest: Manifest) -> dict[int, int]:
    ends: dict[int, int] = {}
    for e in manifest.entries:
        ends[e.partition] = max(ends.get(e.partition, 0), e.end)
    return ends


def _model_below(sch: Schedule, manifest: Manifest) -> list[Row]:
    return _model_at(sch, _ends(manifest))


def _model_at(sch: Schedule, ends: dict[int, int]) -> list[Row]:
    assert sch.config is not None
    rows, _ = expected_table(sch.ds.table_spec(), _records(sch.config, ends))
    return rows


def _lifecycle_operator(sch: Schedule, name: str, rng: random.Random) -> None:
    catalog = sch.catalog()
    registry = Registry(catalog.store)
    try:
        for _ in range(sch.plan.steps):
            if sch.stop.is_set():
                return
            time.sleep(rng.uniform(0, 0.04))
            command = rng.choice([Command.PAUSE, Command.RESUME, Command.STOP, Command.RESUME])
            try:
                rec = registry.command(sch.name, command)
            except InvalidTransitionError:
                continue
            sch.fault("command", name, command.value)
            with sch.lock:
                sch.lifecycle_log.append((rec.version, command, rec.state))
    finally:
        catalog.close()


def _lifecycle_controller(sch: Schedule, name: str, rng: random.Random) -> None:
    catalog = sch.catalog()
    registry = Registry(catalog.store)
    try:
        for _ in range(sch.plan.steps * 2):
            if sch.stop.is_set():
                return
            _complete(registry, sch.name, rng.uniform(0, 0.03))
    finally:
        catalog.close()


#: The asynchronous completions a controller applies, by the state it last read.
COMPLETIONS = {State.INITIALIZING: State.READY, State.STOPPING: State.STOPPED}


def _complete(registry: Registry, name: str, delay: float) -> None:
    """Read the state, wait (a slow controller), then apply its completion conditionally."""
    seen = registry.get(name).state
    time.sleep(delay)
    to = COMPLETIONS.get(seen)
    if to is not None:
        registry.complete(name, expected=seen, to=to)


ACTORS: dict[str, Callable[[Schedule, str, random.Random], None]] = {
    "writer": _writer,
    "sealer": _sealer,
    "operator": _operator,
    "maintainer": _maintainer,
    "reader": _reader,
    "lifecycle-operator": _lifecycle_operator,
    "lifecycle-controller": _lifecycle_controller,
}


# -- a schedule ----------------------------------------------------------------------------


def run_schedule(plan: Plan, settings: Settings, log: CampaignLog, *, seed: int) -> None:
    """Set up, run and check one schedule; anomalies go to ``log``."""
    sch = Schedule(plan, settings, log, name=f"chaos-{seed % 10_000}-{plan.index}")
    source, sch.config = _source(plan)
    table_section: dict[str, Any] = {
        "name": f"c{uuid.uuid4().hex[:10]}",
        **MODES[plan.mode],
        "retention": {"time": plan.retention, "min_versions": plan.min_versions},
    }
    sch.spec = DatastreamSpec.parse(
        {"name": sch.name, "source": source, "table": table_section, "schema": dict(ORDERS_SCHEMA)}
    )
    log.schedule(plan.index, f"{sch.table}: {plan.describe()}")
    setup = sch.catalog()
    try:
        setup.create_table(sch.ds.table_spec())
        setup.create_table(dead_letter_spec(sch.table))
        if plan.lifecycle:
            Registry(setup.store).create(sch.ds)
        actors = _actors(plan)
        threads = [
            threading.Thread(
                target=_guarded,
                args=(sch, actor, ACTORS[kind], random.Random(f"{seed}/{plan.index}/{actor}")),
                name=f"{sch.name}-{actor}",
                daemon=True,
            )
            for kind, actor in actors
        ]
        for t in threads:
            t.start()
        deadline = time.monotonic() + ACTOR_JOIN_SECONDS
        for (kind, _), t in zip(actors, threads, strict=True):
            if kind == "writer":
                t.join(max(0.0, deadline - time.monotonic()))
        sch.writers_done.set()
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        sch.stop.set()
        sch.thaw.set()
        stuck = [t.name for t in threads if t.is_alive()]
        if stuck:
            sch.anomaly("errors", f"actors still running after {ACTOR_JOIN_SECONDS:.0f}s: {stuck}")
            return
        _check(sch, setup)
    except Exception as exc:  # the checker itself failed: that is an anomaly too
        sch.anomaly("errors", f"the schedule failed: {_one_line(exc)}\n{traceback.format_exc()}")
    finally:
        sch.stop.set()
        sch.thaw.set()
        setup.close()


def _actors(plan: Plan) -> list[tuple[str, str]]:
    out = [("writer", f"writer-{i}") for i in range(plan.writers)]
    out += [("sealer", f"sealer-{i}") for i in range(plan.sealers)]
    if plan.operator:
        out.append(("operator", "operator"))
    if plan.maintainer:
        out.append(("maintainer", "maintainer"))
    if plan.reader:
        out.append(("reader", "reader"))
    if plan.lifecycle:
        out.append(("lifecycle-operator", "lifecycle-operator"))
        out += [("lifecycle-controller", f"controller-{i}") for i in range(2)]
    return out


def _guarded(
    sch: Schedule,
    actor: str,
    fn: Callable[[Schedule, str, random.Random], None],
    rng: random.Random,
) -> None:
    try:
        fn(sch, actor, rng)
    except Exception as exc:
        sch.anomaly("errors", f"{actor} raised {_one_line(exc)}\n{traceback.format_exc(limit=-6)}")


def _one_line(exc: BaseException) -> str:
    text = str(exc).splitlines()[0][:300] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"


def _check(sch: Schedule, cat: Catalog) -> None:
    """The checker (see the module doc), after the actors stopped or froze."""
    assert sch.config is not None
    # frontier: a clean writer reaches the source's end.
    started = time.monotonic()
    while time.monotonic() - started < DRAIN_SECONDS:
        _writer(_unstopped(sch), "drain", random.Random(0), clean=True)
        if _reached(sch, cat):
            break
    else:
        sch.anomaly("frontier", f"the shards did not reach the source's end in {DRAIN_SECONDS}s")
        return
    # claims: once claims expired, a clean sealer seals every partition.
    time.sleep(CLAIM_TTL)
    # Its own claims last long: nothing else runs now, and a loaded machine builds slowly.
    sealer = Sealer(cat, sch.table, claim_ttl=60.0, index_cache=IndexCache())
    for p in range(sch.plan.partitions):
        try:
            sealer.seal_partition(p, force=True)
        except Exception as exc:
            sch.anomaly("claims", f"a clean seal of partition {p} failed: {_one_line(exc)}")
    stuck = [e.name for e in cat.manifest(sch.table).entries if e.state is not SegmentState.ONLINE]
    if stuck:
        sch.anomaly("claims", f"entries not sealed after a clean seal: {stuck}")
    # model
    spec = sch.ds.table_spec()
    records = _records(sch.config)
    want, bad = expected_table(spec, records)
    got = cat.read_table(sch.table).to_pylist()
    if _norm(got) != _norm(want):
        sch.anomaly("model", _diff(got, want))
    raw_of = {(p, o): v for p, o, _, v in records}
    dead = sorted(
        (r["partition"], r["offset"], r["raw"]) for r in cat.read_table(sch.dead_table).to_pylist()
    )
    dead_want = sorted((p, o, raw_of[(p, o)]) for p, o in bad)
    if dead != dead_want:
        sch.anomaly(
            "model",
            f"dead letters: {len(dead)} rows for {len(dead_want)} bad records "
            f"(first differing {next((a for a, b in zip(dead, dead_want, strict=False) if a != b), None)})",
        )
    # lifecycle
    if sch.plan.lifecycle:
        _check_lifecycle(sch, cat)
    # view: the final publish shows the current version, which reads as the model.
    if sch.view:
        pointer = _publish(sch, cat)
        current = cat.store.get_table(sch.table).manifest_version
        if pointer is None or pointer.manifest_version != current:
            sch.anomaly(
                "view",
                f"the final publish shows version {pointer and pointer.manifest_version}, "
                f"the table is at {current}",
            )
    # Once, after the final collection: a file missing before it is missing after it, too.
    _check_files(sch, cat)
    if sch.view:
        _read_view(sch, cat, final=True)  # after the final collection of data and view files


def _unstopped(sch: Schedule) -> Schedule:
    """The schedule as seen by the checker's own writer: not stopped."""
    clone = Schedule(sch.plan, sch.settings, sch.log, name=sch.name, spec=sch.spec)
    clone.config = sch.config
    return clone


def _reached(sch: Schedule, cat: Catalog) -> bool:
    assert sch.config is not None and sch.config.total is not None
    n, extra = divmod(sch.config.total, sch.plan.partitions)
    want = {p: n + (1 if p < extra else 0) for p in range(sch.plan.partitions)}
    # The dead-letter table's shards move only with a dead letter; the table's upper covers
    # its offsets (the model check counts every bad record once).
    got = {sh.partition: sh.upper for sh in cat.store.list_shards(sch.table)}
    return got == want


def _norm(rows: list[Row]) -> list[Any]:
    """Rows as comparable values; doubles to 9 significant digits (a partial table's sums
    depend on the order the merge adds them in)."""
    return canonical([{k: _value(v) for k, v in r.items()} for r in rows])


def _value(v: Any) -> Any:
    if isinstance(v, float):
        return float(f"{v:.9g}")
    if isinstance(v, datetime):
        return v.astimezone(UTC)  # one tzinfo, so the canonical order does not depend on it
    return v


def _diff(got: list[Row], want: list[Row]) -> str:
    g, w = _norm(got), _norm(want)
    extra = [r for r in g if r not in w][:2]
    missing = [r for r in w if r not in g][:2]
    return (
        f"table has {len(got)} rows, the model {len(want)}: unexpected {extra}, missing {missing}"
    )


def _check_lifecycle(sch: Schedule, cat: Catalog) -> None:
    registry = Registry(cat.store)
    for _ in range(3):
        _complete(registry, sch.name, 0.0)
    final = registry.get(sch.name).state
    with sch.lock:
        applied = sorted(sch.lifecycle_log, key=lambda x: x[0])
    if not applied:
        want = State.READY
    else:
        _, command, _ = applied[-1]
        want = {
            Command.PAUSE: State.PAUSED,
            Command.RESUME: State.READY,
            Command.STOP: State.STOPPED,
        }[command]
    if final is not want:
        sch.anomaly(
            "lifecycle",
            f"ends {final.value}, the last applied command "
            f"({applied[-1][1].value if applied else 'none'}) implies {want.value}",
        )


def _check_files(sch: Schedule, cat: Catalog) -> None:
    """history: after a garbage collection with no grace period (of the data files and the
    view's), every kept version reads and only referenced files are left."""
    for t in (sch.table, sch.dead_table):
        collect_garbage(cat.store, cat.deep, t, grace_seconds=0, clock=ManualClock(start=4e9))
        collect_view_garbage(cat.store, cat.deep, t, grace_seconds=0, now=4e9)
        current = cat.store.get_table(t).manifest_version
        for v in range(cat.store.oldest_kept_version(t), current + 1):
            try:
                cat.read_table(t, as_of=v)
            except Exception as exc:
                sch.anomaly("history", f"{t} version {v} (kept) does not read: {_one_line(exc)}")
                break
        files = {f.path for f in cat.deep.list_files(table_data_prefix(t))}
        orphans = files - cat.store.referenced_files(t)
        if orphans:
            sch.anomaly("history", f"{t}: unreferenced files left: {sorted(orphans)[:3]}")
        view = {f.path for f in cat.deep.list_files(view_prefix(t))}
        orphans = view - referenced_view_files(cat.store, cat.deep, t)
        if orphans:
            sch.anomaly("view", f"{t}: unreferenced view files left: {sorted(orphans)[:3]}")
        other = {f.path for f in cat.deep.list_files(f"tables/{t}")} - files - view
        if other:
            sch.anomaly("history", f"{t}: files outside data and view: {sorted(other)[:3]}")


# -- the Iceberg view ----------------------------------------------------------------------

#: The snapshots the final check reads whole (newest first); every other retained one is
#: checked for missing files only (reading all would cost more than the rest of the check).
VIEW_READS = 4


def _remember(sch: Schedule, manifest: Manifest) -> None:
    with sch.lock:
        sch.view_ends.setdefault(manifest.version, _ends(manifest))


def _publish(sch: Schedule, cat: Catalog) -> IcebergPointer | None:
    """The production publish of the table's current version. The ends of the version it
    shows are recorded first (a reader may load the snapshot before publish returns, and
    after retention expired the version)."""
    before = cat.store.manifest(sch.table)
    _remember(sch, before)
    try:
        pointer = publish(cat.store, cat.deep, sch.table).pointer
    except SegmentUnavailableError as exc:
        # Only a version retention expired meanwhile may have lost a file to GC.
        if before.version >= cat.store.oldest_kept_version(sch.table):
            sch.anomaly("view", f"publish of kept version {before.version}: {_one_line(exc)}")
        return None
    if pointer is not None and pointer.manifest_version not in sch.view_ends:
        with contextlib.suppress(VersionExpiredError, NotFoundError):
            _remember(sch, cat.store.manifest(sch.table, as_of=pointer.manifest_version))
    return pointer


def _read_view(sch: Schedule, cat: Catalog, *, final: bool) -> None:
    """Load the table's current Iceberg metadata, as an engine does, and read snapshots of it
    with pyiceberg: during the schedule the current one and the oldest retained one; in the
    final check the newest :data:`VIEW_READS` whole, and every retained snapshot's files
    (and the earlier metadata files kept for them) are checked to exist."""
    pointer = cat.store.read_pointer(sch.table)
    if pointer is None:
        return
    try:
        table = StaticTable.from_metadata(
            location(cat.deep, pointer.metadata_location), properties=_io_properties(sch)
        )
    except OSError as exc:
        if cat.store.read_pointer(sch.table) == pointer:
            sch.anomaly("view", f"the current metadata file does not load: {_one_line(exc)}")
        return
    ids = sorted((s.snapshot_id for s in table.metadata.snapshots), reverse=True)
    if final:
        reads = ids[:VIEW_READS]
        io = DeepStoreIO(cat.deep)
        oldest = cat.store.oldest_kept_version(sch.table)
        for entry in table.metadata.metadata_log:
            rel = relative(cat.deep, entry.metadata_file)
            head = (rel or "").rsplit("/", 1)[-1].split("-", 1)[0]
            if rel and head.isdigit() and int(head) >= oldest and not cat.deep.exists(rel):
                sch.anomaly("view", f"a retained snapshot's metadata file is gone: {rel}")
        for snap in table.metadata.snapshots:
            try:
                files = [
                    e.data_file.file_path
                    for m in snap.manifests(io)
                    for e in m.fetch_manifest_entry(io)
                ]
            except OSError as exc:  # its manifest list or a manifest is gone
                sch.anomaly("view", f"snapshot {snap.snapshot_id}: {_one_line(exc)}")
                return
            for path in files:
                rel = relative(cat.deep, path)
                if rel is None or not cat.deep.exists(rel):
                    sch.anomaly(
                        "view", f"snapshot {snap.snapshot_id} references a missing file {path}"
                    )
                    return
    else:
        reads = sorted({pointer.manifest_version, *ids[-1:]}, reverse=True)
    for v in reads:
        try:
            got = table.scan(snapshot_id=v).to_arrow().to_pylist()
        except OSError as exc:
            # A snapshot may lose files only once retention expired its version (the current
            # one never: an engine loading the table by name reads it).
            current = v == pointer.manifest_version and cat.store.read_pointer(sch.table) == pointer
            if current or v >= cat.store.oldest_kept_version(sch.table):
                sch.anomaly("view", f"snapshot {v} references a missing file: {_one_line(exc)}")
            continue
        with sch.lock:
            ends = sch.view_ends.get(v)
        if ends is None:
            continue  # expired before its publisher recorded its ends: no model to compare
        want = _model_at(sch, ends)
        if _norm(got) != _norm(want):
            sch.anomaly(
                "view",
                f"snapshot {v} (pointer {pointer.metadata_location}) reads as "
                f"{_diff(got, want)} (ends {ends})",
            )


def _io_properties(sch: Schedule) -> dict[str, str]:
    """pyiceberg's S3 endpoint for a deep store on S3 (credentials from the environment)."""
    endpoint = sch.settings.s3_endpoint
    return {"s3.endpoint": endpoint} if endpoint else {}


# -- a campaign ----------------------------------------------------------------------------


def run_commit_campaign(
    settings: Settings,
    *,
    seed: int,
    schedules: int | None = None,
    minutes: float | None = None,
    parallel: int = 2,
    stop_after: int | None = None,
    log: CampaignLog | None = None,
) -> CampaignLog:
    """Run ``schedules`` schedules (or as many as fit in ``minutes``), ``parallel`` at a time,
    against the metadata store and deep store of ``settings``; start no new schedule once
    ``stop_after`` anomalies were found. Returns the log (faults, anomalies); nothing raises
    for an anomaly."""
    if schedules is None and minutes is None:
        raise ValueError("give schedules or minutes")
    log = log or CampaignLog("commit-path", seed)
    log.begin(
        f"{schedules if schedules is not None else 'as many'} schedules"
        f"{f' in {minutes} minutes' if minutes is not None else ''}, {parallel} at a time, "
        f"metadata {settings.metadata_url.split('@')[-1]}"
    )
    deadline = None if minutes is None else time.monotonic() + minutes * 60

    def indexes() -> Iterator[int]:
        i = 0
        while (
            (schedules is None or i < schedules)
            and (deadline is None or time.monotonic() < deadline)
            and (stop_after is None or len(log.anomalies) < stop_after)
        ):
            yield i
            i += 1

    with ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="schedule") as pool:
        running: set[Any] = set()
        for i in indexes():
            while len(running) >= parallel:
                done = {f for f in running if f.done()}
                if not done:
                    time.sleep(0.01)
                running -= done
            running.add(pool.submit(run_schedule, Plan.draw(seed, i), settings, log, seed=seed))
        for f in running:
            f.result()
    log.finish()
    return log
