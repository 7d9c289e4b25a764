"""Fault campaign: one to four writers race on one to four partitions of one table and its
dead-letter table, committing through the production commit path
(:func:`millstream.table.commit.commit_writes`, what the Spark sink's commit runs).

Every writer reads the same deterministic source, as replicas of one pipeline do. A writer
bootstraps from the shard upper, or from the partition's first offset if the shard does
not exist yet. It plans a batch ``[pos, pos + n)`` for some partitions and stages it as a
data file. Later it commits the batch with compare-and-append, as Spark's sink does. Between
those steps, other writers may commit, replay an old batch id with a fresh staged copy, or
crash after staging and before committing. A crash leaves the staged file behind and the
writer restarts from the shard upper.

After every step:

* the table reads as ``model_rows`` over the source rows below each shard's upper, so
  every offset is persisted exactly once;
* no upper ever moves backwards;
* a partition's manifest entries are ordered by seq, do not overlap, and lie below the
  upper;
* no batch is stranded: a commit of ``[lo, hi)`` with ``hi`` above the upper leaves the
  upper at ``hi`` or higher (Materialize #36860);
* the deep store holds only referenced files, files still waiting to commit, and the
  files of crashed writers.

At the end, garbage collection with no grace period removes the crashed writers' files and
nothing else, and the table still reads the same.

The campaign is seeded. On failure the test prints the seed (rerun with
``MILLSTREAM_FAULT_SEED=<seed>``), Hypothesis's ``@reproduce_failure`` blob, and the
writer, partition and mode setup of the failing example.
"""

from __future__ import annotations

import functools
import os
import random
import secrets
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import pyarrow as pa
from hypothesis import HealthCheck, event, note, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    get_state_machine_test,
    initialize,
    invariant,
    precondition,
    rule,
)

from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.core.frontier import Outcome, decide
from millstream.datastream import dead_letter_spec
from millstream.ingest.decode import dead_letter_rows
from millstream.reference.model import canonical, model_rows
from millstream.spec import OFFSET_COL, PARTITION_COL, TOMBSTONE_COL, TableSpec
from millstream.table.commit import BatchCommit, StagedFile, StagedWrite, commit_writes
from millstream.table.gc import collect_garbage
from millstream.table.read import read_manifest
from millstream.table.writer import stage_rows

Row = dict[str, Any]

TABLE = "orders"
DEAD = dead_letter_spec(TABLE)
SCHEMA = {"k": "string", "seq": "long", "qty": "long", "note": "string", "gone": "boolean"}
SPECS = {
    "append": {"mode": "append"},
    "upsert": {
        "mode": "upsert",
        "primary_key": ["k"],
        "comparison_column": "seq",
        "delete_column": "gone",
    },
    "dedup": {"mode": "dedup", "primary_key": ["k"], "delete_column": "gone"},
    "partial": {
        "mode": "partial",
        "primary_key": ["k"],
        "delete_column": "gone",
        "partial": {"qty": "sum", "note": "append", "seq": "max"},
    },
}
#: How far the deterministic source reaches in each partition.
SOURCE_OFFSETS = 1_000
MAX_BATCH = 8

SEED = int(os.environ.get("MILLSTREAM_FAULT_SEED") or secrets.randbits(32))
SETTINGS = settings(
    max_examples=60,
    stateful_step_count=20,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)


def make_source(mode: str, partition: int, first_offset: int, source_seed: int) -> dict[int, Row]:
    """The rows of one partition, keyed by offset: deterministic per (partition, offset),
    offsets that step by 1 to 3, and a few keys per partition that repeat (partition
    affine, as Kafka's key partitioner makes them)."""
    rng = random.Random(f"{source_seed}/{partition}")
    rows: dict[int, Row] = {}
    offset = first_offset
    while offset < first_offset + SOURCE_OFFSETS:
        tombstone = mode != "append" and rng.random() < 0.05
        gone = None if tombstone else rng.random() < 0.08
        rows[offset] = {
            "k": f"p{partition}-k{rng.randrange(4)}",
            # Only a delete may lack the comparison value (decode dead-letters other records).
            "seq": None if tombstone or (gone and rng.random() < 0.5) else rng.randrange(10),
            "qty": None if tombstone or rng.random() < 0.2 else rng.randrange(-5, 20),
            "note": None if tombstone or rng.random() < 0.3 else rng.choice("xyz"),
            "gone": gone,
            PARTITION_COL: partition,
            OFFSET_COL: offset,
            TOMBSTONE_COL: tombstone,
        }
        offset += rng.randint(1, 3)
    return rows


