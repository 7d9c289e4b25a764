"""Sealing during real ingestion: the background sealer seals while the batches commit
(pauseless), and the run seals what is still due before it exits; the table stays equal to the
source model and the partitions end up sealed, their segments contiguous."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from millstream.catalog import Catalog
from millstream.datastream import DatastreamSpec
from millstream.ingest.sources.generator import ORDERS_SCHEMA, GeneratorConfig, generate
from millstream.metastore.models import SegmentState
from millstream.reference.model import canonical
from millstream.reference.oracle import expected_table
from millstream.spark.runner import DatastreamRunner

pytestmark = [pytest.mark.spark]


@pytest.mark.parametrize("mode", ["upsert", "dedup"])
def test_ingest_seals_in_the_background_and_the_table_equals_the_model(
    tmp_path: Path, spark: Any, mode: str
) -> None:
    cfg = GeneratorConfig(seed=21, partitions=2, key_cardinality=300, malformed_fraction=0.01)
    records = []
    for p in range(2):
        (tmp_path / "src" / str(p)).mkdir(parents=True)
        lines = [v if v is not None else b"" for _, _, v in generate(cfg, p, 0, 2500)]
        (tmp_path / "src" / str(p) / "0.jsonl").write_bytes(b"\n".join(lines) + b"\n")
        records += [(p, o, None, v) for o, v in enumerate(lines)]
    table: dict[str, Any] = {"primary_key": ["order_id"], "mode": mode}
    if mode == "upsert":
        table.update(comparison_column="updated_at", delete_column="is_deleted")
    spec = DatastreamSpec.parse(
        {
            "name": f"seal-{mode}",
            "source": {"kind": "files", "path": str(tmp_path / "src")},
            "table": table,
            "schema": ORDERS_SCHEMA,
            "max_records_per_batch": 1000,
            "segments": {"flush_rows": 1200},
        }
    )
    cat = Catalog.open(home=tmp_path / "home")
    runner = DatastreamRunner(spec, cat, spark, writer_id="w", background_sealing=True)
    runner.seal_interval = 0.05  # passes while the batches commit, not only the final one
    runner.run(available_now=True)
    expected, _ = expected_table(spec.table_spec(), records)
    assert canonical(cat.read_table(spec.table_name).to_pylist()) == canonical(expected)
    entries = cat.manifest(spec.table_name).entries
    online = [e for e in entries if e.state is SegmentState.ONLINE]
    assert {e.partition for e in online} == {0, 1}, [(e.name, e.state) for e in entries]
    for p in (0, 1):
        mine = sorted((e for e in entries if e.partition == p), key=lambda e: e.seq)
        assert all(a.end == b.start for a, b in itertools.pairwise(mine))
        assert mine[-1].end == 2500
