"""The manifest's guards, on every backend: a seal or re-ingestion whose COMMIT has an unknown
outcome keeps its file; re-ingesting a segment a sealer holds does not wedge sealing; a stale
seal or re-ingestion swaps nothing; garbage collection and a slow commit never lose a file;
a dead-letter shard behind the table's is a gap, not a silent skip.

Each test fails when the guard it names is removed (docs/design.md, "Guards and the tests that
catch them"; ``tests/mutations.py`` removes them one at a time).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from harness.fault_points import at_commit, at_sealer
from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.datastream import DatastreamSpec, dead_letter_spec
from millstream.errors import (
    CommitStateUnknownError,
    SegmentChangedError,
    StagedFileExpiredError,
)
from millstream.ingest.decode import dead_letter_rows, decode_records
from millstream.ingest.sources import spec_reader
from millstream.ingest.sources.base import RAW_SCHEMA
from millstream.metastore import append as append_module
from millstream.metastore.claims import DEFAULT_CLAIM_TTL
from millstream.metastore.models import SegmentState, ShardAppend
from millstream.sealing import reingest as reingest_module
from millstream.sealing.compaction import CompactionPolicy
from millstream.sealing.reingest import reingest_segment
from millstream.sealing.sealer import Sealer
from millstream.storage.deepstore import table_data_prefix
from millstream.table.commit import StagedWrite, commit_writes
from millstream.table.gc import MAX_STAGED_AGE_SECONDS, collect_garbage
from millstream.table.writer import stage_rows

TABLE = "events"
LINES = 12  # per partition and batch


def _datastream(source: Path, table: dict[str, Any]) -> DatastreamSpec:
    return DatastreamSpec.parse(
        {
            "name": TABLE,
            "source": {"kind": "files", "path": str(source)},
            "schema": {"id": "long", "status": "string"},
            "table": table,
        }
    )


class Pipeline:
    """A files source and what the sink does per batch, through the production commit path."""

    def __init__(
        self, catalog: Catalog, tmp_path: Path, table: dict[str, Any] | None = None
    ) -> None:
        self.catalog = catalog
        self.source = tmp_path / "source"
        # Append by default: every row shows, so a duplicate or a loss is visible. Every record
        # has its own id, so an upsert table (which keeps a key index) holds the same rows.
        self.ds = _datastream(self.source, table or {"mode": "append"})
        self.spec = self.ds.table_spec()
        self.dl = dead_letter_spec(TABLE)
        catalog.create_table(self.spec)
        catalog.create_table(self.dl)
        self.pos: dict[int, int] = {}
        self.expected: list[dict[str, Any]] = []
        self._rows: dict[int, list[dict[str, Any]]] = {}

    def write(self, partition: int, n: int = LINES) -> None:
        """Append ``n`` records to the source partition, one of them not JSON."""
        d = self.source / str(partition)
        d.mkdir(parents=True, exist_ok=True)
        start = sum(len(f.read_text().splitlines()) for f in d.iterdir())
        lines = [f'{{"id": {partition * 1000 + start + i}, "status": "s{i}"}}' for i in range(n)]
        lines[n // 2] = "not json"  # one bad record per batch: the dead-letter table gets it
        (d / f"{len(list(d.iterdir())):05d}.jsonl").write_text("\n".join(lines) + "\n")

    def staged(self, partition: int, n: int = LINES) -> StagedWrite:
        """Stage the next ``n`` records of the partition as a write task does (new records are
        appended to the source first unless it already has them)."""
        lo = self.pos.get(partition, 0)
        hi = lo + n
        d = self.source / str(partition)
        have = sum(len(f.read_text().splitlines()) for f in d.iterdir()) if d.exists() else 0
        if have < hi:
            self.write(partition, hi - have)
        raw = pa.Table.from_batches(list(spec_reader(self.ds.source).read_range(partition, lo, hi)))
        raw = raw.select(["partition", "offset", "key", "value"])
        k = raw.num_rows
        raw = raw.append_column("range_lo", pa.array([lo] * k, pa.int64()))
        raw = raw.append_column("range_hi", pa.array([hi] * k, pa.int64()))
        raw = raw.append_column("is_marker", pa.array([False] * k)).cast(RAW_SCHEMA)
        staged_at = time.time()
        decoded = decode_records(self.spec, raw)
        data = stage_rows(self.catalog.deep, self.spec, decoded.rows)
        dead = stage_rows(self.catalog.deep, self.dl, dead_letter_rows(decoded.dead))
        self._rows[id(data)] = decoded.rows.select(list(self.spec.columns)).to_pylist()
        return StagedWrite({partition: (lo, hi)}, data, dead, staged_at)

    def commit(self, write: StagedWrite, **kw: Any) -> None:
        """Commit through the production path; on success the rows count as expected."""
        commit_writes(
            self.catalog.store,
            self.catalog.deep,
            TABLE,
            [write],
            dead_letter_table=self.dl.name,
            **kw,
        )
        self.expected += self._rows.pop(id(write.data))
        for p, (_, hi) in write.ranges.items():
            self.pos[p] = hi

    def batch(self, partition: int) -> None:
        self.commit(self.staged(partition))

    def rows(self) -> list[tuple[Any, ...]]:
        t = self.catalog.read_table(TABLE)
        return sorted(zip(*(t.column(c).to_pylist() for c in self.spec.columns), strict=True))

    def expected_rows(self) -> list[tuple[Any, ...]]:
        return sorted(tuple(r[c] for c in self.spec.columns) for r in self.expected)

    def assert_reads_every_row_once(self) -> None:
        assert self.rows() == self.expected_rows()
        dl_rows = self.catalog.read_table(self.dl.name).num_rows
        assert dl_rows == sum(self.pos.values()) // LINES  # one bad record per batch

    def entries(self, partition: int = 0) -> list[tuple[int, SegmentState]]:
        return [
            (e.seq, e.state)
            for e in self.catalog.manifest(TABLE).entries
            if e.partition == partition
        ]


@pytest.fixture
def pipe(catalog: Catalog, tmp_path: Path) -> Pipeline:
    p = Pipeline(catalog, tmp_path)
    for _ in range(3):
        p.batch(0)
        p.batch(1)
    return p


def _fail_commit_once(catalog: Catalog, *, landed: bool) -> None:
    """The next write transaction's COMMIT fails with an unknown outcome, after (``landed``) or
    before it took effect: the connection drops while COMMIT is in flight."""

    def hook(after: bool) -> None:
        if after == landed:
            uninstall()
            raise OSError("server closed the connection unexpectedly")

    uninstall = at_commit(catalog.store, hook)


def _at(point: str, action: Any) -> Callable[[str, int], None]:
    fired: list[bool] = []

    def hook(p: str, _partition: int) -> None:
        if p == point and not fired:
            fired.append(True)
            action()

    return hook


def _hooked(catalog: Catalog, hook: Callable[[str, int], None]) -> Sealer:
    """A sealer of the table with ``hook`` at its fault points."""
    sealer = Sealer(catalog, TABLE)
    at_sealer(sealer, hook=hook)
    return sealer


def test_a_seal_whose_commit_landed_with_an_unknown_outcome_keeps_its_file_and_reads_work(
    pipe: Pipeline,
) -> None:
    faults = _at("before_swap", lambda: _fail_commit_once(pipe.catalog, landed=True))
    result = _hooked(pipe.catalog, faults).seal_partition(0, force=True)
    assert result is not None, "the re-read found the swap landed: the seal succeeded"
    assert pipe.entries(0) == [(0, SegmentState.ONLINE)]
    assert result.sealed.file_path is not None
    assert pipe.catalog.deep.exists(result.sealed.file_path)
    pipe.assert_reads_every_row_once()


def test_a_seal_whose_commit_did_not_land_keeps_its_files_and_the_run_seals_next_time(
    pipe: Pipeline,
) -> None:
    before = {f.path for f in pipe.catalog.deep.list_files(table_data_prefix(TABLE))}
    faults = _at("before_swap", lambda: _fail_commit_once(pipe.catalog, landed=False))
    sealer = _hooked(pipe.catalog, faults)
    with pytest.raises(CommitStateUnknownError, match="did not land"):
        sealer.seal_partition(0, force=True)
    uploaded = {f.path for f in pipe.catalog.deep.list_files(table_data_prefix(TABLE))} - before
    assert uploaded, "an unknown outcome never licenses deleting the uploaded file"
    assert all(state is SegmentState.CONSUMING for _, state in pipe.entries(0))
    pipe.assert_reads_every_row_once()
    assert sealer.seal_partition(0, force=True) is not None
    assert pipe.entries(0) == [(0, SegmentState.ONLINE)]
    pipe.assert_reads_every_row_once()


def test_a_reingestion_whose_commit_landed_with_an_unknown_outcome_keeps_its_file(
    pipe: Pipeline,
) -> None:
    segment = f"{TABLE}__1__1"
    _fail_commit_once(pipe.catalog, landed=True)
    entry = reingest_segment(pipe.catalog, pipe.ds, segment)
    assert entry.file_path is not None and pipe.catalog.deep.exists(entry.file_path)
    pipe.assert_reads_every_row_once()


def test_reingesting_a_segment_a_sealer_holds_does_not_wedge_sealing_of_its_partition(
    pipe: Pipeline,
) -> None:
    segment = f"{TABLE}__0__1"
    faults = _at("before_upload", lambda: reingest_segment(pipe.catalog, pipe.ds, segment))
    sealer = _hooked(pipe.catalog, faults)
    with pytest.raises(SegmentChangedError):
        sealer.seal_partition(0, force=True)  # the run changed under it: discarded
    pipe.assert_reads_every_row_once()
    assert sealer.seal_partition(0, force=True) is not None
    assert pipe.entries(0) == [(0, SegmentState.ONLINE)]
    pipe.batch(0)
    assert sealer.seal_partition(0, force=True) is not None
    assert pipe.entries(0) == [(0, SegmentState.ONLINE), (3, SegmentState.ONLINE)]
    pipe.assert_reads_every_row_once()


def test_a_sealer_whose_expired_claim_was_taken_over_cannot_swap_its_stale_seal_in(
    pipe: Pipeline,
) -> None:
    successor = Sealer(pipe.catalog, TABLE)
    taken: list[object] = []

    def expire_and_take_over() -> None:
        # Claims are judged on the metadata store's clock: move it past the claim.
        pipe.catalog.store.clock = ManualClock(time.time() + DEFAULT_CLAIM_TTL + 60)
        taken.append(successor.seal_partition(0, force=True))

    faults = _at("before_swap", expire_and_take_over)
    slow = _hooked(pipe.catalog, faults)
    with pytest.raises(SegmentChangedError):
        slow.seal_partition(0, force=True)
    assert taken and taken[0] is not None, "the successor took the expired claim over"
    assert pipe.entries(0) == [(0, SegmentState.ONLINE)]
    pipe.assert_reads_every_row_once()


def test_a_sealer_whose_run_a_successor_claimed_but_not_yet_sealed_swaps_nothing(
    pipe: Pipeline,
) -> None:

    def successor_claims() -> None:
        run = [e for e in pipe.catalog.manifest(TABLE).entries if e.partition == 0]
        pipe.catalog.store.clock = ManualClock(time.time() + DEFAULT_CLAIM_TTL + 60)
        assert pipe.catalog.store.claim_run(run, owner="successor") is not None

    slow = _hooked(pipe.catalog, _at("before_swap", successor_claims))
    with pytest.raises(SegmentChangedError):
        slow.seal_partition(0, force=True)
    assert all(state is SegmentState.COMMITTING for _, state in pipe.entries(0))
    pipe.assert_reads_every_row_once()


def test_a_sealer_stalled_past_its_claim_swaps_nothing_even_if_nobody_took_the_run_over(
    pipe: Pipeline,
) -> None:
    """Found by the commit-path campaign: a sealer frozen between upload and swap for longer
    than GC's grace period, with no other sealer taking its run over, swapped in a sealed file
    GC had already deleted. Its claim had expired long before; the swap now refuses that."""
    clock = ManualClock(time.time())
    pipe.catalog.store.clock = clock  # the metadata store's clock, which judges claims

    def stall_and_collect() -> None:
        clock.advance(DEFAULT_CLAIM_TTL + 3600 + 1)  # stalled past its claim and GC's grace
        collect_garbage(pipe.catalog.store, pipe.catalog.deep, TABLE, clock=clock)

    stalled = _hooked(pipe.catalog, _at("before_swap", stall_and_collect))
    with pytest.raises(SegmentChangedError, match="expired before the swap"):
        stalled.seal_partition(0, force=True)
    assert all(state is SegmentState.CONSUMING for _, state in pipe.entries(0))
    pipe.assert_reads_every_row_once()
    assert Sealer(pipe.catalog, TABLE).seal_partition(0, force=True) is not None
    pipe.assert_reads_every_row_once()


def test_a_reingestion_refuses_a_rebuilt_file_older_than_gc_could_have_deleted(
    pipe: Pipeline,
) -> None:
    segment = f"{TABLE}__0__1"
    before = {e.id: e.file_path for e in pipe.catalog.manifest(TABLE).entries}
    files = {f.path for f in pipe.catalog.deep.list_files(table_data_prefix(TABLE))}
    slow = ManualClock(time.time())
    original_write = pipe.catalog.deep.write_parquet

    def stalled_write(path: str, table: pa.Table, **kw: Any) -> int:
        size = original_write(path, table, **kw)
        slow.advance(MAX_STAGED_AGE_SECONDS + 1)  # the controller stalled after writing
        return size

    pipe.catalog.deep.write_parquet = stalled_write  # type: ignore[method-assign]
    try:
        with pytest.raises(StagedFileExpiredError):
            reingest_segment(pipe.catalog, pipe.ds, segment, clock=slow)
    finally:
        pipe.catalog.deep.write_parquet = original_write  # type: ignore[method-assign]
    assert {e.id: e.file_path for e in pipe.catalog.manifest(TABLE).entries} == before
    assert {f.path for f in pipe.catalog.deep.list_files(table_data_prefix(TABLE))} == files
    pipe.assert_reads_every_row_once()


def test_a_reingestion_stalled_before_its_swap_lands_nothing_once_its_file_is_too_old(
    pipe: Pipeline,
) -> None:
    """The rebuilt file was young when written, but the swap's transaction began only after
    the staged-file limit (a lock wait, a paused controller): by then garbage collection may
    have deleted the unreferenced file, so the swap must not land."""
    segment = f"{TABLE}__0__1"
    before = {e.id: e.file_path for e in pipe.catalog.manifest(TABLE).entries}
    files = {f.path for f in pipe.catalog.deep.list_files(table_data_prefix(TABLE))}
    slow = ManualClock(time.time())
    store = pipe.catalog.store
    original_replace = store.replace_entry

    def stalled_replace(*args: Any, **kw: Any) -> Any:
        slow.advance(MAX_STAGED_AGE_SECONDS + 1)  # stalled between its check and the swap
        return original_replace(*args, **kw)

    store.replace_entry = stalled_replace  # type: ignore[method-assign]
    try:
        with pytest.raises(StagedFileExpiredError):
            reingest_segment(pipe.catalog, pipe.ds, segment, clock=slow)
    finally:
        store.replace_entry = original_replace  # type: ignore[method-assign]
    assert {e.id: e.file_path for e in pipe.catalog.manifest(TABLE).entries} == before
    assert {f.path for f in pipe.catalog.deep.list_files(table_data_prefix(TABLE))} == files
    pipe.assert_reads_every_row_once()


def test_a_live_claim_is_left_alone(pipe: Pipeline) -> None:
    other = Sealer(pipe.catalog, TABLE)
    held: list[object] = []
    faults = _at("before_swap", lambda: held.append(other.seal_partition(0, force=True)))
    assert _hooked(pipe.catalog, faults).seal_partition(0, force=True) is not None
    assert held == [None]
    assert pipe.entries(0) == [(0, SegmentState.ONLINE)]


def test_a_reingestion_of_a_segment_sealed_meanwhile_swaps_nothing(
    pipe: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_decode = reingest_module.decode_records

    def seal_then_decode(*args: Any, **kwargs: Any) -> Any:
        assert Sealer(pipe.catalog, TABLE).seal_partition(0, force=True) is not None
        return real_decode(*args, **kwargs)

    monkeypatch.setattr(reingest_module, "decode_records", seal_then_decode)
    with pytest.raises(SegmentChangedError):
        reingest_segment(pipe.catalog, pipe.ds, f"{TABLE}__0__1")
    assert pipe.entries(0) == [(0, SegmentState.ONLINE)]
    pipe.assert_reads_every_row_once()


def test_gc_lists_files_before_reading_references_so_a_commit_in_between_keeps_its_file(
    pipe: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    write = pipe.staged(0)
    deep = pipe.catalog.deep
    real_list = deep.list_files

    def list_then_commit(prefix: str) -> Any:
        files = real_list(prefix)
        pipe.commit(write)  # lands between GC's listing and its reading of references
        return files

    monkeypatch.setattr(deep, "list_files", list_then_commit)
    later = ManualClock(time.time() + 7200)  # every file is past the grace period
    collect_garbage(pipe.catalog.store, deep, TABLE, clock=later)
    monkeypatch.undo()
    pipe.assert_reads_every_row_once()


def test_gc_takes_its_cutoff_before_reading_references_so_a_stalled_pass_keeps_a_file_committed_meanwhile(
    pipe: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the commit-path campaign on PostgreSQL (seed 2743901968): a GC pass read the
    references, a writer's commit of a young staged file landed, and the pass, stalled,
    judged the file's age by the instant after its stall and deleted it: the current
    version lost a file. The cutoff is now taken before the references are read."""
    write = pipe.staged(0)
    assert write.staged_at is not None
    store = pipe.catalog.store
    clock = ManualClock(write.staged_at + 1)  # the pass starts: the file is young
    real_references = store.referenced_files

    def references_then_commit_then_stall(table: str) -> set[str]:
        referenced = real_references(table)
        pipe.commit(write)  # lands right after the pass's snapshot, young enough
        clock.advance(3600 + 1)  # the pass stalls past the grace period
        return referenced

    monkeypatch.setattr(store, "referenced_files", references_then_commit_then_stall)
    collect_garbage(store, pipe.catalog.deep, TABLE, clock=clock)
    monkeypatch.undo()
    pipe.assert_reads_every_row_once()


