"""Seed 004: Materialize #36860, a lagging writer holding rows below the shard upper.

In Materialize's upsert-v2 operator, a writer sorted each buffered row into one of two
classes: eligible if ``ts == upper``, otherwise stashed for later. A peer writer can move the
shard upper past rows that this writer still holds, for example from 0 to 10 while this
writer holds rows at 5 and 7. Those rows then fall into the "otherwise" class. The upper
only ever grows, so ``5 == upper`` can never hold again. The rows are stashed forever, the
writer's output frontier stays pinned at 5, below the upper, and the export freezes with no
error. The fix sorts rows into three classes: below the upper (drop; a peer already
persisted them), at the upper (process) and above it (wait).

In Millstream the same rule is the shard's compare-and-append (``core.frontier.decide``):
a batch ``[lo, hi)`` with ``hi <= upper`` is dropped, a batch that straddles the upper is
trimmed to ``[upper, hi)``, and the frontier keeps moving. These tests drive the exact
shape from the report against a real catalog (SQLite metadata and a local deep store).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from millstream.catalog import Catalog
from millstream.core.frontier import Outcome
from millstream.reference.model import canonical, model_rows
from millstream.spec import OFFSET_COL, PARTITION_COL, TOMBSTONE_COL, TableSpec
from millstream.table.read import read_entries
from millstream.table.writer import commit_staged, stage_rows

TABLE = "exports"
PARTITION = 0
SPEC = TableSpec.parse(
    {
        "name": TABLE,
        "schema": {"id": "string", "amount": "long", "written_by": "string"},
        "primary_key": ["id"],
        "mode": "upsert",
    }
)


def source_row(offset: int, *, written_by: str) -> dict[str, object]:
    """The deterministic source row at ``offset``. Every writer reads the same source, so
    the rows differ only in ``written_by``, which shows whose copy reached the table."""
    return {
        "id": f"order-{offset}",
        "amount": offset * 100,
        "written_by": written_by,
        PARTITION_COL: PARTITION,
        OFFSET_COL: offset,
        TOMBSTONE_COL: False,
    }


def arrow(rows: list[dict[str, object]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=SPEC.arrow_schema(system_columns=True))


def persisted(cat: Catalog) -> set[tuple[int, str]]:
    """``(offset, written_by)`` of every stored row that the manifest declares valid."""
    raw = read_entries(cat.deep, SPEC, cat.manifest(TABLE).entries)
    offsets = raw.column(OFFSET_COL).to_pylist()
    return set(zip(offsets, raw.column("written_by").to_pylist(), strict=True))


def upper(cat: Catalog) -> int:
    shard = cat.store.get_shard(TABLE, PARTITION)
    assert shard is not None
    return shard.upper


def data_files(cat: Catalog) -> set[str]:
    return {f.path for f in cat.deep.list_files(f"tables/{TABLE}")}


@pytest.fixture
def cat(tmp_path: Path) -> Iterator[Catalog]:
    with Catalog.open(home=tmp_path / "home") as catalog:
        catalog.create_table(SPEC)
        yield catalog


@pytest.fixture
def peer_committed_0_to_10(cat: Catalog) -> list[dict[str, object]]:
    """A peer commits ``[0, 10)``, with rows at offsets 2, 5, 7 and 9, while the lagging
    writer has not written anything yet."""
    peer_rows = [source_row(o, written_by="peer") for o in (2, 5, 7, 9)]
    staged = stage_rows(cat.deep, SPEC, arrow(peer_rows), name_hint="peer")
    result = commit_staged(
        cat.store, cat.deep, TABLE, staged, {PARTITION: (0, 10)}, {PARTITION: 0}, writer_id="peer"
    )
    assert result.outcome(PARTITION) is Outcome.COMMIT
    assert upper(cat) == 10
    return peer_rows


def test_seed_004_materialize_36860_lagging_writer_drops_rows_below_upper_and_frontier_advances(
    cat: Catalog, peer_committed_0_to_10: list[dict[str, object]]
) -> None:
    """Seed 004 (Materialize #36860): a peer has advanced the upper to 10. This writer then
    commits rows at offsets 5 and 7 (batch ``[5, 8)``). The batch is dropped, not held:
    under the buggy two-way rule (stash whatever is not ``== upper``), rows 5 and 7 would
    be stashed again on every drain and the frontier would stay pinned at 5. The writer's
    next batch ``[8, 11)`` is trimmed to ``[10, 11)`` and the frontier moves to 11."""
    peer_rows = peer_committed_0_to_10
    files_before = data_files(cat)

    # The lagging writer's first batch lies entirely below the upper.
    lagging = [source_row(o, written_by="lagging") for o in (5, 7)]
    staged = stage_rows(cat.deep, SPEC, arrow(lagging), name_hint="lagging")
    result = commit_staged(
        cat.store,
        cat.deep,
        TABLE,
        staged,
        {PARTITION: (5, 8)},
        {PARTITION: 0},
        writer_id="lagging",
        batch_id=0,
    )

    assert result.outcome(PARTITION) is Outcome.DROP
    assert result.lost_race
    assert result.version is None, "a dropped batch must not create a manifest version"
    assert upper(cat) == 10, "the upper must stay at 10, not be pinned back to 5"
    assert persisted(cat) == {(o, "peer") for o in (2, 5, 7, 9)}
    assert staged.path is not None
    assert not cat.deep.exists(staged.path), "the dropped batch's staged file was stranded"
    assert data_files(cat) == files_before

    # The writer carries on from 8. Its next batch straddles the upper: rows 8 and 9 are
    # below it and dropped, the row at 10 is committed, and the frontier reaches 11.
    next_batch = [source_row(o, written_by="lagging") for o in (9, 10)]
    staged = stage_rows(cat.deep, SPEC, arrow(next_batch), name_hint="lagging")
    result = commit_staged(
        cat.store,
        cat.deep,
        TABLE,
        staged,
        {PARTITION: (8, 11)},
        {PARTITION: 0},
        writer_id="lagging",
        batch_id=1,
    )

    decision = result.shards[0].decision
    assert decision.outcome is Outcome.TRIM
    assert (decision.start, decision.end, decision.new_upper) == (10, 11, 11)
    assert upper(cat) == 11
    assert [(e.start, e.end) for e in cat.manifest(TABLE).entries] == [(0, 10), (10, 11)]
    assert persisted(cat) == {(2, "peer"), (5, "peer"), (7, "peer"), (9, "peer"), (10, "lagging")}
    expected = model_rows(SPEC, [*peer_rows, next_batch[1]])
    assert canonical(cat.read_table(TABLE).to_pylist()) == canonical(expected)


def test_seed_004_materialize_36860_batch_straddling_upper_is_trimmed_to_upper(
    cat: Catalog, peer_committed_0_to_10: list[dict[str, object]]
) -> None:
    """Seed 004 (Materialize #36860), straddling variant: with the upper at 10, the lagging
    writer's batch ``[8, 12)`` commits as ``[10, 12)``. Its copies of rows 8 and 9 are
    dropped, because a peer has already persisted that range, and the frontier moves to
    12."""
    peer_rows = peer_committed_0_to_10
    batch = [source_row(o, written_by="lagging") for o in (8, 9, 10, 11)]
    staged = stage_rows(cat.deep, SPEC, arrow(batch), name_hint="lagging")
    result = commit_staged(
        cat.store, cat.deep, TABLE, staged, {PARTITION: (8, 12)}, {PARTITION: 0}, batch_id=0
    )

    decision = result.shards[0].decision
    assert decision.outcome is Outcome.TRIM
    assert (decision.start, decision.end, decision.new_upper) == (10, 12, 12)
    assert upper(cat) == 12
    assert staged.path is not None and cat.deep.exists(staged.path)
    assert [(e.start, e.end) for e in cat.manifest(TABLE).entries] == [(0, 10), (10, 12)]
    assert persisted(cat) == {
        (2, "peer"),
        (5, "peer"),
        (7, "peer"),
        (9, "peer"),
        (10, "lagging"),
        (11, "lagging"),
    }
    expected = model_rows(SPEC, [*peer_rows, *batch[2:]])
    assert canonical(cat.read_table(TABLE).to_pylist()) == canonical(expected)


def test_seed_004_materialize_36860_replay_of_dropped_batch_is_still_a_harmless_drop(
    cat: Catalog, peer_committed_0_to_10: list[dict[str, object]]
) -> None:
    """Seed 004 (Materialize #36860): dropping below-upper rows is idempotent. Replaying the
    lagging writer's ``[5, 8)`` batch any number of times is a DROP each time, leaves no
    staged file behind and never moves the upper."""
    files_before = data_files(cat)
    for attempt in range(3):
        lagging = [source_row(o, written_by="lagging") for o in (5, 7)]
        staged = stage_rows(cat.deep, SPEC, arrow(lagging), name_hint="lagging")
        result = commit_staged(
            cat.store, cat.deep, TABLE, staged, {PARTITION: (5, 8)}, {PARTITION: 0}, batch_id=0
        )
        assert result.outcome(PARTITION) is Outcome.DROP, f"attempt {attempt}"
        assert upper(cat) == 10
    assert data_files(cat) == files_before
    assert persisted(cat) == {(o, "peer") for o in (2, 5, 7, 9)}
