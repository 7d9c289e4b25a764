"""Sealing in the background: faults at every named point never change what readers see, a
failed seal is retried until the run is ONLINE, and a partition's segments seal in order."""

from __future__ import annotations

import random
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from harness.fault_points import at_sealer
from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.errors import InjectedFault
from millstream.faults import SEAL_POINTS
from millstream.metastore.models import SegmentState
from millstream.reference.model import canonical, model_rows
from millstream.sealing.sealer import Sealer
from millstream.sealing.thresholds import Thresholds
from millstream.spec import TableSpec
from millstream.storage import deepstore
from millstream.storage.deepstore import DeepStore
from millstream.table.writer import commit_staged, stage_rows

ENGINES: dict[str, dict[str, Any]] = {
    "append": {"mode": "append"},
    "dedup": {"mode": "dedup", "primary_key": ["k"], "delete_column": "d"},
    "upsert": {"mode": "upsert", "primary_key": ["k"], "delete_column": "d"},
    "partial": {
        "mode": "partial",
        "primary_key": ["k"],
        "delete_column": "d",
        "partial": {"v": "sum", "s": "append"},
    },
}


class Feed:
    """Deterministic rows per partition, committed batch by batch like a writer would."""

    def __init__(self, cat: Catalog, spec: TableSpec, seed: int) -> None:
        self.cat, self.spec, self.rnd = cat, spec, random.Random(seed)
        self.rows: list[dict[str, Any]] = []
        self.pos: dict[int, int] = {}

    def batch(self, partition: int, n: int) -> None:
        lo = self.pos.get(partition, 0)
        rows = [
            {
                "k": self.rnd.randrange(6) * 2 + partition,
                "v": self.rnd.choice([None, self.rnd.randrange(10)]),
                "s": self.rnd.choice([None, "a", "b"]),
                "d": self.rnd.random() < 0.1,
                "_ms_partition": partition,
                "_ms_offset": o,
                "_ms_tombstone": False,
            }
            for o in range(lo, lo + n)
        ]
        table = pa.Table.from_pylist(rows, schema=self.spec.arrow_schema(system_columns=True))
        staged = stage_rows(self.cat.deep, self.spec, table)
        commit_staged(
            self.cat.store, self.cat.deep, "t", staged, {partition: (lo, lo + n)}, {partition: 0}
        )
        self.rows += rows
        self.pos[partition] = lo + n

    def assert_table_equals_model(self) -> None:
        got = self.cat.read_table("t").to_pylist()
        assert canonical(got) == canonical(model_rows(self.spec, self.rows))


def _setup(tmp_path: Path, engine: str, seed: int = 0) -> Feed:
    cat = Catalog.open(home=tmp_path)
    spec = TableSpec.parse(
        {
            "name": "t",
            "schema": {"k": "long", "v": "long", "s": "string", "d": "boolean"},
            **ENGINES[engine],
        }
    )
    cat.create_table(spec)
    return Feed(cat, spec, seed)


def _states(cat: Catalog, partition: int) -> list[tuple[int, SegmentState]]:
    return [(e.seq, e.state) for e in cat.manifest("t").entries if e.partition == partition]


