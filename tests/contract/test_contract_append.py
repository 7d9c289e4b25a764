"""compare_and_append: the frontier decision, epoch fencing and multi-partition batches."""

from __future__ import annotations

import pytest

from harness.contract_support import (
    EVENTS,
    TABLE,
    commit,
    data_files,
    expected_rows,
    stage,
    table_rows,
    uppers,
)
from millstream.catalog import Catalog
from millstream.core.frontier import Outcome
from millstream.errors import InvalidSpecError, ShardGapError, WriterFencedError
from millstream.metastore import schema
from millstream.metastore.cas import cas_update
from millstream.metastore.models import ShardAppend
from millstream.spec import TableSpec


@pytest.fixture
def events(catalog: Catalog) -> TableSpec:
    return catalog.create_table(EVENTS).spec


def bump_epoch(cat: Catalog, partition: int) -> int:
    """What a rollback of the shard does to writers that bootstrapped before it."""
    sh = cat.store.get_shard(TABLE, partition)
    assert sh is not None
    with cat.store.write() as conn:
        cas_update(
            conn,
            schema.shards,
            {"table_name": TABLE, "partition": partition},
            sh.version,
            {"epoch": sh.epoch + 1},
        )
    return sh.epoch + 1


def test_first_batch_creates_the_shard_with_its_upper_at_the_batch_end(
    catalog: Catalog, events: TableSpec
) -> None:
    res = commit(catalog, {0: (100, 110)})

    assert res.outcome(0) is Outcome.COMMIT
    assert res.version == 1
    assert uppers(catalog) == {0: 110}
    assert table_rows(catalog) == expected_rows(events, [{0: (100, 110)}])


def test_a_batch_starting_at_the_upper_commits_it(catalog: Catalog, events: TableSpec) -> None:
    commit(catalog, {0: (0, 10)})

    res = commit(catalog, {0: (10, 20)})

    assert res.outcome(0) is Outcome.COMMIT
    assert not res.lost_race
    assert res.version == 2
    assert uppers(catalog) == {0: 20}
    assert table_rows(catalog) == expected_rows(events, [{0: (0, 20)}])
    assert [(e.name, e.start, e.end) for e in catalog.manifest(TABLE).entries] == [
        ("events__0__0", 0, 10),
        ("events__0__1", 10, 20),
    ]


def test_a_batch_below_the_upper_is_dropped_and_its_file_deleted(
    catalog: Catalog, events: TableSpec
) -> None:
    commit(catalog, {0: (0, 20)})
    staged = stage(catalog, {0: (5, 15)})

    res = commit(catalog, {0: (5, 15)}, staged=staged)

    assert res.outcome(0) is Outcome.DROP
    assert res.lost_race
    assert res.version is None
    assert catalog.manifest(TABLE).version == 1
    assert uppers(catalog) == {0: 20}
    assert table_rows(catalog) == expected_rows(events, [{0: (0, 20)}])
    assert staged.path is not None
    assert not catalog.deep.exists(staged.path)
    assert data_files(catalog) == catalog.store.referenced_files(TABLE)


def test_a_batch_straddling_the_upper_commits_only_the_rows_above_it(
    catalog: Catalog, events: TableSpec
) -> None:
    commit(catalog, {0: (0, 10)})

    res = commit(catalog, {0: (5, 15)})

    assert res.outcome(0) is Outcome.TRIM
    assert res.lost_race
    assert res.version == 2
    assert uppers(catalog) == {0: 15}
    newest = catalog.manifest(TABLE).entries[-1]
    assert (newest.start, newest.end) == (10, 15)
    # Rows 5..9 are in the new file too, but only the first commit's copy is visible.
    assert table_rows(catalog) == expected_rows(events, [{0: (0, 15)}])


