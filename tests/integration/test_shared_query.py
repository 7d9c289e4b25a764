"""A worker runs all its datastreams in ONE Spark streaming query, and each
keeps the contract it has alone: its table equals the model of its source, a pause and a
resume of one member lose and duplicate nothing of it or of the others, and a member whose
bad record fails it (``bad_records: fail``) goes to ERROR alone while the others run on. A
pause, a resume and a new datastream change the running query's members without restarting it
(its run id, in the worker's status, stays the same)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.ingest_support import TABLE_SECTIONS, assert_table_matches_source, uppers_or_empty
from millstream.catalog import Catalog
from millstream.clock import SYSTEM_CLOCK
from millstream.control.controller import Controller, ControlSettings
from millstream.control.registry import Registry
from millstream.control.worker import Worker
from millstream.control.workers import heartbeat, list_workers
from millstream.core.lifecycle import Command, State
from millstream.datastream import DatastreamSpec
from millstream.ingest.sources import config_for
from millstream.ingest.sources.generator import (
    ORDERS_SCHEMA,
    GeneratorConfig,
    generate,
    partition_total,
)
from millstream.reference.oracle import RawRecord

pytestmark = [pytest.mark.spark]


def _spec(name: str, mode: str, source: dict[str, Any], **extra: Any) -> DatastreamSpec:
    return DatastreamSpec.parse(
        {
            "name": name,
            "source": {"kind": "generator", **source},
            "table": dict(TABLE_SECTIONS[mode]),
            "schema": dict(ORDERS_SCHEMA),
            **extra,
        }
    )


def _records(spec: DatastreamSpec) -> list[RawRecord]:
    """Every record the generator of ``spec`` produces (its ``total``)."""
    cfg = GeneratorConfig(**config_for(spec.source)[1])
    out: list[RawRecord] = []
    for p in range(cfg.partitions):
        hi = partition_total(cfg.total, cfg.partitions, p)
        assert hi is not None
        out += [(p, o, k, v) for o, k, v in generate(cfg, p, 0, hi)]
    return out


def _ends(records: list[RawRecord]) -> dict[int, int]:
    out: dict[int, int] = {}
    for p, o, _, _ in records:
        out[p] = max(out.get(p, 0), o + 1)
    return out


def test_datastreams_share_one_query_and_each_keeps_its_contract(
    spark: Any, tmp_path: Path
) -> None:
    cat = Catalog.open(home=tmp_path / "home")
    registry = Registry(cat.store)
    # 400 rows/s each: ingestion spans the membership changes below.
    a = _spec("ga", "dedup", {"seed": 1, "partitions": 2, "rate": 400, "total": 4000})
    b = _spec("gb", "upsert", {"seed": 2, "partitions": 3, "rate": 400, "total": 4000})
    bad = _spec(
        "gc",
        "upsert",
        {"seed": 3, "partitions": 2, "total": 1000, "malformed_fraction": 0.05},
        bad_records="fail",
    )
    for spec in (a, b, bad):
        registry.create(spec)
    heartbeat(cat.store, "w1", status="RUNNING", info={}, clock=SYSTEM_CLOCK)
    controller = Controller(cat, controller_id="c1", settings=ControlSettings(worker_ttl=60.0))
    worker = Worker(
        cat,
        spark,
        worker_id="w1",
        settings=ControlSettings(worker_ttl=60.0),
        state_root=tmp_path / "state",
    )
    queries_seen: set[int] = set()

    def run_until(done: Callable[[], bool], what: str, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            controller.tick()
            worker.tick()
            queries_seen.add(len(spark.streams.active))
            time.sleep(0.3)

    try:
        # The bad record puts gc in ERROR, and gc alone: ga and gb keep ingesting.
        run_until(lambda: registry.get("gc").state is State.ERROR, "gc to fail")
        assert "BadRecordError" in (registry.get("gc").last_error or "")
        run_until(
            lambda: (
                sum(uppers_or_empty(cat, a.table_name).values()) > 0
                and worker.shared is not None
                and set(worker.shared.members) == {"ga", "gb"}
                and worker.shared.status()["run_id"] is not None
            ),
            "ga to commit in a query without gc",
        )

        # From here on no membership change restarts the query: its run id stays.
        run_id = worker.shared.status()["run_id"]

        # Pause gb mid-stream: gb leaves the running query, ga runs on.
        registry.command("gb", Command.PAUSE)
        run_until(
            lambda: worker.shared is not None and set(worker.shared.members) == {"ga"},
            "the shared query to run ga alone",
        )
        paused_at = sum(uppers_or_empty(cat, b.table_name).values())
        before = sum(uppers_or_empty(cat, a.table_name).values())
        run_until(
            lambda: sum(uppers_or_empty(cat, a.table_name).values()) > before,
            "ga to commit while gb is paused",
        )
        assert sum(uppers_or_empty(cat, b.table_name).values()) == paused_at
        # gb joins the running query again, and a new datastream gd joins it too.
        registry.command("gb", Command.RESUME)
        d = _spec("gd", "append", {"seed": 4, "partitions": 2, "rate": 400, "total": 1000})
        registry.create(d)

        records = {spec.name: _records(spec) for spec in (a, b, d)}
        run_until(
            lambda: all(
                uppers_or_empty(cat, s.table_name) == _ends(records[s.name]) for s in (a, b, d)
            ),
            "ga, gb and gd to catch up",
        )
        assert set(worker.shared.members) == {"ga", "gb", "gd"}
        for spec in (a, b, d):
            assert_table_matches_source(cat, spec, records[spec.name])
        # every datastream in one query, never one each
        assert max(queries_seen) == 1
        assert registry.get("ga").state is State.READY
        # gb left and joined, gd joined, and the query never restarted (the worker says so)
        status = {w.id: w for w in list_workers(cat.store)}["w1"].info["shared_query"]
        assert status["run_id"] == run_id, "a membership change restarted the shared query"
        assert status["members"] == ["ga", "gb", "gd"]
        assert status["joins"] == 2 and status["leaves"] == 1
    finally:
        worker._stop_shared()
    assert not any(w.state_dir.held for w in worker.writers.values())
    assert not spark.streams.active
