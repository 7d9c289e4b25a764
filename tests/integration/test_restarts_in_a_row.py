"""A writer restarted after fenced commits runs on as long as it commits between them.

A rollback (``millstream table rollback``: :meth:`MetadataStore.rollback_partition`) moves a
shard's epoch on, so the running writer's next commit is fenced and it restarts from the
shard uppers. Such restarts are bounded (:data:`~millstream.spark.runner.MAX_RESTARTS`) in a
row only: a writer or shared-query member that recovered from each of them, committing in
between, must not fail however many it meets over its life, while one that restarts again
and again without a commit still fails at the bound. The bound is lowered here so that a few
rollbacks cross it; the writers are the production runners on the suite's Spark session, the
rollbacks the store's own, and every record must end in the table exactly once.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from harness.shared_query import append_files_spec, members_as_a_worker_holds_them
from millstream import faults
from millstream.catalog import Catalog
from millstream.datastream import DatastreamSpec
from millstream.errors import WriterFencedError
from millstream.spark import runner as runner_module
from millstream.spark import shared as shared_module
from millstream.spark.runner import DatastreamRunner
from millstream.spark.shared import SharedQueryRunner
from millstream.storage.statedir import StateDirectory

pytestmark = pytest.mark.spark

PARTITIONS = 2
LINES = 40  # per partition
BOUND = 1  # restarts in a row a writer may make


@pytest.fixture(autouse=True)
def low_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner_module, "MAX_RESTARTS", BOUND)
    monkeypatch.setattr(shared_module, "MAX_RESTARTS", BOUND)


def _spec(root: Path, name: str) -> DatastreamSpec:
    return append_files_spec(
        root, name, partitions=PARTITIONS, lines=LINES, max_records_per_batch=10, trigger="200ms"
    )


def _rows(catalog: Catalog, spec: DatastreamSpec) -> list[tuple[int, str]]:
    return sorted((r["id"], r["v"]) for r in catalog.read_table(spec.table_name).to_pylist())


def _uppers(catalog: Catalog, spec: DatastreamSpec) -> dict[int, int]:
    try:
        return {s.partition: s.upper for s in catalog.store.list_shards(spec.table_name)}
    except Exception:  # no table yet
        return {}


def _roll_back_last(catalog: Catalog, spec: DatastreamSpec, partition: int) -> None:
    """Roll ``partition`` back by its last segment, as an operator's rollback does."""
    last = max(
        e.seq for e in catalog.store.manifest(spec.table_name).entries if e.partition == partition
    )
    catalog.store.rollback_partition(spec.table_name, partition, last, dry_run=False)


def test_a_writer_that_commits_between_rollbacks_runs_on_past_the_bound(
    spark: Any, tmp_path: Path
) -> None:
    spec = _spec(tmp_path / "sources", "rr")
    rollbacks: list[int] = []
    with Catalog.open(home=tmp_path / "home") as catalog:
        commits = [0]

        def roll_back_now_and_then(point: str, key: Any) -> None:
            # before every third commit, while there are some: the batch before committed
            if point != "before_commit":
                return
            commits[0] += 1
            if commits[0] % 3 == 0 and len(rollbacks) < 3:
                _roll_back_last(catalog, spec, 0)
                rollbacks.append(commits[0])

        runner = DatastreamRunner(spec, catalog, spark, writer_id="w1")
        with faults.installed(faults.call("before_commit", roll_back_now_and_then)):
            stats = runner.run(available_now=True)

        assert len(rollbacks) == 3, rollbacks
        # each rollback fenced the commit after it: three restarts, none of them in a row, and
        # the writer committed after the last one: no restart in a row left
        assert stats.restarts == 3, stats
        assert stats.restarts_in_a_row == 0, stats
        assert _uppers(catalog, spec) == {p: LINES for p in range(PARTITIONS)}
        assert _rows(catalog, spec) == sorted(
            (p * 1000 + i, f"rr{i}") for p in range(PARTITIONS) for i in range(LINES)
        )


