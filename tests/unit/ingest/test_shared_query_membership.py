"""Members join and leave a running shared query without a restart, and lose and duplicate
nothing: the production pieces (the runner's membership, the group source's planning, the
group sink's write tasks and commit) driven as Spark drives them in one query's life.

Spark is stood in for by :class:`Query`: the source plans a batch (``latestOffset``,
``partitions``) in its own process, which follows the membership file; the write tasks run
with a reader and a sink made when the query started (Spark makes them once per query), so a
member that joined later reaches them only through its tasks; each commit gets a fresh sink
from the query's options (Spark's commit process does). Offsets and tasks go through JSON and
pickle, as they travel in Spark. A batch's commit may come after membership changes (a join
or a leave while the batch is in flight)."""

from __future__ import annotations

import json
import pickle
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.shared_query import append_files_spec
from millstream.catalog import Catalog
from millstream.datastream import DatastreamSpec
from millstream.ingest.sources.files import FilesReader
from millstream.metastore.store import MetadataStore
from millstream.spark.membership import Membership
from millstream.spark.options import GroupSinkOptions, GroupSourceOptions, SourceOptions
from millstream.spark.runner import DatastreamRunner
from millstream.spark.shared import SharedQueryMemberError, SharedQueryRunner
from millstream.spark.sink import GroupSink
from millstream.spark.sources import GroupStreamReader
from millstream.storage.statedir import StateDirectory

NAMES = ("ma", "mb", "mc")
PARTITIONS = 2
LINES = 11  # per partition; batches of at most 4 records per member
SPARK = SimpleNamespace(sparkContext=SimpleNamespace(defaultParallelism=2))


def _spec(root: Path, name: str, trigger: str = "500ms") -> DatastreamSpec:
    return append_files_spec(
        root, name, partitions=PARTITIONS, lines=LINES, max_records_per_batch=4, trigger=trigger
    )


class Query:
    """One shared query's life as Spark runs it (see the module's docstring)."""

    def __init__(self, runner: SharedQueryRunner) -> None:
        source, sink = runner.begin()
        runner.query = SimpleNamespace(isActive=True, id="q", runId="r")
        self.source_options, self.sink_options = source.to_options(), sink.to_options()
        self.planner = GroupStreamReader(GroupSourceOptions.from_options(self.source_options))
        self.task_reader = GroupStreamReader(GroupSourceOptions.from_options(self.source_options))
        self.task_sink = GroupSink(GroupSinkOptions.from_options(self.sink_options))
        self.start: dict[str, Any] = json.loads(json.dumps(self.planner.initialOffset()))
        self.batch = 0
        self.in_flight: list[Any] | None = None
        #: Spark's clock (monotonic seconds): each plan comes a trigger interval after the
        #: last, so every member is due (StreamReader.due)
        self.now = 0.0

    def plan(self) -> bool:
        """Plan the next batch and run its write tasks (its commit is :meth:`commit`)."""
        self.commit()
        self.now += 10.0
        limit = self.planner.getDefaultReadLimit()
        end = json.loads(json.dumps(self.planner.latestOffset(self.start, limit, self.now)))
        if end == self.start:
            return False  # Spark runs no batch
        tasks = pickle.loads(pickle.dumps(self.planner.partitions(self.start, end)))
        self.in_flight = pickle.loads(
            pickle.dumps([self.task_sink.write(self.task_reader.read(t)) for t in tasks])
        )
        self.start = end
        return True

    def commit(self) -> None:
        if self.in_flight is not None:
            sink = GroupSink(GroupSinkOptions.from_options(self.sink_options))
            sink.commit(self.in_flight, self.batch)
            self.batch, self.in_flight = self.batch + 1, None


def _uppers(catalog: Catalog, spec: DatastreamSpec) -> dict[int, int]:
    return {s.partition: s.upper for s in catalog.store.list_shards(spec.table_name)}


OPS = st.sampled_from(
    ["plan", "plan", "commit", *(f"{op} {n}" for op in ("join", "leave") for n in NAMES)]
)


