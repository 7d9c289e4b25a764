"""``millstream run --available-now`` seals all it wrote before it exits (no background sealer
outlives it), and compacts what is due; a runner left at its default seals what is due and
says why each other partition was not sealed.

The production :meth:`DatastreamRunner.run` runs here; only the Spark jobs are a stand-in
(``_open`` creates the tables, ``_catch_up`` commits a batch per partition as the sink would
and returns as an available-now run does when it is done)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from millstream.catalog import Catalog
from millstream.datastream import DatastreamSpec
from millstream.metastore.models import SegmentState
from millstream.spark.runner import DatastreamRunner
from millstream.table.writer import commit_staged, stage_rows


def _spec(tmp_path: Path, **segments: Any) -> DatastreamSpec:
    return DatastreamSpec.parse(
        {
            "name": "orders",
            "source": {"kind": "files", "path": str(tmp_path / "source")},
            "schema": {"id": "long"},
            "table": {"mode": "upsert", "primary_key": ["id"]},
            "segments": {"flush_rows": 100, **segments},
        }
    )


def _runner(
    tmp_path: Path,
    spec: DatastreamSpec,
    monkeypatch: pytest.MonkeyPatch,
    batches: tuple[tuple[int, int], ...] = ((0, 150), (1, 20)),
    cat: Catalog | None = None,
    seal_all: bool = True,
) -> Any:
    """A runner whose catch-up commits ``batches`` ((partition, rows)) after what the table
    holds already (each row a new version of keys 0..rows-1); ``seal_all`` as ``millstream run
    --available-now`` sets it."""
    cat = cat or Catalog.open(home=tmp_path / "home")
    runner = DatastreamRunner(spec, cat, spark=None, writer_id="w")
    runner.seal_all_on_exit = seal_all

    def catch_up(on_tick: Any) -> None:
        table = spec.table_spec()
        uppers = {s.partition: s.upper for s in cat.store.list_shards("orders")}
        for partition, n in batches:
            lo = uppers.get(partition, 0)
            rows = pa.table(
                {
                    "id": pa.array(range(n), pa.int64()),
                    "_ms_partition": pa.array([partition] * n, pa.int32()),
                    "_ms_offset": pa.array(range(lo, lo + n), pa.int64()),
                    "_ms_tombstone": pa.array([False] * n),
                }
            )
            staged = stage_rows(cat.deep, table, rows)
            commit_staged(cat.store, cat.deep, "orders", staged, {partition: (lo, lo + n)}, {})

    monkeypatch.setattr(runner, "_open", runner.ensure_tables)
    monkeypatch.setattr(runner, "_catch_up", catch_up)
    return cat, runner


def test_an_available_now_run_seals_all_it_wrote_below_the_thresholds_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Partition 1's 20 rows are far below flush_rows 100, and are sealed all the same: the
    run leaves no consuming segment, so a read right after reads final rows, not every
    version of every key."""
    cat, runner = _runner(tmp_path, _spec(tmp_path), monkeypatch)
    stats = runner.run(available_now=True)
    assert stats.sealing is not None
    assert stats.sealing["sealed"] == {
        "0": {"segments": 1, "rows": 150},
        "1": {"segments": 1, "rows": 20},
    }
    assert stats.sealing["not_due"] == {}
    assert stats.sealing["failed"] == {}
    states = {e.partition: e.state for e in cat.manifest("orders").entries}
    assert states == {0: SegmentState.ONLINE, 1: SegmentState.ONLINE}
    assert sorted(cat.read_table("orders").column("id").to_pylist()) == list(range(150))


def test_repeated_available_now_runs_compact_their_sealed_segments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each run seals its own small segment, whose rows supersede the last run's; the run's
    final pass then compacts what is due (no background sealer would), so a table fed by
    short runs keeps one sealed file, not one per run."""
    spec = _spec(tmp_path)
    cat = Catalog.open(home=tmp_path / "home")
    for i in range(3):
        _, runner = _runner(tmp_path, spec, monkeypatch, batches=((0, 10),), cat=cat)
        stats = runner.run(available_now=True)
        assert stats.sealing is not None
        assert stats.sealing["sealed"] == {"0": {"segments": 1, "rows": 10}}
        assert stats.sealing["compacted"] == ({"0": {"segments": 2, "rows": 10}} if i else {})
        entries = cat.manifest("orders").entries
        assert [(e.state, e.row_count) for e in entries] == [(SegmentState.ONLINE, 10)]
        assert sorted(cat.read_table("orders").column("id").to_pylist()) == list(range(10))


def test_a_runner_at_its_default_seals_what_is_due_and_says_why_the_rest_was_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cat, runner = _runner(tmp_path, _spec(tmp_path), monkeypatch, seal_all=False)
    stats = runner.run(available_now=True)
    assert stats.sealing is not None
    assert stats.sealing["sealed"] == {"0": {"segments": 1, "rows": 150}}
    assert stats.sealing["failed"] == {}
    assert "20 rows of flush_rows 100" in stats.sealing["not_due"]["1"]
    states = {e.partition: e.state for e in cat.manifest("orders").entries}
    assert states == {0: SegmentState.ONLINE, 1: SegmentState.CONSUMING}


def test_an_available_now_run_stores_its_read_and_a_read_right_after_reads_that_file_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys 0..19 have a sealed row in both partitions, so a read of the sealed table merges
    170 rows into 150; the run's final pass stores that read once (the merged copy), and a
    read right after opens that one file instead of every sealed segment."""
    from millstream.storage.deepstore import DeepStore

    cat, runner = _runner(tmp_path, _spec(tmp_path), monkeypatch)
    stats = runner.run(available_now=True)
    assert stats.sealing is not None
    copy = stats.sealing["merged_copy"]
    assert copy["rows"] == 150 and copy["version"] == cat.manifest("orders").version
    opened: list[str] = []
    read = DeepStore.read_parquet

    def counted(self: DeepStore, path: str, **kw: Any) -> pa.Table:
        opened.append(path)
        return read(self, path, **kw)

    monkeypatch.setattr(DeepStore, "read_parquet", counted)
    assert sorted(cat.read_table("orders").column("id").to_pylist()) == list(range(150))
    assert len(opened) == 1 and opened[0].startswith("tables/orders/merged/")
