"""Repairs of a ``topic_pattern`` datastream's tables over the real broker (no Spark: the
tables are written as the sink writes a batch): the leading controller's automatic repair
scans the tables the pattern's topics got (which topic each re-reads, from the broker's
listing) and rebuilds a sealed segment whose file was lost, and an operator's re-ingestion of
another table's segment (``POST /segments/{name}/reingest``) re-reads that table's own topic.
Each table equals the model of its own topic afterwards."""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest

from harness.api_support import TestClient
from harness.ingest_support import assert_table_matches_source, produce_exact
from millstream.api import create_app
from millstream.catalog import Catalog
from millstream.control.controller import Controller, ControlSettings
from millstream.datastream import DatastreamSpec, dead_letter_spec
from millstream.errors import SegmentUnavailableError
from millstream.ingest.decode import decode_records
from millstream.ingest.sources import spec_reader
from millstream.ingest.sources.base import RAW_SCHEMA
from millstream.local.tansu import TansuBroker
from millstream.metastore.jobs import SUCCEEDED
from millstream.reference.oracle import RawRecord
from millstream.sealing.sealer import Sealer
from millstream.table.writer import commit_staged, stage_rows

pytestmark = [pytest.mark.kafka]


def _rows(n: int, tag: str) -> list[tuple[bytes | None, bytes | None]]:
    return [
        (str(i % 15).encode(), json.dumps({"id": i % 15, "v": f"{tag}{i}"}).encode())
        for i in range(n)
    ]


def _ingest(catalog: Catalog, spec: DatastreamSpec, lo: int, hi: int) -> None:
    """What the sink does for one batch of partition 0's records of ``spec``'s topic."""
    batches = list(spec_reader(spec.source).read_range(0, lo, hi))
    raw = pa.Table.from_batches(batches).select(["partition", "offset", "key", "value"])
    n = raw.num_rows
    raw = raw.append_column("range_lo", pa.array([lo] * n, pa.int64()))
    raw = raw.append_column("range_hi", pa.array([hi] * n, pa.int64()))
    raw = raw.append_column("is_marker", pa.array([False] * n)).cast(RAW_SCHEMA)
    decoded = decode_records(spec.table_spec(), raw)
    staged = stage_rows(catalog.deep, spec.table_spec(), decoded.rows)
    commit_staged(catalog.store, catalog.deep, spec.table_name, staged, {0: (lo, hi)}, {0: 0})


def _lose_sealed_segment(catalog: Catalog, table: str) -> str:
    """Seal partition 0 of ``table`` and delete the sealed file; the segment's name."""
    sealed = Sealer(catalog, table).seal_partition(0, force=True)
    assert sealed is not None and sealed.sealed.file_path is not None
    catalog.deep.delete(sealed.sealed.file_path)
    with pytest.raises(SegmentUnavailableError, match=f"{table}__0__"):
        catalog.read_table(table)
    return sealed.sealed.name


def test_a_topic_patterns_tables_are_repaired_automatically_and_reingested_on_request(
    kafka_broker: TansuBroker, tmp_path: Path
) -> None:
    prefix = f"mr{uuid.uuid4().hex[:8]}"
    boot = kafka_broker.bootstrap
    topics = {n: f"{prefix}.shop.{n}" for n in ("alpha", "beta")}
    records: dict[str, list[RawRecord]] = {}
    for n, t in topics.items():
        kafka_broker.create_topic(t, partitions=1)
        records[n] = produce_exact(boot, t, {0: _rows(40, n)})
    spec = DatastreamSpec.parse(
        {
            "name": "shop",
            "source": {
                "kind": "kafka",
                "bootstrap_servers": boot,
                "topic_pattern": rf"{prefix}\.shop\..*",
            },
            "table": {"mode": "upsert", "primary_key": ["id"]},
            "schema": {"id": "long", "v": "string"},
        }
    )
    with Catalog.open(home=tmp_path / "home") as catalog:
        settings = replace(ControlSettings(), repair_interval=0.0)
        controller = Controller(catalog, controller_id="c1", settings=settings)
        controller.registry.create(spec)
        controller.tick()  # READY; a pattern's tables come as its worker finds its topics
        members = spec.tables(topics.values()).members
        for member in members.values():  # what the worker's writer of each table does first
            catalog.store.claim_owners([member.table_name, member.dead_letter_table], "shop")
            catalog.create_table(member.table_spec())
            catalog.create_table(dead_letter_spec(member.table_spec()))
            _ingest(catalog, member, 0, 20)
            _ingest(catalog, member, 20, 40)

        lost = _lose_sealed_segment(catalog, "alpha")
        controller.tick()  # the repair scan lists the pattern's topics: alpha's is among them
        assert controller.reingest.wait(300)
        [job] = catalog.store.reingest_jobs("alpha")
        assert (job.segment, job.payload["status"], job.payload["trigger"]) == (
            lost,
            SUCCEEDED,
            "auto",
        ), job.payload
        assert_table_matches_source(catalog, members["alpha"], records["alpha"])
        assert controller.repair.status("alpha")["topics_loop"]["errors"] == 0

        # An operator's re-ingestion of beta's lost segment re-reads beta's own topic.
        lost = _lose_sealed_segment(catalog, "beta")
        with TestClient(create_app(catalog, controller=controller, upstream_timeout=10)) as api:
            started = api.post(f"/segments/{lost}/reingest")
            assert started.status_code == 202, started.text
            assert controller.reingest.wait(300)
            [job] = [j for j in api.get("/reingestJobs").json() if j["segment"] == lost]
        assert job["state"] == SUCCEEDED, job
        assert_table_matches_source(catalog, members["beta"], records["beta"])
