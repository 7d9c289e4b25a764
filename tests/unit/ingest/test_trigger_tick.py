"""A datastream's query triggers at a short tick and its source gates the batches: while
records flow it is planned at most once per its ``trigger_interval`` (the batches' count and
cost are the interval's), and once a plan found nothing (idle) it is planned at every tick, so
records that reach it start a batch within one tick instead of waiting for the interval. An
available-now run is never held.

The readers are the production ones (:class:`StreamReader`, what Spark's single-datastream
query calls, and :class:`GroupStreamReader`, a shared query's source) over a real files
source; only the clock is the test's: ``latestOffset`` is asked at the instants Spark's ticks
would ask it."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from millstream.spark.options import GroupSourceOptions, SourceOptions
from millstream.spark.shared import member_source
from millstream.spark.sources import GroupStreamReader, StreamReader, tick_seconds


class Files:
    """A files source of one partition whose records the test appends."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "0").mkdir(parents=True)
        self.lines = 0

    def append(self, n: int) -> None:
        path = self.root / "0" / "00000.jsonl"
        with path.open("a") as f:
            f.writelines(f'{{"id": {self.lines + i}}}\n' for i in range(n))
        self.lines += n

    def options(self, trigger: float, **extra: Any) -> SourceOptions:
        return SourceOptions("files", {"path": str(self.root)}, trigger_seconds=trigger, **extra)


def _planned(start: dict[str, Any], end: dict[str, Any]) -> bool:
    return any(int(o) > int(start.get(p, o)) for p, o in end.items())


def test_the_tick_is_a_fifth_of_the_interval_but_at_least_100_ms() -> None:
    assert tick_seconds(0.5) == pytest.approx(0.1)
    assert tick_seconds(5.0) == pytest.approx(1.0)
    assert tick_seconds(20.0) == pytest.approx(4.0)
    assert tick_seconds(0.2) == pytest.approx(0.1)
    assert tick_seconds(0.05) == pytest.approx(0.05), "never longer than the interval"


def test_a_busy_datastream_is_planned_once_per_its_interval_though_asked_every_tick(
    tmp_path: Path,
) -> None:
    files = Files(tmp_path / "src")
    files.append(10)
    reader = StreamReader(files.options(0.5))
    limit = reader.getDefaultReadLimit()
    start = reader.initialOffset()
    planned_at = []
    # Spark asks at every 100 ms tick, each ask a little late after its tick (up to 40 ms:
    # a loaded machine), and records arrive between every two ticks.
    for i in range(21):
        now = 1000.0 + i * 0.1 + (0.04 if i % 3 == 1 else 0.0)
        end = reader.latestOffset(start, limit, now=now)
        if _planned(start, end):
            planned_at.append(i)
            start = end
        files.append(3)
    assert planned_at == [0, 5, 10, 15, 20], "one batch per 500 ms interval while busy"
    assert int(start["0"]) == 10 + 3 * 20, "each plan took every record that had arrived"


def test_an_idle_datastream_is_planned_at_the_next_tick_after_records_arrive(
    tmp_path: Path,
) -> None:
    files = Files(tmp_path / "src")
    reader = StreamReader(files.options(5.0))  # ticks every second
    limit = reader.getDefaultReadLimit()
    start = reader.initialOffset()
    assert reader.latestOffset(start, limit, now=100.0) == start, "nothing yet"
    files.append(4)
    end = reader.latestOffset(start, limit, now=101.0)
    assert end == {"0": 4}, "planned at the tick after its records arrived"
    start = end
    # Busy now: the next records wait for the interval, then the plan after them finds none.
    files.append(2)
    assert reader.latestOffset(start, limit, now=102.0) == start
    end = reader.latestOffset(start, limit, now=106.0)
    assert end == {"0": 6}
    start = end
    assert reader.latestOffset(start, limit, now=111.0) == start, "idle again"
    files.append(1)
    assert reader.latestOffset(start, limit, now=112.0) == {"0": 7}, "woken by the tick"


def test_an_available_now_run_is_never_held_by_the_interval(tmp_path: Path) -> None:
    """What an available-now run does (millstream.spark.catch_up): pin the target, then plan
    batches one after another until a plan is empty, all within one interval."""
    files = Files(tmp_path / "src")
    files.append(10)
    reader = StreamReader(files.options(60.0, max_records_per_batch=3))
    reader.prepareForTriggerAvailableNow()
    start = reader.initialOffset()
    limit = reader.getDefaultReadLimit()
    batches = 0
    while reader.plan(start, end := reader.latestOffset(start, limit, now=7.0)):
        start, batches = end, batches + 1
    assert start == {"0": 10} and batches == 4, "the whole target, in bounded batches"


def _group(members: dict[str, SourceOptions]) -> GroupStreamReader:
    options = {
        n: member_source(o, members=len(members), trigger=o.trigger_seconds)
        for n, o in members.items()
    }
    return GroupStreamReader(
        GroupSourceOptions.from_options(GroupSourceOptions(options).to_options())
    )


