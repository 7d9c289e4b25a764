"""Helpers of the REST API tests: valid spec bodies, a snapshot of every metadata row (to show
a rejected request changed nothing), a source directory, a worker heartbeat, a stand-in writer
on a worker, a real server."""

from __future__ import annotations

import socket
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI
from sqlalchemy import select

from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.control.registry import Registry
from millstream.control.worker import Worker, _Writer
from millstream.control.workers import heartbeat
from millstream.metastore import schema
from millstream.metastore.store import MetadataStore
from millstream.spark.runner import DatastreamRunner
from millstream.storage.statedir import StateDirectory

with warnings.catch_warnings():
    # starlette 1.x prefers the httpx2 fork for its TestClient; plain httpx works the same here.
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

__all__ = ["TestClient"]

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def spec_body(name: str, source_dir: Path, **extra: Any) -> dict[str, Any]:
    """A valid datastream spec body (JSON) reading the files under ``source_dir``."""
    return {
        "name": name,
        "source": {"kind": "files", "path": str(source_dir)},
        "schema": {"id": "long", "status": "string"},
        "table": {"mode": "upsert", "primary_key": ["id"]},
        **extra,
    }


def write_lines(source_dir: Path, partition: int, n: int) -> None:
    """Append ``n`` JSON lines to partition ``partition`` of a files source (offsets grow)."""
    d = source_dir / str(partition)
    d.mkdir(parents=True, exist_ok=True)
    existing = len(list(d.iterdir()))
    lines = "".join(f'{{"id": {i}, "status": "new"}}\n' for i in range(n))
    (d / f"{existing:05d}.jsonl").write_text(lines)


def store_snapshot(store: MetadataStore) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every metadata table (datastreams, events, leases, shards, entries ...)."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    with store.read() as conn:
        for table in [
            *schema.metadata.sorted_tables,
            *schema.control.sorted_tables,
            *schema.sealing.sorted_tables,
            *schema.jobs.sorted_tables,
            *schema.evolution.sorted_tables,
            *schema.ownership.sorted_tables,
        ]:
            q = select(table).order_by(*table.primary_key.columns)
            out[table.name] = [tuple(r) for r in conn.execute(q)]
    return out


def add_running_writer(
    worker: Worker, catalog: Catalog, ds: str, state_root: Path, done: threading.Event
) -> None:
    """An active writer of ``ds`` on ``worker`` whose query thread runs (no Spark: it waits
    for ``done``)."""
    spec = Registry(catalog.store).get(ds).spec
    sd = StateDirectory(state_root, ds)
    runner = DatastreamRunner(spec, catalog, None, writer_id=worker.id, state_dir=sd)
    thread = threading.Thread(target=done.wait, name=f"writer-{ds}", daemon=True)
    thread.start()
    worker.writers[ds] = _Writer(ds, "active", sd, runner=runner, thread=thread)


def running_worker(
    catalog: Catalog,
    clock: ManualClock,
    state_root: Path,
    done: threading.Event,
    *datastreams: str,
    worker_id: str = "w1",
) -> Worker:
    """A :class:`Worker` (no Spark) whose stand-in writers of ``datastreams`` run until
    ``done`` (:func:`add_running_writer`), with its state under ``state_root``."""
    worker = Worker(catalog, None, worker_id=worker_id, clock=clock, state_root=state_root)
    for ds in datastreams:
        add_running_writer(worker, catalog, ds, state_root, done)
    return worker


def beat(
    catalog: Catalog, clock: ManualClock, worker_id: str, *running: str, status: str = "RUNNING"
) -> None:
    """A worker heartbeat reporting a running writer for each datastream in ``running``."""
    writers = [{"datastream": ds, "role": "active", "running": True} for ds in running]
    heartbeat(catalog.store, worker_id, status=status, info={"writers": writers}, clock=clock)


@contextmanager
def serve(app: FastAPI) -> Iterator[str]:
    """Serve ``app`` with uvicorn on a free port in a thread; yields its URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def run_failing_writer(
    catalog: Catalog, controller: Any, clock: ManualClock, state_root: Path, worker_id: str
) -> Any:
    """Run the writers of the datastreams created so far on a real :class:`Worker` whose
    query cannot start for every datastream whose source cannot be read (as a Kafka topic
    that does not exist): the worker heartbeats its writers' health. Spark is a stand-in
    that accepts the query's set-up calls; each member's start reads its source first."""
    from unittest.mock import MagicMock

    from millstream.control.worker import Worker

    heartbeat(catalog.store, worker_id, status="RUNNING", info={}, clock=clock)
    controller.tick()  # READY, assigned to the worker
    worker = Worker(
        catalog,
        MagicMock(name="spark"),
        worker_id=worker_id,
        settings=controller.settings,
        clock=clock,
        state_root=state_root,
    )
    worker.tick()
    assert worker.shared_thread is not None
    worker.shared_thread.join(30)  # the member's start failed
    worker._heartbeat()
    return worker


def ingest_range(catalog: Catalog, spec: Any, partition: int, lo: int, hi: int) -> None:
    """What a write task and the sink's commit do for one range of ``spec``'s source (no
    Spark): read, decode, stage the rows and the bad records, commit both tables at once."""
    import pyarrow as pa

    from millstream.ingest.decode import dead_letter_rows, decode_records
    from millstream.ingest.sources import spec_reader
    from millstream.ingest.sources.base import RAW_SCHEMA
    from millstream.table.commit import StagedWrite, commit_writes
    from millstream.table.writer import stage_rows

    batches = list(spec_reader(spec.source).read_range(partition, lo, hi))
    raw = pa.Table.from_batches(batches).select(["partition", "offset", "key", "value"])
    n = raw.num_rows
    raw = raw.append_column("range_lo", pa.array([lo] * n, pa.int64()))
    raw = raw.append_column("range_hi", pa.array([hi] * n, pa.int64()))
    raw = raw.append_column("is_marker", pa.array([False] * n)).cast(RAW_SCHEMA)
    table_spec = catalog.table(spec.table_name).spec
    decoded = decode_records(table_spec, raw)
    data = stage_rows(catalog.deep, table_spec, decoded.rows)
    dl_spec = catalog.table(spec.dead_letter_table).spec
    dead = stage_rows(catalog.deep, dl_spec, dead_letter_rows(decoded.dead))
    commit_writes(
        catalog.store,
        catalog.deep,
        spec.table_name,
        [StagedWrite({partition: (lo, hi)}, data, dead)],
        dead_letter_table=spec.dead_letter_table,
    )
