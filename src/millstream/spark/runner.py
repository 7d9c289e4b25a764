"""Run one datastream as a Spark streaming query (or, for an available-now run, as Spark jobs:
:mod:`millstream.spark.catch_up`): bootstrap from the shards, check the local checkpoint
against them, start, and restart from the shard upper when fenced or gapped.

**Local state is a cache; the shard is the truth.** A writer always resumes at each shard's
``upper``. The Spark checkpoint is reused only when it agrees with the shards' uppers and
epochs (see :func:`checkpoint_verdict`); otherwise it is discarded with a warning saying why.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import random
import shutil
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.errors import StreamingQueryException

from millstream.catalog import Catalog
from millstream.datastream import DatastreamSpec, dead_letter_spec
from millstream.errors import (
    ShardGapError,
    SparkTransientError,
    StagedFileExpiredError,
    WriterFencedError,
    from_spark_failure,
    transient_spark_failure,
)
from millstream.ingest.sources import config_for, spec_reader
from millstream.metastore.models import Manifest
from millstream.metastore.store import MetadataStore, StoreRegistry
from millstream.sealing.compaction import CompactionPolicy
from millstream.sealing.maintenance import DEFAULT_MAINTENANCE_INTERVAL, Maintainer, Publisher
from millstream.sealing.publishing import PublisherProcess
from millstream.sealing.sealer import Sealer
from millstream.sealing.thresholds import Thresholds
from millstream.spark.catch_up import BatchDone, catch_up
from millstream.spark.options import CommitGate, SinkOptions, SourceOptions
from millstream.spark.session import JobsSession
from millstream.spark.sink import SegmentSink, rotated_log
from millstream.spark.sources import FORMAT as SOURCE_FORMAT
from millstream.spark.sources import StreamReader, tick_seconds
from millstream.spark.table_source import register
from millstream.storage.statedir import StateDirectory
from millstream.supervise import Backoff, SupervisedLoop
from millstream.table.gc import DEFAULT_GRACE_SECONDS, MAX_STAGED_AGE_SECONDS, check_gc_grace

log = logging.getLogger(__name__)

#: Restarts in a row after a fenced, gapped or expired commit (:data:`RESTARTABLE`) with no
#: progress between them (:func:`moved_past`), after which the writer (or a shared query's
#: member) fails with the last error.
MAX_RESTARTS = 10
SIDECAR = "millstream.json"

#: A query that failed on one of Spark's transient failures (a Python process that did not
#: connect back in time: :class:`~millstream.errors.SparkTransientError`) restarts after this
#: backoff: 1 s doubling to a minute, with jitter. Such restarts do not count towards
#: :data:`MAX_RESTARTS`: at load 25-43 they came every few seconds for minutes, and ten in a
#: row ended a run that a restart a little later would have carried on.
TRANSIENT_BACKOFF = Backoff(base=1.0, cap=60.0)
#: Transient failures in a row, with no shard upper moved between them, after which the writer
#: gives up and raises :class:`~millstream.errors.SparkTransientError`: with the backoff and
#: Spark's own 10 s wait for each failed start, about half an hour of failing.
TRANSIENT_MAX_IN_A_ROW = 30


class TransientRestarts:
    """The restarts of a writer (or of a worker's shared query) after Spark's transient
    failures (:func:`~millstream.errors.transient_spark_failure`): each waits a capped
    exponential backoff; they are counted in all (``total``) and in a row (``in_a_row``, which
    ends when a start finds the shard uppers moved since the last one: a batch committed in
    between). ``owner`` names the writer or query in the log and in the error raised when a
    row reaches ``max_in_a_row``."""

    def __init__(
        self,
        owner: str,
        *,
        backoff: Backoff = TRANSIENT_BACKOFF,
        max_in_a_row: int = TRANSIENT_MAX_IN_A_ROW,
        rng: random.Random | None = None,
    ) -> None:
        self.owner = owner
        self.backoff = backoff
        self.max_in_a_row = max_in_a_row
        self.rng = rng or random.Random()
        self.total = 0
        self.in_a_row = 0
        self.last_error: str | None = None
        self.last_at: float | None = None
        #: the backoff of the restart being waited for (seconds), None when none is
        self.waiting: float | None = None
        self._positions: object = None

    def started_at(self, positions: object) -> None:
        """A start at ``positions`` (the shard uppers): a row of failures ends if they moved
        since the last start."""
        if positions != self._positions:
            self.in_a_row = 0
        self._positions = positions

    def failed(self, error: SparkTransientError, cause: BaseException) -> float:
        """Count ``error`` and return the seconds to wait before the restart. Raises a
        :class:`~millstream.errors.SparkTransientError` naming the owner (from ``cause``) when
        it is one more than ``max_in_a_row`` in a row."""
        self.total += 1
        self.in_a_row += 1
        self.last_error = f"{error.condition}: {error.message}"
        self.last_at = time.time()
        if self.in_a_row > self.max_in_a_row:
            raise SparkTransientError(
                error.condition,
                f"{self.owner}: Spark failed {self.in_a_row} times in a row with no commit in "
                f"between ({error.message}); the machine may be too loaded for Spark's Python "
                "processes to start, or the Python Spark runs cannot import pyspark",
                restarts=self.total,
            ) from cause
        return self.backoff.delay(self.in_a_row, self.rng)

    def to_dict(self) -> dict[str, Any]:
        return {
            "transient_restarts": self.total,
            "transient_in_a_row": self.in_a_row,
            "last_transient_error": self.last_error,
            "last_transient_at": self.last_at,
        }


def moved_past(started: dict[int, int], uppers: dict[int, int]) -> bool:
    """True when some partition's shard upper in ``uppers`` is past where it was at a start
    (``started``): a batch committed since that start, and stayed committed."""
    return any(uppers.get(p, at) > at for p, at in started.items())


class RestartsInARow:
    """The restarts of a writer (or of a shared query's member) after a fenced, gapped or
    expired commit, counted in all (``total``) and in a row (``in_a_row``, the one bounded by
    :data:`MAX_RESTARTS`): a restart whose writer committed past where the last start began
    (:func:`moved_past`, or a commit seen since: :meth:`saw`) begins a new row. A writer that
    recovers from each of its rollbacks runs on however many it meets over its life; one that
    restarts without progress fails. The row shown (:meth:`shown`) is 0 once the writer
    committed past where the start after its last restart began."""

    def __init__(self) -> None:
        self.total = 0
        self.in_a_row = 0
        #: a commit past where the start after the last restart began was seen (:meth:`saw`):
        #: the row is over (a rollback below that start later does not hide it)
        self.committed = False
        #: the shard uppers the start after the last restart began at (None until it did)
        self._since: dict[int, int] | None = None

    def began(self, uppers: dict[int, int]) -> None:
        """A start (of the query, or the member's entry in it) at the shard ``uppers``."""
        self._since = dict(uppers)

    def saw(self, uppers: dict[int, int]) -> None:
        """The shard uppers as committed now: past where the last start began, the row is
        over."""
        if self._since is not None and moved_past(self._since, uppers):
            self.committed = True

    def failed(self, progressed: bool) -> int:
        """Count a restart; ``progressed``: the writer committed since its last start. Returns
        the restarts in a row, this one included."""
        if progressed or self.committed:
            self.in_a_row = 0
        self.total += 1
        self.in_a_row += 1
        self.committed, self._since = False, None
        return self.in_a_row

    def shown(self, uppers: Callable[[], dict[int, int]]) -> int:
        """The restarts in a row as a writer's health and metrics report them: 0 once it
        committed past where the start after its last restart began. ``uppers`` (the shard
        uppers as committed now) is read only while that may change the answer; a store that
        does not answer reads as no commit."""
        if self.in_a_row and not self.committed and self._since is not None:
            try:
                self.saw(uppers())
            except Exception:
                log.warning(
                    "reading the shard uppers for the restarts in a row failed", exc_info=True
                )
        return 0 if self.committed else self.in_a_row


@dataclass(frozen=True, slots=True)
class Bootstrap:
    uppers: dict[int, int]
    epochs: dict[int, int]
    dead_letter_epochs: dict[int, int]


def bootstrap(
    spec: DatastreamSpec,
    store: MetadataStore,
    latest: dict[int, int] | None = None,
    earliest: dict[int, int] | None = None,
) -> Bootstrap:
    """The shards' uppers and epochs, where a writer of ``spec`` starts. Every source partition
    gets a shard first (at the position a fresh start would use), so a local checkpoint is
    always compared with an authoritative upper, never trusted for a partition the store knows
    nothing about. ``latest`` is the source's latest offsets if the caller asked for them
    already (a shared query asks for every joining member's at once), else they are asked here;
    ``earliest`` likewise its first offsets (with ``starting_offsets: earliest``).

    The table's and the dead-letter table's shards are created in one transaction, and the
    writer starts each partition at the table's upper. A dead-letter shard moves only with a
    dead letter, so its upper lags the table's after batches without one; every offset below
    the table's upper is covered for dead letters too (a table's range commits only in the
    transaction that records its dead letters: :func:`~millstream.metastore.append.append_txn`),
    so starting at the lower of the two would re-read every batch since the last dead letter
    (on a topic without bad records, its whole history)."""
    table_spec = spec.table_spec()
    table, dl_table = table_spec.name, dead_letter_spec(table_spec.name).name
    reader = spec_reader(spec.source)
    if latest is None:
        latest = reader.latest_offsets()
    if spec.source.starting_offsets != "earliest":
        fresh = latest
    else:
        fresh = earliest if earliest is not None else reader.earliest_offsets()
    starts = {p: fresh.get(p, 0) for p in latest}
    store.ensure_shards(table, starts, together_with=[dl_table])
    shards = {s.partition: s for s in store.list_shards(table)}
    dl = {s.partition: s for s in store.list_shards(dl_table)}
    return Bootstrap(
        uppers={p: sh.upper for p, sh in shards.items()},
        epochs={p: sh.epoch for p, sh in shards.items()},
        dead_letter_epochs={p: sh.epoch for p, sh in dl.items()},
    )


def _read_offsets_file(path: Path) -> dict[int, int] | None:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    if len(lines) < 3:
        return None
    try:
        return {int(p): int(o) for p, o in json.loads(lines[2]).items()}
    except (ValueError, AttributeError):
        return None


def checkpoint_verdict(checkpoint: Path, boot: Bootstrap) -> str | None:
    """None if the checkpoint agrees with the shards; otherwise why it must be discarded.

    With batch N the last one planned (``offsets/N``):
    * if N is committed (``commits/N``), its end must equal every shard's upper;
    * if N is pending, Spark replays it, so its range must contain the upper
      (``start(N) <= upper <= end(N)``; the replay then drops or trims what is persisted);
    * the epochs it was started with must still be the shards' epochs.
    """
    offsets_dir = checkpoint / "offsets"
    if not offsets_dir.is_dir():
        return "it has no offset log"
    batches = sorted(int(f.name) for f in offsets_dir.iterdir() if f.name.isdigit())
    if not batches:
        return "it has no offset log"
    try:
        side = json.loads((checkpoint / SIDECAR).read_text())
    except (OSError, ValueError):
        return f"it has no {SIDECAR} recording the epochs it was started at"
    recorded = {int(k): v for k, v in side.get("epochs", {}).items() if v}
    if recorded != {p: e for p, e in boot.epochs.items() if e}:  # a missing shard is epoch 0
        return f"it was started at epochs {side.get('epochs')} but the shards are at {boot.epochs}"
    n = batches[-1]
    end = _read_offsets_file(offsets_dir / str(n))
    if end is None:
        return f"offsets/{n} is unreadable"
    unknown = sorted(set(end) - set(boot.uppers))
    if unknown:
        return f"it has offsets for partition {unknown[0]} but the store has no shard for it"
    if (checkpoint / "commits" / str(n)).exists():
        for p, upper in boot.uppers.items():
            if end.get(p) != upper:
                return (
                    f"batch {n} ended at offset {end.get(p)} of partition {p} but the shard upper "
                    f"is {upper}"
                )
        return None
    start = _read_offsets_file(offsets_dir / str(n - 1)) if n > 0 else None
    if start is None:
        return f"batch {n} is uncommitted and its start is unknown"
    for p, upper in boot.uppers.items():
        lo, hi = start.get(p), end.get(p)
        if lo is None or hi is None or not lo <= upper <= hi:
            return (
                f"uncommitted batch {n} covers [{lo}, {hi}) of partition {p}, which does not "
                f"contain the shard upper {upper}"
            )
    return None


@dataclass
class RunStats:
    #: restarts after a fenced, gapped or expired commit, in all over the run
    restarts: int = 0
    #: the last of them in a row with no commit in between (bounded by MAX_RESTARTS)
    restarts_in_a_row: int = 0
    #: restarts after Spark's transient failures (not counted in ``restarts``)
    transient_restarts: int = 0
    discarded_checkpoints: list[str] = field(default_factory=list)
    #: ``--available-now`` with pauseless sealing: what the final seal pass did per partition
    #: (:meth:`millstream.sealing.sealer.Sealer.seal_what_is_due`).
    sealing: dict[str, Any] | None = None
    #: The Iceberg views an available-now run published before it exited (per table: its
    #: manifest version and metadata location, or the error), None when it did not publish.
    iceberg: dict[str, Any] | None = None


class DatastreamRunner:
    """Runs one writer of one datastream in a SparkSession."""

    def __init__(
        self,
        spec: DatastreamSpec,
        catalog: Catalog,
        spark: Any,
        *,
        writer_id: str | None = None,
        state_dir: StateDirectory | None = None,
        commit_gate: CommitGate | None = None,
        background_sealing: bool = False,
        maintenance_interval: float = DEFAULT_MAINTENANCE_INTERVAL,
        max_staged_age: float = MAX_STAGED_AGE_SECONDS,
        gc_grace_seconds: float = DEFAULT_GRACE_SECONDS,
        publish_interval: float | None = None,
        member: str | None = None,
    ) -> None:
        check_gc_grace(gc_grace_seconds, max_staged_age, publishes=bool(publish_interval))
        self.spec = spec
        #: Its name as a member of a worker's shared query: the datastream's, or for a table
        #: of a multi-table datastream ``<datastream>.<table>``.
        self.member = member or spec.name
        self.catalog = catalog
        self.spark = spark
        self.writer_id = writer_id or f"{spec.name}-{socket.gethostname()}"
        #: Held (locked) for as long as this runner runs; a worker passes one it already locked.
        self.state_dir = state_dir or StateDirectory(
            catalog.settings.home / "writers" / spec.name, self.writer_id
        )
        self.stats_file = self.state_dir.path / "commits.jsonl"
        self.table_spec = spec.table_spec()
        self.stats = RunStats()
        #: Makes a standby commit only when the active is gone (a worker's standby mode).
        self.commit_gate = commit_gate
        #: Seal and maintain the tables on a thread of this process while the query runs
        #: (``millstream run``; a worker does both on its own threads instead).
        self.background_sealing = background_sealing
        #: An ``available_now`` run seals everything it wrote before it exits, below the flush
        #: thresholds too, and compacts what is due (``millstream run --available-now``: no
        #: sealer outlives it); False, only what is due (see :meth:`_seal_before_exit`).
        self.seal_all_on_exit = False
        #: The final seal pass's read of the table (its manifest, the rows with system
        #: columns), for the Iceberg publish right after it; dropped once offered.
        self._final_read: tuple[Manifest, pa.Table] | None = None
        #: Called once an ``available_now`` run has caught up, before its final seal pass:
        #: ``millstream run --available-now`` ends its Spark JVM there (the seal needs no
        #: Spark), so the seal does not run beside it.
        self.before_final_seal: Callable[[], None] | None = None
        #: Whether an ``available_now`` run registers the data sources (its jobs use none):
        #: the registration starts a Python daemon that then idles beside the write tasks,
        #: and a streaming query started later in the same session finds one started.
        #: ``millstream run --available-now``, whose session runs nothing after, does not.
        self.register_sources = True
        #: Seconds between the background sealer's passes, and its backoff after a failure.
        self.seal_interval = 1.0
        self.seal_backoff = Backoff(base=1.0, cap=60.0)
        #: Expiry and garbage collection of the table and its dead-letter table, on the
        #: background sealer's thread (as a worker's sealing thread does).
        self.maintainer = Maintainer(
            catalog, interval=maintenance_interval, grace_seconds=gc_grace_seconds
        )
        #: Publish the table's and the dead-letter table's Iceberg views this often while
        #: :meth:`run` runs (``millstream run``; a worker publishes for all its writers
        #: instead), by a publisher process of its own; an available-now run publishes once,
        #: before it exits. None: not published here.
        self.publish_interval = publish_interval
        self.publisher: PublisherProcess | None = None
        self.publishing: SupervisedLoop | None = None
        #: The oldest staged file a commit accepts (GC's grace must be at least this).
        self.max_staged_age = max_staged_age
        #: The supervised background sealer while :meth:`run` runs one (see :meth:`sealing_status`).
        self.sealing: SupervisedLoop | None = None
        self.sealer: Sealer | None = None
        self.query: Any = None
        self._stopping = False
        self._catching_up = False  # an available-now run's jobs run (stop() cancels them)
        #: Restarts after Spark's transient failures, and the wait before one (stop() ends it).
        self.transient = TransientRestarts(f"writer {self.writer_id} of {spec.name}")
        #: restarts after a fenced, gapped or expired commit (bounded in a row)
        self.restarts = RestartsInARow()
        #: the shard uppers the last start began at (:meth:`start`, :meth:`_catch_up`)
        self.started_uppers: dict[int, int] = {}
        self._wake = threading.Event()

    # -- bootstrap -------------------------------------------------------------------------

    def ensure_tables(self) -> None:
        # The table and its dead-letter table are this datastream's, or another one's
        # (TableOwnedError): two writers of one table would share its shards, and one's
        # commits would be dropped as covered. A runner started without the controller
        # claims them here.
        self.catalog.store.claim_owners(
            [self.spec.table_name, self.spec.dead_letter_table], self.spec.name
        )
        # The table as it is: its schema may have evolved since this runner's datastream spec
        # was read (the sink reads the current spec per batch anyway).
        self.table_spec = self.catalog.create_table(self.table_spec).spec
        self.catalog.create_table(dead_letter_spec(self.table_spec))

    def bootstrap(
        self, latest: dict[int, int] | None = None, earliest: dict[int, int] | None = None
    ) -> Bootstrap:
        return bootstrap(self.spec, self.catalog.store, latest, earliest)

    @property
    def checkpoint(self) -> Path:
        return self.state_dir.checkpoint_dir  # raises unless the lock is held

    def prepare_checkpoint(self, boot: Bootstrap) -> None:
        """Decide whether the local checkpoint may be reused. Runs only under the state
        directory lock: the checkpoint is read after locking and written while locked."""
        self.state_dir.lock()
        if self.checkpoint.exists():
            why = checkpoint_verdict(self.checkpoint, boot)
            if why is not None:
                log.warning(
                    "discarding the Spark checkpoint of writer %s at %s: %s; resuming from the "
                    "shard uppers %s instead",
                    self.writer_id,
                    self.checkpoint,
                    why,
                    boot.uppers,
                )
                self.stats.discarded_checkpoints.append(why)
                shutil.rmtree(self.checkpoint)
        sidecar = {"epochs": {str(k): v for k, v in boot.epochs.items()}, "writer": self.writer_id}
        self.state_dir.write_checkpoint(f"checkpoint/{SIDECAR}", json.dumps(sidecar).encode())

    # -- query -----------------------------------------------------------------------------

    def _open(self) -> None:
        # The Python sink is looked up through the JVM thread's active session; a runner may
        # start its query from any Python thread (a worker runs several writers).
        self.spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(
            self.spark._jsparkSession
        )
        register(self.spark)
        self.ensure_tables()

    def start(self) -> Any:
        """Start the running writer's streaming query from the shard uppers, reusing the
        checkpoint where it agrees with them. The query triggers at the tick of the
        ``trigger_interval`` (:func:`~millstream.spark.sources.tick_seconds`); its source plans
        at most once per interval while records flow and at every tick while idle
        (:meth:`~millstream.spark.sources.StreamReader.due`)."""
        self._open()
        boot = self.bootstrap()
        self.transient.started_at(boot.uppers)
        self.started_uppers = dict(boot.uppers)
        self.restarts.began(boot.uppers)
        self.prepare_checkpoint(boot)
        source, sink = self.query_options(boot)
        tick = tick_seconds(self.spec.trigger_seconds)
        writer = (
            self.spark.readStream.format(SOURCE_FORMAT)
            .options(**source.to_options())
            .load()
            .writeStream.format("millstream")
            .options(**sink.to_options())
            .option("checkpointLocation", str(self.checkpoint))
            .queryName(f"millstream-{self.spec.name}-{self.writer_id}")
            .trigger(processingTime=f"{int(tick * 1000)} milliseconds")
        )
        self.query = writer.start()
        return self.query

    def query_options(self, boot: Bootstrap) -> tuple[SourceOptions, SinkOptions]:
        """The source's and the sink's options of this writer's query, started at ``boot``
        (the shard uppers and epochs): the query's own, or its member's in a shared query."""
        kind, config = config_for(self.spec.source, self.spec.name)
        settings = self.catalog.settings
        # The sink reads each planned range itself; the source sends only the range markers.
        # While it may not commit, a standby's source follows the shard uppers.
        source = SourceOptions(
            kind,
            config,
            max_records_per_batch=self.spec.max_records_per_batch,
            task_memory_mb=self.spec.task_memory_mb,
            starting_offsets=self.spec.source.starting_offsets,
            start_offsets=boot.uppers,
            tasks=max(1, int(self.spark.sparkContext.defaultParallelism)),
            trigger_seconds=self.spec.trigger_seconds,
            gate=self.commit_gate,
            settings=settings if self.commit_gate is not None else None,
        )
        sink = SinkOptions(
            settings=settings,
            table_spec=self.table_spec,
            writer_id=self.writer_id,
            epochs=boot.epochs,
            dead_letter_epochs=boot.dead_letter_epochs,
            bad_records=self.spec.bad_records,
            stats_file=str(self.stats_file),
            source_kind=kind,
            source_config=config,
            gate=self.commit_gate,
            max_staged_age=self.max_staged_age,
        )
        return source, sink

    def run(
        self,
        *,
        available_now: bool,
        on_tick: Callable[[DatastreamRunner], None] | None = None,
        tick_seconds: float = 1.0,
    ) -> RunStats:
        """Run until done (``available_now``) or :meth:`stop`; restart from the shard upper
        when a commit is fenced or finds a gap. Raises the query's error otherwise.

        A running writer is a streaming query, resuming from its checkpoint; ``on_tick`` is
        called every ``tick_seconds`` while it runs. ``available_now`` runs the batches as
        Spark jobs instead (:mod:`millstream.spark.catch_up`: no streaming query, no Spark
        checkpoint; ``on_tick`` is called after each batch and at the end).

        Holds the state directory lock throughout (and releases it at the end, unless the
        caller locked it first, as a worker does)."""
        owns_lock = not self.state_dir.held
        sealing: SupervisedLoop | None = None
        try:
            while not self._stopping:
                if available_now:
                    # A session of Spark jobs only (JobsSession) has no SQL session to
                    # register them in: registering would create one, for nothing.
                    if self.register_sources and not isinstance(self.spark, JobsSession):
                        self._open()
                    else:  # its jobs need neither the data sources nor the active session
                        self.ensure_tables()
                    if self.background_sealing and sealing is None:
                        sealing = self._start_sealing()
                    # No publisher process while it catches up: it publishes once, before it
                    # exits (_publish_before_exit), after the Spark jobs and the final seal.
                    error = self._catch_up(on_tick)
                    if self._stopping:
                        return self.stats
                else:
                    error = self._start_transiently()
                    if error is None:
                        if self._stopping:
                            # stop() came while start() was starting this query: it stopped
                            # the one before (or none), and this one would run on with nobody
                            # to stop it.
                            self.query.stop()
                            return self.stats
                        if self.background_sealing and sealing is None:
                            # Only now: start() created the tables, so no pass finds them
                            # missing.
                            sealing = self._start_sealing()
                        self._start_publishing()
                        error = self._await(on_tick, tick_seconds)
                if error is None and available_now and not self._stopping:
                    if self.before_final_seal is not None:
                        self.before_final_seal()
                    if self.publish_interval is not None:
                        # The publish after the seal imports pyiceberg (~0.3-0.8 s): on a
                        # thread meanwhile (the seal is mostly Arrow's work, off the GIL).
                        threading.Thread(
                            target=importlib.import_module,
                            args=("millstream.table.iceberg",),
                            name="import-iceberg",
                            daemon=True,
                        ).start()
                    self.stats.sealing = self._seal_before_exit()
                    self.stats.iceberg = self._publish_before_exit()
                if error is None or self._stopping:
                    return self.stats
                transient = None if _restartable(error) else transient_spark_failure(error)
                if transient is not None:
                    if not self._wait_transient(transient, error):
                        return self.stats  # stopped while waiting
                elif not _restartable(error) or self._count_restart() > MAX_RESTARTS:
                    raise error
                else:
                    log.warning(
                        "writer %s restarts from the shard uppers (%d in a row, %d in all): %s",
                        self.writer_id,
                        self.restarts.in_a_row,
                        self.restarts.total,
                        error,
                    )
                # The checkpoint is ahead of (or behind) the truth; make it re-verify.
                shutil.rmtree(self.checkpoint, ignore_errors=True)
            return self.stats
        finally:
            if sealing is not None:
                sealing.stop()  # lets a seal in progress finish, then checkpoints the key index
            if self.publishing is not None:
                self.publishing.stop()
                self.publishing = None
            if self.publisher is not None:
                self.publisher.close()  # after the publish in progress
            if owns_lock:
                self.state_dir.unlock()

    def committed_uppers(self) -> dict[int, int]:
        """The table's shard uppers as committed now."""
        return {s.partition: s.upper for s in self.catalog.store.list_shards(self.table_spec.name)}

    def _count_restart(self) -> int:
        """Count a restart after a fenced, gapped or expired commit: a new row when a batch
        committed since the last start (:class:`RestartsInARow`). Returns the restarts in a
        row."""
        try:
            progressed = moved_past(self.started_uppers, self.committed_uppers())
        except Exception:  # a store that does not answer: no progress seen, still restartable
            log.warning(
                "writer %s: reading the shard uppers of %s failed",
                self.writer_id,
                self.table_spec.name,
                exc_info=True,
            )
            progressed = False
        n = self.restarts.failed(progressed)
        self.stats.restarts, self.stats.restarts_in_a_row = self.restarts.total, n
        return n

    def _show_restarts(self) -> None:
        """The restarts in a row in :attr:`stats` as of now: 0 once the writer committed past
        where the start after its last restart began."""
        self.stats.restarts_in_a_row = self.restarts.shown(self.committed_uppers)

    def _start_transiently(self) -> Exception | None:
        """:meth:`start` the query; returns the error of a start that failed on one of Spark's
        transient failures (the source's Python process did not connect back in time, say:
        the caller restarts after a backoff), raises any other."""
        try:
            self.start()
        except Exception as exc:
            if transient_spark_failure(exc) is None:
                raise
            return exc
        return None

    def _wait_transient(self, transient: SparkTransientError, error: Exception) -> bool:
        """Count a transient failure, log it with the writer, and wait its backoff; False when
        :meth:`stop` came meanwhile. Raises when too many came in a row (see
        :class:`TransientRestarts`)."""
        delay = self.transient.failed(transient, error)
        self.stats.transient_restarts = self.transient.total
        log.warning(
            "writer %s of %s restarts from the shard uppers in %.1f s after Spark's transient "
            "failure %s (%d in a row, %d in all): %s",
            self.writer_id,
            self.spec.name,
            delay,
            transient.condition,
            self.transient.in_a_row,
            self.transient.total,
            transient.message,
        )
        self.transient.waiting = delay
        try:
            self._wake.wait(delay)
        finally:
            self.transient.waiting = None
        return not self._stopping

    def _catch_up(self, on_tick: Callable[[DatastreamRunner], None] | None) -> Exception | None:
        """One ``available_now`` run as Spark jobs from the shard uppers, under the state
        directory lock. Returns a fenced, gapped or expired commit's error, or one of Spark's
        transient failures (the caller restarts); raises any other. A Spark checkpoint left
        by a streaming run is removed once a batch commits: its offsets are behind the shards
        from then on."""
        boot = self.bootstrap()
        self.transient.started_at(boot.uppers)
        self.started_uppers = dict(boot.uppers)
        self.restarts.began(boot.uppers)
        self.state_dir.lock()
        source, sink = self.query_options(boot)

        def batch_done(done: BatchDone) -> None:
            if self.checkpoint.exists():
                log.info(
                    "writer %s: removing the Spark checkpoint at %s, which the shards have "
                    "moved past (an available-now run keeps none)",
                    self.writer_id,
                    self.checkpoint,
                )
                shutil.rmtree(self.checkpoint, ignore_errors=True)
            self._show_restarts()  # a commit since the last restart ends its row
            if on_tick is not None:
                on_tick(self)

        self._catching_up = True
        try:
            catch_up(
                self.spark,
                StreamReader(source),
                SegmentSink(sink),
                SegmentSink(sink, StoreRegistry(self.catalog.store)),
                job_group=self.job_group,
                stopping=lambda: self._stopping,
                on_batch=batch_done,
            )
        except RESTARTABLE as exc:
            return exc
        except Exception as exc:
            if self._stopping:  # stop() cancelled the batch's job
                return None
            if transient_spark_failure(exc) is not None:
                return exc
            raise
        finally:
            self._catching_up = False
        if on_tick is not None:
            on_tick(self)
        return None

    @property
    def job_group(self) -> str:
        """The Spark job group of an available-now run's batch jobs."""
        return f"millstream-{self.spec.name}-{self.writer_id}"

    def _seal_before_exit(self) -> dict[str, Any]:
        """An ``available_now`` run seals before it exits: no background sealer outlives it,
        so without this its segments stay unsealed until some later run, and every read until
        then merges each key's every version. With :attr:`seal_all_on_exit` (``millstream run
        --available-now``) everything it wrote, below the flush thresholds too, and it compacts
        what is due; else what is due."""
        seg = self.spec.segments
        sealer = Sealer(
            self.catalog,
            self.table_spec.name,
            thresholds=Thresholds.of(seg),
            compaction=CompactionPolicy.of(seg),
        )
        try:
            report = sealer.seal_what_is_due(everything=self.seal_all_on_exit)
            # The read its merged copy was written from: the publish after it builds the
            # table's Iceberg view on it rather than merging the table a second time.
            self._final_read = sealer.final_read
            return report
        except Exception as exc:  # ingestion succeeded; the next run seals what is left
            log.warning("the final seal pass of %s failed: %s", self.table_spec.name, exc)
            return {"sealed": {}, "not_due": {}, "failed": {"*": str(exc).splitlines()[0]}}

    @property
    def tables(self) -> dict[str, list[str]]:
        """This writer's datastream -> its table and dead-letter table."""
        return {self.spec.name: [self.table_spec.name, dead_letter_spec(self.table_spec.name).name]}

    def _start_publishing(self) -> None:
        """Publish the tables' Iceberg views every ``publish_interval`` seconds, by a
        publisher process of this runner (see :mod:`millstream.sealing.publishing`), driven by
        a supervised loop of its own (a crashed process is logged, counted and restarted after
        a backoff); the tables must exist. Nothing when not publishing, or already running."""
        if self.publish_interval is None or self.publishing is not None:
            return
        publisher = PublisherProcess(
            self.catalog, interval=self.publish_interval, owner=f"writer {self.writer_id}"
        )
        tables = self.tables
        self.publisher = publisher
        # Its maintenance leaves the views to this publisher (which drops the expired
        # snapshots at its next publish) rather than publish them itself, in full, racing it.
        self.maintainer.shared_publisher = publisher
        self.publishing = SupervisedLoop(
            "publishing",
            lambda: publisher.run_due(tables),
            interval=min(1.0, self.publish_interval),
            thread_name=f"publishing-{self.spec.name}",
        ).start()

    def _publish_before_exit(self) -> dict[str, Any] | None:
        """An ``--available-now`` run publishes its tables' Iceberg views once, before it
        exits, so they show everything it committed (and sealed) as soon as it is done. It
        publishes here, in this process, not by a publisher process while the run catches up:
        beside the write tasks that held ~0.16 GB of the run's peak memory for views of tables
        the run was still writing (docs/performance.md, "Peak RSS under 1 GB"). Per table: the
        version and metadata location, or the error (ingestion succeeded; the next run
        publishes)."""
        if self.publish_interval is None:
            return None
        # lazy: pyiceberg loads only in a process that publishes
        from millstream.table.iceberg import location

        if self.publishing is not None:
            self.publishing.stop()  # no step of a background publisher beside this one
        out: dict[str, Any] = {}
        # In this process, one table after another: the run waits on it and its writes are
        # done, so a publisher process of its own only added its start (an interpreter and its
        # imports, ~2-3 s) to the run's end. A table that fails does not stop the others.
        publisher = Publisher(self.catalog, interval=self.publish_interval)
        if self._final_read is not None:
            publisher.cache.offer_read(self.catalog.deep, *self._final_read)
            self._final_read = None
        for names in self.tables.values():
            for name in names:
                try:
                    publisher.publish([name])
                except Exception as exc:
                    log.warning("the final Iceberg publish of %s failed: %s", name, exc)
                    out.setdefault("error", f"table {name!r}: {str(exc).splitlines()[0]}")
        for name in self.tables[self.spec.name]:
            pointer = self.catalog.store.read_pointer(name)
            if pointer is not None:
                out[name] = {
                    "manifest_version": pointer.manifest_version,
                    "metadata_location": location(self.catalog.deep, pointer.metadata_location),
                }
        return out

    def _start_sealing(self) -> SupervisedLoop:
        """Start sealing this writer's table on a supervised thread of this process; the
        tables must exist (:meth:`start` creates them). A failed pass is logged with the table,
        counted and retried with backoff; it never ends sealing. On stop, the key index is
        checkpointed, so a restart loads it instead of rebuilding it."""
        seg = self.spec.segments
        sealer = Sealer(
            self.catalog,
            self.table_spec.name,
            thresholds=Thresholds.of(seg),
            compaction=CompactionPolicy.of(seg),
        )
        self.sealer = sealer
        tables = {
            self.spec.name: [self.table_spec.name, dead_letter_spec(self.table_spec.name).name]
        }

        def background_pass() -> None:
            sealer.seal_due()  # seals, then compacts
            # Supervised per datastream inside: a failure backs off maintenance only.
            self.maintainer.run_due(tables)

        self.sealing = SupervisedLoop(
            "sealer",
            background_pass,
            interval=self.seal_interval,
            table=self.table_spec.name,
            backoff=self.seal_backoff,
            on_stop=lambda: sealer.checkpoint(force=True),
            thread_name=f"sealer-{self.spec.name}",
        ).start()
        return self.sealing

    def sealing_status(self) -> dict[str, Any] | None:
        """The background sealer's loop status plus the sealer's own (per-partition failures,
        last seal); None when this runner does not seal in the background (or not yet)."""
        if self.sealing is None or self.sealer is None:
            return None
        return {
            **self.sealing.status().to_dict(),
            "sealer": self.sealer.status(),
            "maintenance": self.maintainer.status(),
            "view_gc": self.maintainer.view_gc_status(),
            "maintainer": [
                s.to_dict() for s in self.maintainer.loop_statuses(alive=self.sealing.alive)
            ],
        }

    def sealing_summary(self, now: float) -> str | None:
        """One line on the background sealer for progress output (None without one), naming
        the partitions whose seals fail."""
        if self.sealing is None or self.sealer is None:
            return None
        line = self.sealing.status().describe(now)
        failing = sorted(self.sealer.last_error.items())
        if failing:
            line += "; seals failing: " + ", ".join(f"partition {p}: {e}" for p, e in failing)
        return line

    def _await(
        self, on_tick: Callable[[DatastreamRunner], None] | None, tick: float
    ) -> Exception | None:
        try:
            while not self.query.awaitTermination(tick):
                if on_tick is not None:
                    self._show_restarts()
                    on_tick(self)
            self._show_restarts()
            if on_tick is not None:
                on_tick(self)
            return None
        except StreamingQueryException as exc:
            return exc

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()  # a restart's backoff ends
        if self.query is not None:
            self.query.stop()
        if self._catching_up:  # an available-now run's batch job
            self.spark.sparkContext.cancelJobGroup(self.job_group)

    def stop_after_batch(self, timeout: float = 30.0) -> None:
        """Stop at a batch boundary: no new batch starts, the running one (a query's trigger, an
        available-now run's job) commits, then the query stops. After ``timeout`` seconds it
        stops anyway (a batch cut short commits nothing; the next run reads its range again)."""
        self._stopping = True  # an available-now run ends after its current batch
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            query = self.query
            if query is None:
                if not self._catching_up:
                    break
            else:
                try:
                    if not query.status.get("isTriggerActive"):
                        break
                except Exception:  # the query ended meanwhile
                    break
            time.sleep(0.05)
        self.stop()

    def release(self) -> None:
        """Release the state directory lock (after the query has stopped)."""
        self.state_dir.unlock()

    # -- status ----------------------------------------------------------------------------

    def commits(self) -> list[dict[str, Any]]:
        """The retained commit log, oldest first: the rotated file (if any) and the current
        one, at most twice ``COMMIT_LOG_BYTES``. For running totals, use
        :class:`CommitLogTotals`, which reads each line once."""
        out: list[dict[str, Any]] = []
        for path in (rotated_log(self.stats_file), self.stats_file):
            try:
                text = path.read_text()
            except OSError:
                continue
            for line in text.splitlines():
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
        return out


#: The accepted source losses a writer's status keeps (the newest; all are counted).
LOST_RANGES_KEPT = 20

#: The window of progress output's rows/s (:meth:`CommitLogTotals.rows_per_second`).
RATE_WINDOW_S = 10.0
#: Seconds of a writer's newest commits :class:`CommitLogTotals` keeps for
#: :meth:`~CommitLogTotals.rows_per_second` (its window must not be longer): the worker keeps
#: one per table, and 4,096 commits each held ~0.5 MB a table for nothing (issue 38).
RATE_KEPT_S = 60.0


class CommitLogTotals:
    """Running totals of a writer's commit log (``commits.jsonl``), read incrementally: each
    :meth:`update` reads only the lines appended since the last one, so a writer's status
    costs the same after a month as after a minute. The totals never go down:

    * a log the sink rotated (renamed to ``commits.jsonl.1``, see
      :func:`millstream.spark.sink.append_commit_log`) is read to its end before the new one;
    * a log that was replaced (its state directory cleaned and created again) is read from its
      start and added on.

    A log is known by its device, inode and first line (a new file may get the inode of a
    deleted one)."""

    def __init__(self) -> None:
        self.position = 0
        self.file: tuple[int, int, bytes] | None = None  # the log read (see above)
        #: the table the log's writer writes (set by its reader)
        self.table: str | None = None
        #: partition -> {"consumed": n, "dead_lettered": n, "lost": n}
        self.partitions: dict[int, dict[str, int]] = {}
        #: the last source offsets lost (``[partition, first, end]``, newest last; at most
        #: :data:`LOST_RANGES_KEPT`): a kafka source's ``on_data_loss: accept`` skips
        self.lost_ranges: list[list[int]] = []
        self.batches = 0
        self.rows = 0
        self.lost_races = 0
        #: when the first and the last batch read were committed (epoch seconds), None before any
        self.first_at: float | None = None
        self.last_at: float | None = None
        #: (commit time, rows) of the batches read that were committed within
        #: :data:`RATE_KEPT_S` of the last one, for :meth:`rows_per_second`
        self.recent: deque[tuple[float, int]] = deque()
        #: the log's device, inode, size and modification time when it was last read: a log
        #: that still has them has nothing new (see :meth:`update`)
        self.seen: tuple[int, int, int, int] | None = None

    def update(self, path: Path) -> dict[int, dict[str, int]]:
        """Add the lines appended to the log at ``path`` since the last update. A log whose
        device, inode, size and modification time are those of the last read is not opened
        (a worker updates every table's each heartbeat: 100 opens and reads a beat were a
        fifth of its heartbeat, issue 38). They are taken before the read, so a line appended
        while it reads makes the next update read again."""
        try:
            st = os.stat(path)
        except OSError:
            return self.partitions
        seen = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if seen == self.seen:
            return self.partitions
        try:
            with path.open("rb") as f:
                st = os.fstat(f.fileno())
                identity = (st.st_dev, st.st_ino, f.readline())
                if identity != self.file or st.st_size < self.position:
                    self._finish_rotated(rotated_log(path))
                    self.file, self.position = identity, 0  # a new log
                f.seek(self.position)
                chunk = f.read()
        except OSError:
            return self.partitions
        self.position += self._add(chunk)
        self.seen = seen  # a line still being written changes the size as it ends
        return self.partitions

    def rows_per_second(
        self, now: float, *, window: float = RATE_WINDOW_S, since: float | None = None
    ) -> float:
        """Rows committed per second over the last ``window`` seconds (at most
        :data:`RATE_KEPT_S`; by each batch's commit time), or since ``since`` when that is
        later (a writer started 3 s ago has committed for 3 s): what ingestion achieves,
        whatever Spark counts as a batch's input."""
        start = now - window if since is None else max(now - window, since)
        if now <= start:
            return 0.0
        return sum(rows for at, rows in self.recent if start < at <= now) / (now - start)

    def _finish_rotated(self, rotated: Path) -> None:
        """Read what is left of the log last read if the sink rotated it to ``rotated``."""
        if self.file is None:
            return
        try:
            with rotated.open("rb") as f:
                st = os.fstat(f.fileno())
                if (st.st_dev, st.st_ino, f.readline()) != self.file:
                    return
                f.seek(self.position)
                self._add(f.read())
        except OSError:
            return

    def _add(self, chunk: bytes) -> int:
        """Count the whole lines of ``chunk``; returns the bytes they take (a line being
        written is read next time)."""
        end = chunk.rfind(b"\n") + 1
        for line in chunk[:end].splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            self.batches += 1
            rows = int(entry.get("rows") or 0)
            self.rows += rows
            self.lost_races += 1 if entry.get("lost_race") else 0
            at = entry.get("at")
            if isinstance(at, int | float):
                self.last_at = float(at)
                if self.first_at is None:
                    self.first_at = self.last_at
                self.recent.append((float(at), rows))
                while self.recent[0][0] < self.last_at - RATE_KEPT_S:
                    self.recent.popleft()
            for kind in ("consumed", "dead_lettered", "lost"):
                for p, n in (entry.get(kind) or {}).items():
                    counts = self.partitions.setdefault(int(p), {"consumed": 0, "dead_lettered": 0})
                    counts[kind] = counts.get(kind, 0) + int(n)
            if entry.get("lost_ranges"):
                self.lost_ranges = [*self.lost_ranges, *entry["lost_ranges"]][-LOST_RANGES_KEPT:]
        return end


#: A query that failed with one of these restarts from the shard uppers.
RESTARTABLE = (ShardGapError, WriterFencedError, StagedFileExpiredError)


def _restartable(error: Exception) -> bool:
    if isinstance(error, RESTARTABLE):  # raised in this process (an available-now commit)
        return True
    ours = from_spark_failure(error)
    return ours is not None and issubclass(ours.kind, RESTARTABLE)