def test_a_writer_fenced_again_and_again_without_a_commit_fails_at_the_bound(
    spark: Any, tmp_path: Path
) -> None:
    spec = _spec(tmp_path / "sources", "rf")
    fenced = [0]

    def fence_every_commit(point: str, key: Any) -> None:
        # a few more than the bound, so a writer without one would commit after them
        if point == "before_commit" and fenced[0] < BOUND + 3:
            fenced[0] += 1
            raise WriterFencedError(spec.table_name, 0, 1, 2)

    with Catalog.open(home=tmp_path / "home") as catalog:
        runner = DatastreamRunner(spec, catalog, spark, writer_id="w1")
        with (
            faults.installed(faults.call("before_commit", fence_every_commit)),
            pytest.raises(WriterFencedError),
        ):
            runner.run(available_now=True)
        assert fenced == [BOUND + 1]
        assert runner.stats.restarts_in_a_row == BOUND + 1
        assert _uppers(catalog, spec) == {p: 0 for p in range(PARTITIONS)}


def test_a_shared_query_member_that_commits_between_rollbacks_is_not_failed(
    spark: Any, tmp_path: Path
) -> None:
    specs = [_spec(tmp_path / "sources", n) for n in ("ma", "mb")]
    rolled = specs[0]
    with Catalog.open(home=tmp_path / "home") as catalog:
        members = members_as_a_worker_holds_them(specs, catalog, spark, tmp_path / "state")
        shared = SharedQueryRunner(members, spark, StateDirectory(tmp_path / "state", "_shared"))
        errors: list[BaseException] = []

        def run() -> None:
            try:
                shared.run()
            except BaseException as exc:  # the worker would fail the member with it
                errors.append(exc)

        thread = threading.Thread(target=run, name="test-shared-restarts")
        thread.start()
        deadline = time.monotonic() + 300
        end = LINES

        def wait_for(uppers: dict[int, int]) -> None:
            while thread.is_alive() and time.monotonic() < deadline:
                if _uppers(catalog, rolled) == uppers:
                    return
                time.sleep(0.2)

        try:
            wait_for({p: end for p in range(PARTITIONS)})
            for n in range(3):
                _roll_back_last(catalog, rolled, 0)
                # new records: the member's next batch commits with its stale epoch, is
                # fenced, and the query restarts it from the rolled-back upper
                for p in range(PARTITIONS):
                    (tmp_path / "sources" / rolled.name / str(p) / f"{n + 1:05d}.jsonl").write_text(
                        "".join(
                            f'{{"id": {p * 1000 + end + i}, "v": "{rolled.name}{end + i}"}}\n'
                            for i in range(5)
                        )
                    )
                end += 5
                wait_for({p: end for p in range(PARTITIONS)})
        finally:
            shared.stop()
            thread.join(120)
        assert not errors, f"the shared query raised (the member would fail): {errors[0]!r}"
        assert sorted(shared.members) == ["ma", "mb"]
        assert shared.restarts["ma"].total == 3
        # it committed after its last restart: no restart in a row left
        assert shared.restarts_in_a_row("ma") == 0
        assert _uppers(catalog, rolled) == {p: end for p in range(PARTITIONS)}
        assert _rows(catalog, rolled) == sorted(
            (p * 1000 + i, f"ma{i}") for p in range(PARTITIONS) for i in range(end)
        )
        for m in members:
            m.state_dir.unlock()


def test_a_fenced_writer_restarts_when_its_shard_uppers_cannot_be_read(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counting the restart reads the shard uppers (did the writer commit since its start?):
    a metadata store that does not answer that read reads as no progress, and the fenced
    commit still restarts the writer instead of failing it with the store's error."""
    spec = _spec(tmp_path / "sources", "ru")
    fenced = [0]

    def fence_once(point: str, key: Any) -> None:
        if point == "before_commit" and not fenced[0]:
            fenced[0] += 1
            raise WriterFencedError(spec.table_name, 0, 1, 2)

    def unreadable() -> dict[int, int]:
        raise OSError("the metadata store does not answer")

    with Catalog.open(home=tmp_path / "home") as catalog:
        runner = DatastreamRunner(spec, catalog, spark, writer_id="w1")
        monkeypatch.setattr(runner, "committed_uppers", unreadable)
        with faults.installed(faults.call("before_commit", fence_once)):
            stats = runner.run(available_now=True)
        assert fenced == [1]
        assert (stats.restarts, stats.restarts_in_a_row) == (1, 1), stats
        assert _uppers(catalog, spec) == {p: LINES for p in range(PARTITIONS)}
        assert _rows(catalog, spec) == sorted(
            (p * 1000 + i, f"ru{i}") for p in range(PARTITIONS) for i in range(LINES)
        )
