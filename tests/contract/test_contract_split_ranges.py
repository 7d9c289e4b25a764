"""A partition's range split over several write tasks (a batch with fewer partitions than
tasks, ``spark.sources.plan_tasks``) commits through the production commit path
(``commit_writes``) as that one range would: its pieces are decided one after the other in one
transaction, each against the upper the piece before left, and the shard moves once.

Guard 78 (``split-pieces-chain-their-uppers``, docs/design.md) is the chaining: decided
against the shard as read, the second piece of a fresh range is a gap and the batch never
lands.
"""

from __future__ import annotations

import pytest

from harness.contract_support import EVENTS, TABLE, Ranges, expected_rows, stage, table_rows, uppers
from millstream.catalog import Catalog
from millstream.core.frontier import Outcome
from millstream.datastream import dead_letter_spec
from millstream.errors import InvalidSpecError, ShardGapError
from millstream.spec import TableSpec
from millstream.table.commit import BatchCommit, StagedWrite, commit_writes

DL = dead_letter_spec(TABLE)


@pytest.fixture
def events(catalog: Catalog) -> TableSpec:
    catalog.create_table(DL)
    return catalog.create_table(EVENTS).spec


def task(cat: Catalog, ranges: Ranges) -> StagedWrite:
    """What one write task stages for ``ranges``: its rows in one data file."""
    return StagedWrite(dict(ranges), stage(cat, ranges))


def commit_tasks(cat: Catalog, *tasks: Ranges) -> BatchCommit:
    """One micro-batch of ``tasks`` (each a task's ranges) through the sink's commit path."""
    writes = [task(cat, r) for r in tasks]
    return commit_writes(cat.store, cat.deep, TABLE, writes, dead_letter_table=DL.name)


def outcomes(result: BatchCommit) -> list[tuple[int, Outcome]]:
    return [(s.partition, s.decision.outcome) for s in result.table.shards]


def test_a_partition_split_over_two_tasks_lands_both_pieces_in_one_version(
    catalog: Catalog, events: TableSpec
) -> None:
    commit_tasks(catalog, {0: (0, 10)})  # the shard exists: its upper is 10

    result = commit_tasks(catalog, {0: (10, 50), 1: (0, 30)}, {0: (50, 100)})

    assert outcomes(result) == [(0, Outcome.COMMIT), (0, Outcome.COMMIT), (1, Outcome.COMMIT)]
    assert uppers(catalog) == {0: 100, 1: 30}
    assert uppers(catalog, table=DL.name) == {}  # no dead letter: it moves only with one
    assert table_rows(catalog) == expected_rows(events, [{0: (0, 100), 1: (0, 30)}])
    mine = [e for e in catalog.manifest(TABLE).entries if e.partition == 0]
    assert [(e.seq, e.start, e.end) for e in mine] == [(0, 0, 10), (1, 10, 50), (2, 50, 100)]
    assert mine[1].added_version == mine[2].added_version == result.table.version
    assert catalog.store.get_shard(TABLE, 0).next_seq == 3  # type: ignore[union-attr]


def test_a_brand_new_partition_split_over_two_tasks_creates_its_shard_once(
    catalog: Catalog, events: TableSpec
) -> None:
    commit_tasks(catalog, {0: (0, 60)}, {0: (60, 120)})

    assert uppers(catalog) == {0: 120}
    assert table_rows(catalog) == expected_rows(events, [{0: (0, 120)}])
    assert [(e.start, e.end) for e in catalog.manifest(TABLE).entries] == [(0, 60), (60, 120)]


def test_pieces_a_peer_already_persisted_drop_or_trim_and_every_row_lands_once(
    catalog: Catalog, events: TableSpec
) -> None:
    commit_tasks(catalog, {0: (0, 70)})  # a racing writer got there first, up to 70

    result = commit_tasks(catalog, {0: (0, 50)}, {0: (50, 100)})

    assert outcomes(result) == [(0, Outcome.DROP), (0, Outcome.TRIM)]
    assert uppers(catalog) == {0: 100}
    assert table_rows(catalog) == expected_rows(events, [{0: (0, 100)}])


def test_split_pieces_above_the_upper_are_a_gap_reported_from_the_lowest_piece(
    catalog: Catalog, events: TableSpec
) -> None:
    commit_tasks(catalog, {0: (0, 10)})

    with pytest.raises(ShardGapError) as gap:
        commit_tasks(catalog, {0: (20, 50)}, {0: (50, 90)})

    assert gap.value.gaps == {0: (10, 20)}  # the writer restarts from 10, not from 50
    assert uppers(catalog) == {0: 10}
    assert table_rows(catalog) == expected_rows(events, [{0: (0, 10)}])


@pytest.mark.parametrize(
    ("first", "second", "why"),
    [((0, 60), (50, 100), "overlap"), ((0, 40), (50, 100), "leave a gap")],
)
def test_pieces_of_a_partition_that_overlap_or_leave_a_hole_are_refused_and_nothing_lands(
    catalog: Catalog,
    events: TableSpec,
    first: tuple[int, int],
    second: tuple[int, int],
    why: str,
) -> None:
    writes = [task(catalog, {0: first}), task(catalog, {0: second})]

    with pytest.raises(InvalidSpecError) as refused:
        commit_writes(catalog.store, catalog.deep, TABLE, writes, dead_letter_table=DL.name)

    assert refused.value.field == "appends"
    assert "partition 0" in str(refused.value) and why in str(refused.value)
    assert uppers(catalog) == {}
    assert catalog.read_table(TABLE).num_rows == 0
    # Nothing references the staged files, so the refused batch deleted them.
    assert not any(catalog.deep.exists(p) for w in writes for p in w.paths)
