"""A worker's shared query (the default) with a ``files`` member on an empty directory: a
partition that appears later, with 30 lines, then 5 more, lands whole in the member's table.
Its start in the query's offsets was ``{}`` (falsy), taken for "no start", so only the last 5
lines were read and the shard was created at upper 30: nothing showed a gap (issue 35)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.ingest_support import uppers_or_empty
from millstream.catalog import Catalog
from millstream.clock import SYSTEM_CLOCK
from millstream.control.controller import Controller, ControlSettings
from millstream.control.registry import Registry
from millstream.control.worker import Worker
from millstream.control.workers import heartbeat
from millstream.datastream import DatastreamSpec

pytestmark = [pytest.mark.spark]


def _spec(name: str, path: Path) -> DatastreamSpec:
    return DatastreamSpec.parse(
        {
            "name": name,
            "source": {"kind": "files", "path": str(path)},
            "schema": {"id": "long"},
            "table": {"mode": "upsert", "primary_key": ["id"]},
        }
    )


def _lines(ids: range) -> str:
    return "".join(json.dumps({"id": i}) + "\n" for i in ids)


def test_a_member_starting_empty_ingests_every_line_of_a_partition_found_later(
    spark: Any, tmp_path: Path
) -> None:
    empty, busy = tmp_path / "empty", tmp_path / "busy"
    empty.mkdir()
    (busy / "0").mkdir(parents=True)
    (busy / "0" / "00000.jsonl").write_text(_lines(range(10)))
    cat = Catalog.open(home=tmp_path / "home")
    registry = Registry(cat.store)
    registry.create(_spec("fe", empty))
    registry.create(_spec("fb", busy))
    heartbeat(cat.store, "w1", status="RUNNING", info={}, clock=SYSTEM_CLOCK)
    controller = Controller(cat, controller_id="c1", settings=ControlSettings(worker_ttl=60.0))
    worker = Worker(
        cat,
        spark,
        worker_id="w1",
        settings=ControlSettings(worker_ttl=60.0),
        state_root=tmp_path / "state",
    )

    def run_until(done: Callable[[], bool], what: str, timeout: float = 240.0) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            controller.tick()
            worker.tick()
            time.sleep(0.3)

    try:
        run_until(lambda: uppers_or_empty(cat, "fb") == {0: 10}, "fb to commit its lines")
        assert worker.shared is not None and set(worker.shared.members) == {"fe", "fb"}
        (empty / "0").mkdir()
        (empty / "0" / "00000.jsonl").write_text(_lines(range(30)))
        run_until(lambda: uppers_or_empty(cat, "fe") == {0: 30}, "fe to commit partition 0")
        (empty / "0" / "00001.jsonl").write_text(_lines(range(30, 35)))
        run_until(lambda: uppers_or_empty(cat, "fe") == {0: 35}, "fe to commit 5 more")
        ids = sorted(r["id"] for r in cat.read_table("fe").to_pylist())
        assert ids == list(range(35)), "the partition's first lines were never read"
    finally:
        worker._stop_shared()
