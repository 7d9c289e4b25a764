"""A source whose offsets went backwards stops its datastream with an error naming both offsets,
instead of being taken as consumed.

As a new user found it: the embedded broker keeps topics in memory, so after a restart the topic
starts again at offset 0; the writer's shards were at 13, the source ended at 4, the lag said 0
and the 4 new records never arrived. The writer's planner (the query's source, exactly as the
runner configures it) now refuses to plan a partition whose source ends below the shard upper;
alone or as a shared query's member (the member named). A deleted and re-created topic on any
broker looks the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from millstream.catalog import Catalog
from millstream.control.worker import _bad_record
from millstream.datastream import DatastreamSpec
from millstream.errors import SourceOffsetsRewoundError, from_spark_failure
from millstream.ingest.sources import config_for
from millstream.ingest.sources.kafka import CONSUMERS
from millstream.local.tansu import TansuBroker
from millstream.spark.options import GroupSourceOptions, SourceOptions
from millstream.spark.runner import DatastreamRunner
from millstream.spark.sources import MEMBER_NOTE, GroupStreamReader, StreamReader

pytestmark = [pytest.mark.kafka]


def _produce(bootstrap: str, n: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(n):
        producer.produce("orders", key=b"%d" % i, value=b'{"id": %d}' % i, partition=0)
    assert producer.flush(30) == 0


def _source(bootstrap: str, uppers: dict[int, int]) -> SourceOptions:
    spec = DatastreamSpec.parse(
        {
            "name": "orders_ds",
            "source": {"kind": "kafka", "bootstrap_servers": bootstrap, "topic": "orders"},
            "table": {"name": "orders", "mode": "append"},
            "schema": {"id": "long"},
        }
    )
    kind, config = config_for(spec.source, spec.name)
    return SourceOptions(kind, config, start_offsets=uppers)


def test_a_broker_restarted_empty_stops_the_partition_naming_both_offsets(tmp_path: Path) -> None:
    first = TansuBroker(tmp_path / "a")
    with first:
        port = first.port
        first.create_topic("orders", 1)
        _produce(first.bootstrap, 13)
        reader = StreamReader(_source(first.bootstrap, {}))
        start = reader.initialOffset()
        assert reader.latestOffset(start, reader.getDefaultReadLimit()) == {"0": 13}
    CONSUMERS.close()

    with TansuBroker(tmp_path / "b", port=port) as again:  # the same address, empty
        again.create_topic("orders", 1)
        _produce(again.bootstrap, 4)
        try:
            alone = StreamReader(_source(again.bootstrap, {0: 13}))
            with pytest.raises(SourceOffsetsRewoundError) as failed:
                alone.latestOffset(alone.initialOffset(), alone.getDefaultReadLimit())
            message = str(failed.value)
            assert "'orders_ds'" in message and "partition 0" in message
            assert "ends at offset 4" in message and "offset 13" in message
            assert _bad_record(RuntimeError(f"... {type(failed.value).__name__}: {message}"))

            group = GroupStreamReader(
                GroupSourceOptions({"orders_ds": _source(again.bootstrap, {0: 13})})
            )
            with pytest.raises(SourceOffsetsRewoundError) as member:
                group.latestOffset({"orders_ds": {"0": 13}}, group.getDefaultReadLimit())
            assert MEMBER_NOTE.format("orders_ds") in member.value.__notes__

            # a datastream at or below the source's end plans as before
            behind = StreamReader(_source(again.bootstrap, {0: 1}))
            assert behind.latestOffset({"0": 1}, behind.getDefaultReadLimit()) == {"0": 4}
        finally:
            CONSUMERS.close()


@pytest.mark.spark
def test_a_writer_whose_broker_restarted_empty_stops_and_commits_nothing(
    tmp_path: Path, spark: Any
) -> None:
    """The writer itself (an available-now run, as ``millstream run --available-now``): its
    first run commits offsets 0-12; after the broker restarted empty and got 4 records, the
    next run stops with the error instead of taking them as consumed, and the table is as it
    was."""
    first = TansuBroker(tmp_path / "a")
    with first, Catalog.open(home=tmp_path / "home") as cat:
        port = first.port
        first.create_topic("orders", 1)
        _produce(first.bootstrap, 13)
        spec = DatastreamSpec.parse(
            {
                "name": "orders_ds",
                "source": {
                    "kind": "kafka",
                    "bootstrap_servers": first.bootstrap,
                    "topic": "orders",
                },
                "table": {"name": "orders", "mode": "append"},
                "schema": {"id": "long"},
            }
        )
        DatastreamRunner(spec, cat, spark, writer_id="w1").run(available_now=True)
        assert {s.partition: s.upper for s in cat.store.list_shards("orders")} == {0: 13}
        first.stop()
        CONSUMERS.close()

        with TansuBroker(tmp_path / "b", port=port) as again:
            again.create_topic("orders", 1)
            _produce(again.bootstrap, 4)
            try:
                with pytest.raises(Exception) as failed:
                    DatastreamRunner(spec, cat, spark, writer_id="w1").run(available_now=True)
            finally:
                CONSUMERS.close()
        err = failed.value
        kind = type(err) if isinstance(err, SourceOffsetsRewoundError) else None
        if kind is None:
            ours = from_spark_failure(err)
            kind = ours.kind if ours is not None else None
        assert kind is SourceOffsetsRewoundError, str(err)[:2000]
        assert "ends at offset 4" in str(err) and "offset 13" in str(err)
        assert {s.partition: s.upper for s in cat.store.list_shards("orders")} == {0: 13}
        assert cat.read_table("orders").num_rows == 13