def test_a_batch_starting_above_the_upper_is_a_gap_that_commits_nothing(
    catalog: Catalog, events: TableSpec
) -> None:
    commit(catalog, {0: (0, 10)})
    staged = stage(catalog, {0: (12, 20)})

    res = commit(catalog, {0: (12, 20)}, staged=staged)

    assert res.outcome(0) is Outcome.GAP
    assert res.version is None
    assert uppers(catalog) == {0: 10}
    assert table_rows(catalog) == expected_rows(events, [{0: (0, 10)}])
    assert staged.path is not None
    assert not catalog.deep.exists(staged.path)
    with pytest.raises(ShardGapError) as info:
        res.raise_for_gaps([ShardAppend(0, 12, 20, 0, staged.path, 8)])
    assert info.value.gaps == {0: (10, 12)}


def test_a_writer_at_a_stale_epoch_is_fenced_and_nothing_of_its_batch_is_committed(
    catalog: Catalog, events: TableSpec
) -> None:
    commit(catalog, {0: (0, 10), 1: (0, 10)})
    new_epoch = bump_epoch(catalog, 1)
    before = catalog.manifest(TABLE)
    staged = stage(catalog, {0: (10, 20), 1: (10, 20)})

    with pytest.raises(WriterFencedError) as info:
        commit(catalog, {0: (10, 20), 1: (10, 20)}, staged=staged)

    assert info.value.fields["partition"] == 1
    assert info.value.fields["shard_epoch"] == new_epoch
    # The whole batch is refused, partition 0 (whose epoch is fine) included.
    assert catalog.manifest(TABLE) == before
    assert uppers(catalog) == {0: 10, 1: 10}
    assert staged.path is not None
    assert not catalog.deep.exists(staged.path)
    assert data_files(catalog) == catalog.store.referenced_files(TABLE)

    # A writer that bootstrapped at the new epoch carries on from the upper.
    res = commit(catalog, {0: (10, 20), 1: (10, 20)}, epochs={1: new_epoch})
    assert {s.partition: s.decision.outcome for s in res.shards} == {
        0: Outcome.COMMIT,
        1: Outcome.COMMIT,
    }
    assert table_rows(catalog) == expected_rows(events, [{0: (0, 20), 1: (0, 20)}])


def test_a_writer_ahead_of_a_brand_new_shard_epoch_is_fenced(
    catalog: Catalog, events: TableSpec
) -> None:
    with pytest.raises(WriterFencedError):
        commit(catalog, {3: (0, 5)}, epochs={3: 1})

    assert catalog.store.get_shard(TABLE, 3) is None
    assert data_files(catalog) == set()


def test_a_multi_partition_batch_commits_every_shard_in_one_manifest_version(
    catalog: Catalog, events: TableSpec
) -> None:
    batch = {0: (0, 4), 1: (50, 53), 2: (7, 9)}

    res = commit(catalog, batch, writer_id="w1", batch_id=17)

    assert res.version == 1
    assert [s.decision.outcome for s in res.shards] == [Outcome.COMMIT] * 3
    manifest = catalog.manifest(TABLE)
    assert manifest.version == 1
    assert {e.added_version for e in manifest.entries} == {1}
    assert len({e.file_path for e in manifest.entries}) == 1
    assert {(e.partition, e.start, e.end, e.row_count) for e in manifest.entries} == {
        (0, 0, 4, 4),
        (1, 50, 53, 3),
        (2, 7, 9, 2),
    }
    assert {(e.writer_id, e.batch_id) for e in manifest.entries} == {("w1", 17)}
    assert uppers(catalog) == {0: 4, 1: 53, 2: 9}
    assert table_rows(catalog) == expected_rows(events, [batch])


