"""Automatic repair over a real Kafka source (the Tansu broker): a sealed segment whose data
file is deleted from the deep store is re-read from the topic by the leading controller, with
no human call, and the table equals the source again; the job is in the metadata store."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest

from harness.ingest_support import Topic, orders_spec
from millstream.catalog import Catalog
from millstream.control.controller import Controller, ControlSettings
from millstream.datastream import DatastreamSpec
from millstream.errors import SegmentUnavailableError
from millstream.ingest.decode import decode_records
from millstream.ingest.sources import spec_reader
from millstream.ingest.sources.base import RAW_SCHEMA
from millstream.metastore.jobs import SUCCEEDED
from millstream.sealing.sealer import Sealer
from millstream.table.writer import commit_staged, stage_rows


def _ingest(catalog: Catalog, spec: DatastreamSpec, partition: int, lo: int, hi: int) -> None:
    """What the sink does for one batch of one partition's good records (no Spark needed)."""
    batches = list(spec_reader(spec.source).read_range(partition, lo, hi))
    raw = pa.Table.from_batches(batches).select(["partition", "offset", "key", "value"])
    n = raw.num_rows
    raw = raw.append_column("range_lo", pa.array([lo] * n, pa.int64()))
    raw = raw.append_column("range_hi", pa.array([hi] * n, pa.int64()))
    raw = raw.append_column("is_marker", pa.array([False] * n)).cast(RAW_SCHEMA)
    decoded = decode_records(spec.table_spec(), raw)
    staged = stage_rows(catalog.deep, spec.table_spec(), decoded.rows)
    commit_staged(
        catalog.store, catalog.deep, spec.table_name, staged, {partition: (lo, hi)}, {partition: 0}
    )


def test_a_sealed_segment_lost_from_the_deep_store_is_re_read_from_kafka_automatically(
    tmp_path: Path, new_topic: Callable[..., Topic]
) -> None:
    topic = new_topic()
    topic.produce(60)
    spec = DatastreamSpec.parse(orders_spec("orders", topic, "upsert", max_records_per_batch=1000))
    with Catalog.open(home=tmp_path / "home") as catalog:
        settings = replace(ControlSettings(), repair_interval=0.0)
        controller = Controller(catalog, controller_id="controller-k", settings=settings)
        controller.registry.create(spec)
        controller.tick()  # creates the tables
        ends = topic.ends()
        for p, end in ends.items():
            _ingest(catalog, spec, p, 0, end // 2)
            _ingest(catalog, spec, p, end // 2, end)
        sealed = Sealer(catalog, "orders").seal_partition(0, force=True)
        assert sealed is not None and sealed.sealed.file_path is not None
        before = catalog.read_table("orders").to_pylist()
        catalog.deep.delete(sealed.sealed.file_path)
        with pytest.raises(SegmentUnavailableError, match="orders__0__0"):
            catalog.read_table("orders")

        controller.tick()
        assert controller.reingest.wait(300)

        [job] = catalog.store.reingest_jobs("orders")
        assert (job.segment, job.payload["status"], job.payload["trigger"]) == (
            "orders__0__0",
            SUCCEEDED,
            "auto",
        ), job.payload
        after = catalog.read_table("orders").to_pylist()
        assert len(after) == len(before) > 0
        assert sorted(map(repr, after)) == sorted(map(repr, before))
