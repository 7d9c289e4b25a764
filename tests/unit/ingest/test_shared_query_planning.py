"""A shared query's planning: each member's ranges are planned as the member would plan them
alone and packed into the query's tasks whole; a member's error carries its name through
Spark's text."""

from __future__ import annotations

import random
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from millstream.errors import (
    BadRecordError,
    InvalidSpecError,
    WriterFencedError,
    from_spark_failure,
)
from millstream.spark.options import GroupSinkOptions, GroupSourceOptions, SourceOptions
from millstream.spark.shared import SharedQueryMemberError, member_of, member_source
from millstream.spark.sources import (
    MEMBER_NOTE,
    GroupStreamReader,
    plan_group_tasks,
    plan_tasks,
    whole_if_small,
)


@pytest.mark.parametrize("seed", range(200))
def test_every_members_tasks_are_packed_whole_into_at_most_the_querys_tasks(seed: int) -> None:
    rng = random.Random(seed)
    tasks = rng.randint(1, 4)
    members = []
    for m in range(rng.randint(1, 9)):
        ranges = []
        for p in rng.sample(range(16), rng.randint(1, 6)):
            lo = rng.randint(0, 1000)
            ranges.append((p, lo, lo + rng.choice([1, 50, 400, 150_000])))
        planned = plan_tasks(sorted(ranges), tasks, 50_000)
        merged = whole_if_small(planned, 50_000)  # a small batch in one task
        assert sorted(r for b in merged for r in b) == sorted(r for b in planned for r in b)
        members.append((f"ds{m}", merged))
    packed = plan_group_tasks(members, tasks)
    assert 1 <= len(packed) <= tasks, f"seed {seed}"
    got = sorted((name, tuple(bucket)) for task in packed for name, bucket in task)
    want = sorted((name, tuple(bucket)) for name, buckets in members for bucket in buckets)
    assert got == want, f"seed {seed}: a member's task was split, lost or doubled"
    if len(want) >= tasks:
        assert len(packed) == tasks, f"seed {seed}: a task slot left idle"
    for task in packed:
        names = [name for name, _ in task]
        assert len(names) == len(set(names)), (
            f"seed {seed}: a task holds two of one member's buckets (a split partition's two "
            "pieces would be reported as one range and refused)"
        )


def test_a_split_partitions_pieces_never_share_a_task_beside_other_members() -> None:
    # The review's case: 4 tasks, member a's one partition split in 4 pieces, member b's one
    # piece as long as them: packed longest first, a's last piece went to a task with another.
    a = plan_tasks([(0, 0, 200_000)], 4, 50_000)
    assert len(a) == 4
    packed = plan_group_tasks([("a", a), ("b", [[(0, 0, 60_000)]])], 4)
    for task in packed:
        assert [name for name, _ in task].count("a") <= 1, packed


def test_nothing_to_plan_is_no_task() -> None:
    assert plan_group_tasks([], 2) == []


def test_a_members_error_is_known_by_its_name_in_sparks_text() -> None:
    err = BadRecordError("orders", 1, 21, "not valid JSON")
    err.add_note(MEMBER_NOTE.format("orders-ds"))
    spark_text = (
        "[STREAM_FAILED] Query [id = 1] terminated with exception: [PYTHON_EXCEPTION] An "
        "exception was thrown from the Python worker: Traceback (most recent call last):\n"
        '  File "sink.py", line 1, in write\n'
        f"millstream.errors.BadRecordError: {err}\n{err.__notes__[0]}\n"
        "\tat org.apache.spark.sql.execution.python.PythonException(...)\n"
    )
    failure = Exception(spark_text)
    assert member_of(failure) == "orders-ds"
    member_error = SharedQueryMemberError("orders-ds", failure)
    assert str(member_error).startswith("datastream 'orders-ds': BadRecordError: bad record")
    assert "partition 1 offset 21" in str(member_error)
    ours = from_spark_failure(failure)
    assert ours is not None and ours.kind is BadRecordError
    # An error of the query itself names no member.
    assert member_of(Exception(f"WriterFencedError: {WriterFencedError('t', 0, 1, 2)}")) is None


def test_a_shared_query_without_members_is_refused_naming_the_field() -> None:
    for make in (
        lambda: GroupSourceOptions.from_options({}),
        lambda: GroupSourceOptions.from_options({"members": "{}"}),
        lambda: GroupSinkOptions({}),
    ):
        with pytest.raises(InvalidSpecError) as raised:
            make()
        assert "members" in str(raised.value)


def _generator(rate: float, trigger: float = 0.0) -> SourceOptions:
    return SourceOptions(
        "generator",
        {"seed": 1, "partitions": 2, "rate": rate},
        tasks=2,
        trigger_seconds=trigger,
    )


def test_a_member_with_a_longer_trigger_is_planned_once_per_its_own_trigger() -> None:
    reader = GroupStreamReader(
        GroupSourceOptions.from_options(
            GroupSourceOptions(
                {"fast": _generator(200_000), "slow": _generator(200_000, trigger=60.0)}
            ).to_options()
        )
    )
    start = reader.initialOffset()
    first = reader.latestOffset(start, reader.getDefaultReadLimit())
    time.sleep(0.05)  # 10,000 more rows in each source
    second = reader.latestOffset(first, reader.getDefaultReadLimit())
    assert first["fast"] != start["fast"] and second["fast"] != first["fast"]
    assert first["slow"] != start["slow"], "planned at its first trigger"
    assert second["slow"] == first["slow"], "planned again before its own trigger came"


