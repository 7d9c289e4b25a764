"""Delete vectors and the per-partition key index.

A seal records, as a delete vector, the rows of older sealed segments its run supersedes, found
through the partition's key index without reading those segments. Readers drop those rows
before merging. The contract: the table read with delete vectors equals the model and equals
the read without them; rollback brings superseded rows back; a lost delete vector never makes a
read wrong; the key index survives a restart through its checkpoint and is rebuilt when stale.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from harness.fault_points import at_sealer
from millstream.catalog import Catalog
from millstream.metastore.models import Manifest, SegmentState
from millstream.reference.model import canonical, model_rows
from millstream.sealing.keyindex import CACHE, KeyIndex, indexed
from millstream.sealing.sealer import Sealer
from millstream.spec import OFFSET_COL, TableSpec
from millstream.table.read import read_manifest
from millstream.table.writer import commit_staged, stage_rows

SCHEMA = {"k": "long", "v": "long", "s": "string", "d": "boolean", "c": "long"}
ENGINES: dict[str, dict[str, Any]] = {
    "upsert": {"mode": "upsert", "primary_key": ["k"], "delete_column": "d"},
    "upsert_cmp": {
        "mode": "upsert",
        "primary_key": ["k"],
        "delete_column": "d",
        "comparison_column": "c",
    },
    "dedup": {"mode": "dedup", "primary_key": ["k"], "delete_column": "d"},
    "dedup_cmp": {
        "mode": "dedup",
        "primary_key": ["k"],
        "delete_column": "d",
        "comparison_column": "c",
    },
    "partial_cmp": {
        "mode": "partial",
        "primary_key": ["k"],
        "delete_column": "d",
        "comparison_column": "c",
        "partial": {"v": "sum", "s": "append"},
    },
    "partial": {
        "mode": "partial",
        "primary_key": ["k"],
        "delete_column": "d",
        "partial": {"v": "sum", "s": "append", "c": "max"},
    },
    "string_key": {"mode": "upsert", "primary_key": ["s"], "delete_column": "d"},
}


class Feed:
    """Random rows committed batch by batch to partitions 0 and 1, like a writer would.

    Some rows are Kafka tombstones (key only) and some have the delete column set; with a
    comparison column only those may lack its value. Values come from a small range, so a
    deleted key meets re-inserts with higher, equal and lower (late older) values.
    """

    def __init__(self, cat: Catalog, spec: TableSpec, rnd: random.Random, affine: bool) -> None:
        self.cat, self.spec, self.rnd, self.affine = cat, spec, rnd, affine
        self.rows: list[dict[str, Any]] = []
        self.pos: dict[int, int] = {}

    def batch(
        self, partition: int, n: int, *, keys: list[int] | None = None, epoch: int = 0
    ) -> None:
        lo = self.pos.get(partition, 0)
        rnd = self.rnd
        rows = []
        for i, o in enumerate(range(lo, lo + n)):
            k = keys[i % len(keys)] if keys else rnd.randrange(8)
            if self.affine:
                k = k * 2 + partition
            s = rnd.choice([None, "a", "b", "c", "d"])
            if rnd.random() < 0.08:  # a tombstone: the key only
                rows.append(_row(k, None, s, None, None, partition, o, tombstone=True))
                continue
            d = rnd.random() < 0.1
            c = rnd.choice([None, rnd.randrange(5), rnd.randrange(5)])
            if c is None and not d and self.spec.comparison_column is not None:
                c = rnd.randrange(5)  # only a delete may lack the comparison value
            rows.append(_row(k, rnd.choice([None, rnd.randrange(10)]), s, d, c, partition, o))
        table = pa.Table.from_pylist(rows, schema=self.spec.arrow_schema(system_columns=True))
        staged = stage_rows(self.cat.deep, self.spec, table)
        commit_staged(
            self.cat.store,
            self.cat.deep,
            "t",
            staged,
            {partition: (lo, lo + n)},
            {partition: epoch},
        )
        self.rows += rows
        self.pos[partition] = lo + n

    def model(self, rows: list[dict[str, Any]] | None = None) -> list[Any]:
        return canonical(model_rows(self.spec, self.rows if rows is None else rows))

    def read(self, *, use_delete_vectors: bool = True) -> list[Any]:
        m = self.cat.manifest("t")
        return canonical(
            read_manifest(self.cat.deep, m, use_delete_vectors=use_delete_vectors).to_pylist()
        )


def _row(
    k: int,
    v: int | None,
    s: str | None,
    d: bool | None,
    c: int | None,
    partition: int,
    offset: int,
    *,
    tombstone: bool = False,
) -> dict[str, Any]:
    return {
        "k": k,
        "v": v,
        "s": s,
        "d": d,
        "c": c,
        "_ms_partition": partition,
        "_ms_offset": offset,
        "_ms_tombstone": tombstone,
    }


def _setup(tmp_path: Path, engine: str, seed: int, *, affine: bool = True) -> Feed:
    CACHE.clear()
    cat = Catalog.open(home=tmp_path)
    spec = TableSpec.parse({"name": "t", "schema": SCHEMA, **ENGINES[engine]})
    cat.create_table(spec)
    return Feed(cat, spec, random.Random(seed), affine)


def _index_rows(index: KeyIndex) -> list[tuple[Any, ...]]:
    cols = KeyIndex.columns(index.spec)  # key columns, offset, comparison value
    rows = zip(*(index.data.column(c).to_pylist() for c in cols), strict=True)
    return sorted(rows, key=repr)


def _sealed_end(p: int, m: Manifest) -> int:
    return max(
        (e.end for e in m.entries if e.partition == p and e.state is SegmentState.ONLINE),
        default=0,
    )


def _highest_sealed(rows: list[dict[str, Any]], p: int, m: Manifest) -> dict[Any, Any]:
    """Per key, the highest comparison value of every row written to the sealed offsets of p."""
    end = _sealed_end(p, m)
    out: dict[Any, Any] = {}
    for r in rows:
        if r["_ms_partition"] == p and r["_ms_offset"] < end and r["c"] is not None:
            out[r["k"]] = max(out.get(r["k"], r["c"]), r["c"])
    return out


def _floor(index: KeyIndex, rows: list[dict[str, Any]], p: int, m: Manifest) -> dict[Any, Any]:
    keys = sorted({r["k"] for r in rows if r["_ms_partition"] == p})
    floor = index.comparison_floor(pa.table({"k": pa.array(keys, pa.int64())}))
    assert floor is not None
    return dict(zip(floor.column("k").to_pylist(), floor.column("c").to_pylist(), strict=True))


def _check_index(feed: Feed, sealer: Sealer, p: int, context: str) -> None:
    """The incrementally maintained index equals one rebuilt from the segments, and its live
    rows hold each key's highest comparison value of every sealed row (the floor a seal
    materializes effective values from)."""
    m = feed.cat.manifest("t")
    live = KeyIndex.build(feed.spec, p, feed.cat.deep, m)
    cached = CACHE.get(sealer._where, "t", p)
    assert cached is not None, context
    assert _index_rows(cached) == _index_rows(live), context
    if feed.spec.comparison_column is not None:
        assert _floor(cached, feed.rows, p, m) == _highest_sealed(feed.rows, p, m), (
            f"{context}: the live sealed rows' highest comparison value per key is not the "
            "highest of every sealed row"
        )


@pytest.mark.parametrize("affine", [True, False], ids=["partition_affine_keys", "shared_keys"])
@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.parametrize("seed", range(4))
def test_random_ingest_and_seals_read_equal_to_the_model_with_and_without_delete_vectors(
    tmp_path: Path, engine: str, seed: int, affine: bool
) -> None:
    feed = _setup(tmp_path, engine, seed, affine=affine)
    rnd = feed.rnd
    sealer = Sealer(feed.cat, "t", checkpoint_seconds=0.0)
    deleted = 0
    for step in range(14):
        context = f"seed={seed} engine={engine} affine={affine} step={step}"
        feed.batch(rnd.randrange(2), rnd.randrange(1, 25))
        if rnd.random() < 0.6:
            p = rnd.randrange(2)
            pending = sealer.pending_run(p)
            result = sealer.seal_partition(p, force=True)
            assert (result is None) == (not pending), context
            if result is None:
                continue
            deleted += result.rows_deleted
            if indexed(feed.spec):
                _check_index(feed, sealer, p, context)
            else:
                assert result.rows_deleted == 0, context  # and there is no key index
        if rnd.random() < 0.15:
            CACHE.clear()  # a restart: the next seal loads the checkpoint
            sealer = Sealer(feed.cat, "t", checkpoint_seconds=0.0)
        assert feed.read() == feed.model(), context
        assert feed.read(use_delete_vectors=False) == feed.model(), context
    assert sealer.index_rebuilds == 0, "a checkpoint written after each seal is always current"
    if engine in ("upsert", "upsert_cmp", "string_key"):
        assert deleted > 0, "upsert seals must record superseded rows"


def test_a_seal_writes_a_delete_vector_for_each_superseded_row_and_readers_skip_them(
    tmp_path: Path,
) -> None:
    feed = _setup(tmp_path, "upsert", 1)
    feed.batch(0, 10, keys=list(range(10)))  # keys 0, 2, ..., 18 in partition 0
    sealer = Sealer(feed.cat, "t")
    first = sealer.seal_partition(0, force=True)
    assert first is not None and first.rows_deleted == 0
    feed.batch(0, 4, keys=[0, 1, 2, 3])  # updates 4 keys
    second = sealer.seal_partition(0, force=True)
    assert second is not None and second.rows_deleted == 4
    m = feed.cat.manifest("t")
    (dv,) = m.delete_vectors
    assert (dv.partition, dv.source_seq, dv.row_count) == (0, second.sealed.seq, 4)
    offsets = feed.cat.deep.read_parquet(dv.file_path).column(OFFSET_COL).to_pylist()
    assert sorted(offsets) == [0, 1, 2, 3]
    assert feed.read() == feed.model()
    # Time travel to before the second seal sees no delete vector.
    before = feed.cat.manifest("t", as_of=second.sealed.added_version - 1)
    assert before.delete_vectors == ()
    # GC must keep the delete vector's file.
    assert dv.file_path in feed.cat.store.referenced_files("t")


def test_rollback_removes_the_delete_vectors_of_the_removed_seals(tmp_path: Path) -> None:
    feed = _setup(tmp_path, "upsert", 2)
    feed.batch(0, 10, keys=list(range(10)))
    sealer = Sealer(feed.cat, "t")
    assert sealer.seal_partition(0, force=True) is not None
    prefix = list(feed.rows)
    feed.batch(0, 10, keys=list(range(10)))  # every key updated
    second = sealer.seal_partition(0, force=True)
    assert second is not None and second.rows_deleted == 10
    plan = feed.cat.store.rollback_partition("t", 0, second.sealed.seq, dry_run=False)
    assert [e.seq for e in plan.removed] == [second.sealed.seq]
    m = feed.cat.manifest("t")
    assert m.delete_vectors == ()
    assert feed.read() == feed.model(prefix), "the superseded rows are current again"
    # The next seal after the re-read works from a current index (the stale one is replaced).
    feed.rows = prefix
    feed.pos[0] = 10
    feed.batch(0, 5, keys=[1, 2, 3, 4, 5], epoch=plan.new_epoch)
    third = sealer.seal_partition(0, force=True)
    assert third is not None and third.rows_deleted == 5
    assert feed.read() == feed.model()


def test_a_lost_delete_vector_file_never_makes_a_read_wrong(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    feed = _setup(tmp_path, "upsert", 3)
    feed.batch(0, 10, keys=list(range(10)))
    sealer = Sealer(feed.cat, "t")
    sealer.seal_partition(0, force=True)
    feed.batch(0, 10, keys=list(range(10)))
    sealer.seal_partition(0, force=True)
    (dv,) = feed.cat.manifest("t").delete_vectors
    feed.cat.deep.delete(dv.file_path)
    with caplog.at_level(logging.WARNING, logger="millstream.table.read"):
        assert feed.read() == feed.model()
    assert any(dv.file_path in r.getMessage() for r in caplog.records)


def test_a_seal_with_a_current_index_never_reads_older_sealed_segments(tmp_path: Path) -> None:
    """Seal cost grows with the run, not the table: once the index is current, an older sealed
    segment's file is not even opened (here it is gone, and the seal still succeeds)."""
    feed = _setup(tmp_path, "upsert", 4)
    feed.batch(0, 30)
    sealer = Sealer(feed.cat, "t")
    old = sealer.seal_partition(0, force=True)
    assert old is not None and old.sealed.file_path is not None
    feed.cat.deep.delete(old.sealed.file_path)
    feed.batch(0, 10, keys=[0, 1, 2])
    new = sealer.seal_partition(0, force=True)
    assert new is not None and new.rows_deleted > 0
    assert sealer.index_rebuilds == 0


