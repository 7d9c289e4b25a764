"""A shared query's member whose source starts empty (a ``files`` member on an empty directory)
reads every record of a partition its source gains later: its start is ``{}``, which is
falsy, and the group source took it for "no start yet", asked the member's initial offsets
again (which by then held the new partition) and planned the batch from the end it had just
computed: the partition's first records were never read, and its shard was created at the
offset after them, so nothing showed a gap.

The group source is driven as Spark's micro-batch loop drives it (``latestOffset`` from the
previous end, ``partitions`` of the range between the two), its options handed over as Spark
hands them (``to_options``/``from_options``), every planned task's markers made by a second
instance, as an executor's Python worker does, and their ranges read as each member's sink
reads them, without a SparkSession."""

from __future__ import annotations

import collections
import json
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st

from millstream.ingest.sources import reader_for
from millstream.spark.options import GroupSourceOptions, SourceOptions
from millstream.spark.sources import GroupStreamReader, GroupTask, marked_ranges


class Member:
    """A ``files`` source directory a producer adds files to (names sorting last)."""

    def __init__(self, root: Path, name: str) -> None:
        self.name = name
        self.root = root / name
        self.root.mkdir(parents=True)
        self.files = 0
        self.lines: dict[int, int] = {}

    def produce(self, partition: int, lines: int) -> None:
        d = self.root / str(partition)
        d.mkdir(exist_ok=True)
        first = self.lines.get(partition, 0)
        body = "".join(
            json.dumps({"m": self.name, "p": partition, "i": i}) + "\n"
            for i in range(first, first + lines)
        )
        (d / f"{self.files:05d}.jsonl").write_text(body)
        self.files += 1
        self.lines[partition] = first + lines

    def records(self) -> collections.Counter[bytes]:
        return collections.Counter(
            json.dumps({"m": self.name, "p": p, "i": i}).encode()
            for p, n in self.lines.items()
            for i in range(n)
        )


class Query:
    """Spark's micro-batch loop over a shared query's source: what its tasks read."""

    def __init__(self, members: list[Member], max_records_per_batch: int | None, tasks: int):
        options = GroupSourceOptions(
            {
                m.name: SourceOptions(
                    "files",
                    {"path": str(m.root)},
                    tasks=tasks,
                    max_records_per_batch=max_records_per_batch,
                )
                for m in members
            }
        ).to_options()
        self.planner = GroupStreamReader(GroupSourceOptions.from_options(options))
        self.executor = GroupStreamReader(GroupSourceOptions.from_options(options))
        # each member's sink reader: of its source's kind and config (SinkOptions.source_reader)
        self.sink_readers = {
            n: reader_for(r.opts.kind, r.opts.config) for n, r in self.executor.members.items()
        }
        self.start: dict[str, Any] = self.planner.initialOffset()
        self.read: dict[str, collections.Counter[bytes]] = collections.defaultdict(
            collections.Counter
        )
        self.offsets: dict[tuple[str, int], collections.Counter[int]] = collections.defaultdict(
            collections.Counter
        )

    def batch(self) -> bool:
        """One micro-batch; False if there was none (the end equals the start)."""
        end = self.planner.latestOffset(self.start, self.planner.getDefaultReadLimit())
        if end == self.start:
            return False
        for task in self.planner.partitions(self.start, end):
            assert isinstance(task, GroupTask)
            # as the shared sink does: each member's markers name the ranges its sink reads
            markers = pa.Table.from_batches(list(self.executor.read(task)))
            for member in set(markers.column("member").to_pylist()):
                mine = markers.filter(pc.equal(markers.column("member"), member))
                for batch in self.sink_readers[member].read_records(marked_ranges(mine)):
                    rows = batch.to_pydict()
                    for p, o, value in zip(
                        rows["partition"], rows["offset"], rows["value"], strict=True
                    ):
                        self.read[member][value] += 1
                        self.offsets[member, p][o] += 1
        self.start = end
        return True

    def drain(self) -> None:
        for _ in range(1000):
            if not self.batch():
                return
        raise AssertionError("the query kept planning batches with nothing new")


def test_a_member_starting_empty_reads_every_record_of_a_partition_found_later(
    tmp_path: Path,
) -> None:
    empty, busy = Member(tmp_path, "empty"), Member(tmp_path, "busy")
    busy.produce(0, 12)
    query = Query([empty, busy], max_records_per_batch=None, tasks=2)
    assert query.start["empty"] == {}, "the empty member's start: no partition yet"
    query.batch()
    empty.produce(0, 30)  # the case: partition 0 appears with 30 lines
    query.batch()
    query.batch()
    empty.produce(0, 5)  # then 5 more
    query.drain()

    assert sorted(query.offsets["empty", 0]) == list(range(35)), "offsets 0..29 were skipped"
    assert query.read["empty"] == empty.records()
    assert query.read["busy"] == busy.records()


@settings(max_examples=60, deadline=None, print_blob=True)
@given(
    members=st.integers(1, 3),
    starts=st.lists(st.lists(st.integers(1, 20), max_size=2), min_size=3, max_size=3),
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("produce"), st.integers(0, 2), st.integers(0, 3), st.integers(1, 40)),
            st.tuples(st.just("batch"), st.just(0), st.just(0), st.just(0)),
        ),
        max_size=25,
    ),
    max_records_per_batch=st.sampled_from([None, 1, 7, 50]),
    tasks=st.integers(1, 3),
)
def test_members_starting_empty_and_gaining_partitions_read_every_record_once(
    members: int,
    starts: list[list[int]],
    steps: list[tuple[str, int, int, int]],
    max_records_per_batch: int | None,
    tasks: int,
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        group = [Member(Path(tmp), f"m{i}") for i in range(members)]
        for m, lines in zip(group, starts, strict=False):
            for p, n in enumerate(lines):  # an empty list: the member starts empty
                m.produce(p, n)
        query = Query(group, max_records_per_batch, tasks)
        for kind, member, partition, lines in steps:
            if kind == "batch":
                query.batch()
            elif member < members:
                group[member].produce(partition, lines)
        query.drain()
        for m in group:
            assert query.read[m.name] == m.records(), f"member {m.name}: a record lost or doubled"
            for p, n in m.lines.items():
                assert query.offsets[m.name, p] == collections.Counter(range(n)), (m.name, p)