def test_each_member_plans_with_its_share_of_a_tasks_memory() -> None:
    source = _generator(0)
    alone = member_source(source, members=1, trigger=0.5)
    assert alone.task_memory_mb == source.task_memory_mb
    eight = member_source(source, members=8, trigger=0.5)
    assert eight.task_memory_mb == source.task_memory_mb // 8
    # the query ticks faster than any member's trigger: each is gated by its own
    assert alone.trigger_seconds == eight.trigger_seconds == 0.5
    slow = member_source(source, members=8, trigger=60.0)
    assert slow.trigger_seconds == 60.0


def test_a_backlog_of_many_small_members_is_caught_up_in_one_batch_within_a_tasks_memory() -> None:
    """100 one-partition members with 10,000 records each behind (1M records in 100 topics):
    each member plans its whole backlog at once, where a share of a task's memory among all
    100 planned 2,621 records a member a batch (4 batches of ~256,000 records, each paying
    every table's per-batch cost). A task writes at most MEMBER_THREADS members at once, so
    what it holds at once stays within one task's memory, as for one datastream alone."""
    from millstream.spark.sources import MEMBER_THREADS, StreamReader

    alone = SourceOptions("kafka", {"bootstrap_servers": "127.0.0.1:1", "topic": "t"}, tasks=2)
    member = member_source(alone, members=100, trigger=0.5)
    reader = StreamReader(member)

    end = reader.latestOffset({"0": 0}, reader.getDefaultReadLimit(), {0: 10_000})

    assert end == {"0": 10_000}, "the member's whole backlog in one batch"
    assert MEMBER_THREADS * reader.budget() <= StreamReader(alone).budget() // alone.tasks


def test_a_members_small_batch_is_written_by_one_task_and_a_large_one_is_spread() -> None:
    source = SourceOptions("generator", {"seed": 1, "partitions": 4}, tasks=2)
    reader = GroupStreamReader(GroupSourceOptions({"a": source, "b": source, "c": source}))
    zero = {"0": 0, "1": 0, "2": 0, "3": 0}
    small = {"0": 250, "1": 260, "2": 240, "3": 250}  # a trigger's worth at 1,000 rows/s
    large = {p: 20_000 for p in zero}  # 80,000 records: a catch-up

    tasks = reader.partitions(
        {"a": zero, "b": zero, "c": zero}, {"a": small, "b": small, "c": large}
    )

    parts = [dict(t.parts) for t in tasks]  # type: ignore[attr-defined]
    assert len(parts) == 2
    for name in ("a", "b"):  # each whole in one task: one fetch, one staged file
        (mine,) = [p[name] for p in parts if name in p]
        assert sorted(p for p, _, _ in mine) == [0, 1, 2, 3]
    assert all("c" in p and len(p["c"]) == 2 for p in parts), "a catch-up uses both tasks"


def test_a_plan_asks_each_datastreams_standby_gate_once_and_each_follows_its_own(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A shared query's plan asks whether a standby may commit once per datastream, not once
    per table (100 tables of one datastream asked the metadata store the same question 100
    times a plan, each through a store of its own); each member still follows its own
    datastream's answer: a standby that may not commit plans no further than its table's
    shard uppers, while the active beside it plans its backlog."""
    from millstream.config import Settings
    from millstream.metastore import store
    from millstream.spark.options import CommitGate

    url = f"sqlite:///{tmp_path / 'metadata.db'}"
    settings = Settings(home=tmp_path, metadata_url=url, deep_store=str(tmp_path))

    class _Store:
        url = settings.metadata_url
        asked: list[str] = []

        def may_commit(self, datastream: str, worker: str, **_: object) -> bool:
            self.asked.append(datastream)
            return datastream == "active"

        def list_shards(self, table: str) -> list[SimpleNamespace]:
            return [SimpleNamespace(partition=p, upper=7) for p in range(2)]

    monkeypatch.setattr(store, "STORES", store.StoreRegistry(_Store()))  # type: ignore[arg-type]

    def member(datastream: str, table: str) -> SourceOptions:
        return SourceOptions(
            "generator",
            {"seed": 1, "partitions": 2},
            tasks=2,
            gate=CommitGate(datastream, "w1", table),
            settings=settings,
        )

    members = {f"standby.t{i}": member("standby", f"t{i}") for i in range(5)}
    members |= {f"active.t{i}": member("active", f"u{i}") for i in range(5)}
    reader = GroupStreamReader(GroupSourceOptions(members))
    start = {n: {"0": 0, "1": 0} for n in members}

    end = reader.latestOffset(start, reader.getDefaultReadLimit())

    assert sorted(_Store.asked) == ["active", "standby"], "one question per datastream"
    for n in members:
        if n.startswith("standby"):
            assert end[n] == {"0": 7, "1": 7}, f"{n} planned past its shard uppers"
        else:
            assert all(o > 7 for o in end[n].values()), f"{n} did not plan its backlog"