def test_a_commit_refuses_a_staged_file_older_than_gc_could_have_deleted(pipe: Pipeline) -> None:
    write = pipe.staged(0)
    assert write.staged_at is not None
    # The writer stalled past the grace period; GC ran meanwhile.
    later = ManualClock(write.staged_at + 3600 + 1)
    collect_garbage(pipe.catalog.store, pipe.catalog.deep, TABLE, clock=later)
    upper = pipe.catalog.store.get_shard(TABLE, 0)
    with pytest.raises(StagedFileExpiredError) as info:
        pipe.commit(write, clock=later)
    assert info.value.fields["limit_seconds"] == MAX_STAGED_AGE_SECONDS
    assert pipe.catalog.store.get_shard(TABLE, 0) == upper, "nothing was committed"
    pipe.assert_reads_every_row_once()
    pipe.batch(0)  # the writer restarts from the upper and stages the range again
    pipe.assert_reads_every_row_once()


def test_a_commit_that_waits_inside_its_transaction_past_the_limit_is_refused(
    pipe: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the commit-path campaign: a commit passed an up-front age check, then waited
    on locks while GC deleted its (still unreferenced) file, and landed referencing it. The
    age is now checked inside the transaction, right before COMMIT."""
    write = pipe.staged(0)
    assert write.staged_at is not None
    clock = ManualClock(write.staged_at + 1)  # young when the commit starts
    waiting = append_module.append_txn

    def wait_on_locks(*args: Any, **kwargs: Any) -> Any:
        clock.advance(MAX_STAGED_AGE_SECONDS)  # ...but it waits that long for its locks
        return waiting(*args, **kwargs)

    monkeypatch.setattr(append_module, "append_txn", wait_on_locks)
    upper = pipe.catalog.store.get_shard(TABLE, 0)
    with pytest.raises(StagedFileExpiredError):
        pipe.commit(write, clock=clock)
    assert pipe.catalog.store.get_shard(TABLE, 0) == upper, "nothing was committed"
    assert not any(pipe.catalog.deep.exists(path) for path in write.paths)
    monkeypatch.undo()
    pipe.assert_reads_every_row_once()


def test_a_dead_letter_shard_behind_the_tables_is_covered_by_it(pipe: Pipeline) -> None:
    """A dead-letter shard moves only with a dead letter, so one behind its table's is the
    normal state, not a gap: the next batch's dead letter lands and the shard jumps to the
    table's upper (issue 38; it used to be reported as a gap)."""
    # The table's shard moves on without the dead-letter table.
    write = pipe.staged(0)
    commit_writes(pipe.catalog.store, pipe.catalog.deep, TABLE, [write])
    pipe.pos[0] = write.ranges[0][1]
    before = pipe.catalog.read_table(pipe.dl.name).num_rows
    pipe.batch(0)
    assert pipe.catalog.read_table(pipe.dl.name).num_rows == before + 1
    table, dead = (
        pipe.catalog.store.get_shard(TABLE, 0),
        pipe.catalog.store.get_shard(pipe.dl.name, 0),
    )
    assert table is not None and dead is not None and dead.upper == table.upper == pipe.pos[0]


def test_a_reingestion_whose_commit_did_not_land_keeps_its_file(pipe: Pipeline) -> None:
    before = {f.path for f in pipe.catalog.deep.list_files(table_data_prefix(TABLE))}
    _fail_commit_once(pipe.catalog, landed=False)
    with pytest.raises(CommitStateUnknownError, match="did not land"):
        reingest_segment(pipe.catalog, pipe.ds, f"{TABLE}__1__1")
    rebuilt = {f.path for f in pipe.catalog.deep.list_files(table_data_prefix(TABLE))} - before
    assert rebuilt, "an unknown outcome never licenses deleting the rebuilt file"
    pipe.assert_reads_every_row_once()
    entry = reingest_segment(pipe.catalog, pipe.ds, f"{TABLE}__1__1")  # retried: it lands
    assert entry.file_path is not None and pipe.catalog.deep.exists(entry.file_path)
    pipe.assert_reads_every_row_once()


def test_a_run_claimed_between_reading_it_and_claiming_it_is_not_claimed_twice(
    pipe: Pipeline,
) -> None:
    # Two sealers read the run as unclaimed from the same manifest, then claim one by one.
    run = Sealer(pipe.catalog, TABLE).pending_run(0)
    first = pipe.catalog.store.claim_run(run, owner="sealer-a")
    second = pipe.catalog.store.claim_run(run, owner="sealer-b")
    assert first is not None and second is None
    owners = {e.claimed_by for e in pipe.catalog.manifest(TABLE).entries if e.partition == 0}
    assert owners == {"sealer-a"}


def test_a_seal_built_on_a_key_index_that_went_stale_is_discarded_and_retried(
    catalog: Catalog, tmp_path: Path
) -> None:
    pipe = Pipeline(catalog, tmp_path, {"mode": "upsert", "primary_key": ["id"]})
    for _ in range(2):
        pipe.batch(0)
    assert Sealer(catalog, TABLE).seal_partition(0, force=True) is not None
    pipe.batch(0)
    # Between the next seal's build and its swap, the sealed segment its key index reflects is
    # re-ingested (a new entry): the index is stale, so the seal must not be swapped in.
    stale = _at("before_swap", lambda: reingest_segment(catalog, pipe.ds, f"{TABLE}__0__0"))
    with pytest.raises(SegmentChangedError, match="key index"):
        _hooked(catalog, stale).seal_partition(0, force=True)
    pipe.assert_reads_every_row_once()
    assert Sealer(catalog, TABLE).seal_partition(0, force=True) is not None
    assert pipe.entries(0) == [(0, SegmentState.ONLINE), (2, SegmentState.ONLINE)]
    pipe.assert_reads_every_row_once()


def test_a_compaction_whose_segment_was_re_ingested_and_collected_meanwhile_is_retried(
    catalog: Catalog, tmp_path: Path
) -> None:
    """The compaction read the manifest, then (a frozen sealer) a segment of its window was
    re-ingested and GC deleted the replaced file once its versions expired: the missing file
    is the partition having changed (retried from the current manifest), not a segment to
    re-ingest (seen in the commit-path campaign on PostgreSQL, seed 1781056226)."""
    pipe = Pipeline(catalog, tmp_path, {"mode": "upsert", "primary_key": ["id"]})
    for _ in range(2):
        pipe.batch(0)
        assert Sealer(catalog, TABLE).seal_partition(0, force=True) is not None
    (old,) = [e.file_path for e in catalog.manifest(TABLE).entries if e.name == f"{TABLE}__0__0"]
    assert old is not None

    def reingest_and_collect() -> None:
        reingest_segment(catalog, pipe.ds, f"{TABLE}__0__0")
        catalog.deep.delete(old)  # its versions expired, GC collected it

    sealer = _hooked(catalog, _at("before_compact_build", reingest_and_collect))
    sealer.compaction = CompactionPolicy(min_segments=2, max_segments=6)
    with pytest.raises(SegmentChangedError, match="replaced and collected"):
        sealer.compact_partition(0)
    pipe.assert_reads_every_row_once()
    again = Sealer(catalog, TABLE)
    again.compaction = CompactionPolicy(min_segments=2, max_segments=6)
    assert again.compact_partition(0) is not None
    pipe.assert_reads_every_row_once()


def test_a_claim_that_finds_one_entry_taken_claims_none_of_the_run(pipe: Pipeline) -> None:
    run = Sealer(pipe.catalog, TABLE).pending_run(0)
    assert pipe.catalog.store.claim_run(run[-1:], owner="sealer-a") is not None
    assert pipe.catalog.store.claim_run(run, owner="sealer-b") is None
    states = {
        e.seq: (e.state, e.claimed_by)
        for e in pipe.catalog.manifest(TABLE).entries
        if e.partition == 0
    }
    assert states[0] == (SegmentState.CONSUMING, None), "no partial claim left behind"
    assert states[2] == (SegmentState.COMMITTING, "sealer-a")


def test_a_rollback_whose_commit_outcome_is_unknown_is_reconciled_by_re_reading(
    pipe: Pipeline,
) -> None:
    before = pipe.catalog.store.get_shard(TABLE, 0)
    assert before is not None
    _fail_commit_once(pipe.catalog, landed=False)
    with pytest.raises(CommitStateUnknownError, match="did not land"):
        pipe.catalog.store.rollback_partition(TABLE, 0, 1, dry_run=False)
    assert pipe.catalog.store.get_shard(TABLE, 0) == before
    _fail_commit_once(pipe.catalog, landed=True)
    plan = pipe.catalog.store.rollback_partition(TABLE, 0, 1, dry_run=False)
    shard = pipe.catalog.store.get_shard(TABLE, 0)
    assert shard is not None
    assert (shard.upper, shard.epoch) == (plan.new_upper, before.epoch + 1) == (LINES, 1)
    assert [seq for seq, _ in pipe.entries(0)] == [0]


def test_an_interrupt_during_a_seals_commit_keeps_the_file_the_swap_may_reference(
    pipe: Pipeline,
) -> None:
    undo: list[Callable[[], None]] = []

    def interrupt_after_landing(landed: bool) -> None:
        if landed:
            undo.pop()()
            raise KeyboardInterrupt  # Ctrl-C in `millstream run --available-now`, say

    faults = _at(
        "before_swap",
        lambda: undo.append(at_commit(pipe.catalog.store, interrupt_after_landing)),
    )
    with pytest.raises(KeyboardInterrupt):
        _hooked(pipe.catalog, faults).seal_partition(0, force=True)
    assert pipe.entries(0) == [(0, SegmentState.ONLINE)], "the swap landed"
    pipe.assert_reads_every_row_once()


def test_an_interrupt_during_a_compactions_commit_keeps_the_files_the_swap_references(
    pipe: Pipeline,
) -> None:
    """The compaction twin of the seal's rule: once the swap may have run, only a proven
    non-landing (a refused precondition, every compare-and-set lost) deletes the uploaded
    files. Deleting them after an interrupt that came once the swap landed would leave the
    manifest naming a compacted file that is gone: every row of the partition unreadable."""
    policy = CompactionPolicy(min_segments=2, size_ratio=100.0)  # merge them all
    sealer = Sealer(pipe.catalog, TABLE, compaction=policy)
    assert sealer.seal_partition(0, force=True) is not None
    for _ in range(2):
        pipe.batch(0)
        assert sealer.seal_partition(0, force=True) is not None
    assert len(pipe.entries(0)) == 3, "three sealed segments to compact"

    undo: list[Callable[[], None]] = []

    def interrupt_after_landing(landed: bool) -> None:
        if landed:
            undo.pop()()
            raise KeyboardInterrupt

    at_sealer(
        sealer,
        hook=_at(
            "before_compact_swap",
            lambda: undo.append(at_commit(pipe.catalog.store, interrupt_after_landing)),
        ),
    )
    with pytest.raises(KeyboardInterrupt):
        sealer.compact_partition(0)
    assert len(pipe.entries(0)) == 1, "the swap landed"
    pipe.assert_reads_every_row_once()


@pytest.mark.parametrize("landed", [True, False], ids=["landed", "not-landed"])
def test_a_batch_commit_with_an_unknown_outcome_keeps_its_files_and_is_reconciled(
    pipe: Pipeline, landed: bool
) -> None:
    write = pipe.staged(0)
    upper = pipe.catalog.store.get_shard(TABLE, 0)
    _fail_commit_once(pipe.catalog, landed=landed)
    if landed:
        commit = commit_writes(
            pipe.catalog.store,
            pipe.catalog.deep,
            TABLE,
            [write],
            dead_letter_table=pipe.dl.name,
        )
        assert commit.reconciled, "the re-read found every range persisted"
        pipe.expected += pipe._rows.pop(id(write.data))
        pipe.pos[0] = write.ranges[0][1]
    else:
        with pytest.raises(CommitStateUnknownError):
            pipe.commit(write)
        assert pipe.catalog.store.get_shard(TABLE, 0) == upper
    for path in write.paths:
        assert pipe.catalog.deep.exists(path), "an unknown outcome never licenses a delete"
    pipe.assert_reads_every_row_once()


def test_abort_deletes_staged_files_only_when_a_write_task_failed(
    catalog: Catalog, tmp_path: Path
) -> None:
    from millstream.spark.options import SinkOptions
    from millstream.spark.sink import SegmentSink, SinkMessage

    pipe = Pipeline(catalog, tmp_path)
    write = pipe.staged(0)
    messages = [
        SinkMessage(
            ranges=dict(write.ranges),
            data_path=write.data.path,
            data_size=write.data.size_bytes,
            data_counts=dict(write.data.row_counts),
            dead_path=write.dead.path,
            dead_size=write.dead.size_bytes,
            dead_counts=dict(write.dead.row_counts),
        )
    ]
    options = {
        **catalog.settings.as_options(),
        "table": TABLE,
        "tableSpec": json.dumps(pipe.spec.to_json_dict()),
    }
    sink = SegmentSink(SinkOptions.from_options(options))
    # Every task succeeded: commit ran and disposed of the files (or kept them after an
    # unknown outcome, deliberately); abort must not second-guess it.
    sink.abort(list(messages), 0)
    assert all(catalog.deep.exists(p) for p in write.paths)
    # A task failed (its message is missing): the commit never ran, nothing references them.
    sink.abort([*messages, None], 0)
    assert not any(catalog.deep.exists(p) for p in write.paths)


def test_a_rollback_that_landed_is_reported_landed_even_if_a_writer_committed_since(
    pipe: Pipeline,
) -> None:
    def writer_commits_then_connection_drops(landed: bool) -> None:
        if landed:
            uninstall()
            # A writer at the new epoch commits an empty range before the re-read.
            pipe.catalog.store.compare_and_append(
                TABLE, [ShardAppend(0, LINES, LINES + 5, 1, None, 0)]
            )
            raise OSError("server closed the connection unexpectedly")

    uninstall = at_commit(pipe.catalog.store, writer_commits_then_connection_drops)
    plan = pipe.catalog.store.rollback_partition(TABLE, 0, 1, dry_run=False)
    assert plan.new_epoch == 1
    shard = pipe.catalog.store.get_shard(TABLE, 0)
    assert shard is not None and (shard.epoch, shard.upper) == (1, LINES + 5)


def test_a_staged_write_committed_twice_keeps_the_files_its_first_commit_references(
    pipe: Pipeline,
) -> None:
    """The second commit of the same staged write is a DROP (its ranges are below the shard
    uppers), and a DROP deletes the staged files it did not reference: here the first commit's
    files, which the manifest references. Spark's replay re-runs the write tasks (new file
    names), so no production path commits a file twice, but the commit must not depend on it."""
    write = pipe.staged(0)
    pipe.commit(write)
    commit_writes(
        pipe.catalog.store, pipe.catalog.deep, TABLE, [write], dead_letter_table=pipe.dl.name
    )

    for path in write.paths:
        assert pipe.catalog.deep.exists(path), "a file the manifest references was deleted"
    pipe.assert_reads_every_row_once()


def test_a_replays_unreferenced_staged_files_are_deleted(pipe: Pipeline) -> None:
    first = pipe.staged(0)
    pipe.commit(first)
    pipe.pos[0] -= LINES  # the same ranges staged again, as a replayed write task does
    replay = pipe.staged(0)
    pipe._rows.pop(id(replay.data))
    commit_writes(
        pipe.catalog.store, pipe.catalog.deep, TABLE, [replay], dead_letter_table=pipe.dl.name
    )

    assert replay.paths and not any(pipe.catalog.deep.exists(p) for p in replay.paths)
    pipe.pos[0] += LINES
    pipe.assert_reads_every_row_once()
