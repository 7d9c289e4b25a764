"""Several datastreams in one streaming query: a worker's *shared query*.

A micro-batch costs a worker about 0.6 CPU-seconds whatever it holds (Spark's planning, its
offset and commit logs, a Python worker call per task for the source and another for the
sink; docs/performance.md, "Scale"). With a query per datastream that cost is paid per
datastream and trigger, so ten quiet datastreams cost ten times one. A shared query pays it
once per trigger for all of them: its source (:class:`~millstream.spark.sources.GroupStreamReader`)
plans every member's ranges as the member would alone, its tasks read and stage each member's
ranges as that member's sink would (:class:`~millstream.spark.sink.GroupSink`), and its commit
commits every member in ONE metadata transaction, each in a savepoint of its own with its own
compare-and-append checks, epochs and standby gate. Nothing about a member's correctness
depends on the others:

* a member's commit is rolled back alone when it fails; a member fenced or gapped does not
  keep the others from committing, and the query then restarts every member from its shard
  uppers (the others' replay is a DROP);
* the query's checkpoint is a cache like a writer's: it is discarded at every start, and every
  member starts at its shard uppers (the truth);
* a member's error carries its name (:data:`~millstream.spark.sources.MEMBER_NOTE`), so the
  worker puts that member alone in ERROR or backoff and restarts the others without it.

Members join and leave the running query (:meth:`SharedQueryRunner.add`,
:meth:`SharedQueryRunner.add_many` for many at once, :meth:`SharedQueryRunner.remove`) without a
restart: the runner keeps the membership in a file
(:mod:`millstream.spark.membership`) that the source reads at each batch it plans and the
sink's commit reads under a shared lock. A member that joins enters at its shard uppers (as at
a start); one that leaves is planned no more, and once :meth:`~SharedQueryRunner.remove` has
returned none of its batches commits. A query start costs seconds (Spark initialises the
query, starts a Python process for its source and one for its sink's planning), so a new
datastream's first rows no longer wait for one, nor do the other members. A member's
restartable error still restarts them all, from their shard uppers.
"""

from __future__ import annotations

import logging
import re
import shutil
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from pyspark.errors import StreamingQueryException

from millstream.errors import InvalidSpecError, from_spark_failure, transient_spark_failure
from millstream.ingest.sources import spec_reader
from millstream.ingest.sources.base import (
    PartitionReader,
    earliest_offsets_of,
    latest_offsets_of,
)
from millstream.spark.membership import (
    MEMBERSHIP_FILE,
    Member,
    Membership,
    MembershipLockTimeout,
)
from millstream.spark.options import (
    GroupSinkOptions,
    GroupSourceOptions,
    SinkOptions,
    SourceOptions,
)
from millstream.spark.runner import (
    MAX_RESTARTS,
    DatastreamRunner,
    RestartsInARow,
    TransientRestarts,
    _restartable,
    moved_past,
)
from millstream.spark.sources import GROUP_FORMAT, MEMBER_THREADS, each_member, tick_seconds
from millstream.spark.table_source import GROUP_SINK_FORMAT, register
from millstream.storage.statedir import StateDirectory

log = logging.getLogger(__name__)

_MEMBER = re.compile(r"in the shared query's member datastream ['\"]([^'\"]+)['\"]")


def member_of(error: BaseException) -> str | None:
    """The member datastream a shared query's error names (the last named: a traceback ends
    with the error that propagated), or None for an error of the query as a whole."""
    found = _MEMBER.findall(str(error))
    return found[-1] if found else None


