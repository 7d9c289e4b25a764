"""Writers racing on the same shards: each offset is committed exactly once, and the loser of
a compare-and-set finds out."""

from __future__ import annotations

import itertools
import multiprocessing
import queue
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from harness.contract_support import (
    EVENTS,
    TABLE,
    Backend,
    commit,
    commit_worker,
    data_files,
    expected_rows,
    stage,
    table_rows,
    uppers,
)
from millstream.catalog import Catalog
from millstream.core.frontier import Outcome
from millstream.errors import CommitConflictError
from millstream.metastore import schema
from millstream.metastore.cas import cas_update
from millstream.spec import TableSpec

PARTITIONS = (0, 1, 2)
BARRIER_TIMEOUT = 60


def batches_of(size: int, end: int, partitions: tuple[int, ...] = PARTITIONS) -> list[dict]:
    """``[0, end)`` of every partition cut into multi-partition batches of ``size`` offsets."""
    return [{p: (lo, min(lo + size, end)) for p in partitions} for lo in range(0, end, size)]


def assert_each_offset_committed_once(cat: Catalog, end: int, partitions: tuple[int, ...]) -> None:
    """The visible entries of every partition tile ``[0, end)`` with no overlap."""
    by_part: dict[int, list[tuple[int, int]]] = {p: [] for p in partitions}
    for e in cat.manifest(TABLE).entries:
        by_part[e.partition].append((e.start, e.end))
    for p, ranges in by_part.items():
        ranges.sort()
        assert ranges[0][0] == 0, (p, ranges)
        assert ranges[-1][1] == end, (p, ranges)
        for (_, prev_end), (start, _) in itertools.pairwise(ranges):
            assert start == prev_end, (p, ranges)


def run_writers(backend: Backend, plans: list[list[dict]]) -> list[list[dict[int, Outcome]]]:
    """One thread (with its own Catalog) per plan: stage every batch, wait for all, then
    commit the batches in order. Returns each writer's outcomes; any exception propagates."""
    barrier = threading.Barrier(len(plans))

    def writer(i: int, plan: list[dict]) -> list[dict[int, Outcome]]:
        with backend.open() as cat:
            staged = [stage(cat, b) for b in plan]
            barrier.wait(BARRIER_TIMEOUT)
            out = []
            for b, st in zip(plan, staged, strict=True):
                res = commit(cat, b, staged=st, writer_id=f"w{i}")
                out.append({s.partition: s.decision.outcome for s in res.shards})
            return out

    with ThreadPoolExecutor(len(plans)) as pool:
        futures = [pool.submit(writer, i, plan) for i, plan in enumerate(plans)]
        return [f.result() for f in futures]


def test_four_threads_committing_the_same_batches_commit_each_exactly_once(
    catalog: Catalog, backend: Backend
) -> None:
    spec = catalog.create_table(EVENTS).spec
    plan = batches_of(10, 80)

    outcomes = run_writers(backend, [plan] * 4)

    for i in range(len(plan)):
        per_writer = [writer[i] for writer in outcomes]
        # A batch wins or loses as a whole: its partitions moved together.
        assert all(len(set(o.values())) == 1 for o in per_writer), per_writer
        assert Counter(next(iter(o.values())) for o in per_writer) == {
            Outcome.COMMIT: 1,
            Outcome.DROP: 3,
        }, (i, per_writer)
    assert uppers(catalog) == dict.fromkeys(PARTITIONS, 80)
    assert catalog.manifest(TABLE).version == len(plan)
    assert_each_offset_committed_once(catalog, 80, PARTITIONS)
    assert table_rows(catalog) == expected_rows(spec, plan)
    assert data_files(catalog) == catalog.store.referenced_files(TABLE)


def test_four_threads_with_different_batch_sizes_trim_and_commit_every_offset_once(
    catalog: Catalog, backend: Backend
) -> None:
    spec = catalog.create_table(EVENTS).spec
    plans = [batches_of(size, 60, (0, 1)) for size in (5, 7, 10, 13)]

    outcomes = run_writers(backend, plans)

    seen = Counter(o for writer in outcomes for batch in writer for o in batch.values())
    assert set(seen) <= {Outcome.COMMIT, Outcome.TRIM, Outcome.DROP}, seen
    assert seen[Outcome.COMMIT] >= 1
    assert uppers(catalog) == {0: 60, 1: 60}
    assert_each_offset_committed_once(catalog, 60, (0, 1))
    assert table_rows(catalog) == expected_rows(spec, [{0: (0, 60), 1: (0, 60)}])
    assert data_files(catalog) == catalog.store.referenced_files(TABLE)


def test_two_processes_opening_a_new_store_and_committing_the_same_batches_commit_each_once(
    backend: Backend,
) -> None:
    """Both processes migrate the empty store, create the table and commit at once."""
    spec = TableSpec.parse(EVENTS)
    plan = batches_of(10, 40)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=commit_worker,
            args=(backend.as_dict(), plan, f"proc{i}", barrier, results),
            daemon=True,
        )
        for i in range(2)
    ]
    for p in procs:
        p.start()
    try:
        reports = [results.get(timeout=120) for _ in procs]
    except queue.Empty:
        pytest.fail("a writer process did not report within 120s")
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()

    assert [err for _, _, err in reports] == [None, None]
    assert [p.exitcode for p in procs] == [0, 0]
    by_writer = {w: dict(outs) for w, outs, _ in reports}
    for i in range(len(plan)):
        per_writer = [by_writer[w][i] for w in sorted(by_writer)]
        assert Counter(o for outs in per_writer for o in set(outs.values())) == {
            "commit": 1,
            "drop": 1,
        }, (i, per_writer)
    with backend.open() as catalog:
        assert catalog.store.schema_version() == schema.LATEST_SCHEMA_VERSION
        assert [t.spec for t in catalog.store.list_tables()] == [spec]
        assert uppers(catalog) == dict.fromkeys(PARTITIONS, 40)
        assert_each_offset_committed_once(catalog, 40, PARTITIONS)
        assert table_rows(catalog) == expected_rows(spec, plan)
        assert data_files(catalog) == catalog.store.referenced_files(TABLE)


def test_two_compare_and_sets_on_the_same_row_version_exactly_one_conflicts(
    catalog: Catalog, backend: Backend
) -> None:
    catalog.create_table(EVENTS)
    commit(catalog, {0: (0, 10)})
    shard = catalog.store.get_shard(TABLE, 0)
    assert shard is not None
    barrier = threading.Barrier(2)

    def cas(upper: int) -> int:
        with backend.open() as cat:
            barrier.wait(BARRIER_TIMEOUT)
            with cat.store.write() as conn:
                return cas_update(
                    conn,
                    schema.shards,
                    {"table_name": TABLE, "partition": 0},
                    shard.version,
                    {"upper": upper},
                )

    with ThreadPoolExecutor(2) as pool:
        futures = {upper: pool.submit(cas, upper) for upper in (11, 12)}
        errors = {u: f.exception() for u, f in futures.items()}

    conflicts = [u for u, e in errors.items() if isinstance(e, CommitConflictError)]
    assert len(conflicts) == 1, errors
    (winner,) = {11, 12} - set(conflicts)
    assert errors[winner] is None
    assert futures[winner].result() == shard.version + 1
    after = catalog.store.get_shard(TABLE, 0)
    assert after is not None
    assert (after.upper, after.version) == (winner, shard.version + 1)
