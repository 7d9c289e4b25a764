"""Issue 3 acceptance: a writer killed with SIGKILL at the worst moments loses nothing and
duplicates nothing when it is started again.

The writer runs as a subprocess in its own session, either as ``millstream run`` (a running
writer's streaming query) or as ``millstream run --available-now`` (whose batches are Spark
jobs); a named fault point
(``MILLSTREAM_FAULTS``) makes it write a marker and hang at exactly the moment under test, and
the test then SIGKILLs the whole process group (the Python driver, its JVM and the Python
workers). A second run without faults, the same way, must finish the job; it runs in this
process (the same ``DatastreamRunner.run``, on the test session's warm SparkSession; the
streaming query is stopped once caught up) against the same home, writer id and checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.ingest_support import (
    Topic,
    assert_same_rows,
    assert_table_matches_source,
    kill_group,
    orders_spec,
    run_until_caught_up,
    shard_uppers,
    start_cli,
    wait_for_marker,
    write_spec,
    writer_commits,
)
from millstream.catalog import Catalog
from millstream.datastream import DatastreamSpec
from millstream.reference.oracle import RawRecord, expected_table
from millstream.spark.runner import DatastreamRunner
from millstream.storage.deepstore import table_data_prefix
from millstream.table.gc import collect_garbage

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

PER_PARTITION = 2_000  # 8,000 records
BATCH = 2_000  # 4 batches: 0..3
WRITER = "w"


@dataclass
class Crash:
    spec: DatastreamSpec
    home: Path
    topic: Topic


def crash_at(
    point: str, new_topic: Callable[..., Topic], tmp_path: Path, *, streaming: bool
) -> Crash:
    """Ingest 8,000 records and SIGKILL the writer when it reaches ``point`` in batch 1."""
    topic = new_topic(seed=11)
    topic.produce(PER_PARTITION)
    raw = orders_spec(
        f"crash-{point.replace('_', '-')}", topic, "upsert", max_records_per_batch=BATCH
    )
    spec = DatastreamSpec.parse(raw)
    spec_file = write_spec(tmp_path / "spec.yaml", raw)
    home, logs, faults = tmp_path / "home", tmp_path / "logs", tmp_path / "faults"
    proc = start_cli(
        spec_file,
        home,
        WRITER,
        logs,
        streaming=streaming,
        MILLSTREAM_FAULTS=f"{point}@1=hang",
        MILLSTREAM_FAULT_DIR=str(faults),
    )
    try:
        wait_for_marker(proc, faults / f"{point}-1")
    finally:
        kill_group(proc)
    return Crash(spec, home, topic)


def unreferenced(cat: Catalog, table: str) -> set[str]:
    files = {f.path for f in cat.deep.list_files(table_data_prefix(table))}
    return files - cat.store.referenced_files(table)


def below(records: list[RawRecord], uppers: dict[int, int]) -> list[RawRecord]:
    return [r for r in records if r[1] < uppers.get(r[0], 0)]


@pytest.mark.parametrize("streaming", [True, False], ids=["query", "jobs"])
def test_writer_killed_before_commit_resumes_without_loss_or_duplicates(
    streaming: bool, new_topic, spark, tmp_path: Path
) -> None:
    crash = crash_at("before_commit", new_topic, tmp_path, streaming=streaming)
    spec = crash.spec
    tables = (spec.table_name, spec.dead_letter_table)

    with Catalog.open(home=crash.home) as cat:
        # Killed with batch 1 staged but not committed: readers see exactly batch 0.
        uppers = shard_uppers(cat, spec.table_name)
        assert uppers == {p: BATCH // 4 for p in range(4)}
        expected, _ = expected_table(spec.table_spec(), below(crash.topic.records, uppers))
        assert_same_rows(cat.read_table(spec.table_name).to_pylist(), expected, what="at crash")
        leftovers = {t: unreferenced(cat, t) for t in tables}
        assert leftovers[spec.table_name], "batch 1's staged data file should be left behind"
        assert all(Path(p).name.startswith("b1-") for files in leftovers.values() for p in files), (
            leftovers
        )

    with Catalog.open(home=crash.home) as cat:
        runner = DatastreamRunner(spec, cat, spark, writer_id=WRITER)
        stats = run_until_caught_up(runner) if streaming else runner.run(available_now=True)
        assert stats.discarded_checkpoints == []  # a query's checkpoint agreed: batch 1 replays
        assert stats.restarts == 0
        assert shard_uppers(cat, spec.table_name) == crash.topic.ends()
        assert_table_matches_source(cat, spec, crash.topic.records)
        batches = [c["batch_id"] for c in writer_commits(crash.home, spec.name, WRITER)]
        # The query resumes at its batch 1; a jobs run starts at the shard uppers, numbering
        # its batches from 0 again.
        assert batches == ([0, 1, 2, 3] if streaming else [0, 0, 1, 2])

        # The killed attempt's staged files are garbage: nothing references them, and
        # collecting them leaves the table as it was.
        for table in tables:
            assert unreferenced(cat, table) == leftovers[table]
            removed = collect_garbage(cat.store, cat.deep, table, grace_seconds=-60)
            assert set(removed) == leftovers[table]
            assert unreferenced(cat, table) == set()
        assert_table_matches_source(cat, spec, crash.topic.records)


def test_writer_killed_after_commit_replays_the_batch_as_a_harmless_drop(
    new_topic, spark, tmp_path: Path
) -> None:
    crash = crash_at("after_commit", new_topic, tmp_path, streaming=True)
    spec = crash.spec

    with Catalog.open(home=crash.home) as cat:
        # Batch 1 reached the shards but not Spark's commit log.
        uppers = shard_uppers(cat, spec.table_name)
        assert uppers == {p: 2 * BATCH // 4 for p in range(4)}
        expected, _ = expected_table(spec.table_spec(), below(crash.topic.records, uppers))
        assert_same_rows(cat.read_table(spec.table_name).to_pylist(), expected, what="at crash")

    with Catalog.open(home=crash.home) as cat:
        stats = run_until_caught_up(DatastreamRunner(spec, cat, spark, writer_id=WRITER))
        assert stats.discarded_checkpoints == []  # the checkpoint agreed: batch 1 replays
        assert stats.restarts == 0

    commits = writer_commits(crash.home, spec.name, WRITER)
    assert [c["batch_id"] for c in commits] == [0, 1, 1, 2, 3]
    replay = commits[2]
    assert replay["lost_race"] is True
    assert set(replay["outcomes"].values()) == {"drop"}, replay
    assert replay["version"] is None  # the replay changed no manifest
    assert replay["uppers"] == {str(p): u for p, u in uppers.items()}

    with Catalog.open(home=crash.home) as cat:
        assert shard_uppers(cat, spec.table_name) == crash.topic.ends()
        assert_table_matches_source(cat, spec, crash.topic.records)
        for table in (spec.table_name, spec.dead_letter_table):
            assert unreferenced(cat, table) == set(), "the dropped replay left files behind"
