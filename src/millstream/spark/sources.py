"""The stream source ``millstream_source``: any :mod:`millstream.ingest.sources` reader behind
Spark's Python Data Source API (options: :class:`millstream.spark.options.SourceOptions`).

Offsets are ``{partition: offset}`` (JSON keys are strings). Admission control comes from
``ReadMaxRows(max_records_per_batch)`` where the spec sets it and otherwise from the adaptive
budget (:meth:`StreamReader.budget`: what the batch's write tasks hold in their memory);
``SupportsTriggerAvailableNow`` pins the target so ``trigger(availableNow=True)`` still runs
in bounded batches.

A task's reader yields one *marker* row per planned range ``[lo, hi)`` of a partition, valued
:data:`SELF_READ`, and no records: the sink reads every range itself through the same source
kind and config (:func:`marked_ranges`). Record data never passes through the JVM (records
would be turned from Arrow into JVM rows and back into Arrow, in a second Python worker per
task), the sink learns every range, even one with no records (offsets need not be
contiguous), and the frontier always advances over the whole range. Ranges are fixed by the
batch's offsets, so a replayed batch re-reads exactly the same records.
"""

from __future__ import annotations

import gc
import json
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from millstream.core.memory import release_freed_memory
from millstream.errors import SourceOffsetsRewoundError
from millstream.ingest.sources.base import (
    MIN_ADAPTIVE_BATCH,
    RAW_SCHEMA,
    PartitionReader,
    adaptive_budget,
    decode_offsets,
    encode_offsets,
    latest_offsets_of,
    split_budget,
)
from millstream.spark.membership import Member, Membership
from millstream.spark.options import SPLIT_MIN_RECORDS, GroupSourceOptions, SourceOptions

T = TypeVar("T")

#: The Spark format name of the stream source.
FORMAT = "millstream_source"

RAW_DDL = (
    "partition int, offset bigint, key binary, value binary, "
    "range_lo bigint, range_hi bigint, is_marker boolean"
)

#: The value of a marker: the sink reads the marker's range itself.
SELF_READ = b"millstream:read-range"

#: The value of the row that carries a joined member's entry to its task's sink.
ENTRY = b"millstream:member-entry"

#: The Spark format name of a shared query's source (several datastreams in one query).
GROUP_FORMAT = "millstream_group_source"
#: A shared query's rows: the raw rows plus the member datastream each belongs to.
GROUP_DDL = RAW_DDL + ", member string"
GROUP_SCHEMA = RAW_SCHEMA.append(pa.field("member", pa.string()))
#: Members of a shared query planned, or written by one task, at once (each on a thread).
MEMBER_THREADS = 8
#: The note a member's error carries out of a shared query (its Python worker's traceback
#: reaches the driver as text), so the worker knows whose error it was.
MEMBER_NOTE = "in the shared query's member datastream {!r}"


def plan_tasks(
    ranges: list[tuple[int, int, int]], tasks: int, split_min: int = SPLIT_MIN_RECORDS
) -> list[list[tuple[int, int, int]]]:
    """A batch's ``(partition, lo, hi)`` ranges as the ranges of at most ``tasks`` write tasks,
    balanced longest first. With fewer ranges than tasks (a topic of one partition, say), the
    longest range is halved while it leaves pieces of at least ``split_min`` records, so a
    catch-up uses every core; the pieces of a partition then go to different tasks, and the
    commit chains them (:func:`millstream.metastore.append.checked_appends`)."""
    pieces = list(ranges)
    while len(pieces) < tasks:
        longest = max(pieces, key=lambda r: r[2] - r[1], default=None)
        if longest is None or longest[2] - longest[1] < 2 * split_min:
            break
        p, lo, hi = longest
        mid = lo + (hi - lo) // 2
        pieces.remove(longest)
        pieces += [(p, lo, mid), (p, mid, hi)]
    n = max(1, min(tasks, len(pieces)))
    buckets: list[list[tuple[int, int, int]]] = [[] for _ in range(n)]
    load = [0] * n
    for r in sorted(pieces, key=lambda r: r[2] - r[1], reverse=True):
        i = load.index(min(load))
        buckets[i].append(r)
        load[i] += r[2] - r[1]
    return [sorted(b) for b in buckets if b]