@dataclass
class Pending:
    staged: StagedFile
    dead: StagedFile
    ranges: dict[int, tuple[int, int]]
    rows: list[Row]
    batch_id: int

    @property
    def paths(self) -> set[str]:
        return {p for p in (self.staged.path, self.dead.path) if p}


@dataclass
class Writer:
    name: str
    #: Next offset to read, per partition (from the shard upper at bootstrap).
    pos: dict[int, int] = field(default_factory=dict)
    pending: Pending | None = None
    last_committed: Pending | None = None
    next_batch_id: int = 0


F = TypeVar("F", bound=Callable[..., None])


def step(fn: F) -> F:
    """Mark the machine unclean while a step runs, so teardown can tell whether the example
    already failed (and then only cleans up instead of piling a second error on top)."""

    @functools.wraps(fn)
    def run(self: ConcurrentWriters, *args: Any, **kwargs: Any) -> None:
        self.clean = False
        fn(self, *args, **kwargs)
        self.clean = True

    return cast(F, run)


class ConcurrentWriters(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.home: str | None = None
        self.cat: Catalog | None = None
        self.clean = True

    # -- setup ---------------------------------------------------------------------------

    @initialize(
        mode=st.sampled_from(sorted(SPECS)),
        n_writers=st.integers(1, 4),
        first_offsets=st.lists(st.integers(0, 5), min_size=1, max_size=4),
        source_seed=st.integers(0, 2**16),
    )
    @step
    def setup(self, mode: str, n_writers: int, first_offsets: list[int], source_seed: int) -> None:
        note(
            f"campaign seed {SEED}: mode={mode} writers={n_writers} "
            f"partitions={len(first_offsets)} first_offsets={first_offsets} "
            f"source_seed={source_seed}"
        )
        self.home = tempfile.mkdtemp(prefix="ms-fault-")
        self.cat = Catalog.open(home=self.home)
        self.spec = TableSpec.parse({"name": TABLE, "schema": SCHEMA, **SPECS[mode]})
        self.cat.create_table(self.spec)
        self.cat.create_table(DEAD)
        self.first_offsets = dict(enumerate(first_offsets))
        self.source = {
            p: make_source(mode, p, first, source_seed) for p, first in self.first_offsets.items()
        }
        # Records that fail to decode: the dead-letter table must hold exactly these.
        self.bad = {
            p: {o for o in rows if random.Random(f"{source_seed}/{p}/{o}/bad").random() < 0.05}
            for p, rows in self.source.items()
        }
        self.uppers: dict[int, int] = {}
        self.crashed_files: set[str] = set()
        self.writers = [Writer(f"writer-{i}") for i in range(n_writers)]
        for w in self.writers:
            self.bootstrap(w)

    def bootstrap(self, w: Writer) -> None:
        """Start (or restart) from the shard upper; a shard that does not exist yet starts
        at the partition's first offset."""
        shards = {sh.partition: sh.upper for sh in self.catalog.store.list_shards(TABLE)}
        w.pos = {p: shards.get(p, first) for p, first in self.first_offsets.items()}

    @property
    def catalog(self) -> Catalog:
        assert self.cat is not None
        return self.cat

    def read_source(self, p: int, lo: int, hi: int) -> list[Row]:
        return [r for o, r in self.source[p].items() if lo <= o < hi]

    def stage(self, w: Writer, ranges: dict[int, tuple[int, int]], batch_id: int) -> Pending:
        """What a write task stages: the good records as a data file, the bad ones as a
        dead-letter file."""
        rows = [r for p, (lo, hi) in ranges.items() for r in self.read_source(p, lo, hi)]
        good = [r for r in rows if r[OFFSET_COL] not in self.bad[r[PARTITION_COL]]]
        dead = [
            (r[PARTITION_COL], r[OFFSET_COL], b"{", None, "not JSON")
            for r in rows
            if r[OFFSET_COL] in self.bad[r[PARTITION_COL]]
        ]
        table = pa.Table.from_pylist(good, schema=self.spec.arrow_schema(system_columns=True))
        staged = stage_rows(self.catalog.deep, self.spec, table, name_hint=w.name)
        dead_file = stage_rows(self.catalog.deep, DEAD, dead_letter_rows(dead), name_hint=w.name)
        return Pending(staged, dead_file, ranges, good, batch_id)

    def commit(self, w: Writer, pending: Pending) -> BatchCommit:
        """The production commit path (what the Spark sink's commit runs): the table and its
        dead-letter table in one transaction."""
        return commit_writes(
            self.catalog.store,
            self.catalog.deep,
            TABLE,
            [StagedWrite(pending.ranges, pending.staged, pending.dead)],
            dead_letter_table=DEAD.name,
            writer_id=w.name,
            batch_id=pending.batch_id,
            raise_for_gaps=False,
        )

    def draw_writer(self, data: st.DataObject, eligible: Callable[[Writer], bool]) -> Writer:
        names = [w.name for w in self.writers if eligible(w)]
        name = data.draw(st.sampled_from(names), label="writer")
        return next(w for w in self.writers if w.name == name)

    def shard_uppers(self) -> dict[int, int]:
        return {sh.partition: sh.upper for sh in self.catalog.store.list_shards(TABLE)}

    # -- rules ---------------------------------------------------------------------------

    @precondition(lambda self: any(w.pending is None for w in self.writers))
    @rule(data=st.data())
    @step
    def plan_and_stage_a_batch(self, data: st.DataObject) -> None:
        """A writer reads ``[pos, pos + n)`` of some partitions and stages the rows."""
        w = self.draw_writer(data, lambda w: w.pending is None)
        parts = data.draw(
            st.lists(st.sampled_from(sorted(self.first_offsets)), min_size=1, unique=True),
            label="partitions",
        )
        sizes = data.draw(
            st.lists(st.integers(0, MAX_BATCH), min_size=len(parts), max_size=len(parts)),
            label="offsets to read per partition",
        )
        ranges = {p: (w.pos[p], w.pos[p] + n) for p, n in zip(parts, sizes, strict=True)}
        w.pending = self.stage(w, ranges, w.next_batch_id)
        w.next_batch_id += 1

    @precondition(lambda self: any(w.pending is not None for w in self.writers))
    @rule(data=st.data())
    @step
    def commit_a_staged_batch(self, data: st.DataObject) -> None:
        """compare_and_append: below-upper rows are dropped, a straddling batch is trimmed,
        and the upper ends at ``hi`` or beyond whenever the batch reached past it."""
        w = self.draw_writer(data, lambda w: w.pending is not None)
        pending = w.pending
        assert pending is not None
        before = self.uppers  # as the invariant read them after the previous step
        commit = self.commit(w, pending)
        result = commit.table
        assert commit.dead_letter is not None
        assert [s.decision for s in commit.dead_letter.shards] == [
            s.decision for s in result.shards
        ], "the dead-letter table decides exactly like the table"
        after = self.shard_uppers()
        for p, (lo, hi) in pending.ranges.items():
            upper = before.get(p, lo)  # a new shard starts where its first batch starts
            expected = decide(upper=upper, epoch=0, lo=lo, hi=hi, writer_epoch=0)
            assert result.outcome(p) is expected.outcome, (p, lo, hi, upper)
            event(f"commit outcome: {expected.outcome}")
            assert result.outcome(p) is not Outcome.GAP, "a writer ran ahead of the upper"
            if hi > upper:
                assert after[p] >= hi, f"batch [{lo}, {hi}) stranded below upper {after.get(p)}"
            w.pos[p] = hi
        for path in pending.paths:
            assert self.catalog.deep.exists(path) == (path in commit.files_referenced), (
                "a staged file outlived a commit that did not reference it"
            )
        w.pending = None
        w.last_committed = pending

    @precondition(lambda self: any(w.pending is None and w.last_committed for w in self.writers))
    @rule(data=st.data())
    @step
    def replay_the_last_committed_batch(self, data: st.DataObject) -> None:
        """Spark re-runs a batch id after a driver restart: the same ranges, a fresh file."""
        w = self.draw_writer(data, lambda w: w.pending is None and w.last_committed is not None)
        last = w.last_committed
        assert last is not None
        before = self.uppers
        version = self.catalog.store.get_table(TABLE).manifest_version
        replay = self.stage(w, last.ranges, last.batch_id)
        result = self.commit(w, replay).table
        assert all(s.decision.outcome is Outcome.DROP for s in result.shards), result
        assert result.version is None
        assert self.catalog.store.get_table(TABLE).manifest_version == version
        assert self.shard_uppers() == before
        for path in replay.paths:
            assert not self.catalog.deep.exists(path)

    @rule(data=st.data())
    @step
    def crash_and_restart_a_writer(self, data: st.DataObject) -> None:
        """The process dies: a staged, uncommitted file is left behind, and the writer
        restarts from the shard upper."""
        w = self.draw_writer(data, lambda w: True)
        if w.pending is not None and w.pending.paths:
            self.crashed_files |= w.pending.paths
            event("crash left a staged file behind")
        w.pending = None
        self.bootstrap(w)

    # -- invariants ----------------------------------------------------------------------

    def expected_rows(self, uppers: dict[int, int]) -> list[Row]:
        """The good records below the uppers (bad ones are in the dead-letter table)."""
        return [
            r
            for p, upper in uppers.items()
            for o, r in self.source[p].items()
            if o < upper and o not in self.bad[p]
        ]

    @invariant()
    @step
    def table_reads_as_the_model_of_everything_below_the_uppers(self) -> None:
        if self.cat is None:
            return
        manifest = self.catalog.manifest(TABLE)
        uppers = self.shard_uppers()
        got = read_manifest(self.catalog.deep, manifest).to_pylist()
        assert canonical(got) == canonical(model_rows(self.spec, self.expected_rows(uppers)))

        for p, upper in self.uppers.items():
            assert uppers.get(p, upper) >= upper, f"partition {p} upper went backwards"
        assert set(self.uppers) <= set(uppers), "a shard disappeared"
        self.uppers = uppers

        for p, upper in uppers.items():
            entries = [e for e in manifest.entries if e.partition == p]
            assert [e.seq for e in entries] == sorted({e.seq for e in entries})
            prev_end = self.first_offsets[p]
            for e in entries:
                assert prev_end <= e.start < e.end <= upper, (p, e.start, e.end, upper)
                prev_end = e.end

        dead = self.catalog.manifest(DEAD.name)
        dead_uppers = {sh.partition: sh.upper for sh in self.catalog.store.list_shards(DEAD.name)}
        assert all(dead_uppers[p] <= uppers.get(p, 0) for p in dead_uppers), (
            "a dead-letter shard moves only with its table's range (it may lag: it moves only "
            f"with a dead letter): {dead_uppers} against {uppers}"
        )
        dead_rows = read_manifest(self.catalog.deep, dead).to_pylist()
        got_bad = sorted((r["partition"], r["offset"]) for r in dead_rows)
        want_bad = sorted((p, o) for p, upper in uppers.items() for o in self.bad[p] if o < upper)
        assert got_bad == want_bad, "every bad record below the upper is dead-lettered once"

        files = self.files()
        pending = {p for w in self.writers if w.pending is not None for p in w.pending.paths}
        referenced = {
            e.file_path for m in (manifest, dead) for e in m.entries if e.file_path is not None
        }
        assert files == referenced | pending | self.crashed_files

    def files(self) -> set[str]:
        return {
            f.path for t in (TABLE, DEAD.name) for f in self.catalog.deep.list_files(f"tables/{t}")
        }

    def teardown(self) -> None:
        if self.cat is None:
            return
        try:
            if not self.clean:
                return  # a step failed: that is the error to report
            for w in self.writers:  # the campaign ends: whatever is still staged is orphaned
                if w.pending is not None:
                    self.crashed_files |= w.pending.paths
                w.pending = None
            before = canonical(self.catalog.read_table(TABLE).to_pylist())
            far_future = ManualClock(start=4_000_000_000.0)
            deleted = [
                path
                for t in (TABLE, DEAD.name)
                for path in collect_garbage(
                    self.catalog.store, self.catalog.deep, t, grace_seconds=0, clock=far_future
                )
            ]
            assert set(deleted) == self.crashed_files
            assert len(deleted) == len(set(deleted))
            assert canonical(self.catalog.read_table(TABLE).to_pylist()) == before
            assert self.files() == self.catalog.store.referenced_files(
                TABLE
            ) | self.catalog.store.referenced_files(DEAD.name)
        finally:
            self.catalog.close()
            assert self.home is not None
            shutil.rmtree(self.home, ignore_errors=True)


def test_racing_writers_converge_persist_every_offset_once_and_never_strand_a_batch() -> None:
    """Runs the campaign: 60 examples of up to 20 steps each, seeded (see module doc)."""
    print(f"concurrent-writers campaign seed: {SEED} (rerun with MILLSTREAM_FAULT_SEED={SEED})")
    campaign = seed(SEED)(get_state_machine_test(ConcurrentWriters, settings=SETTINGS))
    try:
        campaign()
    except BaseException as exc:
        exc.add_note(f"campaign seed {SEED}: rerun with MILLSTREAM_FAULT_SEED={SEED}")
        raise
