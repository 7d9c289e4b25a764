"""One table of a datastream of many topics paused, rolled back and resumed on its own, over
the real broker, with a worker's shared query and the REST API: while ``alpha`` is paused its
writer commits nothing (its uppers and its manifest stay as they are although its topic keeps
growing) and the other tables keep committing; a rollback of alpha is allowed (its own pause)
while one of beta is refused (beta runs); on resume alpha goes on exactly at its uppers and
every table equals the model of its own topic: nothing lost, nothing read twice."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.api_support import TestClient
from harness.ingest_support import assert_table_matches_source, produce_exact, uppers_or_empty
from millstream.api import create_app
from millstream.catalog import Catalog
from millstream.clock import SYSTEM_CLOCK
from millstream.control.controller import Controller, ControlSettings
from millstream.control.worker import Worker
from millstream.control.workers import heartbeat, list_workers
from millstream.datastream import DatastreamSpec
from millstream.local.tansu import TansuBroker
from millstream.reference.oracle import RawRecord

pytestmark = [pytest.mark.kafka]


def _rows(n: int, tag: str) -> list[tuple[bytes | None, bytes | None]]:
    """``n`` records of 25 keys (updates after the first 25)."""
    return [
        (str(i % 25).encode(), json.dumps({"id": i % 25, "v": f"{tag}{i}"}).encode())
        for i in range(n)
    ]


def _ends(records: list[RawRecord]) -> dict[int, int]:
    out: dict[int, int] = {}
    for p, o, _, _ in records:
        out[p] = max(out.get(p, 0), o + 1)
    return out


@pytest.mark.spark
def test_one_table_pauses_rolls_back_and_resumes_while_the_others_commit(
    spark: Any, kafka_broker: TansuBroker, tmp_path: Path
) -> None:
    prefix = f"ml{uuid.uuid4().hex[:8]}"
    boot = kafka_broker.bootstrap
    names = ("alpha", "beta", "gamma")
    topics = {n: f"{prefix}.shop.{n}" for n in names}
    records: dict[str, list[RawRecord]] = {}
    for n, t in topics.items():
        kafka_broker.create_topic(t, partitions=2 if n == "alpha" else 1)
        rows = {0: _rows(30, n), 1: _rows(20, n.upper())} if n == "alpha" else {0: _rows(30, n)}
        records[n] = produce_exact(boot, t, rows)
    body = {
        "name": "shop",
        "source": {"kind": "kafka", "bootstrap_servers": boot, "topics": list(topics.values())},
        "table": {"mode": "upsert", "primary_key": ["id"]},
        "schema": {"id": "long", "v": "string"},
    }
    spec = DatastreamSpec.parse(body)
    members = spec.tables(topics.values()).members
    cat = Catalog.open(home=tmp_path / "home")
    heartbeat(cat.store, "w1", status="RUNNING", info={}, clock=SYSTEM_CLOCK)
    settings = ControlSettings(worker_ttl=60.0)
    controller = Controller(cat, controller_id="c1", settings=settings)
    worker = Worker(cat, spark, worker_id="w1", settings=settings, state_root=tmp_path / "state")
    api = TestClient(create_app(cat, controller=controller, upstream_timeout=10))

    def run_until(done: Callable[[], bool], what: str, timeout: float = 600.0) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            controller.tick()
            worker.tick()
            time.sleep(0.3)

    def caught_up(*tables: str) -> bool:
        return all(uppers_or_empty(cat, n) == _ends(records[n]) for n in tables)

    def running_members() -> set[str]:
        info = {w.id: w for w in list_workers(cat.store)}["w1"].info
        return {wr["member"] for wr in info["writers"] if wr.get("running")}

    def versions(table: str) -> tuple[int, int]:
        return cat.table(table).manifest_version, cat.table(
            f"{table}__dead_letter"
        ).manifest_version

    with api:
        try:
            assert api.post("/datastreams", json=body).status_code == 201
            run_until(lambda: caught_up(*names), "every table")

            paused = api.post("/datastreams/shop/tables/alpha/pause")
            assert paused.status_code == 200, paused.text
            assert paused.json()["paused_tables"] == ["alpha"]
            run_until(lambda: "shop.alpha" not in running_members(), "alpha's writer to stop")
            assert {"shop.beta", "shop.gamma"} <= running_members()
            uppers, before = uppers_or_empty(cat, "alpha"), versions("alpha")
            for n in names:
                more = {0: _rows(25, f"{n}2")}
                records[n] += produce_exact(boot, topics[n], more)
            run_until(lambda: caught_up("beta", "gamma"), "beta and gamma, alpha paused")
            for _ in range(10):  # alpha's topic has news: a few more ticks with it paused
                controller.tick()
                worker.tick()
                time.sleep(0.3)
            assert uppers_or_empty(cat, "alpha") == uppers, "alpha committed while paused"
            assert versions("alpha") == before, "alpha committed while paused"
            status = api.get("/tables/alpha/pauseStatus").json()
            assert (status["pauseFlag"], status["consumingSegments"]) == (True, [])
            assert api.get("/datastreams/shop").json()["state"] == "READY"

            # A rollback of alpha (paused on its own) re-reads its range on resume; one of
            # beta (running) is refused although a sibling table is paused.
            segs = api.get("/tables/alpha/segments").json()["partitions"]
            last = max(s["seq"] for p in segs if p["partition"] == 0 for s in p["segments"])
            rollback = "/tables/{t}/segments?partition=0&fromSequence={seq}&dryRun=false"
            rolled = api.delete(rollback.format(t="alpha", seq=last))
            assert rolled.status_code == 200, rolled.text
            assert rolled.json()["upper"]["to"] < uppers[0]
            assert api.delete(rollback.format(t="beta", seq=0)).status_code == 409

            resumed = api.post("/datastreams/shop/tables/alpha/resume")
            assert resumed.json()["paused_tables"] == []
            run_until(lambda: caught_up(*names), "alpha after its resume")
            for n in names:
                assert_table_matches_source(cat, members[n], records[n])
            assert api.get("/datastreams/shop").json()["state"] == "READY"
        finally:
            worker._stop_shared()
    assert not spark.streams.active
