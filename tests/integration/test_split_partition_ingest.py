"""A topic of one partition catching up uses every write task: the batch's range is split
(``spark.sources.plan_tasks``), each task stages its piece, and the sink's one commit chains
the pieces. The table equals the model and the pieces land in one manifest version."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from millstream.catalog import Catalog
from millstream.datastream import DatastreamSpec
from millstream.ingest.sources.generator import ORDERS_SCHEMA, GeneratorConfig, generate
from millstream.reference.model import canonical
from millstream.reference.oracle import expected_table
from millstream.spark.options import SPLIT_MIN_RECORDS
from millstream.spark.runner import DatastreamRunner

pytestmark = [pytest.mark.spark]


def test_a_lone_partition_is_split_over_the_write_tasks_and_nothing_is_lost_or_doubled(
    tmp_path: Path, spark: Any
) -> None:
    total = 2 * SPLIT_MIN_RECORDS + 2_000  # one batch at default settings, split in two
    cfg = GeneratorConfig(seed=33, partitions=1, key_cardinality=5_000, malformed_fraction=0.01)
    (tmp_path / "src" / "0").mkdir(parents=True)
    lines = [v if v is not None else b"" for _, _, v in generate(cfg, 0, 0, total)]
    (tmp_path / "src" / "0" / "0.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    spec = DatastreamSpec.parse(
        {
            "name": "split",
            "source": {"kind": "files", "path": str(tmp_path / "src")},
            "table": {"primary_key": ["order_id"], "mode": "upsert"},
            "schema": ORDERS_SCHEMA,
        }
    )
    cat = Catalog.open(home=tmp_path / "home")

    DatastreamRunner(spec, cat, spark, writer_id="w").run(available_now=True)

    expected, dead = expected_table(
        spec.table_spec(), [(0, o, None, v) for o, v in enumerate(lines)]
    )
    assert canonical(cat.read_table(spec.table_name).to_pylist()) == canonical(expected)
    assert dead, "the malformed records are dead-lettered, not lost"
    assert cat.read_table(spec.dead_letter_table).num_rows == len(dead)
    entries = sorted(cat.manifest(spec.table_name).entries, key=lambda e: e.seq)
    assert all(a.end == b.start for a, b in itertools.pairwise(entries))
    assert entries[0].start == 0 and entries[-1].end == total
    by_version = {v: len(list(g)) for v, g in itertools.groupby(entries, lambda e: e.added_version)}
    assert max(by_version.values()) >= 2, [(e.start, e.end, e.added_version) for e in entries]
