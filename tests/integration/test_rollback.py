"""Rollback: dry run by default, fences every writer, and resume re-ingests exactly once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.ingest_support import run_until_caught_up
from millstream.catalog import Catalog
from millstream.datastream import DatastreamSpec
from millstream.errors import NotFoundError, WriterFencedError
from millstream.ingest.sources.generator import ORDERS_SCHEMA, GeneratorConfig, generate
from millstream.metastore.models import ShardAppend
from millstream.reference.model import canonical
from millstream.reference.oracle import expected_table
from millstream.spark.runner import DatastreamRunner

pytestmark = [pytest.mark.spark]

PARTITIONS = 2
PER_PARTITION = 3000


def _write_source(root: Path) -> list[tuple[int, int, bytes | None, bytes | None]]:
    cfg = GeneratorConfig(
        seed=11, partitions=PARTITIONS, key_cardinality=500, malformed_fraction=0.01
    )
    records = []
    for p in range(PARTITIONS):
        d = root / str(p)
        d.mkdir(parents=True)
        lines = []
        for offset, _key, value in generate(cfg, p, 0, PER_PARTITION):
            if value is None:  # the files source has no null values: write an empty line
                value = b""
            lines.append(value)
            records.append((p, offset, None, value))
        (d / "0000.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    return records


def _spec(source: Path) -> DatastreamSpec:
    return DatastreamSpec.parse(
        {
            "name": "rb",
            "source": {"kind": "files", "path": str(source)},
            "table": {
                "primary_key": ["order_id"],
                "mode": "upsert",
                "comparison_column": "updated_at",
                "delete_column": "is_deleted",
            },
            "schema": ORDERS_SCHEMA,
            "max_records_per_batch": 1500,
        }
    )


def _rows(cat: Catalog, table: str) -> list[Any]:
    return canonical(cat.read_table(table).to_pylist())


def test_rollback_dry_run_changes_nothing_then_resume_reingests_and_old_writers_are_fenced(
    tmp_path: Path, spark: Any
) -> None:
    records = _write_source(tmp_path / "src")
    spec = _spec(tmp_path / "src")
    table = spec.table_spec()
    cat = Catalog.open(home=tmp_path / "home")
    run_until_caught_up(DatastreamRunner(spec, cat, spark, writer_id="w"))
    full, bad = expected_table(table, records)
    assert _rows(cat, "rb") == canonical(full)
    before = cat.manifest("rb")
    shard = cat.store.get_shard("rb", 0)
    assert shard is not None and shard.upper == PER_PARTITION
    seqs = sorted(e.seq for e in before.entries if e.partition == 0)
    assert len(seqs) >= 2, "the test needs several segments in partition 0"
    cut = seqs[1]

    # Dry run (the default): a plan, and nothing changes.
    plan = cat.store.rollback_partition("rb", 0, cut)
    assert plan.dry_run and [e.seq for e in plan.removed] == seqs[1:]
    assert cat.manifest("rb").version == before.version
    assert cat.store.get_shard("rb", 0) == shard

    # A real rollback: the table equals the model over the remaining prefix.
    applied = cat.store.rollback_partition("rb", 0, cut, dry_run=False)
    new_upper = applied.new_upper
    after = cat.store.get_shard("rb", 0)
    assert after is not None and (after.upper, after.epoch) == (new_upper, shard.epoch + 1)
    prefix = [r for r in records if r[0] != 0 or r[1] < new_upper]
    expected_prefix, bad_prefix = expected_table(table, prefix)
    assert _rows(cat, "rb") == canonical(expected_prefix)
    dead = cat.read_table("rb__dead_letter")
    assert sorted(
        zip(dead.column("partition").to_pylist(), dead.column("offset").to_pylist(), strict=True)
    ) == sorted(bad_prefix)

    # A writer that had not noticed the rollback (still at the old epoch) cannot commit.
    with pytest.raises(WriterFencedError):
        cat.store.compare_and_append(
            "rb", [ShardAppend(0, new_upper, new_upper + 10, shard.epoch, None, 0)]
        )

    # Resume: the writer's checkpoint disagrees with the new epoch and upper, so it is
    # discarded; the range is re-ingested exactly once.
    stats = run_until_caught_up(DatastreamRunner(spec, cat, spark, writer_id="w"))
    assert stats.discarded_checkpoints, "the stale checkpoint must not be trusted"
    assert _rows(cat, "rb") == canonical(full)
    dead = cat.read_table("rb__dead_letter")
    assert sorted(
        zip(dead.column("partition").to_pylist(), dead.column("offset").to_pylist(), strict=True)
    ) == sorted(bad)


def test_rollback_of_an_unknown_segment_names_it(tmp_path: Path) -> None:
    cat = Catalog.open(home=tmp_path)
    cat.create_table({"name": "t", "schema": {"k": "long"}, "mode": "append"})
    cat.store.compare_and_append("t", [ShardAppend(0, 0, 5, 0, None, 0)])
    with pytest.raises(NotFoundError, match="t__0__7"):
        cat.store.rollback_partition("t", 0, 7)
