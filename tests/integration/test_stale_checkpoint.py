"""Issue 3 acceptance: local Spark checkpoints are a cache and the shards are the truth.

A checkpoint that disagrees with the shard uppers (restored from a backup, copied from another
host, left behind by a writer whose shards moved on) is discarded with a reason naming the
partition and offset, and the writer resumes from the shard uppers: nothing is duplicated or
lost. The unit-level tests feed :func:`checkpoint_verdict` hand-made offset logs in Spark's
on-disk format.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from harness.ingest_support import (
    assert_table_matches_source,
    orders_spec,
    run_until_caught_up,
    shard_uppers,
)
from millstream.catalog import Catalog
from millstream.datastream import DatastreamSpec
from millstream.spark.runner import SIDECAR, Bootstrap, DatastreamRunner, checkpoint_verdict

PER_RUN = 1_000  # records per partition produced before each run


@pytest.mark.spark
@pytest.mark.kafka
def test_stale_checkpoint_is_discarded_and_the_writer_resumes_from_the_shards(
    new_topic, spark, tmp_path: Path
) -> None:
    topic = new_topic(seed=31)
    spec = DatastreamSpec.parse(
        orders_spec("orders-stale", topic, "upsert", max_records_per_batch=1_500)
    )
    with Catalog.open(home=tmp_path / "home") as cat:

        def run():
            return run_until_caught_up(DatastreamRunner(spec, cat, spark, writer_id="w"))

        topic.produce(PER_RUN)
        run()
        checkpoint = tmp_path / "home" / "writers" / spec.name / "w" / "checkpoint"
        assert (checkpoint / "offsets").is_dir()
        old_uppers = shard_uppers(cat, spec.table_name)
        assert old_uppers == topic.ends()
        backup = tmp_path / "checkpoint-backup"
        shutil.copytree(checkpoint, backup)

        topic.produce(PER_RUN)
        assert run().discarded_checkpoints == []  # its own, current checkpoint is reused
        new_uppers = shard_uppers(cat, spec.table_name)
        assert new_uppers == topic.ends()

        # The old checkpoint comes back (a restored backup); more data arrives meanwhile.
        topic.produce(PER_RUN)
        shutil.rmtree(checkpoint)
        shutil.copytree(backup, checkpoint)
        stats = run()

        assert len(stats.discarded_checkpoints) == 1, stats
        reason = stats.discarded_checkpoints[0]
        m = re.search(
            r"ended at offset (\d+) of partition (\d+) but the shard upper is (\d+)", reason
        )
        assert m, reason
        offset, partition, upper = map(int, m.groups())
        assert offset == old_uppers[partition]
        assert upper == new_uppers[partition]
        assert shard_uppers(cat, spec.table_name) == topic.ends()
        assert_table_matches_source(cat, spec, topic.records)


# -- checkpoint_verdict on hand-made offset logs ---------------------------------------------


def offsets_file(offsets: dict[int, int]) -> str:
    """An ``offsets/N`` file as Spark writes it: version, batch metadata, the source offset."""
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": 1795348848727, "conf": {}}
    return "v1\n" + json.dumps(meta) + "\n" + json.dumps({str(p): o for p, o in offsets.items()})


def make_checkpoint(
    root: Path,
    batch_ends: list[dict[int, int]],
    *,
    committed: int,
    epochs: dict[int, int] | None = None,
) -> Path:
    """Batches ``0..len(batch_ends)-1`` planned; ``0..committed`` in Spark's commit log."""
    cp = root / "checkpoint"
    (cp / "offsets").mkdir(parents=True)
    (cp / "commits").mkdir()
    for n, end in enumerate(batch_ends):
        (cp / "offsets" / str(n)).write_text(offsets_file(end))
        (cp / "offsets" / f".{n}.crc").write_text("")  # Spark's checksum files are ignored
    for n in range(committed + 1):
        (cp / "commits" / str(n)).write_text('v1\n{"nextBatchWatermarkMs":0}')
    epochs = epochs if epochs is not None else dict.fromkeys(batch_ends[0], 0)
    (cp / SIDECAR).write_text(
        json.dumps({"epochs": {str(p): e for p, e in epochs.items()}, "writer": "w"})
    )
    return cp


def boot(uppers: dict[int, int], epochs: dict[int, int] | None = None) -> Bootstrap:
    epochs = epochs if epochs is not None else dict.fromkeys(uppers, 0)
    return Bootstrap(uppers=uppers, epochs=epochs, dead_letter_epochs=dict(epochs))


ENDS = [{0: 100, 1: 80}, {0: 200, 1: 160}]  # batch 0 ends at these offsets, then batch 1


def test_committed_checkpoint_agreeing_with_the_shards_is_kept(tmp_path: Path) -> None:
    cp = make_checkpoint(tmp_path, ENDS, committed=1)
    assert checkpoint_verdict(cp, boot({0: 200, 1: 160})) is None


