"""A dead-letter table moves only with a dead letter (issue 38): a batch without bad records
costs its table's dead-letter table nothing (no statement, no manifest version, nothing for the
Iceberg publisher), through the commit path a shared query's sink takes
(:func:`~millstream.table.commit.commit_many`), and every bad record is still dead-lettered
exactly once: after many clean batches, when a batch is replayed, when a writer restarts at its
bootstrap's uppers and when the table is rolled back.

Guards 420-423 (docs/design.md): without the dead-letter shard deciding against its table's
upper, the first dead letter after a clean batch is a gap and is never recorded; without the
shortcut the clean batch reads and locks the dead-letter table's rows; a dead-letter table
rolled back alone would leave its range counted as covered.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from harness.contract_support import EVENTS, TABLE, Ranges, source_rows, to_arrow
from harness.fault_points import at_commit
from millstream.catalog import Catalog
from millstream.datastream import DatastreamSpec, dead_letter_spec
from millstream.errors import InvalidSpecError
from millstream.ingest.decode import dead_letter_rows
from millstream.sealing.maintenance import Publisher
from millstream.spark.runner import bootstrap
from millstream.spec import OFFSET_COL, PARTITION_COL
from millstream.table.commit import BatchCommit, StagedWrite, TableBatch, commit_many
from millstream.table.writer import stage_rows

DL = dead_letter_spec(TABLE)


@pytest.fixture
def cat(catalog: Catalog) -> Catalog:
    catalog.create_table(DL)
    catalog.create_table(EVENTS)
    # as a writer's bootstrap does: both tables' shards, in one transaction
    catalog.store.ensure_shards(TABLE, {0: 0, 1: 0}, together_with=[DL.name])
    return catalog


def task(cat: Catalog, ranges: Ranges, bad: Sequence[tuple[int, int]] = ()) -> StagedWrite:
    """What a write task stages for ``ranges``: the good records in a data file, the ``bad``
    ones ((partition, offset)) in a dead-letter file."""
    spec = cat.table(TABLE).spec
    good = [r for r in source_rows(ranges) if (r[PARTITION_COL], r[OFFSET_COL]) not in set(bad)]
    dead = dead_letter_rows([(p, o, b"not json", None, "invalid JSON") for p, o in bad])
    return StagedWrite(
        dict(ranges),
        stage_rows(cat.deep, spec, to_arrow(spec, good)),
        stage_rows(cat.deep, DL, dead),
    )


def commit(cat: Catalog, *writes: StagedWrite, epochs: Mapping[int, int] | None = None) -> Any:
    """One batch of ``writes`` through the shared query's commit (this table among others)."""
    out = commit_many(
        cat.store,
        cat.deep,
        {
            TABLE: TableBatch(
                TABLE,
                list(writes),
                dead_letter_table=DL.name,
                epochs=dict(epochs or {}),
                dead_letter_epochs=dict(epochs or {}),
            )
        },
    )[TABLE]
    assert isinstance(out, BatchCommit), out
    out.raise_for_gaps()
    return out


def dead_letters(cat: Catalog) -> list[tuple[int, int]]:
    rows = cat.read_table(DL.name).to_pylist()
    return sorted((r["partition"], r["offset"]) for r in rows)


@contextmanager
def statements(cat: Catalog) -> Iterator[list[str]]:
    """Every SQL statement sent to the metadata store meanwhile, with its parameters."""
    seen: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, parameters: Any, *args: Any) -> None:
        seen.append(f"{statement} {parameters}")

    event.listen(cat.store.engine, "before_cursor_execute", count)
    try:
        yield seen
    finally:
        event.remove(cat.store.engine, "before_cursor_execute", count)


def test_clean_batches_leave_the_dead_letter_table_alone(cat: Catalog) -> None:
    commit(cat, task(cat, {0: (0, 10), 1: (0, 10)}, bad=[(0, 3)]))
    dl_version = cat.manifest(DL.name).version
    assert dl_version == 1
    publisher = Publisher(cat)
    publisher.publish([TABLE, DL.name])
    assert publisher.published[DL.name]["publishes"] == 1

    with statements(cat) as seen:
        for b in range(1, 6):  # five batches without a bad record
            commit(cat, task(cat, {0: (10 * b, 10 * b + 10), 1: (10 * b, 10 * b + 10)}))
    publisher.publish([TABLE, DL.name])

    assert cat.manifest(TABLE).version == 6
    assert cat.manifest(DL.name).version == dl_version, "a clean batch made a dead-letter version"
    touching = [s for s in seen if DL.name in s]
    assert not touching, f"a clean batch sent statements for the dead-letter table: {touching}"
    assert publisher.published[TABLE]["publishes"] == 2
    assert publisher.published[DL.name]["publishes"] == 1, "an unchanged dead-letter table"
    assert dead_letters(cat) == [(0, 3)]


def writer_spec(tmp_path: Path) -> DatastreamSpec:
    """A datastream writing the table (its source is not read: the bootstrap is given the
    source's latest offsets)."""
    return DatastreamSpec.parse(
        {
            "name": TABLE,
            "source": {"kind": "files", "path": str(tmp_path), "starting_offsets": "latest"},
            "schema": EVENTS["schema"],
            "table": {"mode": "append"},
        }
    )


