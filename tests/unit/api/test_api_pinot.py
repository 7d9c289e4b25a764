"""Pinot's controller endpoints with Pinot's paths and shapes: the pauseless-consumption guide's
enablement procedure (seed 003: pause, check that ``_segmentToConsumingInfoMap`` is empty,
resume), its rollback (``deleteSegmentsFromSequenceNum``) and its debugging calls, against a
real controller loop and worker heartbeats."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from harness.api_support import TestClient, beat, spec_body, store_snapshot, write_lines
from millstream.api import create_app
from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.control.controller import Controller
from millstream.control.workers import heartbeat
from millstream.errors import SegmentUnavailableError
from millstream.metastore.models import SegmentState, ShardAppend
from millstream.sealing.sealer import Sealer
from millstream.table.writer import commit_staged, stage_rows


def commit(catalog: Catalog, partition: int, lo: int, hi: int) -> None:
    catalog.store.compare_and_append(
        "orders",
        [ShardAppend(partition, lo, hi, 0, f"data/orders/{partition}-{lo}.parquet", hi - lo, 10)],
        writer_id="worker-a",
        batch_id=0,
    )


@pytest.fixture
def orders(
    api: TestClient, controller: Controller, catalog: Catalog, clock: ManualClock, source_dir: Path
) -> None:
    """READY ``orders``: partition 0 has segments 0..1 (offsets 0..10), partition 1 segment 0
    (0..4); ``worker-a`` runs its writer."""
    write_lines(source_dir, 0, 12)
    write_lines(source_dir, 1, 4)
    assert api.post("/datastreams", json=spec_body("orders", source_dir)).status_code == 201
    beat(catalog, clock, "worker-a", "orders")
    controller.tick()
    commit(catalog, 0, 0, 6)
    commit(catalog, 0, 6, 10)
    commit(catalog, 1, 0, 4)
    clock.advance(1.0)


def test_the_pauseless_enablement_procedure_works_as_the_pinot_guide_writes_it(
    api: TestClient, orders: None, catalog: Catalog, clock: ManualClock
) -> None:
    # Before: each partition consumes into its next segment, on worker-a.
    info = api.get("/tables/orders/consumingSegmentsInfo").json()
    consuming = info["_segmentToConsumingInfoMap"]
    assert sorted(consuming) == ["orders__0__2", "orders__1__1"]
    (p0,) = consuming["orders__0__2"]
    assert (p0["serverName"], p0["consumerState"]) == ("worker-a", "CONSUMING")
    assert p0["partitionToOffsetMap"] == {"0": "10"}
    assert p0["partitionOffsetInfo"] == {
        "currentOffsetsMap": {"0": "10"},
        "latestUpstreamOffsetMap": {"0": "12"},
        "recordsLagMap": {"0": "2"},
        "availabilityLagMsMap": {"0": "1000"},
    }
    assert (info["serversFailingToRespond"], info["serversUnparsableRespond"]) == (0, 0)
    assert info["partitions"][0]["current_offset"] == 10  # Millstream's own fields stay
    status = api.get("/tables/orders/pauseStatus").json()
    assert (status["pauseFlag"], status["comment"]) == (False, "Table is unpaused.")
    assert status["consumingSegments"] == ["orders__0__2", "orders__1__1"]

    # Step 1: pause. The writer is still finishing: its segments are still listed.
    paused = api.post("/tables/orders/pauseConsumption", params={"comment": "enable pauseless"})
    assert paused.status_code == 200, paused.text
    body = paused.json()
    assert (body["pauseFlag"], body["reasonCode"], body["state"]) == (
        True,
        "ADMINISTRATIVE",
        "PAUSED",
    )
    assert body["comment"] == "enable pauseless"
    assert body["consumingSegments"] == ["orders__0__2", "orders__1__1"]
    assert api.get("/datastreams/orders").json()["state"] == "PAUSED"

    # Verify inactive: once the worker reports its writer stopped, the map is empty.
    heartbeat(catalog.store, "worker-a", status="RUNNING", info={"writers": []}, clock=clock)
    assert (
        api.get("/tables/orders/consumingSegmentsInfo").json()["_segmentToConsumingInfoMap"] == {}
    )
    assert api.get("/tables/orders/pauseStatus").json()["consumingSegments"] == []
    # Pausing again is harmless, as in Pinot.
    assert api.post("/tables/orders/pauseConsumption").json()["pauseFlag"] is True

    # Steps 2-3: pauseless is on (Millstream's default; the guide's PAUSELESS gauge).
    assert 'millstream_pauseless_enabled{datastream="orders"} 1.0' in api.get("/metrics").text

    # Step 4: resume where it stopped.
    resumed = api.post("/tables/orders/resumeConsumption").json()
    assert (resumed["pauseFlag"], resumed["state"], resumed["reasonCode"]) == (
        False,
        "READY",
        None,
    )
    assert api.get("/datastreams/orders").json()["state"] == "READY"


def test_resume_refuses_to_skip_or_replay_and_unknown_tables_are_404(
    api: TestClient, orders: None, catalog: Catalog
) -> None:
    api.post("/tables/orders/pauseConsumption")
    before = store_snapshot(catalog.store)
    for where in ("smallest", "largest"):
        r = api.post("/tables/orders/resumeConsumption", params={"consumeFrom": where})
        assert r.status_code == 422
        assert r.json()["field"] == "consumeFrom" and where in r.json()["message"]
    assert store_snapshot(catalog.store) == before  # still PAUSED, nothing changed
    ok = api.post("/tables/orders/resumeConsumption", params={"consumeFrom": "lastConsumed"})
    assert ok.json()["state"] == "READY"
    for path in ("pauseStatus", "pauselessDebugInfo", "consumingSegmentsInfo"):
        assert api.get(f"/tables/nope/{path}").status_code == 404
    assert api.post("/tables/nope/pauseConsumption").status_code == 404
    # A dead-letter table has no pause of its own.
    assert api.post("/tables/orders__dead_letter/pauseConsumption").status_code == 404


def test_delete_segments_from_sequence_num_rolls_back_each_named_partition(
    api: TestClient, orders: None, catalog: Catalog
) -> None:
    url = "/deleteSegmentsFromSequenceNum/orders_REALTIME"
    before = store_snapshot(catalog.store)
    dry = api.delete(url, params={"segments": "orders__0__1,orders__1__0"})
    assert dry.status_code == 200, dry.text
    assert dry.json()["dryRun"] is True
    assert [p["partition"] for p in dry.json()["partitions"]] == [0, 1]
    assert store_snapshot(catalog.store) == before  # a dry run (the default) changes nothing

    running = api.delete(url, params={"segments": "orders__0__1", "dryRun": "false"})
    assert running.status_code == 409 and "pause it" in running.json()["message"]
    for bad in ("orders__0__1,orders__0__0", "other__0__1", "nonsense", ""):
        r = api.delete(url, params={"segments": bad, "dryRun": "false"})
        assert r.status_code == 422, (bad, r.text)
    assert store_snapshot(catalog.store) == before

    api.post("/tables/orders/pauseConsumption")
    done = api.delete(url, params={"segments": "orders__0__1,orders__1__0", "dryRun": "false"})
    assert done.status_code == 200, done.text
    shards = {sh.partition: sh.upper for sh in catalog.store.list_shards("orders")}
    assert shards == {0: 6, 1: 0}  # each partition re-reads from the named segment's start
    names = [e.name for e in catalog.manifest("orders").entries]
    assert names == ["orders__0__0"]


def test_pauseless_debug_info_has_pinots_fields_and_millstreams(
    api: TestClient, orders: None, catalog: Catalog
) -> None:
    body = api.get("/tables/orders/pauselessDebugInfo").json()
    assert (body["instanceToErrorSegmentsMap"], body["committingSegments"]) == ({}, [])
    assert body["millstream"]["table"] == "orders"
    # These entries' files do not exist: seals fail, and after two the segment is ERROR.
    sealer = Sealer(catalog, "orders", max_failures=2)
    for _ in range(2):
        with pytest.raises(SegmentUnavailableError):
            sealer.seal_partition(0, force=True)
    errors = api.get("/tables/orders/pauselessDebugInfo").json()["instanceToErrorSegmentsMap"]
    assert list(errors.values()) == [["orders__0__0"]]
    assert api.get("/reingestSegment/jobs").json() == []


def _write(catalog: Catalog, partition: int, lo: int, n: int) -> None:
    """A micro-batch of real rows, committed as a writer commits it."""
    spec = catalog.table("orders").spec
    rows = [
        {
            "id": o % 7,
            "status": "new",
            "_ms_partition": partition,
            "_ms_offset": o,
            "_ms_tombstone": False,
        }
        for o in range(lo, lo + n)
    ]
    table = pa.Table.from_pylist(rows, schema=spec.arrow_schema(system_columns=True))
    staged = stage_rows(catalog.deep, spec, table)
    commit_staged(
        catalog.store, catalog.deep, "orders", staged, {partition: (lo, lo + n)}, {partition: 0}
    )


def test_force_commit_seals_the_named_segments_now_and_its_job_outlives_the_controller(
    api: TestClient, controller: Controller, catalog: Catalog, clock: ManualClock, source_dir: Path
) -> None:
    assert api.post("/datastreams", json=spec_body("orders", source_dir)).status_code == 201
    controller.tick()
    _write(catalog, 0, 0, 5)
    _write(catalog, 0, 5, 5)
    _write(catalog, 1, 0, 4)
    sealer = Sealer(catalog, "orders", clock=clock)
    assert sealer.seal_due() == []  # far below the flush thresholds: nothing is due

    r = api.post("/tables/orders/forceCommit")
    assert r.status_code == 200, r.text
    job_id = r.json()["forceCommitJobId"]
    assert r.json()["segmentsForceCommitted"] == ["orders__0__0", "orders__0__1", "orders__1__0"]
    status = api.get(f"/tables/forceCommitStatus/{job_id}").json()
    assert (status["jobType"], status["tableName"]) == ("FORCE_COMMIT", "orders")
    assert status["numberOfSegmentsYetToBeCommitted"] == 3

    _write(catalog, 1, 4, 3)  # after the request: part of partition 1's run, sealed with it
    sealed = sealer.seal_due()
    assert sorted(r.partition for r in sealed) == [0, 1]
    assert all(e.state is SegmentState.ONLINE for e in catalog.manifest("orders").entries)

    # Another controller (a restart) answers for the same job, from the metadata store.
    other = create_app(catalog, controller=controller, clock=clock)
    with TestClient(other) as again:
        done = again.get(f"/tables/forceCommitStatus/{job_id}").json()
    assert (done["numberOfSegmentsYetToBeCommitted"], done["segmentsYetToBeCommitted"]) == (0, [])

    # Segments committed after the job are not forced: they wait for their thresholds.
    _write(catalog, 0, 10, 5)
    assert sealer.seal_due() == []
    assert api.get("/tables/forceCommitStatus/nope").status_code == 404
    assert api.post("/tables/nope/forceCommit").status_code == 404