@pytest.mark.parametrize("point", SEAL_POINTS)
@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_a_fault_at_any_seal_point_keeps_reads_exact_and_the_retry_brings_the_run_online(
    tmp_path: Path, engine: str, point: str
) -> None:
    feed = _setup(tmp_path, engine)
    for _ in range(3):
        feed.batch(0, 20)
        feed.batch(1, 15)
    sealer = Sealer(feed.cat, "t")
    at_sealer(sealer, fail={point: 1})
    if point == "after_swap":
        # Only cleanup is interrupted: the seal itself is done.
        assert sealer.seal_partition(0, force=True) is not None
    else:
        with pytest.raises(InjectedFault):
            sealer.seal_partition(0, force=True)
        assert all(state is SegmentState.CONSUMING for _, state in _states(feed.cat, 0))
        feed.assert_table_equals_model()
        # Ingestion keeps committing while the seal is failing.
        feed.batch(0, 10)
        feed.assert_table_equals_model()
        result = sealer.seal_partition(0, force=True)
        assert result is not None
    assert _states(feed.cat, 0) == [(0, SegmentState.ONLINE)]
    assert all(state is SegmentState.CONSUMING for _, state in _states(feed.cat, 1))
    feed.assert_table_equals_model()
    # Seal again after more data: a second sealed segment follows the first, in order.
    feed.batch(0, 12)
    assert sealer.seal_partition(0, force=True) is not None
    online = [e for e in feed.cat.manifest("t").entries if e.partition == 0]
    assert [e.state for e in online] == [SegmentState.ONLINE, SegmentState.ONLINE]
    assert online[0].end == online[1].start and online[1].end == feed.pos[0]
    feed.assert_table_equals_model()


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_a_seal_that_keeps_failing_marks_its_segment_error_and_the_table_stays_correct(
    tmp_path: Path, engine: str
) -> None:
    feed = _setup(tmp_path, engine, seed=3)
    for _ in range(3):
        feed.batch(0, 10)
    sealer = Sealer(feed.cat, "t", max_failures=3)
    at_sealer(sealer, fail={"before_swap": 3})
    for _ in range(3):
        with pytest.raises(InjectedFault):
            sealer.seal_partition(0, force=True)
    entries = [e for e in feed.cat.manifest("t").entries if e.partition == 0]
    assert entries[0].state is SegmentState.ERROR
    assert "before_swap" in (entries[0].last_error or "")
    feed.assert_table_equals_model()
    leftovers = [f.path for f in feed.cat.deep.list_files("tables/t/data") if "sealed" in f.path]
    assert leftovers == [], "an unswapped sealed file must not be left behind"
    assert sealer.seal_partition(0, force=True) is not None
    assert _states(feed.cat, 0) == [(0, SegmentState.ONLINE)]
    feed.assert_table_equals_model()


def test_segments_of_a_partition_never_swap_out_of_order_when_a_build_is_delayed(
    tmp_path: Path,
) -> None:
    feed = _setup(tmp_path, "upsert", seed=5)
    feed.batch(0, 10)
    feed.batch(0, 10)
    in_build, release = threading.Event(), threading.Event()

    def delay_first_build(point: str, partition: int) -> None:
        if point == "before_build" and not in_build.is_set():
            in_build.set()
            assert release.wait(30)

    slow = Sealer(feed.cat, "t")

    at_sealer(slow, hook=delay_first_build)
    results: list[Any] = []
    t = threading.Thread(target=lambda: results.append(slow.seal_partition(0, force=True)))
    t.start()
    assert in_build.wait(30)
    # While run N (seq 0-1) is building, segment N+1 arrives and another sealer tries.
    feed.batch(0, 10)
    other = Sealer(feed.cat, "t")
    assert other.seal_partition(0, force=True) is None, "N+1 must wait for N"
    feed.assert_table_equals_model()
    release.set()
    t.join(30)
    assert results and results[0] is not None and results[0].sealed.end == 20
    later = other.seal_partition(0, force=True)
    assert later is not None and later.sealed.start == 20
    entries = [e for e in feed.cat.manifest("t").entries if e.partition == 0]
    assert [(e.seq, e.start, e.end, e.state) for e in entries] == [
        (0, 0, 20, SegmentState.ONLINE),
        (2, 20, 30, SegmentState.ONLINE),
    ]
    feed.assert_table_equals_model()


def test_sealing_is_due_by_rows_bytes_or_age_and_not_before(tmp_path: Path) -> None:
    from millstream.clock import ManualClock
    from millstream.sealing.thresholds import Thresholds

    feed = _setup(tmp_path, "append")
    feed.batch(0, 10)
    clock = ManualClock(start=feed.cat.manifest("t").entries[0].created_at)
    sealer = Sealer(
        feed.cat, "t", thresholds=Thresholds(flush_rows=25, flush_seconds=60), clock=clock
    )
    assert sealer.seal_due() == []
    feed.batch(0, 20)
    assert [r.partition for r in sealer.seal_due()] == [0]
    feed.batch(0, 5)
    assert sealer.seal_due() == []
    clock.advance(61)
    assert [r.rows_in for r in sealer.seal_due()] == [5]