def test_a_dead_letter_after_clean_batches_survives_replay_and_restart_exactly_once(
    cat: Catalog, tmp_path: Path
) -> None:
    commit(cat, task(cat, {0: (0, 10), 1: (0, 10)}, bad=[(1, 4)]))
    for b in range(1, 5):
        commit(cat, task(cat, {0: (10 * b, 10 * b + 10), 1: (10 * b, 10 * b + 10)}))
    lagging = {sh.partition: sh.upper for sh in cat.store.list_shards(DL.name)}
    assert lagging == {0: 0, 1: 10}, "the dead-letter shards moved without a dead letter"

    # A dead letter after four clean batches: recorded, its shard jumps to the table's upper.
    late = task(cat, {0: (50, 60), 1: (50, 60)}, bad=[(0, 57), (1, 50), (1, 59)])
    result = commit(cat, late)
    assert [s.decision.outcome for s in result.dead_letter.shards] == ["commit", "commit"]
    assert dead_letters(cat) == [(0, 57), (1, 4), (1, 50), (1, 59)]
    moved = {sh.partition: sh.upper for sh in cat.store.list_shards(DL.name)}
    assert moved == {0: 60, 1: 60}

    # The same batch again (Spark replays a batch whose commit it did not see end): a DROP.
    replay = commit(cat, late)
    assert replay.dead_letter is not None and replay.dead_letter.version is None
    # A clean batch of long ago, replayed: nothing either.
    commit(cat, task(cat, {0: (20, 30), 1: (20, 30)}))
    assert dead_letters(cat) == [(0, 57), (1, 4), (1, 50), (1, 59)]

    # A restarted writer starts at the table's uppers (the bootstrap's rule), however far
    # the dead-letter shards lag, and its next dead letters land once.
    commit(cat, task(cat, {0: (60, 70), 1: (60, 70)}))
    starts = bootstrap(writer_spec(tmp_path), cat.store, latest={0: 100, 1: 100}).uppers
    assert starts == {0: 70, 1: 70}
    commit(cat, task(cat, {p: (lo, lo + 10) for p, lo in starts.items()}, bad=[(0, 75)]))
    assert dead_letters(cat) == [(0, 57), (0, 75), (1, 4), (1, 50), (1, 59)]
    assert table_rows(cat) == 2 * 80 - 5


def table_rows(cat: Catalog) -> int:
    rows = cat.read_table(TABLE).to_pylist()
    assert len({r["id"] for r in rows}) == len(rows), "a duplicate row"
    return len(rows)


def test_a_rollback_rereads_the_dead_letters_above_its_upper_once(cat: Catalog) -> None:
    commit(cat, task(cat, {0: (0, 10)}))  # seq 0
    commit(cat, task(cat, {0: (10, 20)}, bad=[(0, 12)]))  # seq 1
    commit(cat, task(cat, {0: (20, 30)}))  # seq 2
    again = [task(cat, {0: (30, 40)}, bad=[(0, 33)]), task(cat, {0: (40, 50)})]
    for w in again:
        commit(cat, w)  # seq 3, 4

    plan = cat.store.rollback_partition(TABLE, 0, 3, dry_run=False)
    assert plan.new_upper == 30
    assert dead_letters(cat) == [(0, 12)]
    epoch = {0: plan.new_epoch}
    commit(cat, task(cat, {0: (30, 40)}, bad=[(0, 33)]), epochs=epoch)
    commit(cat, task(cat, {0: (40, 50)}), epochs=epoch)
    assert dead_letters(cat) == [(0, 12), (0, 33)]
    assert table_rows(cat) == 50 - 2


def test_a_dead_letter_table_is_not_rolled_back_alone(cat: Catalog) -> None:
    commit(cat, task(cat, {0: (0, 10)}, bad=[(0, 2)]))
    commit(cat, task(cat, {0: (10, 20)}))
    with pytest.raises(InvalidSpecError, match=f"roll back {TABLE} instead"):
        cat.store.rollback_partition(DL.name, 0, 0, dry_run=False)
    assert dead_letters(cat) == [(0, 2)]


def test_a_clean_batch_whose_commit_outcome_is_unknown_is_reconciled_as_landed(
    cat: Catalog,
) -> None:
    """An unknown COMMIT outcome is settled by re-reading the shards: a clean batch's range
    is covered by its table's upper, though its dead-letter shard did not move (reading that
    shard alone said it had not landed, and the batch failed with its files kept)."""
    commit(cat, task(cat, {0: (0, 10)}, bad=[(0, 1)]))
    commit(cat, task(cat, {0: (10, 20)}))

    def drop_connection_after_commit(after: bool) -> None:
        if after:
            uninstall()
            raise OSError("server closed the connection unexpectedly")

    uninstall = at_commit(cat.store, drop_connection_after_commit)
    result = commit(cat, task(cat, {0: (20, 30)}))
    assert result.reconciled, "the re-read found the batch landed"
    assert table_rows(cat) == 30 - 1
    assert dead_letters(cat) == [(0, 1)]