class RangeTask(InputPartition):
    """One Spark task: ranges ``(partition, lo, hi)`` of one or more stream partitions."""

    def __init__(self, ranges: list[tuple[int, int, int]]) -> None:
        super().__init__(ranges)
        self.ranges = ranges


#: The shortest tick of a query (seconds): what an idle datastream's tick costs is asked
#: this often at most (:func:`tick_seconds`).
MIN_TICK_SECONDS = 0.1


def tick_seconds(trigger: float) -> float:
    """The Spark trigger of a query whose datastreams' trigger interval is ``trigger``: a fifth
    of it, at least :data:`MIN_TICK_SECONDS` (never more than the interval itself): 100 ms for
    the default 500 ms, 1 s for 5 s, 4 s for 20 s. Spark's processing-time trigger cannot be
    woken, so the query asks its source at every tick and the source plans a datastream at
    most once per its own interval while records flow (:meth:`StreamReader.due`); an idle one
    is asked at every tick, so records that reach it start a batch within one tick, not
    within one interval (on average half of it).

    What a tick costs an idle datastream: one ``latestOffset`` round trip to the source's
    Python process and, for Kafka, one watermark request per client config (a files source
    lists its directories). A fifth of the interval keeps that at five asks per interval
    whatever the interval (ten a second at most); a busy datastream's ticks between its plans
    ask nothing of its source."""
    if trigger <= 0:
        return 0.0
    return min(trigger, max(MIN_TICK_SECONDS, trigger / 5))


