"""Issue 3 acceptance: two writers of one datastream running at the same time (a standby
that took over too early, an operator starting a second copy by mistake) give the same table
as one writer would: every record once, nothing lost, and both writers finish cleanly.

The shard's compare-and-append settles every overlapping batch: the writer that commits a
range second finds it below the upper and drops it (or trims what straddles it). Each
writer's ``commits.jsonl`` records those lost races, which shows the writers really raced.

``writer-a`` is ``millstream run --available-now`` in a process of its own; ``writer-b`` is the
same run (``DatastreamRunner.run(available_now=True)``, what the CLI runs) in this process, on
the test session's warm SparkSession, started once ``writer-a`` has committed its first batch:
one Spark JVM starts instead of two, and the two writers surely overlap (``writer-a`` has 19
batches to go when ``writer-b`` starts, however long its JVM took to start).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from harness.ingest_support import (
    assert_table_matches_source,
    kill_group,
    orders_spec,
    shard_uppers,
    start_cli,
    wait_cli,
    write_spec,
    writer_commits,
)
from millstream.catalog import Catalog
from millstream.datastream import DatastreamSpec
from millstream.spark.runner import DatastreamRunner

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

PER_PARTITION = 5_000  # 20,000 records
BATCH = 1_000  # 20 small batches per writer: a long window for the writers to overlap
WRITERS = ("writer-a", "writer-b")


def wait_until_committed(
    proc: subprocess.Popen[bytes], home: Path, datastream: str, writer_id: str
) -> None:
    """Until ``writer_id`` (the process ``proc``) has committed its first batch."""
    deadline = time.monotonic() + 300
    while not writer_commits(home, datastream, writer_id):
        assert proc.poll() is None, f"{writer_id} exited ({proc.returncode}) before any commit"
        assert time.monotonic() < deadline, f"{writer_id} committed nothing in 300 s"
        time.sleep(0.1)


def test_two_writers_at_once_give_every_record_exactly_once(
    new_topic, spark, tmp_path: Path
) -> None:
    topic = new_topic(seed=23, key_cardinality=5_000)
    topic.produce(PER_PARTITION)
    raw = orders_spec("orders-two-writers", topic, "upsert", max_records_per_batch=BATCH)
    spec = DatastreamSpec.parse(raw)
    spec_file = write_spec(tmp_path / "spec.yaml", raw)
    home, logs = tmp_path / "home", tmp_path / "logs"

    cli, inproc = WRITERS
    proc = start_cli(spec_file, home, cli, logs)
    try:
        wait_until_committed(proc, home, spec.name, cli)
        with Catalog.open(home=home) as cat:
            runner = DatastreamRunner(spec, cat, spark, writer_id=inproc)
            runner.seal_all_on_exit = True  # as `millstream run --available-now` does
            stats = runner.run(available_now=True)
    except BaseException:
        kill_group(proc)
        raise
    result = wait_cli(proc, logs, cli)

    assert result.returncode == 0, f"{cli}: {result.explain()}"
    assert result.summary()["restarts"] == 0
    assert stats.restarts == 0
    with Catalog.open(home=home) as cat:
        assert shard_uppers(cat, spec.table_name) == topic.ends()
        assert_table_matches_source(cat, spec, topic.records)

    commits = {w: writer_commits(home, spec.name, w) for w in WRITERS}
    lost = {w: sum(1 for c in cs if c.get("lost_race")) for w, cs in commits.items()}
    committed = {w: sum(1 for c in cs if c.get("version") is not None) for w, cs in commits.items()}
    print(
        f"batches { ({w: len(cs) for w, cs in commits.items()}) }, lost races {lost}, "
        f"batches that changed the table {committed}"
    )
    # Both writers ran batches over the same ranges, and the compare-and-append settled them.
    assert sum(lost.values()) >= 1, f"the writers never raced: {commits}"