def test_the_key_index_is_loaded_from_its_checkpoint_after_a_restart_and_rebuilt_if_stale(
    tmp_path: Path,
) -> None:
    feed = _setup(tmp_path, "upsert", 5)
    feed.batch(0, 20)
    a = Sealer(feed.cat, "t", checkpoint_seconds=0.0)
    assert a.seal_partition(0, force=True) is not None
    assert a.checkpoint_path(0).exists()
    # Restart: a fresh process has no index in memory and loads the checkpoint.
    CACHE.clear()
    b = Sealer(feed.cat, "t", checkpoint_seconds=3600.0)
    feed.batch(0, 10, keys=[0, 1])
    assert b.seal_partition(0, force=True) is not None
    assert b.index_rebuilds == 0
    # b did not checkpoint (interval not reached): after another restart the checkpoint is
    # one seal behind, so it is not trusted and the index is rebuilt from the segments.
    CACHE.clear()
    c = Sealer(feed.cat, "t")
    feed.batch(0, 10, keys=[0, 1, 2])
    result = c.seal_partition(0, force=True)
    assert result is not None and result.rows_deleted > 0
    assert c.index_rebuilds == 1
    assert feed.read() == feed.model()
    assert feed.read(use_delete_vectors=False) == feed.model()


def test_a_seal_built_on_an_index_that_went_stale_is_discarded_not_swapped(
    tmp_path: Path,
) -> None:
    """A rollback lands between a seal's build and its swap: the swap sees the partition's
    sealed set changed and discards the seal (its delete vector would name rows that are no
    longer superseded)."""
    feed = _setup(tmp_path, "upsert", 6)
    feed.batch(0, 10, keys=list(range(10)))
    sealer = Sealer(feed.cat, "t")
    assert sealer.seal_partition(0, force=True) is not None
    feed.batch(0, 10, keys=list(range(10)))
    assert sealer.seal_partition(0, force=True) is not None  # seq 1, supersedes all of seq 0
    prefix = feed.rows[:10]
    feed.batch(0, 5, keys=[0, 1, 2, 3, 4])

    def rollback_during_build(point: str, partition: int) -> None:
        if point == "before_swap":
            feed.cat.store.rollback_partition("t", 0, 1, dry_run=False)

    uninstall = at_sealer(sealer, hook=rollback_during_build)
    with pytest.raises(Exception, match="changed"):
        sealer.seal_partition(0, force=True)
    uninstall()
    states = [(e.seq, e.state) for e in feed.cat.manifest("t").entries]
    assert states == [(0, SegmentState.ONLINE)]
    assert feed.cat.manifest("t").delete_vectors == ()
    assert feed.read() == feed.model(prefix)