def _advances(start: dict[str, Any], end: dict[str, Any]) -> bool:
    """Whether the batch from ``start`` to ``end`` holds records (a partition's end past its
    start; a partition the start lacks is not planned yet)."""
    begin = decode_offsets(start)
    return any(o > begin.get(p, o) for p, o in decode_offsets(end).items())


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans offset ranges of a :class:`PartitionReader` and reads them in Spark tasks."""

    def __init__(self, options: SourceOptions, source: PartitionReader | None = None) -> None:
        self.opts = options
        self.source = source if source is not None else options.reader()
        self._target: dict[int, int] | None = None
        self._gate_store: Any = None
        #: When a plan last found records (monotonic seconds; None: never, or not since the
        #: reader was made): the datastream is busy for its interval since (:meth:`due`).
        self._planned_at: float | None = None

    def __getstate__(self) -> dict[str, Any]:
        # The gate's metadata store holds connections; a task never needs it.
        return {**self.__dict__, "_gate_store": None}

    def due(self, now: float) -> bool:
        """Whether the datastream is planned when asked at ``now`` (monotonic seconds): its
        query ticks faster than its trigger interval (:func:`tick_seconds`), and while records
        flow it plans at most once per interval (its batches' count and cost are the
        interval's). One whose last plan found nothing (idle) is planned at every ask, so
        records that reach it start a batch at the next tick. Half a tick early counts: the
        ask of the tick that ends the interval comes a little earlier or later after its
        tick than the plan did. An available-now run (its target pinned) is never held: it
        plans until it reaches its target."""
        every = self.opts.trigger_seconds
        last = self._planned_at
        if self._target is not None or every <= 0 or last is None:
            return True
        return now - last >= every - tick_seconds(every) / 2

    def _fill_new_partitions(self, start: dict[int, int], latest: dict[int, int]) -> dict[int, int]:
        missing = [p for p in latest if p not in start]
        if not missing:
            return start
        fresh = (
            self.source.earliest_offsets() if self.opts.starting_offsets == "earliest" else latest
        )
        return {**start, **{p: fresh.get(p, 0) for p in missing}}

    def initialOffset(self, latest: dict[int, int] | None = None) -> dict[str, int]:
        """Where a batch starts: the start offsets, and for a partition they lack where a
        fresh start would begin; ``latest`` is the source's latest offsets if the caller asked
        for them already (a shared query asks for every member's at once)."""
        if latest is None:
            latest = self.source.latest_offsets()
        return encode_offsets(self._fill_new_partitions(dict(self.opts.start_offsets), latest))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_records_per_batch is None:
            return ReadAllAvailable()  # bounded in latestOffset by the adaptive budget
        return ReadMaxRows(self.opts.max_records_per_batch)

    def budget(self) -> int:
        """Records a batch may plan: ``max_records_per_batch`` if the spec sets it, else the
        adaptive budget (what the batch's write tasks hold in ``task_memory_mb`` each)."""
        if self.opts.max_records_per_batch is not None:
            return self.opts.max_records_per_batch
        size = self.source.record_bytes()
        return adaptive_budget(
            self.opts.tasks,
            self.opts.task_memory_mb << 20,
            size if size is not None else self.source.typical_record_bytes,
        )

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self.source.latest_offsets()

    def latestOffset(
        self,
        start: dict[str, Any],
        limit: ReadLimit,
        latest: dict[int, int] | None = None,
        gates: dict[tuple[str, str, str, float], bool] | None = None,
        now: float | None = None,
    ) -> dict[str, Any]:
        """The end of the next batch from ``start``: ``start`` itself (no batch) while the
        datastream is not :meth:`due` at ``now`` (monotonic seconds, the clock's if None);
        ``latest`` is the source's latest offsets if the caller asked for them already (a
        shared query asks for every member's at once), else they are asked here; ``gates`` as
        :meth:`_follow_shards`."""
        now = time.monotonic() if now is None else now
        if not self.due(now):
            return start  # not its turn: its source is not asked
        end = self._plan(start, limit, latest, gates)
        if _advances(start, end):
            self._planned_at = now  # busy: its next plan waits for its interval
        return end

    def _plan(
        self,
        start: dict[str, Any],
        limit: ReadLimit,
        latest: dict[int, int] | None,
        gates: dict[tuple[str, str, str, float], bool] | None,
    ) -> dict[str, int]:
        known = decode_offsets(start)
        if self._target is not None:
            latest = self._target
        elif latest is None:
            latest = self.source.latest_offsets()
        begin = self._fill_new_partitions(known, latest)
        self._refuse_rewound(begin, latest)
        latest = {p: max(latest.get(p, o), o) for p, o in begin.items()}
        if isinstance(limit, ReadMaxRows):
            budget = limit.max_rows
        elif isinstance(limit, ReadAllAvailable) and self.opts.max_records_per_batch is not None:
            budget = None
        else:
            # Caught up (what a trigger mostly finds): the budget, which never plans fewer
            # than MIN_ADAPTIVE_BATCH, cannot bind, so the source need not size its records.
            backlog = sum(latest[p] - o for p, o in begin.items())
            budget = backlog if backlog <= MIN_ADAPTIVE_BATCH else self.budget()
        end = latest if budget is None else split_budget(begin, latest, budget)
        # A partition the source gained since ``start`` (a topic's partitions were added)
        # ends this batch where it starts: Spark plans the batch's ranges from ``start``,
        # which lacks it, so a range for it here would never be read, and the next batch
        # would start past it (its first records lost). It is read from the next batch on.
        end = {p: begin[p] if p not in known else o for p, o in end.items()}
        return encode_offsets(self._follow_shards(begin, end, gates))

    def _refuse_rewound(self, begin: dict[int, int], latest: dict[int, int]) -> None:
        """A partition whose source ends below where the batch begins (the shard upper) had
        its offsets go backwards: the topic was deleted and created again, or a broker that
        keeps topics in memory restarted. Planned as before (nothing above the upper), its
        new records were taken as consumed while the lag said 0. The source is asked once
        more (an answer may have been short), then :class:`SourceOffsetsRewoundError` names
        the partition and both offsets (the writer stops; docs/operations.md says how an
        operator recovers)."""
        behind = [p for p, o in begin.items() if p in latest and latest[p] < o]
        if not behind:
            return
        again = self.source.latest_offsets()
        for p in behind:
            if again.get(p, begin[p]) < begin[p]:
                config = self.source.config
                raise SourceOffsetsRewoundError(
                    getattr(config, "datastream", "") or "?",
                    describe_reader(self.source),
                    p,
                    again[p],
                    begin[p],
                )

    def _follow_shards(
        self,
        begin: dict[int, int],
        end: dict[int, int],
        gates: dict[tuple[str, str, str, float], bool] | None = None,
    ) -> dict[int, int]:
        """A warm standby (a source with a commit gate) that may not commit plans no further
        than what the active has committed. So it stays warm but never runs ahead of the shard
        upper, and the first batch it plans once the active is gone starts at the upper and
        commits directly: no gap, no restart. ``gates``: the answers of the plan's gates so
        far (a shared query's plan asks each datastream's gate once for all its tables: 100
        tables of one datastream asked the same question 100 times a plan)."""
        gate = self.opts.gate
        if gate is None or all(e <= begin.get(p, e) for p, e in end.items()):
            # nothing to hold back: an idle standby's ticks (every tick_seconds) ask no store
            return end
        # lazy: only a gated (standby) source needs the metadata store; importing SQLAlchemy
        # in every query's source process would slow every query start by ~0.3 s.
        from millstream.metastore.store import STORES

        if self._gate_store is None:
            assert self.opts.settings is not None
            # the process's store of that URL: one engine a member cost 100 of them
            self._gate_store = STORES.get(self.opts.settings.metadata_url)
        store = self._gate_store
        key = (store.url, gate.datastream, gate.worker, gate.takeover_ttl)
        allowed = gates.get(key) if gates is not None else None
        if allowed is None:
            allowed = store.may_commit(
                gate.datastream, gate.worker, takeover_ttl=gate.takeover_ttl, now=time.time()
            )
            if gates is not None:
                gates[key] = allowed
        if allowed:
            return end
        uppers = {sh.partition: sh.upper for sh in store.list_shards(gate.table)}
        return {p: max(begin.get(p, e), min(e, uppers.get(p, e))) for p, e in end.items()}

    def plan(self, start: dict[str, Any], end: dict[str, Any]) -> list[list[tuple[int, int, int]]]:
        """The ranges of the batch from ``start`` to ``end``, as its write tasks' ranges."""
        begin, stop = decode_offsets(start), decode_offsets(end)
        ranges = [
            (p, begin.get(p, hi), hi) for p, hi in sorted(stop.items()) if hi > begin.get(p, hi)
        ]
        return plan_tasks(ranges, self.opts.tasks, self.opts.split_min_records) if ranges else []

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        return [RangeTask(b) for b in self.plan(start, end)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangeTask)
        settle_worker()
        yield markers_batch(partition.ranges)

    def commit(self, end: dict[str, Any]) -> None:
        pass


class GroupTask(InputPartition):
    """One Spark task of a shared query: ``(member, ranges)`` of one or more datastreams, and
    the entry (:class:`~millstream.spark.membership.Member`) of each member that joined the
    running query: the task's reader and sink were made at the query's start and know only
    the members it started with."""

    def __init__(
        self,
        parts: list[tuple[str, list[tuple[int, int, int]]]],
        joined: dict[str, Member] | None = None,
    ) -> None:
        super().__init__(parts)
        self.parts = parts
        self.joined = joined or {}


def whole_if_small(
    buckets: list[list[tuple[int, int, int]]], split_min: int
) -> list[list[tuple[int, int, int]]]:
    """A shared query's member whose batch holds fewer than ``split_min`` records is written
    by ONE task: the other members fill the other tasks, and spreading a few hundred records
    over tasks multiplied what each piece costs whatever its size (a fetch, a staged file, a
    commit entry): 8 datastreams of 4 partitions wrote 16 pieces a batch instead of 8
    (bench/scale.py (b)). A batch that large keeps its buckets (whose pieces of one split
    partition must stay in different tasks)."""
    ranges = sorted(r for b in buckets for r in b)
    if len(buckets) <= 1 or sum(hi - lo for _, lo, hi in ranges) >= split_min:
        return buckets
    if len({p for p, _, _ in ranges}) < len(ranges):
        return buckets  # pieces of a split partition (never below split_min; kept apart)
    return [ranges]


def plan_group_tasks(
    members: list[tuple[str, list[list[tuple[int, int, int]]]]], tasks: int
) -> list[list[tuple[str, list[tuple[int, int, int]]]]]:
    """Each member's write tasks (:func:`plan_tasks`) packed into at most ``tasks`` tasks of the
    shared query, balanced longest first: the query runs ``tasks`` tasks a batch, however many
    datastreams it holds.

    A task never gets two of one member's buckets: a task writes a member's part with one
    sink, which reports one range per partition, so the two pieces of a split partition in one
    task would be reported as one range spanning both and the commit would refuse it as an
    overlap. A member has at most ``tasks`` buckets (:func:`plan_tasks`), so a task without it
    is always left."""
    pieces = [
        (sum(hi - lo for _, lo, hi in bucket), name, bucket)
        for name, buckets in members
        for bucket in buckets
    ]
    most = max((len(buckets) for _, buckets in members), default=0)
    n = max(1, most, min(tasks, len(pieces)))
    out: list[list[tuple[str, list[tuple[int, int, int]]]]] = [[] for _ in range(n)]
    load = [0] * n
    held: list[set[str]] = [set() for _ in range(n)]
    for size, name, bucket in sorted(pieces, key=lambda t: (-t[0], t[1])):
        i = min((j for j in range(n) if name not in held[j]), key=lambda j: load[j])
        out[i].append((name, bucket))
        held[i].add(name)
        load[i] += size
    return [sorted(t) for t in out if t]


class GroupStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The source of a shared query: a :class:`StreamReader` per member datastream, each
    planning as it would alone (its budget, its standby gate); offsets are
    ``{datastream: {partition: offset}}``. A member's error carries :data:`MEMBER_NOTE`."""

    def __init__(self, options: GroupSourceOptions) -> None:
        self.opts = options
        self.members = {n: StreamReader(o) for n, o in sorted(options.members.items())}
        self.tasks = max(o.tasks for o in options.members.values())
        #: The running query's membership (None: fixed members), the generation last read,
        #: each member's incarnation, and the entries of the members that joined since the
        #: query started (their tasks carry them).
        self._membership = Membership(options.membership) if options.membership else None
        self._generation = -1
        self.since: dict[str, int] = dict(options.since)
        self.joined: dict[str, Member] = {}
        #: A member that joined as a new incarnation of one the batch's start still holds:
        #: the end its entry starts it at, until a batch starts there (then it plans).
        self._entering: dict[str, Any] = {}
        #: Members whose end in the batch last planned is their entry's start, not a plan.
        self._unplanned: set[str] = set()
        #: Readers made for joined members in a task's process, by (member, since).
        self._task_readers: dict[tuple[str, int], StreamReader] = {}
        #: When a plan of the query last found records for any member (monotonic seconds;
        #: None: never): the query is busy for the shortest interval since (:meth:`_query_due`).
        self._busy_at: float | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_task_readers": {}}

    def refresh(self) -> None:
        """Take the membership file's members (at each batch planned): a member that joined
        gets a reader of its entry's options and enters at their start offsets; a member
        that left is planned no more. An error names the file."""
        if self._membership is None:
            return
        changed = self._membership.read_changed()
        if changed is None:
            return  # the same file as at the last plan
        generation, members = changed
        if generation == self._generation or not members:
            return
        self._generation = generation
        for name in [n for n in self.members if n not in members]:
            del self.members[name]
            self.since.pop(name, None)
            self.joined.pop(name, None)
            self._entering.pop(name, None)
        for name, entry in sorted(members.items()):
            if self.since.get(name) == entry.since:
                continue
            with member_errors(name):
                reader = StreamReader(SourceOptions.from_options(entry.source))
            self.members[name] = reader
            self.since[name] = entry.since
            self.joined[name] = entry
            self._entering[name] = None
        self.members = dict(sorted(self.members.items()))
        self.tasks = max(r.opts.tasks for r in self.members.values())

    def _query_due(self, now: float) -> bool:
        """Whether the query may plan a batch at ``now``: a batch costs the query its fixed
        cost (Spark's planning, its logs, a Python call per task) whatever members it holds,
        so while records flow the query runs at most one batch per its members' shortest
        trigger, as it did when it triggered at that interval, and its members' plans come
        together: asked each at its own turn, members whose records arrive at different
        instants would each start a batch at the next tick. An idle query (no plan found
        records for an interval) plans at every tick: records that reach any member start a
        batch within one tick; a member's records that arrive while others flow join the
        query's next batch. Half a tick early counts, as for a member
        (:meth:`StreamReader.due`)."""
        last = self._busy_at
        every = min((r.opts.trigger_seconds for r in self.members.values()), default=0.0)
        if last is None or every <= 0:
            return True
        return now - last >= every - tick_seconds(every) / 2

    def initialOffset(self) -> dict[str, Any]:
        """Every member's start, their sources' latest offsets asked together (Kafka members
        of one client config in one request, and one probe past the watermarks for all: a
        fresh reader's probe waits for a fetch, and 100 members asked one after another made a
        query's start wait ~0.75 s a member)."""
        self.refresh()
        asked = latest_offsets_of({n: r.source for n, r in self.members.items()})
        out: dict[str, Any] = {}
        for n, r in self.members.items():
            with member_errors(n):
                got = asked[n]
                if isinstance(got, Exception):
                    raise got
                out[n] = r.initialOffset(got)
        return out

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadAllAvailable()  # each member applies its own limit

    def prepareForTriggerAvailableNow(self) -> None:
        for n, r in self.members.items():
            with member_errors(n):
                r.prepareForTriggerAvailableNow()

    def latestOffset(
        self, start: dict[str, Any], limit: ReadLimit, now: float | None = None
    ) -> dict[str, Any]:
        """Every member's end at ``now`` (monotonic seconds, the clock's if None); a member
        not :meth:`~StreamReader.due` ends where it starts, and neither its source nor a
        thread is asked for it. The due members' sources are asked for their latest offsets
        together (:func:`~millstream.ingest.sources.base.latest_offsets_of`: Kafka members
        of one client config in one request), then each member plans on a thread of its own
        (a standby's gate asks the metadata store). 8 datastreams of 4 partitions asked a
        watermark per partition, each member on its thread, waited 180-350 ms a batch for a
        busy broker (bench/scale.py (b))."""

        self.refresh()
        # A member that joined enters where its entry starts it: until a batch starts there,
        # its end is that start (``partitions`` plans nothing for it). The batch's start may
        # hold an earlier incarnation's end, which is not where the new one begins.
        entering = {n for n, at in self._entering.items() if n not in start or start[n] != at}
        for n in [n for n in self._entering if n not in entering]:
            del self._entering[n]
        now = time.monotonic() if now is None else now
        # each member is planned at most once per its own trigger while busy, at every tick
        # of the query while idle (StreamReader.due)
        held = not self._query_due(now)
        due = {
            n
            for n, r in self.members.items()
            if (r._target is not None or (not held and r.due(now))) and n not in entering
        }
        starting = {n for n in self.members if n not in start or n in entering}
        asked = latest_offsets_of(
            {
                n: r.source
                for n, r in self.members.items()
                if (n in due and r._target is None) or n in starting
            }
        )

        def latest(n: str) -> Any:
            r = self.members[n]
            with member_errors(n):
                # A member the checkpoint does not know yet ends this batch where it would
                # start alone: ``partitions`` plans nothing for it (the start lacks it), so
                # an end past that start would skip its first records. One it knows with no
                # partitions yet (``{}``: falsy) keeps that start, so a partition its source
                # gains is planned from its first record.
                if n in starting:
                    got = asked.get(n)
                    if isinstance(got, Exception):
                        raise got
                    return r.initialOffset(got)
                begin = start[n]
                got = asked.get(n)
                if isinstance(got, Exception):
                    raise got
                return r.latestOffset(begin, r.getDefaultReadLimit(), got, gates, now)

        gates: dict[tuple[str, str, str, float], bool] = {}  # this plan's answers
        # A due member whose source answered exactly where it starts (nothing new, no
        # partition gained, none rewound) ends there without a plan: a wholly idle query asks
        # every member at every tick, and planning 100 idle members each on a thread of a
        # fresh pool cost its source process ~6.5 ms a tick, 0.05 cores
        # (docs/performance.md, "An idle worker of 100 topics"). Any other answer is planned
        # in full, its checks (a rewound partition, a gained one) included.
        to_plan = [
            n
            for n in self.members
            if n in starting
            or (n in due and not _answered_its_start(self.members[n], start[n], asked.get(n)))
        ]
        planned = each_member(to_plan, latest, "member-plan")
        # a member not due: not its turn, nothing new for it this batch (it is in the start:
        # one that is not is starting)
        ends = {n: planned[n] if n in planned else start[n] for n in self.members}
        if any(_advances(start[n], ends[n]) for n in due if n in start and n not in starting):
            self._busy_at = now  # busy: the next batch waits for the shortest interval
        for n in entering:
            self._entering[n] = ends[n]
        self._unplanned = entering | {n for n in self.members if n not in start}
        return ends

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        planned = [
            (n, whole_if_small(buckets, r.opts.split_min_records))
            for n, r in self.members.items()
            if n not in self._unplanned
            and n in start
            and (buckets := r.plan(start[n], end.get(n, start[n])))
        ]
        return [
            GroupTask(t, {n: self.joined[n] for n, _ in t if n in self.joined})
            for t in plan_group_tasks(planned, self.tasks)
        ]

    def _reader_of(self, name: str, joined: Member | None) -> StreamReader:
        """The member's reader in a task: the query's own for a member it started with, one
        of the task's entry for a member that joined the running query."""
        if joined is None:
            return self.members[name]
        key = (name, joined.since)
        if key not in self._task_readers:
            self._task_readers[key] = StreamReader(SourceOptions.from_options(joined.source))
        return self._task_readers[key]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, GroupTask)
        settle_worker()
        for n, ranges in partition.parts:
            joined = partition.joined.get(n)
            with member_errors(n):
                if joined is not None:
                    yield with_member(entry_batch(joined), n)
                for batch in self._reader_of(n, joined).read(RangeTask(ranges)):
                    yield with_member(batch, n)

    def commit(self, end: dict[str, Any]) -> None:
        pass


#: Whether this process froze what it held at its first task (:func:`settle_worker`).
_settled = False


def settle_worker() -> None:
    """At a process's first task, move every object it holds then (the modules and the
    query's reader or sink, made as the task was unpickled) to the collector's permanent
    generation (:func:`gc.freeze`). Spark's Python daemon runs a full ``gc.collect()`` after
    every task of a reused worker, and that collection walked all of them every time:
    ~30 ms a task for the imports alone, a third of a worker's samples at 100 topics in one
    datastream (docs/performance.md, "Spark's Python workers at 100 tables"). Frozen objects
    are still freed by their reference counts; only a cycle among them is never collected,
    and they are the process's long-lived state. Later objects are collected as before."""
    global _settled, _rss_floor
    if not _settled:
        _settled = True
        gc.freeze()
        _rss_floor = _rss_bytes()  # what :func:`release_after_task` measures growth from


#: A worker gives back what its allocators keep after a task once its RSS grew this much since
#: it last did (or since its first task): a catch-up's write tasks (``task_memory_mb`` each)
#: left each worker ~100-140 MB above its size in mimalloc's and glibc's free pages, held to
#: the end of the run, while the small tasks of a caught-up batch grow it by nothing and pay
#: only the RSS read (docs/performance.md, "Spark's Python workers give back a catch-up").
RELEASE_GROWTH_BYTES = 64 << 20

#: The worker's RSS after its last release (None before its first task).
_rss_floor: int | None = None
#: How many times this process gave its freed memory back (:func:`release_after_task`).
releases = 0


_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0  # no /proc: never releases


def release_after_task() -> bool:
    """At the end of a write task, give back to the system what the task freed but the
    allocators keep (the Arrow pool's ``release_unused()``, mimalloc's in a streaming worker,
    and glibc's ``malloc_trim(0)``), only when the process's RSS grew past
    :data:`RELEASE_GROWTH_BYTES` since it last did: a reused worker keeps the high-water mark
    of its largest task otherwise. True when it released."""
    global _rss_floor, releases
    rss = _rss_bytes()
    if _rss_floor is None or rss < _rss_floor:
        _rss_floor = rss
        return False
    if rss - _rss_floor < RELEASE_GROWTH_BYTES:
        return False
    release_freed_memory()
    _rss_floor = _rss_bytes()
    releases += 1
    return True


@contextmanager
def member_errors(member: str) -> Iterator[None]:
    """An error raised inside carries :data:`MEMBER_NOTE` naming ``member``."""
    try:
        yield
    except Exception as exc:
        exc.add_note(MEMBER_NOTE.format(member))
        raise


def _answered_its_start(reader: StreamReader, start: dict[str, Any], got: Any) -> bool:
    """Whether a member's source answered exactly the offsets its batch starts at (so its
    plan would end there): every partition, no more, none other. An available-now member
    plans to its target, not to an answer."""
    return reader._target is None and isinstance(got, dict) and got == decode_offsets(start)


def each_member(names: list[str], call: Callable[[str], T], thread_prefix: str) -> dict[str, T]:
    """``{name: call(name)}``, a thread per member (at most :data:`MEMBER_THREADS` at once):
    what a member does waits on its source (a broker round trip), so members one after
    another made a batch wait the sum of their waits. The first error is raised."""
    if len(names) <= 1:
        return {n: call(n) for n in names}
    with ThreadPoolExecutor(
        max_workers=min(len(names), MEMBER_THREADS), thread_name_prefix=thread_prefix
    ) as pool:
        futures = {n: pool.submit(call, n) for n in names}
        return {n: f.result() for n, f in futures.items()}


def with_member(batch: pa.RecordBatch, member: str) -> pa.RecordBatch:
    """A raw batch of ``member`` as a shared query's batch (:data:`GROUP_SCHEMA`)."""
    n = batch.num_rows
    return pa.RecordBatch.from_arrays(
        [*batch.columns, pa.array([member] * n, pa.string())], schema=GROUP_SCHEMA
    )


class GroupStreamSource(DataSource):
    """``spark.readStream.format("millstream_group_source")`` with
    :class:`~millstream.spark.options.GroupSourceOptions`: several datastreams in one query."""

    @classmethod
    def name(cls) -> str:
        return GROUP_FORMAT

    def schema(self) -> str:
        return GROUP_DDL

    def streamReader(self, schema: object) -> DataSourceStreamReader:
        return GroupStreamReader(GroupSourceOptions.from_options(self.options))


class StreamSource(DataSource):
    """``spark.readStream.format("millstream_source").options(**SourceOptions(...).to_options())``."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return RAW_DDL

    def streamReader(self, schema: object) -> DataSourceStreamReader:
        return StreamReader(SourceOptions.from_options(self.options))


def describe_reader(source: PartitionReader) -> str:
    """A source in words, for an error: a kafka topic and its brokers, a files path."""
    config = source.config
    if getattr(config, "topic", None):
        return f"kafka topic {config.topic!r} on {config.bootstrap_servers}"
    if getattr(config, "path", None):
        return f"files under {config.path}"
    return f"the {source.kind} source"


def entry_batch(entry: Member) -> pa.RecordBatch:
    """The row that brings a joined member's entry to the sink of its task (whose sink was
    made at the query's start): partition -1, the entry as JSON in its key, :data:`ENTRY` as
    its value."""
    return pa.RecordBatch.from_arrays(
        [
            pa.array([-1], pa.int32()),
            pa.array([-1], pa.int64()),
            pa.array([json.dumps(entry.to_json()).encode()], pa.binary()),
            pa.array([ENTRY], pa.binary()),
            pa.array([-1], pa.int64()),
            pa.array([-1], pa.int64()),
            pa.array([True], pa.bool_()),
        ],
        schema=RAW_SCHEMA,
    )


def markers_batch(ranges: list[tuple[int, int, int]]) -> pa.RecordBatch:
    """Marker rows for ``ranges``, whose records the sink reads itself (:data:`SELF_READ`)."""
    n = len(ranges)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([p for p, _, _ in ranges], pa.int32()),
            pa.array([hi for _, _, hi in ranges], pa.int64()),
            pa.nulls(n, pa.binary()),
            pa.array([SELF_READ] * n, pa.binary()),
            pa.array([lo for _, lo, _ in ranges], pa.int64()),
            pa.array([hi for _, _, hi in ranges], pa.int64()),
            pa.array([True] * n, pa.bool_()),
        ],
        schema=RAW_SCHEMA,
    )


def marked_ranges(raw: pa.Table) -> list[tuple[int, int, int]]:
    """The ``(partition, lo, hi)`` ranges of a task's :data:`SELF_READ` markers, in offset
    order: what its sink reads from the source."""
    markers = raw.filter(pc.equal(raw.column("value"), pa.scalar(SELF_READ)))
    return sorted(
        zip(
            markers.column("partition").to_pylist(),
            markers.column("range_lo").to_pylist(),
            markers.column("range_hi").to_pylist(),
            strict=True,
        )
    )