def member_source(source: SourceOptions, *, members: int, trigger: float) -> SourceOptions:
    """A member's source options in a shared query of ``members`` datastreams:

    * a task writes up to :data:`~millstream.spark.sources.MEMBER_THREADS` members' parts at
      once (a thread each; a member's part is staged and freed before the next one starts on
      that thread), and a member's batch, planned over ``tasks`` tasks, may be one piece in
      one task; so each member plans with its share of a task's memory (``task_memory_mb``)
      among the members, but among no more than ``MEMBER_THREADS * tasks`` of them: what a
      task holds at once stays within its memory however many members there are. Shared among
      every member, the 100 small tables of one datastream caught a backlog up in batches of
      1/100 of a task's memory each (256,000 records of 1M in 100 topics), paying each table's
      per-batch cost (a read, a staged file, a commit entry) once per such batch
      (docs/performance.md, "(c) Catch-up of a 100-topic backlog");
    * the query ticks at the tick of its members' shortest ``trigger``
      (:func:`~millstream.spark.sources.tick_seconds`), and each member is planned at most
      once per its own ``trigger`` while records flow, at every tick while it is idle
      (:meth:`~millstream.spark.sources.StreamReader.due`)."""
    at_once = max(1, min(members, MEMBER_THREADS * max(1, source.tasks)))
    return replace(
        source,
        task_memory_mb=max(1, source.task_memory_mb // at_once),
        trigger_seconds=trigger,
    )


class SharedQueryMemberError(Exception):
    """A member's error that restarting the shared query cannot help (a bad record with
    ``bad_records: fail``, a source that does not answer, restarts exhausted): the worker
    takes ``member`` out of the query and restarts the others."""

    def __init__(self, member: str, error: BaseException) -> None:
        ours = from_spark_failure(error)  # Spark's text leads with its own words
        what = (
            f"{ours.kind.__name__}: {ours.message}"
            if ours is not None
            else (str(error).splitlines() or [repr(error)])[0]
        )
        super().__init__(f"datastream {member!r}: {what}")
        self.member = member
        self.error = error


class SharedQueryRunner:
    """Runs the writers of several datastreams (``members``, each a :class:`DatastreamRunner`
    whose state directory the caller holds) in one streaming query. The query's checkpoint is
    kept under ``state_dir``, which this runner locks while it runs."""

    def __init__(
        self,
        members: list[DatastreamRunner],
        spark: Any,
        state_dir: StateDirectory,
        *,
        on_transient: Callable[[Sequence[str], str], None] | None = None,
    ) -> None:
        if not members:
            raise InvalidSpecError("members", "a shared query runs at least one datastream")
        self.members = {m.member: m for m in sorted(members, key=lambda m: m.member)}
        self.spark = spark
        self.state_dir = state_dir
        #: restarts after a restartable error (fenced, gapped, expired), per member (``*``: the
        #: query's own), in all and in a row (bounded by MAX_RESTARTS; a row ends when the
        #: member committed past where it last started: :class:`RestartsInARow`)
        self.restarts: dict[str, RestartsInARow] = {}
        #: restarts after Spark's transient failures (see :meth:`run`), and the wait before one
        self.transient = TransientRestarts(f"shared query {state_dir.path.name}")
        #: Called with the members and the error at each such restart (a worker counts them
        #: per writer: its health, ``millstream_writer_transient_restarts``).
        self.on_transient = on_transient
        self._wake = threading.Event()
        self.query: Any = None
        #: ``self.query`` and its ids, asked of the JVM once a query (two py4j calls each
        #: status, and the worker's heartbeat asks every tick)
        self._ids: tuple[Any, str, str] | None = None
        self._stopping = False
        #: The running query's members (see :mod:`millstream.spark.membership`): the file,
        #: its generation (one more at each start, join and leave) and each member's entry.
        self.membership = Membership(state_dir.path / MEMBERSHIP_FILE)
        self.generation = 0
        self.entries: dict[str, Member] = {}
        #: The query's Spark trigger: the tick of its members' shortest trigger interval at its
        #: start (:func:`~millstream.spark.sources.tick_seconds`).
        self.tick = 0.0
        #: Query starts, members joined and left the running query (for the worker's status).
        self.starts = self.joins = self.leaves = 0
        #: One membership change at a time (the worker's tick, the query's restarts).
        self._lock = threading.RLock()

    @property
    def checkpoint(self) -> Path:
        return self.state_dir.checkpoint_dir  # raises unless the lock is held

    def _entry(
        self,
        name: str,
        m: DatastreamRunner,
        *,
        members: int,
        latest: dict[int, int] | Exception | None = None,
        earliest: dict[int, int] | Exception | None = None,
    ) -> Member:
        """A member's entry at the next generation: its options from its shard uppers.
        ``latest`` and ``earliest``: its source's latest and first offsets (or the error
        asking them raised) if they were asked already."""
        try:
            if isinstance(latest, Exception):
                raise latest
            if isinstance(earliest, Exception):
                raise earliest
            m.ensure_tables()
            source, sink = m.query_options(m.bootstrap(latest, earliest))
        except Exception as exc:
            raise SharedQueryMemberError(name, exc) from exc
        source = member_source(source, members=members, trigger=m.spec.trigger_seconds)
        return Member(self.generation + 1, source.to_options(), sink.to_options())

    def _entries(
        self, new: dict[str, DatastreamRunner], *, members: int
    ) -> dict[str, Member | SharedQueryMemberError]:
        """The entries of the members ``new`` at the next generation, made together: their
        sources' latest offsets asked at once (:func:`latest_offsets_of`: Kafka members of
        one client config in one request), then each member's tables and shards on a thread
        of its own (at most :data:`MEMBER_THREADS` at once). One after the other, each
        member's entry asked its broker and made its metadata transactions alone: the 100
        tables of one datastream joined about 1 s apart (docs/performance.md, "(c) 100
        topics: the tables join together, a batch's commits share one transaction"). A member
        whose tables or source did not answer gets its :class:`SharedQueryMemberError` in its
        place."""
        readers: dict[str, PartitionReader] = {}
        asked: dict[str, dict[int, int] | Exception] = {}
        for name, m in new.items():
            try:
                readers[name] = spec_reader(m.spec.source)
            except Exception as exc:  # its source's config: its error alone
                asked[name] = exc
        asked.update(latest_offsets_of(readers))
        # where a partition without a shard starts (``starting_offsets: earliest``), asked
        # together too: each member asking its own cost a consumer of its topic each
        earliest = earliest_offsets_of(
            {
                n: r
                for n, r in readers.items()
                if new[n].spec.source.starting_offsets == "earliest"
                and not isinstance(asked.get(n), Exception)
            }
        )

        def entry(name: str) -> Member | SharedQueryMemberError:
            try:
                return self._entry(
                    name,
                    new[name],
                    members=members,
                    latest=asked.get(name),
                    earliest=earliest.get(name),
                )
            except SharedQueryMemberError as exc:
                return exc

        return each_member(sorted(new), entry, "member-join")

    def begin(self) -> tuple[GroupSourceOptions, GroupSinkOptions]:
        """The options a query starts with: every member's entry from its shard uppers, at a
        new generation, also written to the membership file (which the query then follows).
        A member whose entry cannot be made raises its :class:`SharedQueryMemberError`."""
        with self._lock:
            self.tick = tick_seconds(min(m.spec.trigger_seconds for m in self.members.values()))
            built = self._entries(self.members, members=len(self.members))
            for failed in built.values():
                if isinstance(failed, SharedQueryMemberError):
                    raise failed
            entries = {n: e for n, e in built.items() if isinstance(e, Member)}
            # where each member starts: a row of transient failures ends once any moved
            self.transient.started_at({n: e.source.get("startOffsets") for n, e in entries.items()})
            self.generation += 1
            self.entries = entries
            self._began(entries)
            self.membership.write(self.generation, entries)
            since = {n: self.generation for n in entries}
            path = str(self.membership.path)
            return (
                GroupSourceOptions(
                    {n: SourceOptions.from_options(e.source) for n, e in entries.items()},
                    path,
                    since,
                ),
                GroupSinkOptions(
                    {n: SinkOptions.from_options(e.sink) for n, e in entries.items()}, path, since
                ),
            )

    def start(self) -> Any:
        with self._lock:
            self.spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(
                self.spark._jsparkSession
            )
            register(self.spark)
            source, sink = self.begin()
            # A cache like a writer's checkpoint; each member starts at its shard uppers instead.
            shutil.rmtree(self.checkpoint, ignore_errors=True)
            self.query = (
                self.spark.readStream.format(GROUP_FORMAT)
                .options(**source.to_options())
                .load()
                .writeStream.format(GROUP_SINK_FORMAT)
                .options(**sink.to_options())
                .option("checkpointLocation", str(self.checkpoint))
                .queryName(f"millstream-shared-{self.state_dir.path.name}")
                .trigger(processingTime=f"{int(self.tick * 1000)} milliseconds")
                .start()
            )
            self.starts += 1
            for m in self.members.values():
                m.query = self.query
            return self.query

    def add(self, member: DatastreamRunner) -> bool:
        """Let ``member`` (whose state directory the caller holds) join the running query at
        its shard uppers, without a restart: :meth:`add_many` of one. False when it cannot
        join a running query; a member whose tables or source do not answer raises
        :class:`SharedQueryMemberError`, and the query runs on without it."""
        joined = self.add_many([member])[member.member]
        if isinstance(joined, SharedQueryMemberError):
            raise joined
        return joined

    def add_many(
        self, members: Sequence[DatastreamRunner]
    ) -> dict[str, bool | SharedQueryMemberError]:
        """Let ``members`` (whose state directories the caller holds) join the running query
        together, each at its shard uppers, without a restart: their entries are made at once
        (:meth:`_entries`) and written in ONE membership change (one generation), which the
        query's source takes at the next batch it plans. The 100 tables of a datastream, or
        the topics a pattern's listing found, join as one change, not one after another.

        Per member: True (it runs in the query, now or already), False when it cannot join a
        running query (none runs, or its trigger's tick is shorter than the query's, so its
        records would wait for the query's tick: the caller then restarts the query with it), or the :class:`SharedQueryMemberError` of a member whose
        tables or source do not answer (the query runs on without it)."""
        with self._lock:
            if self._stopping or self.query is None or not self.query.isActive:
                return {m.member: False for m in members}
            out: dict[str, bool | SharedQueryMemberError] = {}
            new: dict[str, DatastreamRunner] = {}
            for m in members:
                if m.member in self.members:
                    out[m.member] = True
                elif tick_seconds(m.spec.trigger_seconds) < self.tick:
                    out[m.member] = False
                else:
                    new[m.member] = m
            if not new:
                return out
            built = self._entries(new, members=len(self.members) + len(new))
            joined = {n: e for n, e in built.items() if isinstance(e, Member)}
            out.update({n: e for n, e in built.items() if not isinstance(e, Member)})
            if not joined:
                return out
            self.generation += 1
            self.entries = {**self.entries, **joined}
            self._began(joined)
            self.members = dict(sorted({**self.members, **{n: new[n] for n in joined}}.items()))
            self.membership.write(self.generation, self.entries)
            for name in joined:
                new[name].query = self.query
                out[name] = True
            self.joins += len(joined)
            log.info(
                "%s joined shared query %s (generation %d)",
                ", ".join(f"datastream {n}" for n in sorted(joined))
                if len(joined) <= 5
                else f"{len(joined)} datastreams ({', '.join(sorted(joined)[:3])}, ...)",
                self.state_dir.path.name,
                self.generation,
            )
            return out

    def remove(self, name: str, timeout: float = 60.0) -> bool:
        """Take ``name`` out of the running query without a restart: once this returns True,
        none of its batches commits any more (a commit in flight has ended; one that starts
        later finds it gone and deletes its files). False when it cannot: it is the last
        member, a commit held the membership longer than ``timeout`` seconds, or the query
        has ended (a member's error ended it, and its thread has yet to raise it): the caller
        then stops the query instead, and a new one starts without the member."""
        with self._lock:
            if name not in self.members:
                return True
            if len(self.members) == 1 or self.query is None or not self.query.isActive:
                return False
            try:
                with self.membership.exclusive(timeout):
                    entries = {n: e for n, e in self.entries.items() if n != name}
                    self.membership.write(self.generation + 1, entries)
            except MembershipLockTimeout:
                log.warning(
                    "datastream %s could not leave shared query %s within %.0f s (a commit "
                    "held its membership): the query is restarted without it",
                    name,
                    self.state_dir.path.name,
                    timeout,
                )
                return False
            self.generation += 1
            self.entries = entries
            member = self.members.pop(name)
            member.query = None
            self.leaves += 1
            log.info(
                "datastream %s left shared query %s (generation %d)",
                name,
                self.state_dir.path.name,
                self.generation,
            )
            return True

    def status(self) -> dict[str, Any]:
        """The query's ids (a join or a leave keeps them; a restart changes the run id; none
        once it ended), its members and its counts of starts, joins and leaves."""
        query = self.query
        if query is not None and not query.isActive:
            query = None
        ids = self._ids
        if query is not None and (ids is None or ids[0] is not query):
            ids = self._ids = (query, str(query.id), str(query.runId))
        return {
            "query_id": ids[1] if query is not None and ids is not None else None,
            "run_id": ids[2] if query is not None and ids is not None else None,
            "members": sorted(self.members),
            "generation": self.generation,
            "starts": self.starts,
            "joins": self.joins,
            "leaves": self.leaves,
            **self.transient.to_dict(),
        }

    def run(self) -> None:
        """Run until :meth:`stop`. A restartable error (a member fenced, gapped, or its staged
        files too old) restarts the query from every member's shard uppers; any other error of
        a member raises :class:`SharedQueryMemberError`, and one of the query as a whole is
        raised as it is.

        One of Spark's transient failures (:func:`~millstream.errors.transient_spark_failure`:
        a Python process that did not connect back in time), at the query's start or while it
        runs, whichever member's task met it, restarts the query from every member's shard
        uppers after a capped exponential backoff (:class:`~millstream.spark.runner.
        TransientRestarts`), with the same members: none of them fails. It is raised only
        when too many came in a row with no commit in between."""
        owns_lock = not self.state_dir.held
        if owns_lock:
            self.state_dir.lock()
        try:
            while not self._stopping:
                error = self._start_transiently()
                if error is None:
                    if self._stopping:
                        self.query.stop()  # stop() came while this query was starting
                        return
                    error = self._await()
                    if error is None or self._stopping:
                        return
                if self._stopping:
                    return
                transient = None if _restartable(error) else transient_spark_failure(error)
                if transient is not None:
                    delay = self.transient.failed(transient, error)
                    log.warning(
                        "shared query %s restarts every member from its shard uppers in %.1f s "
                        "after Spark's transient failure %s (%d in a row, %d in all; %d "
                        "members): %s",
                        self.state_dir.path.name,
                        delay,
                        transient.condition,
                        self.transient.in_a_row,
                        self.transient.total,
                        len(self.members),
                        transient.message,
                    )
                    if self.on_transient is not None:
                        self.on_transient(sorted(self.members), self.transient.last_error or "")
                    self.transient.waiting = delay
                    try:
                        self._wake.wait(delay)
                    finally:
                        self.transient.waiting = None
                    continue
                member = member_of(error)
                key = member or "*"
                if not _restartable(error) or self._count_restart(key) > MAX_RESTARTS:
                    if member is not None:
                        raise SharedQueryMemberError(member, error) from error
                    raise error
                counted = self.restarts[key]
                log.warning(
                    "shared query %s restarts every member from its shard uppers (%s, %d in a "
                    "row, %d in all): %s",
                    self.state_dir.path.name,
                    f"datastream {member!r}" if member else "the query",
                    counted.in_a_row,
                    counted.total,
                    str(error).splitlines()[0],
                )
        finally:
            if owns_lock:
                self.state_dir.unlock()

    def _count_restart(self, key: str) -> int:
        """Count a restart of ``key`` (a member, or ``*``: the query as a whole) after a
        restartable error; returns its restarts in a row. A row ends when the member (for
        ``*``, any member) committed past the shard uppers its entry started at."""
        names = list(self.entries) if key == "*" else [key]
        progressed = False
        for name in names:
            entry, m = self.entries.get(name), self.members.get(name)
            if entry is None or m is None:
                continue
            started = SourceOptions.from_options(entry.source).start_offsets
            try:
                progressed = moved_past(started, m.committed_uppers())
            except Exception:  # a store that does not answer: no progress seen
                log.warning(
                    "shared query %s: reading %s's shard uppers failed",
                    self.state_dir.path.name,
                    name,
                    exc_info=True,
                )
            if progressed:
                break
        return self.restarts.setdefault(key, RestartsInARow()).failed(progressed)

    def _began(self, entries: dict[str, Member]) -> None:
        """Members that restarted before start now at their entries' start offsets: a commit
        past them ends their rows (:class:`RestartsInARow`)."""
        for name, entry in entries.items():
            counted = self.restarts.get(name)
            if counted is not None:
                counted.began(SourceOptions.from_options(entry.source).start_offsets)

    def restarts_in_a_row(self, member: str) -> int:
        """``member``'s restarts in a row after a fenced, gapped or expired commit (0 once it
        committed past where it started after the last one)."""
        counted, m = self.restarts.get(member), self.members.get(member)
        if counted is None:
            return 0
        return counted.shown(m.committed_uppers if m is not None else dict)

    def _start_transiently(self) -> Exception | None:
        """:meth:`start` the query; returns the error of a start that failed on one of Spark's
        transient failures (the source's Python process did not connect back in time), raises
        any other (a member's entry that cannot be made: :class:`SharedQueryMemberError`)."""
        try:
            self.start()
        except SharedQueryMemberError:
            raise
        except Exception as exc:
            if transient_spark_failure(exc) is None:
                raise
            return exc
        return None

    def _await(self) -> Exception | None:
        try:
            self.query.awaitTermination()
            return None
        except StreamingQueryException as exc:
            return exc

    def stop(self) -> None:
        with self._lock:  # no member joins a query being stopped
            self._stopping = True
        self._wake.set()  # a restart's backoff ends
        if self.query is not None:
            self.query.stop()
