"""``millstream run --available-now`` seals what is due before it exits (no background sealer
outlives it), and says why each other partition was not sealed.

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


def _runner(tmp_path: Path, spec: DatastreamSpec, monkeypatch: pytest.MonkeyPatch) -> Any:
    cat = Catalog.open(home=tmp_path / "home")
    runner = DatastreamRunner(spec, cat, spark=None, writer_id="w")

    def catch_up(on_tick: Any) -> None:
        table = spec.table_spec()
        for partition, n in ((0, 150), (1, 20)):  # partition 0 reaches flush_rows, 1 does not
            rows = pa.table(
                {
                    "id": pa.array(range(n), pa.int64()),
                    "_ms_partition": pa.array([partition] * n, pa.int32()),
                    "_ms_offset": pa.array(range(n), pa.int64()),
                    "_ms_tombstone": pa.array([False] * n),
                }
            )
            staged = stage_rows(cat.deep, table, rows)
            commit_staged(cat.store, cat.deep, "orders", staged, {partition: (0, n)}, {})

    monkeypatch.setattr(runner, "_open", runner.ensure_tables)
    monkeypatch.setattr(runner, "_catch_up", catch_up)
    return cat, runner


def test_an_available_now_run_seals_what_is_due_and_says_why_the_rest_was_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cat, runner = _runner(tmp_path, _spec(tmp_path), monkeypatch)
    stats = runner.run(available_now=True)
    assert stats.sealing is not None
    assert stats.sealing["sealed"] == {"0": {"segments": 1, "rows": 150}}
    assert stats.sealing["failed"] == {}
    assert "20 rows of flush_rows 100" in stats.sealing["not_due"]["1"]
    states = {e.partition: e.state for e in cat.manifest("orders").entries}
    assert states == {0: SegmentState.ONLINE, 1: SegmentState.CONSUMING}