def test_a_pass_reads_the_manifest_once_unless_a_partition_is_due(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A background pass runs every second for every table: a manifest read per partition, to
    seal and again to compact, was most of a worker's own CPU with 8 tables of 4 partitions,
    and it grew with the unsealed segments."""
    from millstream.clock import ManualClock
    from millstream.sealing.thresholds import Thresholds

    feed = _setup(tmp_path, "upsert")
    for p in range(4):
        feed.batch(p, 10)
    clock = ManualClock(start=feed.cat.manifest("t").entries[0].created_at)
    sealer = Sealer(
        feed.cat, "t", thresholds=Thresholds(flush_rows=25, flush_seconds=60), clock=clock
    )
    reads: list[str] = []
    real = feed.cat.manifest

    def counted(table: str, **kw: Any) -> Any:
        reads.append(table)
        return real(table, **kw)

    monkeypatch.setattr(feed.cat, "manifest", counted)

    assert sealer.seal_due() == []  # each partition found with nothing to compact
    feed.batch(1, 5)  # not due
    reads.clear()
    assert sealer.seal_due() == []
    assert reads == []  # appends alone: judged from the changes since the last read
    sealer._last_read = None  # as after a seal, a compaction or a rollback: the pass reads
    assert sealer.seal_due() == []
    assert len(reads) == 1  # one read decided for 4 partitions, to seal and to compact
    feed.batch(2, 20)
    reads.clear()
    assert [r.partition for r in sealer.seal_due()] == [2]
    assert len(reads) >= 2  # the due partition is read again before it is sealed
    feed.assert_table_equals_model()


# -- a pass skips the manifest read of a table where nothing is due -------------------------
# A sealing pass over a table where nothing can have become due since its last manifest read
# skips the read (it was most of a busy worker's own CPU); a busy table's appends since are
# judged from what changed (the entries added), not from its whole manifest. A pass may delay
# a seal by one pass, never skip one that is due: an age threshold reached, a commit that
# makes a run due, a force commit, anything but appends since, or changes it cannot read.

PARTITIONS = 4


def _sealer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Feed, Sealer, list[str]]:
    """A table with a pending run (10 rows, below every threshold) in each partition, a sealer
    that has done one pass over it, and the list of manifest reads made from then on."""
    feed = _setup(tmp_path, "upsert")
    for p in range(PARTITIONS):
        feed.batch(p, 10)
    clock = ManualClock(start=feed.cat.manifest("t").entries[0].created_at)
    sealer = Sealer(
        feed.cat, "t", thresholds=Thresholds(flush_rows=25, flush_seconds=60), clock=clock
    )
    reads: list[str] = []
    real = feed.cat.manifest

    def counted(table: str, **kw: Any) -> Any:
        reads.append(table)
        return real(table, **kw)

    monkeypatch.setattr(feed.cat, "manifest", counted)
    assert sealer.seal_due() == []  # reads it (and each partition again to compact)
    assert reads
    reads.clear()
    return feed, sealer, reads


def test_a_pass_over_an_unchanged_table_reads_no_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    feed, sealer, reads = _sealer(tmp_path, monkeypatch)
    assert isinstance(sealer.clock, ManualClock)
    for _ in range(5):
        sealer.clock.advance(10)  # 50 s: still below the 60 s age threshold
        assert sealer.seal_due() == []
    assert reads == []
    assert sealer.status()["passes_skipped"] == 5

    # A failed read of the changes is unknown: the pass reads the manifest as before.
    def down(table: str, *, after: int) -> Any:
        raise ConnectionError("metadata store unreachable")

    monkeypatch.setattr(feed.cat.store, "manifest_changes", down)
    assert sealer.seal_due() == []
    assert reads == ["t"]
    feed.assert_table_equals_model()


def test_appends_that_make_nothing_due_are_judged_without_a_manifest_read_until_one_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A busy table's version moves every batch: its passes judge the appends since the last
    read (rows, bytes, age, first segment) and read the manifest only once a run is due."""
    feed, sealer, reads = _sealer(tmp_path, monkeypatch)
    assert isinstance(sealer.clock, ManualClock)
    for n in (4, 5, 5):  # partition 1: 10 + 14 rows pending, below flush_rows 25
        feed.batch(1, n)
        feed.batch(3, 1)
        sealer.clock.advance(10)
        assert sealer.seal_due() == []
    assert reads == []
    assert sealer.status()["passes_skipped"] == 3
    feed.batch(1, 1)  # 25 rows: due by rows, counted over the appends of four passes
    assert [r.partition for r in sealer.seal_due()] == [1]
    assert reads
    feed.assert_table_equals_model()


def test_a_run_started_after_the_last_read_is_judged_and_sealed_when_due(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partition with nothing pending at the last read (all sealed) starts a run with its
    next append: the pass judges it from the appended entries alone."""
    feed, sealer, reads = _sealer(tmp_path, monkeypatch)
    feed.batch(0, 20)  # 30 rows: due
    assert [r.partition for r in sealer.seal_due()] == [0]
    assert sealer.seal_due() == []  # reads the manifest after the seal: partition 0 empty
    reads.clear()
    feed.batch(0, 10)
    assert sealer.seal_due() == []
    assert reads == []
    feed.batch(0, 20)  # 30 rows in the new run: due
    assert [r.partition for r in sealer.seal_due()] == [0]
    feed.assert_table_equals_model()


def test_a_pass_whose_changes_cannot_be_read_reads_the_manifest_and_seals_what_is_due(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    feed, sealer, _ = _sealer(tmp_path, monkeypatch)

    def down(table: str, *, after: int) -> Any:
        raise ConnectionError("metadata store unreachable")

    monkeypatch.setattr(feed.cat.store, "manifest_changes", down)
    feed.batch(2, 20)  # 30 rows pending in partition 2: due by rows
    assert [r.partition for r in sealer.seal_due()] == [2]
    feed.assert_table_equals_model()


def test_a_pass_judges_the_appends_from_a_worker_wide_read_taken_after_its_remembered_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker reads all its tables' changes in one transaction (``sealing_reads``): a
    table's pass judges its appends from that read, without reads of its own, and seals
    when they make a run due."""
    feed, sealer, reads = _sealer(tmp_path, monkeypatch)
    own: list[str] = []
    real = feed.cat.store.manifest_changes

    def counted(table: str, *, after: int) -> Any:
        own.append(table)
        return real(table, after=after)

    monkeypatch.setattr(feed.cat.store, "manifest_changes", counted)
    feed.batch(1, 5)  # partition 1: 15 rows, below flush_rows 25
    read = feed.cat.store.sealing_reads({"t": sealer.remembered_version, "nothere": None})
    assert set(read) == {"t"}  # a table missing is left out
    assert sealer.seal_due(read["t"]) == []
    assert (reads, own) == ([], [])
    feed.batch(1, 10)  # 25 rows: due
    read = feed.cat.store.sealing_reads({"t": sealer.remembered_version})
    assert [r.partition for r in sealer.seal_due(read["t"])] == [1]
    assert own == []
    feed.assert_table_equals_model()


def test_a_worker_wide_read_after_another_version_than_the_remembered_one_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Changes read after a later version than the pass remembered miss the appends between:
    judged from them, the run that those appends made due would not be sealed (nor counted
    by any later pass, the remembered read having moved past them). The pass reads its own."""
    feed, sealer, _ = _sealer(tmp_path, monkeypatch)
    feed.batch(1, 15)  # partition 1: 25 rows, due by rows
    current = feed.cat.manifest("t").version
    stale = feed.cat.store.sealing_reads({"t": current})["t"]  # nothing after `current`
    assert stale.changes is not None and stale.changes.added == ()
    assert sealer.remembered_version != current
    assert [r.partition for r in sealer.seal_due(stale)] == [1]
    feed.assert_table_equals_model()


def test_another_sealers_seals_between_passes_are_seen_and_compacted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seals of the table by another sealer (a takeover, an ``--available-now`` run) between
    two passes are not appends: the pass reads the manifest, and compacts the sealed segments
    they left, although no run of its own is due."""
    from millstream.sealing.compaction import CompactionPolicy

    feed = _setup(tmp_path, "append")  # two sealed segments of 10 rows: one merge due
    feed.batch(0, 10)
    feed.batch(1, 10)
    clock = ManualClock(start=feed.cat.manifest("t").entries[0].created_at)
    sealer = Sealer(
        feed.cat,
        "t",
        thresholds=Thresholds(flush_rows=10**9, flush_seconds=3600),
        clock=clock,
        compaction=CompactionPolicy(min_segments=2),
    )
    assert sealer.seal_due() == []
    other = Sealer(feed.cat, "t", compaction=CompactionPolicy(enabled=False))
    assert other.seal_partition(0, force=True) is not None
    feed.batch(0, 10)
    assert other.seal_partition(0, force=True) is not None
    feed.batch(1, 1)
    assert sealer.seal_due() == []
    assert [c.partition for c in sealer.compactions] == [0]
    sealed = [e for e in feed.cat.manifest("t").entries if e.partition == 0]
    assert [e.state for e in sealed] == [SegmentState.ONLINE]
    feed.assert_table_equals_model()


def test_a_run_whose_age_threshold_passes_is_sealed_at_the_next_pass_without_a_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    feed, sealer, reads = _sealer(tmp_path, monkeypatch)
    assert isinstance(sealer.clock, ManualClock)
    sealer.clock.advance(59)
    assert sealer.seal_due() == []
    assert reads == []
    sealer.clock.advance(1)  # partition 0's run (committed first) is 60 s old: due by age
    assert [r.partition for r in sealer.seal_due()] == [0]
    sealer.clock.advance(10)  # the others' too
    assert sorted(r.partition for r in sealer.seal_due()) == [1, 2, 3]
    feed.assert_table_equals_model()


def test_a_commit_makes_the_next_pass_read_and_seal_what_it_made_due(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    feed, sealer, reads = _sealer(tmp_path, monkeypatch)
    assert sealer.seal_due() == []
    assert reads == []
    feed.batch(2, 20)  # 30 rows pending in partition 2: due by rows
    assert [r.partition for r in sealer.seal_due()] == [2]
    assert reads
    feed.assert_table_equals_model()


def test_a_force_commit_is_honoured_at_the_next_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    feed, sealer, reads = _sealer(tmp_path, monkeypatch)
    assert sealer.seal_due() == []
    assert reads == []
    store = feed.cat.store
    store.submit_force_commit(store.manifest("t"), now=store.clock.now())
    assert sorted(r.partition for r in sealer.seal_due()) == list(range(PARTITIONS))
    feed.assert_table_equals_model()


def test_a_long_lived_sealer_keeps_the_newest_seal_timings_and_counts_every_seal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's sealer lives as long as the worker: its seal and key-index timings are
    the newest few only (a list of every one grew a float a seal, issue 38), while its
    status still counts every seal and the table reads as its model."""
    import millstream.sealing.indexes as indexes_mod
    import millstream.sealing.sealer as sealer_mod

    monkeypatch.setattr(sealer_mod, "TIMES_KEPT", 3)
    monkeypatch.setattr(indexes_mod, "TIMES_KEPT", 3)
    feed = _setup(tmp_path, "upsert")
    sealer = Sealer(feed.cat, "t", thresholds=Thresholds(flush_rows=5))
    for _ in range(6):
        feed.batch(0, 6)
        assert len(sealer.seal_due()) == 1
    assert sealer.status()["seals"] == 6
    assert len(sealer.durations) == 3
    assert 0 < len(sealer.index_seconds) <= 3
    feed.assert_table_equals_model()


@pytest.mark.parametrize("read_whole", [True, False], ids=["small-file", "pre-buffered"])
def test_a_seal_of_one_partition_of_a_shared_file_keeps_its_rows_in_a_row_group_it_shares(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read_whole: bool
) -> None:
    """A write task stages its partitions one after another in one file; a seal of one of
    them reads only the row groups that may hold its rows (by their footer statistics), and
    still every row of its range, those in the group it shares with the other partition too.
    Whether the file is small enough to be read whole and decoded on the reading thread or
    larger (read pre-buffered, on pyarrow's threads)."""
    if not read_whole:
        monkeypatch.setattr(deepstore, "SMALL_FILE_BYTES", 0)
    feed = _setup(tmp_path, "upsert")
    cat, spec = feed.cat, feed.spec
    write = DeepStore.write_parquet

    def small_groups(self: DeepStore, path: str, table: pa.Table, **kw: Any) -> int:
        if kw.get("row_group_size") is None:
            kw["row_group_size"] = 128  # a micro-batch file of several row groups
        return write(self, path, table, **kw)

    monkeypatch.setattr(DeepStore, "write_parquet", small_groups)
    rnd = random.Random(7)
    rows = [
        {
            "k": rnd.randrange(40),
            "v": rnd.randrange(10),
            "s": "a",
            "d": rnd.random() < 0.1,
            "_ms_partition": p,
            "_ms_offset": o,
            "_ms_tombstone": False,
        }
        for p, n in ((0, 300), (2, 200))
        for o in range(n)
    ]
    table = pa.Table.from_pylist(rows, schema=spec.arrow_schema(system_columns=True))
    staged = stage_rows(cat.deep, spec, table)
    assert staged.path is not None
    groups = pq.ParquetFile(cat.deep._abs(staged.path), filesystem=cat.deep.fs).metadata
    assert groups.num_row_groups == 4  # [0, 128) [128, 256) of 0; [256, 384) of 0 and 2; ...
    commit_staged(cat.store, cat.deep, "t", staged, {0: (0, 300), 2: (0, 200)}, {0: 0, 2: 0})
    feed.rows += rows
    sealer = Sealer(cat, "t")
    sealed = {p: sealer.seal_partition(p, force=True) for p in (2, 0)}
    assert {p: r.rows_in for p, r in sealed.items() if r is not None} == {2: 200, 0: 300}
    assert all(e.state is SegmentState.ONLINE for e in cat.manifest("t").entries)
    feed.assert_table_equals_model()
