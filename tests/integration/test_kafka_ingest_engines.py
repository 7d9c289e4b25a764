"""Issue 3 acceptance: ingesting a real Kafka-protocol topic gives exactly the model's table,
for every merge engine, with every bad record in the dead-letter table once.

One topic of 50,000 generator orders (updates, deletes, tombstones, duplicates and ~0.2%
malformed records) on the session Tansu broker. Each engine ingests it into its own table in
several batches with ``DatastreamRunner.run(available_now=True)`` (Spark jobs; one engine also
as the streaming query a running writer runs, stopped once caught up), and the result is
compared with the source-side oracle built from the broker's delivery reports.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from harness.ingest_support import (
    TABLE_SECTIONS,
    Topic,
    assert_table_matches_source,
    orders_spec,
    run_until_caught_up,
    shard_uppers,
)
from millstream.catalog import Catalog
from millstream.datastream import DatastreamSpec
from millstream.spark.runner import DatastreamRunner

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

BATCH = 20_000


def _block_managers(spark, master: str) -> int:
    """The session's block managers (the driver + its executors). On ``local-cluster[N,...]``
    the executors register with the driver a while after the session starts (longer on a
    loaded machine): wait up to 120 s for all N before counting, so the count says where the
    test ran, not how far the executors' start had got."""
    status = spark.sparkContext._jsc.sc().getExecutorMemoryStatus
    if master.startswith("local-cluster["):
        want = int(master[len("local-cluster[") :].split(",")[0]) + 1
        deadline = time.monotonic() + 120
        while status().size() < want and time.monotonic() < deadline:
            time.sleep(0.2)
    return int(status().size())


@pytest.mark.parametrize("mode", list(TABLE_SECTIONS))
def test_kafka_ingest_equals_model_for_every_merge_engine(
    mode: str, engine_topic: Topic, spark, tmp_path: Path, record_property
) -> None:
    # Where this ran, for test_local_cluster.py (block managers: the driver + executors).
    master = spark.sparkContext.master
    record_property("spark_master", master)
    record_property("block_managers", _block_managers(spark, master))
    _ingest_and_compare(mode, engine_topic, spark, tmp_path, streaming=False)


def test_kafka_ingest_as_a_streaming_query_equals_model(
    engine_topic: Topic, spark, tmp_path: Path
) -> None:
    """The same through the streaming query a running writer runs (its write tasks are the
    streaming sink's), for the engine with the most to merge."""
    _ingest_and_compare("partial", engine_topic, spark, tmp_path, streaming=True)


def _ingest_and_compare(
    mode: str, engine_topic: Topic, spark, tmp_path: Path, *, streaming: bool
) -> None:
    spec = DatastreamSpec.parse(
        orders_spec(
            f"orders-{mode}",
            engine_topic,
            mode,
            max_records_per_batch=BATCH,
            table=f"orders_{mode}",
        )
    )
    with Catalog.open(home=tmp_path / "home") as cat:
        runner = DatastreamRunner(spec, cat, spark, writer_id=f"w-{mode}")
        stats = run_until_caught_up(runner) if streaming else runner.run(available_now=True)

        assert stats.restarts == 0
        assert stats.discarded_checkpoints == []
        batches = runner.commits()
        assert len(batches) >= len(engine_topic.records) // BATCH, "expected several batches"
        assert shard_uppers(cat, spec.table_name) == engine_topic.ends()
        _, bad = assert_table_matches_source(cat, spec, engine_topic.records)
        assert bad, "the topic should hold malformed records"
        version = cat.table(spec.table_name).manifest_version

        # Everything is ingested: running again commits nothing and changes nothing.
        rerun = DatastreamRunner(spec, cat, spark, writer_id=f"w-{mode}")
        again = run_until_caught_up(rerun) if streaming else rerun.run(available_now=True)
        assert again.discarded_checkpoints == []
        assert cat.table(spec.table_name).manifest_version == version
        assert_table_matches_source(cat, spec, engine_topic.records)
