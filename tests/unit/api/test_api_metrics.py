"""Metric semantics (issue 14): live table rows counted once per manifest version within a
bounded wait, the ingestion delay's timestamp kept by commits without records and cleared by a
rollback, the row counters' commit-log totals, and a scrape that never waits on a broker that
is down."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families

import millstream.api.rows as rows_module
from harness.api_support import TestClient, spec_body
from millstream.api import create_app
from millstream.api.rows import LiveRows
from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.control.controller import Controller
from millstream.datastream import DatastreamSpec
from millstream.ingest.decode import dead_letter_rows, decode_records
from millstream.ingest.sources import spec_reader
from millstream.ingest.sources.base import RAW_SCHEMA
from millstream.metastore.models import ShardAppend
from millstream.spark.runner import CommitLogTotals
from millstream.spark.sink import _row_counts, append_commit_log
from millstream.table.commit import StagedWrite, commit_writes
from millstream.table.writer import stage_rows

KEYS = 7


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _write(source_dir: Path, partition: int, lines: list[str]) -> None:
    d = source_dir / str(partition)
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{len(list(d.iterdir())):05d}.jsonl").write_text("".join(f"{x}\n" for x in lines))


def _ingest(catalog: Catalog, spec: DatastreamSpec, partition: int, lo: int, hi: int) -> Any:
    """What a write task and the sink's commit do for one range (no Spark): read, decode,
    stage the rows and the bad records, commit both tables in one transaction."""
    return _ingest_pieces(catalog, spec, partition, [(lo, hi)])


def _ingest_pieces(
    catalog: Catalog, spec: DatastreamSpec, partition: int, pieces: list[tuple[int, int]]
) -> Any:
    """One batch whose write tasks each staged one piece of the partition's range."""
    writes = [_staged(catalog, spec, partition, lo, hi) for lo, hi in pieces]
    return commit_writes(
        catalog.store,
        catalog.deep,
        spec.table_name,
        writes,
        dead_letter_table=spec.dead_letter_table,
    )


def _staged(catalog: Catalog, spec: DatastreamSpec, partition: int, lo: int, hi: int) -> Any:
    batches = list(spec_reader(spec.source).read_range(partition, lo, hi))
    raw = pa.Table.from_batches(batches).select(["partition", "offset", "key", "value"])
    n = raw.num_rows
    raw = raw.append_column("range_lo", pa.array([lo] * n, pa.int64()))
    raw = raw.append_column("range_hi", pa.array([hi] * n, pa.int64()))
    raw = raw.append_column("is_marker", pa.array([False] * n)).cast(RAW_SCHEMA)
    decoded = decode_records(catalog.table(spec.table_name).spec, raw)
    data = stage_rows(catalog.deep, catalog.table(spec.table_name).spec, decoded.rows)
    dl_spec = catalog.table(spec.dead_letter_table).spec
    dead = stage_rows(catalog.deep, dl_spec, dead_letter_rows(decoded.dead))
    return StagedWrite({partition: (lo, hi)}, data, dead)


@pytest.fixture
def orders(api: TestClient, controller: Controller, source_dir: Path) -> DatastreamSpec:
    """An upsert datastream over a files source whose partition 0 holds 40 records of 7 keys
    and 2 bad records, none ingested yet."""
    lines = [json.dumps({"id": i % KEYS, "status": f"v{i}"}) for i in range(40)]
    lines[10:10] = ["not json", "{"]
    _write(source_dir, 0, lines)
    body = spec_body("orders", source_dir)
    assert api.post("/datastreams", json=body).status_code == 201
    controller.tick()
    return DatastreamSpec.parse(body)