def test_committed_checkpoint_behind_a_shard_is_discarded_naming_partition_and_offset(
    tmp_path: Path,
) -> None:
    cp = make_checkpoint(tmp_path, ENDS, committed=1)
    why = checkpoint_verdict(cp, boot({0: 200, 1: 170}))
    assert why is not None
    assert "offset 160 of partition 1" in why
    assert "upper is 170" in why


def test_committed_checkpoint_ahead_of_a_shard_is_discarded(tmp_path: Path) -> None:
    cp = make_checkpoint(tmp_path, ENDS, committed=1)
    why = checkpoint_verdict(cp, boot({0: 150, 1: 160}))
    assert why is not None
    assert "offset 200 of partition 0" in why


@pytest.mark.parametrize("upper0", [100, 150, 200], ids=["at-start", "inside", "at-end"])
def test_pending_batch_containing_the_shard_upper_is_kept_for_replay(
    tmp_path: Path, upper0: int
) -> None:
    # Batch 1 was planned, maybe committed to the shards, not to Spark's commit log: the
    # replay drops or trims what the shards already hold.
    cp = make_checkpoint(tmp_path, ENDS, committed=0)
    assert checkpoint_verdict(cp, boot({0: upper0, 1: 160})) is None


@pytest.mark.parametrize("upper0", [99, 201], ids=["below-start", "beyond-end"])
def test_pending_batch_not_containing_the_shard_upper_is_discarded(
    tmp_path: Path, upper0: int
) -> None:
    cp = make_checkpoint(tmp_path, ENDS, committed=0)
    why = checkpoint_verdict(cp, boot({0: upper0, 1: 160}))
    assert why is not None
    assert "[100, 200) of partition 0" in why
    assert f"shard upper {upper0}" in why


def test_checkpoint_started_at_other_epochs_is_discarded(tmp_path: Path) -> None:
    # A shard was fenced (epoch bumped) after this writer started: its checkpoint is stale
    # even though the offsets agree.
    cp = make_checkpoint(tmp_path, ENDS, committed=1, epochs={0: 0, 1: 0})
    why = checkpoint_verdict(cp, boot({0: 200, 1: 160}, epochs={0: 0, 1: 1}))
    assert why is not None
    assert "epochs" in why


def test_checkpoint_without_offsets_or_sidecar_is_discarded(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert checkpoint_verdict(empty, boot({0: 10})) == "it has no offset log"
    cp = make_checkpoint(tmp_path, ENDS, committed=1)
    (cp / SIDECAR).unlink()
    why = checkpoint_verdict(cp, boot({0: 200, 1: 160}))
    assert why is not None
    assert SIDECAR in why


def test_committed_checkpoint_ahead_of_a_table_without_shards_is_discarded(
    tmp_path: Path,
) -> None:
    # The metadata store was replaced (or the table re-created): nothing is committed, so
    # the writer must start from the source's earliest offsets, not from the checkpoint.
    cp = make_checkpoint(tmp_path, ENDS, committed=1)
    assert checkpoint_verdict(cp, boot({})) is not None


def test_a_checkpoint_is_not_trusted_against_a_fresh_metadata_store(
    tmp_path: Path, spark: Any
) -> None:
    """The metadata store was replaced but the writer's local checkpoint survived: the writer
    must ingest from the source's start, not from where the old checkpoint says."""
    from millstream.catalog import Catalog
    from millstream.datastream import DatastreamSpec
    from millstream.ingest.sources.generator import ORDERS_SCHEMA
    from millstream.reference.model import canonical

    def spec(total: int) -> DatastreamSpec:
        return DatastreamSpec.parse(
            {
                "name": "fresh",
                "source": {"kind": "generator", "seed": 4, "partitions": 2, "total": total},
                "table": {"primary_key": ["order_id"], "mode": "dedup"},
                "schema": ORDERS_SCHEMA,
            }
        )

    home = tmp_path / "home"
    run_until_caught_up(DatastreamRunner(spec(1000), Catalog.open(home=home), spark, writer_id="w"))
    fresh = Catalog.open(home=home, metadata_url=f"sqlite:///{home / 'fresh.db'}")
    stats = run_until_caught_up(DatastreamRunner(spec(2000), fresh, spark, writer_id="w"))
    assert stats.discarded_checkpoints
    full = Catalog.open(home=tmp_path / "reference")
    run_until_caught_up(DatastreamRunner(spec(2000), full, spark, writer_id="w"))
    assert canonical(fresh.read_table("fresh").to_pylist()) == canonical(
        full.read_table("fresh").to_pylist()
    )
    assert {s.partition: s.upper for s in fresh.store.list_shards("fresh")} == {0: 1000, 1: 1000}
