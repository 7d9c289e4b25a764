"""Re-ingestion: a sealed segment whose file is lost makes reads fail loudly, naming the
segment (never silently wrong rows); POST /segments/{name}/reingest rebuilds it from the
source as a job, and the table equals the model again."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pytest

from harness.api_support import TestClient, spec_body
from millstream.catalog import Catalog
from millstream.control.controller import Controller
from millstream.datastream import DatastreamSpec
from millstream.errors import SegmentUnavailableError
from millstream.ingest.decode import decode_records
from millstream.ingest.formats import decoder_for
from millstream.ingest.sources import config_for, reader_for
from millstream.ingest.sources.base import RAW_SCHEMA
from millstream.reference.model import canonical
from millstream.reference.oracle import expected_table
from millstream.sealing.sealer import Sealer
from millstream.table.writer import commit_staged, stage_rows


def _write_source(
    source_dir: Path, fmt: str = "json"
) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """30 records per partition, one of them bad, as JSON lines or CSV; the records returned
    are their JSON twins (the model's input)."""
    records = []
    for p in range(2):
        d = source_dir / str(p)
        d.mkdir(parents=True)
        pairs = [(i % 7 * 2 + p, i) for i in range(30)]
        lines = [b'{"id": %d, "status": "s%d"}' % pair for pair in pairs]
        lines[11] = b"not json"
        if fmt == "csv":
            rows = [b"%d,s%d" % pair for pair in pairs]
            rows[11] = b"1,2,3"  # a row with a field too many
            (d / "0.csv").write_bytes(b"id,status\n" + b"\n".join(rows) + b"\n")
        else:
            (d / "0.jsonl").write_bytes(b"\n".join(lines) + b"\n")
        records += [(p, o, None, v) for o, v in enumerate(lines)]
    return records


def _ingest(catalog: Catalog, spec: DatastreamSpec, partition: int, lo: int, hi: int) -> None:
    """What the sink does for one batch of one partition (no Spark needed here)."""
    kind, config = config_for(spec.source)
    batches = list(reader_for(kind, config).read_range(partition, lo, hi))
    raw = pa.Table.from_batches(batches).select(["partition", "offset", "key", "value"])
    n = raw.num_rows
    raw = raw.append_column("range_lo", pa.array([lo] * n, pa.int64()))
    raw = raw.append_column("range_hi", pa.array([hi] * n, pa.int64()))
    raw = raw.append_column("is_marker", pa.array([False] * n)).cast(RAW_SCHEMA)
    rows = decode_records(spec.table_spec(), raw, decoder_for(config)).rows
    staged = stage_rows(catalog.deep, spec.table_spec(), rows)
    commit_staged(
        catalog.store, catalog.deep, "orders", staged, {partition: (lo, hi)}, {partition: 0}
    )


@pytest.mark.parametrize(("fmt", "by_key"), [("json", False), ("csv", False), ("json", True)])
def test_a_lost_sealed_segment_is_reported_by_name_and_reingestion_restores_the_table(
    api: TestClient,
    controller: Controller,
    catalog: Catalog,
    source_dir: Path,
    fmt: str,
    by_key: bool,
) -> None:
    """Partitioned by key, a partition's sealed rows are read as they are (one per key, no
    merge): the rebuilt segment must be compacted as its seal compacted it, else every older
    row of a key it holds comes back."""
    records = _write_source(source_dir, fmt)
    table = {"mode": "upsert", "primary_key": ["id"], "partitioned_by_key": by_key}
    body = spec_body("orders", source_dir, table=table)
    body["source"]["format"] = fmt  # re-ingestion decodes the source's format, as the writer
    assert api.post("/datastreams", json=body).status_code == 201
    controller.tick()
    spec = DatastreamSpec.parse(body)
    for p in range(2):
        for lo in range(0, 30, 10):
            _ingest(catalog, spec, p, lo, lo + 10)
    sealed = Sealer(catalog, "orders").seal_partition(0, force=True)
    assert sealed is not None
    expected, _ = expected_table(spec.table_spec(), records)
    assert canonical(catalog.read_table("orders").to_pylist()) == canonical(expected)

    assert sealed.sealed.file_path is not None
    catalog.deep.delete(sealed.sealed.file_path)
    with pytest.raises(SegmentUnavailableError, match="orders__0__0"):
        catalog.read_table("orders")

    r = api.post("/segments/orders__0__0/reingest")
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    deadline = time.monotonic() + 60
    while True:
        jobs = {j["id"]: j for j in api.get("/reingestJobs").json()}
        if jobs[job_id]["state"] != "RUNNING" or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert jobs[job_id]["state"] == "SUCCEEDED", jobs[job_id]
    assert canonical(catalog.read_table("orders").to_pylist()) == canonical(expected)
    entries = [e for e in catalog.manifest("orders").entries if e.partition == 0]
    assert [(e.seq, e.start, e.end, e.state.value) for e in entries] == [(0, 0, 30, "ONLINE")]


def test_reingest_refuses_a_second_job_for_the_same_segment_and_unknown_segments(
    api: TestClient, controller: Controller, catalog: Catalog, source_dir: Path
) -> None:
    _write_source(source_dir)
    assert api.post("/datastreams", json=spec_body("orders", source_dir)).status_code == 201
    controller.tick()
    _ingest(catalog, DatastreamSpec.parse(spec_body("orders", source_dir)), 0, 0, 10)
    # Another controller runs a job for the segment (its lease holds): the store says so.
    catalog.store.start_reingest(
        "orders",
        "orders__0__0",
        entry_id=catalog.manifest("orders").entries[0].id,
        owner="controller-2",
        now=controller.clock.now(),
        lease=60.0,
        trigger="api",
    )
    r = api.post("/segments/orders__0__0/reingest")
    assert r.status_code == 409 and "orders__0__0" in r.json()["message"]
    assert api.post("/segments/orders__0__9/reingest").status_code == 404
    assert api.post("/segments/nonsense/reingest").status_code == 422
