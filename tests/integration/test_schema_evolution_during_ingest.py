"""Schema evolution without downtime, through Spark from a real Kafka broker: while a writer
runs continuously, the datastream's schema gains a column and widens a type through the update
path (what ``PATCH /datastreams/{name}`` and ``millstream datastream update`` call). The writer
picks the change up at a batch boundary with no restart; records produced after the update
carry the new column; at the end the table equals the sequential model (the old rows with
null in the new column), nothing lost or duplicated. An incompatible change is refused and
changes nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.cluster import wait_until
from harness.ingest_support import produce_exact, uppers_or_empty, writer_in_background
from millstream.catalog import Catalog
from millstream.control.registry import Registry
from millstream.datastream import DatastreamSpec
from millstream.errors import IncompatibleChangeError
from millstream.local.tansu import TansuBroker
from millstream.reference.model import canonical
from millstream.spark.runner import DatastreamRunner

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

PARTITIONS = 2
PER_PARTITION = 300


def _wait_for_uppers(cat: Catalog, table: str, ends: dict[int, int], timeout: float) -> None:
    wait_until(
        f"the writer reaches {ends}",
        lambda: all(uppers_or_empty(cat, table).get(p, 0) >= end for p, end in ends.items()),
        timeout=timeout,
        diagnostics=lambda: f"uppers {uppers_or_empty(cat, table)}",
    )


def _produce(broker: TansuBroker, topic: str, first_id: int, **extra: Any) -> list[Any]:
    rows = {
        p: [
            (
                None,
                json.dumps(
                    {"id": first_id + p * PER_PARTITION + i, "qty": i, "note": f"n{i}"} | extra
                ).encode(),
            )
            for i in range(PER_PARTITION)
        ]
        for p in range(PARTITIONS)
    }
    return produce_exact(broker.bootstrap, topic, rows)


def test_a_column_added_and_a_type_widened_during_continuous_ingestion_lose_nothing(
    tmp_path: Path, spark: Any, kafka_broker: TansuBroker
) -> None:
    topic = "schema-evolution"
    kafka_broker.create_topic(topic, PARTITIONS)
    body: dict[str, Any] = {
        "name": "evolving",
        "source": {"kind": "kafka", "bootstrap_servers": kafka_broker.bootstrap, "topic": topic},
        "schema": {"id": "long", "qty": "int", "note": "string"},
        "max_records_per_batch": 200,
        "trigger_interval": "200ms",
    }
    spec = DatastreamSpec.parse(body)
    cat = Catalog.open(home=tmp_path / "home")
    registry = Registry(cat.store)
    registry.create(spec)
    runner = DatastreamRunner(spec, cat, spark, writer_id="w")
    with writer_in_background(runner, "writer-evolving") as errors:
        before = _produce(kafka_broker, topic, 0)
        ends = {p: max(o for q, o, _, _ in before if q == p) + 1 for p in range(PARTITIONS)}
        _wait_for_uppers(cat, "evolving", ends, timeout=180)

        evolved = {**body, "schema": {"id": "long", "qty": "long", "note": "string"}}
        evolved["schema"]["discount"] = "double"
        _, changes, version = registry.update("evolving", DatastreamSpec.parse(evolved))
        assert [c.describe() for c in changes] == [
            "~ column qty int -> long",
            "+ column discount double",
        ]
        assert version == 2

        # Produced after the update was acknowledged: qty beyond an int, and a discount.
        after = _produce(kafka_broker, topic, 10_000, qty=2**40, discount=0.25)
        ends = {p: max(o for q, o, _, _ in after if q == p) + 1 for p in range(PARTITIONS)}
        _wait_for_uppers(cat, "evolving", ends, timeout=180)

        # An incompatible change is refused while it runs; nothing changes.
        table_before, rec_before = cat.table("evolving"), registry.get("evolving")
        narrowed = {**evolved, "schema": {**evolved["schema"], "qty": "int"}}
        with pytest.raises(IncompatibleChangeError) as refused:
            registry.update("evolving", DatastreamSpec.parse(narrowed))
        assert (refused.value.column, refused.value.field) == ("qty", "schema.qty")
        assert cat.table("evolving") == table_before
        assert registry.get("evolving") == rec_before
    assert not errors, errors
    assert runner.stats.restarts == 0, "the writer picked the change up without a restart"

    expected = [
        {**json.loads(v), "discount": None} if "discount" not in json.loads(v) else json.loads(v)
        for _, _, _, v in [*before, *after]
    ]
    got = cat.read_table("evolving").to_pylist()
    assert len(got) == len(expected) == 4 * PER_PARTITION, "nothing lost or duplicated"
    assert canonical(got) == canonical(expected)
    assert cat.read_table("evolving__dead_letter").num_rows == 0
    assert [v for v, _, _ in cat.store.schema_history("evolving")] == [1, 2]
