"""Fixtures of the integration tests: topics of generator records on the session broker."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from harness.ingest_support import PARTITIONS, Topic, orders_config
from millstream.local.tansu import TansuBroker

#: Records the engine test ingests: several batches of ``max_records_per_batch`` each.
ENGINE_RECORDS = 50_000
ENGINE_SEED = 20260101

_topic_ids = itertools.count()


def _create(broker: TansuBroker, prefix: str, seed: int, key_cardinality: int) -> Topic:
    name = f"{prefix}-{next(_topic_ids)}"
    broker.create_topic(name, PARTITIONS)
    return Topic(broker.bootstrap, name, orders_config(seed, key_cardinality=key_cardinality))


@pytest.fixture(scope="module")
def engine_topic(kafka_broker: TansuBroker) -> Topic:
    """50,000 generator orders (updates, deletes, tombstones, duplicates, ~0.2% malformed)
    in a 4-partition topic; every merge engine test ingests this same topic."""
    topic = _create(kafka_broker, "orders-engines", ENGINE_SEED, 10_000)
    topic.produce(ENGINE_RECORDS // PARTITIONS)
    return topic


@pytest.fixture
def new_topic(kafka_broker: TansuBroker, request: pytest.FixtureRequest) -> Callable[..., Topic]:
    """A fresh, empty 4-partition topic of generator orders (produce with ``.produce(n)``)."""

    def make(seed: int = 7, key_cardinality: int = 2_000) -> Topic:
        prefix = request.node.name.split("[")[0].removeprefix("test_").replace("_", "-")[:40]
        return _create(kafka_broker, prefix, seed, key_cardinality)

    return make