def test_a_failed_swap_leaves_no_delete_vector_file_and_the_retry_writes_it(
    tmp_path: Path,
) -> None:
    from millstream.errors import InjectedFault

    feed = _setup(tmp_path, "upsert", 7)
    feed.batch(0, 10, keys=list(range(10)))
    assert Sealer(feed.cat, "t").seal_partition(0, force=True) is not None
    feed.batch(0, 10, keys=list(range(10)))
    failing = Sealer(feed.cat, "t")
    at_sealer(failing, fail={"before_swap": 1})
    with pytest.raises(InjectedFault):
        failing.seal_partition(0, force=True)
    files = [f.path for f in feed.cat.deep.list_files("tables/t/data")]
    assert not [f for f in files if "/dv-" in f], "an unswapped delete vector is deleted"
    assert feed.cat.manifest("t").delete_vectors == ()
    assert feed.read() == feed.model()
    result = failing.seal_partition(0, force=True)
    assert result is not None and result.rows_deleted == 10
    assert len(feed.cat.manifest("t").delete_vectors) == 1
    assert feed.read() == feed.model()


def test_a_checkpoint_of_an_earlier_table_with_the_same_ids_is_not_trusted(
    tmp_path: Path,
) -> None:
    """Entry ids restart at 1 in a new metadata store: a checkpoint left in the same home by an
    earlier table of the same name, whose ids match, must be rebuilt, not loaded (its rows
    would name the wrong offsets in the new table's delete vectors)."""
    import shutil

    first = _setup(tmp_path / "run", "upsert", 8)
    first.batch(0, 10, keys=list(range(10)))
    sealer = Sealer(first.cat, "t", checkpoint_seconds=0.0)
    assert sealer.seal_partition(0, force=True) is not None
    checkpoint = sealer.checkpoint_path(0)
    assert checkpoint.exists()
    saved = checkpoint.read_bytes()
    first.cat.close()
    # A new deployment in the same home: same table name, same entry ids, other keys.
    shutil.rmtree(tmp_path / "run")
    second = _setup(tmp_path / "run", "upsert", 9)
    second.batch(0, 10, keys=list(range(10, 20)))
    s2 = Sealer(second.cat, "t", checkpoint_seconds=0.0)
    assert s2.seal_partition(0, force=True) is not None
    checkpoint.write_bytes(saved)  # the old checkpoint, reflecting the same ids
    CACHE.clear()
    second.batch(0, 10, keys=list(range(10, 20)))
    s3 = Sealer(second.cat, "t")
    result = s3.seal_partition(0, force=True)
    assert result is not None and s3.index_rebuilds == 1, "the old checkpoint was rebuilt"
    assert result.rows_deleted == 10
    assert second.read() == second.model()