def test_table_rows_are_the_live_rows_counted_once_per_manifest_version(
    api: TestClient,
    catalog: Catalog,
    orders: DatastreamSpec,
    source_dir: Path,
    clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _ingest(catalog, orders, 0, 0, 42)
    assert catalog.manifest("orders").row_count == 40
    reads: list[int] = []
    real = rows_module.read_manifest

    def counted(deep: Any, manifest: Any, **kwargs: Any) -> pa.Table:
        reads.append(manifest.version)
        return real(deep, manifest, **kwargs)

    monkeypatch.setattr(rows_module, "read_manifest", counted)

    first = _samples(api.get("/metrics").text)
    second = _samples(api.get("/metrics").text)

    assert first["millstream_table_rows", (("table", "orders"),)] == KEYS
    assert first["millstream_table_rows", (("table", "orders__dead_letter"),)] == 2
    assert second == first
    assert len(reads) == 1, "a scrape of an unchanged version reads nothing"

    _write(source_dir, 0, [json.dumps({"id": 100, "status": "new"})])
    _ingest(catalog, orders, 0, 42, 43)
    third = _samples(api.get("/metrics").text)

    # A table is read at most once per interval: the count of version 1 stands meanwhile.
    assert third["millstream_table_rows", (("table", "orders"),)] == KEYS
    assert reads == [1]
    clock.advance(rows_module.DEFAULT_MIN_INTERVAL)
    fourth = _samples(api.get("/metrics").text)
    assert fourth["millstream_table_rows", (("table", "orders"),)] == KEYS + 1
    assert reads == [1, 2], "the new version, once"


def test_a_scrape_waits_for_a_slow_count_only_as_long_as_its_bound(
    catalog: Catalog, orders: DatastreamSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    _ingest(catalog, orders, 0, 0, 42)
    release = threading.Event()
    real = rows_module.read_manifest

    def slow(*args: Any, **kwargs: Any) -> pa.Table:
        release.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(rows_module, "read_manifest", slow)
    live = LiveRows(catalog, wait=0.2)

    started = time.monotonic()
    got = live.rows()
    assert time.monotonic() - started < 5
    assert "orders" not in got, "not counted yet: nothing to report"
    assert got["orders__dead_letter"] == 2, "append tables need no read"
    live.rows()
    assert live.reads == 1, "one count of a table at a time"

    release.set()
    deadline = time.monotonic() + 30
    while live.rows().get("orders") is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert live.rows()["orders"] == KEYS
    assert live.reads == 1


def test_a_commit_without_records_keeps_the_last_record_timestamp_and_a_rollback_clears_it(
    catalog: Catalog, orders: DatastreamSpec
) -> None:
    store = catalog.store
    store.compare_and_append(
        "orders", [ShardAppend(0, 0, 5, 0, "a.parquet", 5, 10, last_record_ms=1_000)]
    )
    store.compare_and_append("orders", [ShardAppend(0, 5, 8, 0, None, 0)])  # markers only

    assert store.get_shard("orders", 0).last_record_ms == 1_000  # type: ignore[union-attr]

    store.compare_and_append(
        "orders", [ShardAppend(0, 8, 9, 0, "b.parquet", 1, 10, last_record_ms=2_000)]
    )
    assert store.get_shard("orders", 0).last_record_ms == 2_000  # type: ignore[union-attr]

    store.rollback_partition("orders", 0, 1, dry_run=False)

    assert store.get_shard("orders", 0).last_record_ms is None  # type: ignore[union-attr]


def test_only_appended_ranges_are_counted_and_a_log_is_read_once(
    catalog: Catalog, orders: DatastreamSpec, tmp_path: Path
) -> None:
    first = _ingest(catalog, orders, 0, 0, 42)
    assert _row_counts(first) == {"consumed": {"0": 42}, "dead_lettered": {"0": 2}}
    again = _ingest(catalog, orders, 0, 0, 42)  # a replay: already persisted, dropped
    assert _row_counts(again) == {"consumed": {}, "dead_lettered": {}}

    log = tmp_path / "commits.jsonl"
    line = json.dumps({"batch_id": 0, **_row_counts(first)})
    log.write_text(line + "\n" + line[:10])  # the second line is being written
    totals = CommitLogTotals()
    assert totals.update(log) == {0: {"consumed": 42, "dead_lettered": 2}}
    with log.open("a") as f:
        f.write(line[10:] + "\n")
    assert totals.update(log) == {0: {"consumed": 84, "dead_lettered": 4}}
    assert totals.update(log) == {0: {"consumed": 84, "dead_lettered": 4}}

    log.unlink()  # the state directory was cleaned: a new log adds on, never down
    # Longer than the old one (and maybe with its inode): read from its start all the same.
    newer = json.dumps({"batch_id": 7, **_row_counts(first)})
    log.write_text((newer + "\n") * 3)
    assert totals.update(log) == {0: {"consumed": 210, "dead_lettered": 10}}


def test_a_log_unchanged_since_its_last_read_is_not_opened_and_every_append_is_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker updates every table's totals each heartbeat: a log with nothing new is not
    opened, and a line appended within the file system's timestamp granularity (the same
    modification time) is counted all the same."""
    log = tmp_path / "commits.jsonl"
    line = json.dumps({"batch_id": 0, "consumed": {"0": 5}, "dead_lettered": {}})
    log.write_text(line + "\n")
    totals = CommitLogTotals()
    assert totals.update(log) == {0: {"consumed": 5, "dead_lettered": 0}}
    opened: list[str] = []
    real_open = Path.open

    def counted(self: Path, *args: Any, **kwargs: Any) -> Any:
        opened.append(self.name)
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", counted)
    for _ in range(3):
        assert totals.update(log) == {0: {"consumed": 5, "dead_lettered": 0}}
    assert opened == []

    before = log.stat()
    with real_open(log, "a") as f:
        f.write(line + "\n")
    os.utime(log, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert totals.update(log) == {0: {"consumed": 10, "dead_lettered": 0}}
    assert opened == ["commits.jsonl"]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_a_scrape_with_the_broker_down_returns_within_its_timeout_with_the_stored_series(
    catalog: Catalog, controller: Controller, clock: ManualClock
) -> None:
    timeout = 1.0
    app = create_app(catalog, controller=controller, clock=clock, upstream_timeout=timeout)
    kafka = {
        "kind": "kafka",
        "bootstrap_servers": f"127.0.0.1:{_closed_port()}",
        "topic": "orders",
        "options": {"log_level": "0"},
    }
    with TestClient(app) as api:
        api.post("/datastreams", json=spec_body("orders", Path("/unused"), source=kafka))
        controller.tick()
        now_ms = round(clock.now() * 1000)
        catalog.store.compare_and_append(
            "orders", [ShardAppend(0, 0, 5, 0, None, 0, 0, now_ms - 4_000)]
        )

        started = time.monotonic()
        r = api.get("/metrics")
        elapsed = time.monotonic() - started

    assert r.status_code == 200
    assert elapsed < 3 * timeout + 1, f"the scrape took {elapsed:.1f}s"
    m = _samples(r.text)
    p0 = (("partition", "0"), ("table", "orders"))
    assert ("millstream_offset_lag", p0) not in m, "the latest offset is unknown"
    # From the metadata store alone: the delay (caught up is unknown), rows, states.
    assert m["millstream_ingestion_delay_ms", p0] == 4_000
    assert m["millstream_table_rows", (("table", "orders"),)] == 0
    assert m["millstream_datastreams", (("state", "READY"),)] == 1


def test_a_rotated_commit_log_is_bounded_on_disk_and_its_totals_lose_no_line(
    tmp_path: Path,
) -> None:
    """A writer that runs for months: the sink rotates its log past a size, so the state
    directory holds at most two files; a reader that last looked before a rotation finishes
    the rotated file before it reads the new one, so no batch is missed or counted twice."""
    log = tmp_path / "commits.jsonl"
    totals = CommitLogTotals()
    written = 0
    for batch in range(500):
        entry = {"batch_id": batch, "at": 1000.0 + batch, "rows": 3, "lost_race": batch % 7 == 0}
        append_commit_log(log, {**entry, "consumed": {"0": 3}, "dead_lettered": {}}, limit=2_000)
        written += 1
        if batch % 13 == 0:  # the heartbeat reads now and then, rotations fall in between
            totals.update(log)
    totals.update(log)
    assert totals.batches == written == 500
    assert totals.rows == 1500 and totals.partitions == {0: {"consumed": 1500, "dead_lettered": 0}}
    assert totals.lost_races == len([b for b in range(500) if b % 7 == 0])
    assert totals.last_at == 1499.0
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["commits.jsonl", "commits.jsonl.1"]
    assert all((tmp_path / f).stat().st_size <= 2_000 + 200 for f in files)


def test_a_split_partition_counts_only_the_pieces_that_appended(
    catalog: Catalog, orders: DatastreamSpec
) -> None:
    """A batch that split partition 0 over two tasks, after a peer committed it up to 20:
    the first piece (the two bad records among its 15) is dropped, the second trimmed; only
    the second counts, as the records its task staged (an upper bound)."""
    _ingest(catalog, orders, 0, 0, 20)

    result = _ingest_pieces(catalog, orders, 0, [(0, 15), (15, 42)])

    assert [s.decision.outcome.value for s in result.table.shards] == ["drop", "trim"]
    assert result.table.outcome(0).value == "trim"  # the shard moved: its last piece says so
    assert _row_counts(result) == {"consumed": {"0": 27}, "dead_lettered": {}}


def test_a_writers_commit_log_totals_keep_only_the_commits_its_rate_reads(tmp_path: Path) -> None:
    """The worker reads every table's commit log for its counters for as long as it runs: the
    commits kept for the rows/s of progress output are those of the last minute (4,096 each
    before: ~0.5 MB a table at 100 tables, issue 38), while the totals, the first commit's
    time and the rate over the last 10 s are what the whole log says."""
    log = tmp_path / "commits.jsonl"
    lines = [
        json.dumps({"batch_id": i, "at": 1000.0 + i, "rows": 10, "consumed": {"0": 10}})
        for i in range(600)
    ]
    log.write_text("".join(line + "\n" for line in lines))
    totals = CommitLogTotals()
    assert totals.update(log) == {0: {"consumed": 6000, "dead_lettered": 0}}
    assert totals.batches == 600 and totals.rows == 6000
    assert totals.first_at == 1000.0 and totals.last_at == 1599.0
    assert len(totals.recent) <= 61, f"{len(totals.recent)} commits kept"
    assert totals.rows_per_second(1599.0, window=10.0) == pytest.approx(10.0)
    assert totals.rows_per_second(1599.0, window=60.0) == pytest.approx(10.0)