def test_a_shared_query_runs_one_batch_per_shortest_interval_and_each_member_per_its_own(
    tmp_path: Path,
) -> None:
    """A shared query ticks at its shortest member's tick (100 ms for 500 ms): while records
    flow it runs one batch per 500 ms (a batch costs the query its fixed cost whatever it
    holds), a member of 1 s is planned every second, and a member whose first records
    arrive meanwhile joins the query's next batch rather than starting one of its own."""
    fast, slow, quiet = (Files(tmp_path / n) for n in ("fast", "slow", "quiet"))
    fast.append(5)
    slow.append(5)
    reader = _group(
        {"fast": fast.options(0.5), "slow": slow.options(1.0), "quiet": quiet.options(0.5)}
    )
    start = reader.initialOffset()
    limit = reader.getDefaultReadLimit()
    planned: dict[str, list[int]] = {n: [] for n in ("fast", "slow", "quiet")}
    for i in range(21):
        if i == 13:
            quiet.append(2)  # the quiet member's first records, between two ticks
        end = reader.latestOffset(start, limit, now=50.0 + i * 0.1)
        for n in planned:
            if _planned(start[n], end[n]):
                planned[n].append(i)
        start = end
        fast.append(1)
        slow.append(1)
    assert planned["fast"] == [0, 5, 10, 15, 20]
    assert planned["slow"] == [0, 10, 20]
    assert planned["quiet"] == [15], "in the query's next batch, not a batch of its own"


def test_an_idle_shared_query_plans_a_members_records_at_the_next_tick(tmp_path: Path) -> None:
    a, b = Files(tmp_path / "a"), Files(tmp_path / "b")
    a.append(3)
    reader = _group({"a": a.options(5.0), "b": b.options(5.0)})  # ticks every second
    limit = reader.getDefaultReadLimit()
    start = reader.initialOffset()
    planned: dict[str, list[int]] = {"a": [], "b": []}
    for i in range(16):
        if i == 7:
            b.append(2)  # the query found nothing at 5: idle since
        if i == 9:
            a.append(1)  # within the interval of the query's batch at 7: joins its next
        end = reader.latestOffset(start, limit, now=200.0 + i)
        for n in planned:
            if _planned(start[n], end[n]):
                planned[n].append(i)
        start = end
    assert planned == {"a": [0, 12], "b": [7]}


def test_an_idle_standbys_ticks_ask_no_metadata_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An idle datastream is asked at every tick: a standby's gate (may this worker commit?)
    is a metadata store read, asked only when the plan has records to hold back."""
    from millstream.config import Settings
    from millstream.metastore import store
    from millstream.spark.options import CommitGate

    settings = Settings(
        home=tmp_path, metadata_url=f"sqlite:///{tmp_path / 'm.db'}", deep_store=str(tmp_path)
    )
    asked: list[str] = []

    class _Store:
        url = settings.metadata_url

        def may_commit(self, datastream: str, worker: str, **_: object) -> bool:
            asked.append(datastream)
            return False

        def list_shards(self, table: str) -> list[SimpleNamespace]:
            return [SimpleNamespace(partition=0, upper=2)]

    monkeypatch.setattr(store, "STORES", store.StoreRegistry(_Store()))  # type: ignore[arg-type]
    files = Files(tmp_path / "src")
    reader = StreamReader(files.options(0.5, gate=CommitGate("ds", "w1", "t"), settings=settings))
    limit = reader.getDefaultReadLimit()
    start = reader.initialOffset()
    for i in range(10):
        assert reader.latestOffset(start, limit, now=float(i)) == start
    assert asked == [], "an idle tick asked the metadata store"
    files.append(5)
    assert reader.latestOffset(start, limit, now=11.0) == {"0": 2}, "held to the shard upper"
    assert asked == ["ds"]


def test_a_shared_querys_tick_parses_the_membership_only_when_it_changed(tmp_path: Path) -> None:
    """The source reads the membership file at every tick: the same bytes are not parsed
    again, and any write (a join, a leave: a new generation) is."""
    from millstream.spark.membership import Member, Membership

    files = Files(tmp_path / "src")
    entry = Member(1, files.options(0.5).to_options(), {})
    membership = Membership(tmp_path / "members.json")
    assert membership.read_changed() == (-1, {}), "no file yet"
    membership.write(1, {"a": entry})
    assert membership.read_changed() == (1, {"a": entry})
    assert membership.read_changed() is None, "the same file: nothing to parse"
    membership.write(2, {"a": entry})  # the same length, another generation
    assert membership.read_changed() == (2, {"a": entry})
    assert membership.read() == (2, {"a": entry}), "read() parses whatever the file holds"


def test_an_idle_shared_querys_tick_plans_no_member_whose_source_answered_its_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wholly idle query asks every member's source at every tick (ten a second at the
    default interval): a member whose source answered exactly where it starts ends there
    without a plan (100 idle members planned each on a thread cost 0.05 cores); a member with
    records is planned at the next tick, in full."""
    sources = {f"m{i:02d}": Files(tmp_path / f"m{i:02d}") for i in range(20)}
    for f in sources.values():
        f.append(3)
    reader = _group({n: f.options(0.5) for n, f in sources.items()})
    limit = reader.getDefaultReadLimit()
    start = reader.latestOffset(reader.initialOffset(), limit, now=10.0)  # the first batch
    assert all(o == {"0": 3} for o in start.values())
    plans: list[str] = []
    plan = StreamReader._plan

    def counted(self: StreamReader, *args: Any) -> Any:
        plans.append(self.opts.config["path"])
        return plan(self, *args)

    monkeypatch.setattr(StreamReader, "_plan", counted)
    for i in range(1, 11):  # idle: the query is asked at every tick, its members answer 3
        assert reader.latestOffset(start, limit, now=11.0 + i * 0.1) == start
    assert plans == [], "an idle tick planned members whose source answered their start"
    sources["m07"].append(2)
    end = reader.latestOffset(start, limit, now=12.2)
    assert plans == [str(tmp_path / "m07")]
    assert end == {**start, "m07": {"0": 5}}