@settings(max_examples=30, deadline=None, print_blob=True)
@given(first=st.sets(st.sampled_from(NAMES), min_size=1), ops=st.lists(OPS, max_size=25))
def test_joins_and_leaves_in_a_running_query_lose_and_duplicate_nothing(
    first: set[str], ops: list[str]
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        catalog = Catalog.open(home=root / "home")
        try:
            specs = {n: _spec(root / "sources", n) for n in NAMES}

            def member(name: str) -> DatastreamRunner:
                return DatastreamRunner(
                    specs[name],
                    catalog,
                    SPARK,
                    writer_id="w1",
                    state_dir=StateDirectory(root / "state", name),
                )

            runner = SharedQueryRunner(
                [member(n) for n in sorted(first)], SPARK, StateDirectory(root / "state", "_q")
            )
            query = Query(runner)
            left: dict[str, dict[int, int]] = {}  # a member out of the query: its uppers then
            for op in ops:
                if op == "plan":
                    query.plan()
                elif op == "commit":
                    query.commit()
                elif op.startswith("join"):
                    name = op.split()[1]
                    assert runner.add(member(name)) is True
                    left.pop(name, None)
                else:
                    name = op.split()[1]
                    was = name in runner.members
                    last = set(runner.members) == {name}
                    assert runner.remove(name) is (not last), "the last member cannot leave"
                    if was and not last:
                        left[name] = _uppers(catalog, specs[name])
                for name, uppers in left.items():
                    assert _uppers(catalog, specs[name]) == uppers, (
                        f"{name} committed after it left the query"
                    )
            for name in NAMES:
                runner.add(member(name))
            idle = 0
            for _ in range(100):
                idle = 0 if query.plan() else idle + 1
                if idle == 2:
                    break
            query.commit()
            assert runner.status()["starts"] == 0, "members changed without a query start"
            for name, spec in specs.items():
                assert _uppers(catalog, spec) == dict.fromkeys(range(PARTITIONS), LINES), name
                rows = catalog.read_table(spec.table_name).to_pylist()
                assert sorted(r["id"] for r in rows) == sorted(
                    p * 1000 + i for p in range(PARTITIONS) for i in range(LINES)
                ), f"{name}: rows lost or duplicated"
        finally:
            catalog.close()


def test_a_member_that_left_mid_batch_commits_nothing_of_it_and_rejoins_where_it_was(
    tmp_path: Path,
) -> None:
    """mb leaves while a batch holding its records is in flight: the batch commits ma's part
    alone and deletes mb's staged files; mb joins again at its shard uppers, and its rows
    arrive once."""
    specs = {n: _spec(tmp_path / "sources", n) for n in ("ma", "mb")}
    catalog = Catalog.open(home=tmp_path / "home")
    members = {
        n: DatastreamRunner(
            specs[n], catalog, SPARK, writer_id="w1", state_dir=StateDirectory(tmp_path, n)
        )
        for n in specs
    }
    runner = SharedQueryRunner(list(members.values()), SPARK, StateDirectory(tmp_path, "_q"))
    query = Query(runner)
    assert query.plan()
    assert query.in_flight is not None and any("mb" in m.messages for m in query.in_flight)
    assert runner.remove("mb")
    query.commit()
    assert _uppers(catalog, specs["mb"]) == {0: 0, 1: 0}, "mb committed after it left"
    assert sum(_uppers(catalog, specs["ma"]).values()) == 4
    staged = Path(catalog.settings.deep_store).rglob("*.parquet")
    assert not [p for p in staged if "mb" in p.relative_to(catalog.settings.deep_store).parts[1]]
    assert runner.add(members["mb"])
    while query.plan():
        pass
    query.commit()
    assert runner.status()["joins"] == 1 and runner.status()["leaves"] == 1
    for spec in specs.values():
        assert _uppers(catalog, spec) == {0: LINES, 1: LINES}
        assert catalog.read_table(spec.table_name).num_rows == PARTITIONS * LINES
    catalog.close()


def test_a_member_cannot_join_a_query_that_does_not_run_or_ticks_slower(
    tmp_path: Path,
) -> None:
    """The query ticks at its shortest member's tick (100 ms for 500 ms): a member whose own
    tick is shorter would wait for the query's ticks, so the query restarts with it; one of a
    shorter trigger but the same tick (200 ms) joins, and is gated by its own trigger."""
    specs = {n: _spec(tmp_path / "sources", n, trigger="5s") for n in ("ma", "mb")}
    catalog = Catalog.open(home=tmp_path / "home")
    a = DatastreamRunner(specs["ma"], catalog, SPARK, state_dir=StateDirectory(tmp_path, "ma"))
    fast = _spec(tmp_path / "fast", "mb", trigger="500ms")
    b = DatastreamRunner(fast, catalog, SPARK, state_dir=StateDirectory(tmp_path, "mb"))
    runner = SharedQueryRunner([a], SPARK, StateDirectory(tmp_path, "_q"))
    assert runner.add(b) is False, "no query runs"
    Query(runner)
    assert runner.tick == 1.0, "the tick of 5 s"
    assert runner.add(b) is False, "its tick (100 ms) is shorter than the query's: a restart"
    assert set(runner.members) == {"ma"}
    catalog.close()


def test_a_member_of_a_shorter_trigger_but_the_same_tick_joins(tmp_path: Path) -> None:
    catalog = Catalog.open(home=tmp_path / "home")
    a = DatastreamRunner(
        _spec(tmp_path / "sources", "ma"), catalog, SPARK, state_dir=StateDirectory(tmp_path, "ma")
    )
    fast = _spec(tmp_path / "sources", "mb", trigger="200ms")
    b = DatastreamRunner(fast, catalog, SPARK, state_dir=StateDirectory(tmp_path, "mb"))
    runner = SharedQueryRunner([a], SPARK, StateDirectory(tmp_path, "_q"))
    query = Query(runner)
    assert runner.add(b) is True, "the query's tick (100 ms) is its own"
    assert set(runner.members) == {"ma", "mb"}
    assert query.plan(), "a batch planned with the member that joined"
    assert SourceOptions.from_options(runner.entries["mb"].source).trigger_seconds == 0.2
    catalog.close()


def _runner_of(tmp_path: Path, catalog: Catalog, names: tuple[str, ...]) -> SharedQueryRunner:
    """A shared query's runner of one files datastream per name (not started)."""
    return SharedQueryRunner(
        [
            DatastreamRunner(
                _spec(tmp_path / "sources", n),
                catalog,
                SPARK,
                state_dir=StateDirectory(tmp_path, n),
            )
            for n in names
        ],
        SPARK,
        StateDirectory(tmp_path, "_q"),
    )


def test_the_last_member_does_not_leave_a_running_query(tmp_path: Path) -> None:
    catalog = Catalog.open(home=tmp_path / "home")
    runner = _runner_of(tmp_path, catalog, ("ma",))
    Query(runner)
    assert runner.remove("ma") is False
    assert set(runner.members) == {"ma"}
    catalog.close()


def test_no_member_leaves_a_query_that_ended(tmp_path: Path) -> None:
    """A member's error ends the query before the thread running it raises that error: a
    leave meanwhile is refused (the worker restarts the query without the member instead of
    counting a dead query as running on), and the status names no run id."""
    catalog = Catalog.open(home=tmp_path / "home")
    runner = _runner_of(tmp_path, catalog, ("ma", "mb"))
    Query(runner)
    assert runner.status()["run_id"] == "r"
    runner.query.isActive = False  # ended on a member's error
    assert runner.remove("mb") is False
    assert set(runner.members) == {"ma", "mb"}
    assert runner.status()["run_id"] is None
    catalog.close()


def test_a_member_leaves_only_once_no_commit_holds_the_membership(tmp_path: Path) -> None:
    """A commit holds the membership's shared lock (the sink's commit process): a member's
    leave waits for it, and gives up after its timeout (the worker then restarts the query
    instead), leaving the membership as it was."""
    catalog = Catalog.open(home=tmp_path / "home")
    runner = _runner_of(tmp_path, catalog, ("ma", "mb"))
    Query(runner)
    with runner.membership.shared() as current:  # a commit in flight
        assert set(current) == {"ma", "mb"}
        assert runner.remove("mb", timeout=0.3) is False
        assert set(runner.members) == {"ma", "mb"}
        assert set(runner.membership.read()[1]) == {"ma", "mb"}
    assert runner.remove("mb", timeout=0.3) is True
    assert set(runner.membership.read()[1]) == {"ma"}
    catalog.close()


def test_many_members_join_a_running_query_in_one_membership_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tables of one datastream (or the topics a pattern's listing found) join the running
    query together: ONE membership change, so the query's source re-plans once for the lot,
    not once per table. A member whose table another datastream owns gets its own error and
    the others join; every joined member then ingests its source whole and exactly once,
    without a query start."""
    names = [f"j{i:02d}" for i in range(12)]
    specs = {n: _spec(tmp_path / "sources", n) for n in ["ma", *names]}
    catalog = Catalog.open(home=tmp_path / "home")
    owned = specs["j03"]
    catalog.store.claim_owners([owned.table_name, owned.dead_letter_table], "another")

    def member(name: str) -> DatastreamRunner:
        return DatastreamRunner(
            specs[name], catalog, SPARK, writer_id="w1", state_dir=StateDirectory(tmp_path, name)
        )

    runner = SharedQueryRunner([member("ma")], SPARK, StateDirectory(tmp_path, "_q"))
    query = Query(runner)
    query.plan()
    changes: list[int] = []
    write = Membership.write

    def counted(self: Membership, generation: int, members: dict[str, Any]) -> None:
        changes.append(generation)
        write(self, generation, members)

    monkeypatch.setattr(Membership, "write", counted)
    before = runner.generation
    joined = runner.add_many([member(n) for n in names])
    assert changes == [before + 1], "one membership change for every member that joined"
    failed = joined.pop("j03")
    assert isinstance(failed, SharedQueryMemberError) and failed.member == "j03"
    assert "another" in str(failed), "the error names the table's owner"
    assert joined == dict.fromkeys(sorted(set(names) - {"j03"}), True)
    assert set(runner.members) == {"ma", *names} - {"j03"}
    assert runner.status()["joins"] == len(names) - 1

    idle = 0
    for _ in range(100):
        idle = 0 if query.plan() else idle + 1
        if idle == 2:
            break
    query.commit()
    assert runner.status()["starts"] == 0, "members joined without a query start"
    for name in sorted(set(specs) - {"j03"}):
        spec = specs[name]
        assert _uppers(catalog, spec) == dict.fromkeys(range(PARTITIONS), LINES), name
        rows = catalog.read_table(spec.table_name).to_pylist()
        assert sorted(r["id"] for r in rows) == sorted(
            p * 1000 + i for p in range(PARTITIONS) for i in range(LINES)
        ), f"{name}: rows lost or duplicated"
    catalog.close()


def test_a_batch_where_one_of_fifty_tables_has_records_plans_and_commits_only_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A query of 50 tables, caught up; then 3 records arrive for one of them. The next batch
    plans write tasks for that table alone and commits in ONE metadata transaction that
    touches only its table: the 49 idle tables cost no task and no transaction."""
    names = [f"t{i:02d}" for i in range(50)]
    specs = {n: _spec(tmp_path / "sources", n) for n in names}
    catalog = Catalog.open(home=tmp_path / "home")
    runner = SharedQueryRunner(
        [
            DatastreamRunner(
                specs[n], catalog, SPARK, writer_id="w1", state_dir=StateDirectory(tmp_path, n)
            )
            for n in names
        ],
        SPARK,
        StateDirectory(tmp_path, "_q"),
    )
    query = Query(runner)
    while query.plan():
        pass
    query.commit()
    versions = {n: catalog.table(specs[n].table_name).manifest_version for n in names}
    (tmp_path / "sources" / "t17" / "1" / "00001.jsonl").write_text(
        "".join(f'{{"id": {5000 + i}, "v": "new{i}"}}\n' for i in range(3))
    )
    planned: list[set[str]] = []
    partitions = GroupStreamReader.partitions

    def planning(self: GroupStreamReader, start: Any, end: Any) -> Any:
        tasks = partitions(self, start, end)
        planned.append({n for t in tasks for n, _ in t.parts})  # type: ignore[attr-defined]
        return tasks

    transactions: list[str] = []
    write = MetadataStore.write

    def counted(self: MetadataStore) -> Any:
        transactions.append(self.url)
        return write(self)

    monkeypatch.setattr(GroupStreamReader, "partitions", planning)
    monkeypatch.setattr(MetadataStore, "write", counted)
    assert query.plan()
    query.commit()
    assert planned == [{"t17"}], "tasks were planned for tables with nothing new"
    assert len(transactions) == 1, f"{len(transactions)} metadata transactions for one table"
    after = {n: catalog.table(specs[n].table_name).manifest_version for n in names}
    assert {n for n in names if after[n] != versions[n]} == {"t17"}
    assert _uppers(catalog, specs["t17"]) == {0: LINES, 1: LINES + 3}
    catalog.close()


def test_a_query_of_many_tables_asks_their_sources_together_at_its_start_and_joins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The query's start asks every member's source for its latest offsets in ONE call (a
    Kafka source answers all its topics in one request and probes past their watermarks
    with one fetch; asked one member after another, a fresh reader's probe made 100 tables
    wait ~0.75 s each before the first batch), and so does the batch that brings in the
    members that joined together."""
    first = [f"s{i:02d}" for i in range(20)]
    later = [f"l{i:02d}" for i in range(10)]
    specs = {n: _spec(tmp_path / "sources", n) for n in [*first, *later]}
    catalog = Catalog.open(home=tmp_path / "home")

    def member(name: str) -> DatastreamRunner:
        return DatastreamRunner(
            specs[name], catalog, SPARK, writer_id="w1", state_dir=StateDirectory(tmp_path, name)
        )

    asked: list[set[str]] = []
    together = FilesReader.latest_offsets_of.__func__  # type: ignore[attr-defined]

    def counted(cls: type[FilesReader], readers: Any) -> Any:
        asked.append({Path(r.config.path).name for r in readers})
        return together(cls, readers)

    monkeypatch.setattr(FilesReader, "latest_offsets_of", classmethod(counted))
    runner = SharedQueryRunner([member(n) for n in first], SPARK, StateDirectory(tmp_path, "_q"))
    query = Query(runner)  # the runner's entries, then the source's initial offsets
    assert asked == [set(first), set(first)], "each asks every member's source at once"
    query.plan()
    assert runner.add_many([member(n) for n in later]) == dict.fromkeys(later, True)
    asked.clear()
    query.plan()
    assert any(set(later) <= a for a in asked) and len(asked) == 1, asked
    catalog.close()


def test_a_query_of_many_tables_asks_their_first_offsets_together_at_its_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where each member's partitions start (``starting_offsets: earliest``, the default) is
    asked of every member's source in ONE call too, not by each member's bootstrap: a Kafka
    member asking its own made a consumer of its topic each (100 tables: 1.2-2.6 s before
    the first batch, docs/performance.md "(c) Backlog catch-up: where the first batch's
    wait goes"). Every member then ingests its source whole, from its first record."""
    names = [f"e{i:02d}" for i in range(12)]
    specs = {n: _spec(tmp_path / "sources", n) for n in names}
    catalog = Catalog.open(home=tmp_path / "home")
    asked: list[set[str]] = []
    alone: list[str] = []
    own = FilesReader.earliest_offsets

    def counted(cls: type[FilesReader], readers: Any) -> Any:
        asked.append({Path(r.config.path).name for r in readers})
        return [own(r) for r in readers]

    def each(self: FilesReader) -> dict[int, int]:
        alone.append(Path(self.config.path).name)
        return own(self)

    monkeypatch.setattr(FilesReader, "earliest_offsets_of", classmethod(counted), raising=False)
    monkeypatch.setattr(FilesReader, "earliest_offsets", each)
    runner = SharedQueryRunner(
        [
            DatastreamRunner(
                specs[n], catalog, SPARK, writer_id="w1", state_dir=StateDirectory(tmp_path, n)
            )
            for n in names
        ],
        SPARK,
        StateDirectory(tmp_path, "_q"),
    )
    query = Query(runner)
    assert asked == [set(names)], "the members' first offsets are asked at once"
    assert alone == [], f"members asked their own first offsets: {sorted(alone)}"
    while query.plan():
        pass
    query.commit()
    for name in names:
        assert _uppers(catalog, specs[name]) == dict.fromkeys(range(PARTITIONS), LINES), name
        rows = catalog.read_table(specs[name].table_name).to_pylist()
        assert sorted(r["id"] for r in rows) == sorted(
            p * 1000 + i for p in range(PARTITIONS) for i in range(LINES)
        ), f"{name}: rows lost or duplicated"
    catalog.close()


def _wide_spec(root: Path, name: str) -> DatastreamSpec:
    """A member whose table has other columns than :func:`_spec`'s (``w``, a long)."""
    for p in range(PARTITIONS):
        (root / name / str(p)).mkdir(parents=True)
        (root / name / str(p) / "00000.jsonl").write_text(
            "".join(f'{{"id": {p * 1000 + i}, "w": {i * 7}}}\n' for i in range(LINES))
        )
    return DatastreamSpec.parse(
        {
            "name": name,
            "source": {"kind": "files", "path": str(root / name)},
            "schema": {"id": "long", "w": "long"},
            "table": {"mode": "append"},
            "trigger_interval": "500ms",
        }
    )


def test_a_task_of_many_busy_tables_reads_their_specs_at_once_and_each_decodes_under_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shared query's write task holding 12 tables with records reads the specs it decodes
    them under in ONE metadata read, not one per table (a round trip per busy table per
    task; docs/performance.md, "(c) What a batch of small busy tables costs"), and each table's
    rows are still decoded under its own table's spec: tables of two shapes in one task each
    keep their own columns."""
    narrow = [f"n{i:02d}" for i in range(6)]
    wide = [f"w{i:02d}" for i in range(6)]
    specs = {n: _spec(tmp_path / "sources", n) for n in narrow}
    specs |= {n: _wide_spec(tmp_path / "sources", n) for n in wide}
    catalog = Catalog.open(home=tmp_path / "home")
    runner = SharedQueryRunner(
        [
            DatastreamRunner(
                specs[n], catalog, SPARK, writer_id="w1", state_dir=StateDirectory(tmp_path, n)
            )
            for n in sorted(specs)
        ],
        SPARK,
        StateDirectory(tmp_path, "_q"),
    )
    query = Query(runner)
    reads: list[int] = []
    write, read = GroupSink.write, MetadataStore.read

    def counted_write(self: GroupSink, iterator: Any) -> Any:
        reads.append(0)
        return write(self, iterator)

    def counted_read(self: MetadataStore) -> Any:
        if reads:
            reads[-1] += 1
        return read(self)

    monkeypatch.setattr(GroupSink, "write", counted_write)
    monkeypatch.setattr(MetadataStore, "read", counted_read)
    assert query.plan()
    assert 0 < len(reads) < len(specs), f"{len(reads)} tasks for {len(specs)} small tables"
    while query.plan():
        pass
    query.commit()
    assert max(reads) == 1, f"metadata reads per write task: {reads}"
    for n in narrow:
        got = catalog.read_table(specs[n].table_name)
        assert "w" not in got.column_names
        assert sorted(got.column("v").to_pylist()) == sorted(
            f"{n}{i}" for _ in range(PARTITIONS) for i in range(LINES)
        )
    for n in wide:
        got = catalog.read_table(specs[n].table_name)
        assert "v" not in got.column_names
        assert sorted(got.column("w").to_pylist()) == sorted(
            i * 7 for _ in range(PARTITIONS) for i in range(LINES)
        )
    catalog.close()
