"""Issue 3 acceptance: with ``bad_records: fail`` a malformed record stops the datastream
with an error naming its partition and offset, and nothing at or after it is committed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.ingest_support import orders_spec, produce_exact, run_cli, shard_uppers, write_spec
from millstream.catalog import Catalog
from millstream.datastream import DatastreamSpec
from millstream.storage.deepstore import table_data_prefix
from millstream.table.gc import collect_garbage

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

PER_PARTITION = 20
BAD_PARTITION, BAD_OFFSET = 2, 13


def order(order_id: int) -> bytes:
    return json.dumps(
        {
            "order_id": order_id,
            "customer": "c1",
            "amount": 10.5,
            "status": "new",
            "updated_at": "2026-01-01T00:00:00Z",
            "is_deleted": False,
        }
    ).encode()


def test_bad_record_with_bad_records_fail_stops_naming_partition_and_offset(
    new_topic, tmp_path: Path
) -> None:
    topic = new_topic()
    rows = {
        p: [
            (str(i * 4 + p).encode(), order(i * 4 + p))
            if (p, i) != (BAD_PARTITION, BAD_OFFSET)
            else (b"x", b"not json at all")
            for i in range(PER_PARTITION)
        ]
        for p in range(4)
    }
    topic.records.extend(produce_exact(topic.bootstrap, topic.name, rows))
    assert (BAD_PARTITION, BAD_OFFSET, b"x", b"not json at all") in topic.records
    # Two batches: [0, 10) of every partition commits, [10, 20) holds the bad record.
    raw = orders_spec(
        "orders-strict", topic, "upsert", max_records_per_batch=40, bad_records="fail"
    )
    spec = DatastreamSpec.parse(raw)

    result = run_cli(write_spec(tmp_path / "spec.yaml", raw), tmp_path / "home", "w", tmp_path)

    assert result.returncode == 9, result.explain()  # 9: the Spark query failed with our error
    error = result.summary()
    assert f"partition {BAD_PARTITION} offset {BAD_OFFSET}" in error["message"], error
    assert "bad_records" in error["message"]
    with Catalog.open(home=tmp_path / "home") as cat:
        assert shard_uppers(cat, spec.table_name) == dict.fromkeys(range(4), 10)
        assert cat.read_table(spec.table_name).num_rows == 40
        assert cat.read_table(spec.dead_letter_table).num_rows == 0
        # The failed batch's other task may have staged a file. The abort deletes every staged
        # file its commit messages name; a task still writing when Spark aborted the batch can
        # leave its file behind, unreferenced, for garbage collection. Either way nothing the
        # manifest references is gone, and GC leaves exactly the referenced files.
        referenced = cat.store.referenced_files(spec.table_name)
        staged = {f.path for f in cat.deep.list_files(table_data_prefix(spec.table_name))}
        assert referenced <= staged
        collect_garbage(cat.store, cat.deep, spec.table_name, grace_seconds=0)
        staged = {f.path for f in cat.deep.list_files(table_data_prefix(spec.table_name))}
        assert staged == referenced