def test_one_file_holding_several_partitions_is_read_per_partition_range(
    catalog: Catalog, events: TableSpec
) -> None:
    commit(catalog, {0: (0, 10), 1: (0, 3)})

    # One file with rows 5..14 of partition 0 (5..9 already committed), 3..8 of
    # partition 1 and 0..4 of partition 2: trim, commit and create in one transaction.
    res = commit(catalog, {0: (5, 15), 1: (3, 9), 2: (0, 5)})

    assert res.version == 2
    assert {s.partition: s.decision.outcome for s in res.shards} == {
        0: Outcome.TRIM,
        1: Outcome.COMMIT,
        2: Outcome.COMMIT,
    }
    latest = [e for e in catalog.manifest(TABLE).entries if e.added_version == 2]
    assert len({e.file_path for e in latest}) == 1
    assert {(e.partition, e.start, e.end) for e in latest} == {(0, 10, 15), (1, 3, 9), (2, 0, 5)}
    assert table_rows(catalog) == expected_rows(events, [{0: (0, 15), 1: (0, 9), 2: (0, 5)}])
    # Older versions read only their own rows from the shared files.
    assert table_rows(catalog, as_of=1) == expected_rows(events, [{0: (0, 10), 1: (0, 3)}])


def test_replaying_a_committed_batch_is_a_harmless_drop(
    catalog: Catalog, events: TableSpec
) -> None:
    batch = {0: (0, 10), 1: (20, 30)}
    commit(catalog, batch, writer_id="w1", batch_id=1)
    before = catalog.manifest(TABLE)

    replay = commit(catalog, batch, writer_id="w1", batch_id=1)

    assert [s.decision.outcome for s in replay.shards] == [Outcome.DROP, Outcome.DROP]
    assert replay.version is None
    assert catalog.manifest(TABLE) == before
    assert uppers(catalog) == {0: 10, 1: 30}
    assert table_rows(catalog) == expected_rows(events, [batch])
    assert data_files(catalog) == catalog.store.referenced_files(TABLE)


def test_a_gap_on_one_partition_still_commits_the_others_and_raise_for_gaps_names_it(
    catalog: Catalog, events: TableSpec
) -> None:
    commit(catalog, {0: (0, 10), 1: (0, 10)})
    batch = {0: (10, 20), 1: (15, 20)}  # partition 1 skips offsets 10..14
    staged = stage(catalog, batch)

    res = commit(catalog, batch, staged=staged)

    assert res.outcome(0) is Outcome.COMMIT
    assert res.outcome(1) is Outcome.GAP
    assert res.version == 2
    assert uppers(catalog) == {0: 20, 1: 10}
    assert table_rows(catalog) == expected_rows(events, [{0: (0, 20), 1: (0, 10)}])
    assert staged.path in catalog.store.referenced_files(TABLE)
    appends = [ShardAppend(p, lo, hi, 0, staged.path, hi - lo) for p, (lo, hi) in batch.items()]
    with pytest.raises(ShardGapError, match="partition 1: upper 10, batch starts at 15") as info:
        res.raise_for_gaps(appends)
    assert info.value.gaps == {1: (10, 15)}


def test_a_range_with_no_rows_advances_the_frontier_without_an_entry(
    catalog: Catalog, events: TableSpec
) -> None:
    commit(catalog, {0: (0, 10)})

    res = catalog.store.compare_and_append(TABLE, [ShardAppend(0, 10, 25, 0, None, 0)])

    assert res.outcome(0) is Outcome.COMMIT
    assert uppers(catalog) == {0: 25}
    assert len(catalog.manifest(TABLE).entries) == 1
    # The next batch starts where the empty range ended.
    assert commit(catalog, {0: (25, 30)}).outcome(0) is Outcome.COMMIT
    assert table_rows(catalog) == expected_rows(events, [{0: (0, 10)}, {0: (25, 30)}])


def test_a_batch_listing_overlapping_ranges_of_a_partition_or_a_reversed_range_is_invalid(
    catalog: Catalog, events: TableSpec
) -> None:
    # Pieces of one partition must follow each other (test_contract_split_ranges.py).
    with pytest.raises(InvalidSpecError) as twice:
        catalog.store.compare_and_append(
            TABLE, [ShardAppend(0, 0, 5, 0, None, 0), ShardAppend(0, 4, 9, 0, None, 0)]
        )
    assert twice.value.field == "appends"
    with pytest.raises(InvalidSpecError):
        catalog.store.compare_and_append(TABLE, [ShardAppend(0, 9, 5, 0, None, 0)])
    assert uppers(catalog) == {}
