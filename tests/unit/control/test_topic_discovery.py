"""A worker's listing of a ``topic_pattern``'s topics (:class:`millstream.control.topics.Topics`):
listed again every ``topic_poll_interval``, a failed listing keeps the tables found before and
backs off (counted and shown in the worker's loops), a topic refused a table is reported."""

from __future__ import annotations

from millstream.clock import ManualClock
from millstream.control.topics import Topics, datastream_of, member_key
from millstream.datastream import DatastreamSpec, KafkaSource


def _spec() -> DatastreamSpec:
    return DatastreamSpec.parse(
        {
            "name": "shop",
            "source": {
                "kind": "kafka",
                "bootstrap_servers": "127.0.0.1:1",
                "topic_pattern": r"db\.shop\..*",
                "topic_poll_interval": "10s",
            },
            "table": {"mode": "upsert", "primary_key": ["id"]},
            "schema": {"id": "long"},
        }
    )


class Broker:
    def __init__(self) -> None:
        self.topics = ["db.shop.orders", "db.other.orders", "__consumer_offsets"]
        self.down = False
        self.calls = 0

    def __call__(self, source: KafkaSource) -> list[str]:
        self.calls += 1
        if self.down:
            raise ConnectionError("broker down")
        return list(self.topics)


def test_a_pattern_is_listed_again_when_due_and_a_failed_listing_keeps_the_tables() -> None:
    clock = ManualClock(start=1_000.0)
    broker = Broker()
    topics = Topics(clock=clock, lister=broker)
    spec = _spec()
    assert list(topics.tables("shop", spec).members) == ["orders"]
    broker.topics.append("db.shop.customers")
    assert list(topics.tables("shop", spec).members) == ["orders"]  # not due yet
    assert broker.calls == 1
    clock.advance(10)
    assert list(topics.tables("shop", spec).members) == ["customers", "orders"]

    broker.down = True
    clock.advance(10)
    assert list(topics.tables("shop", spec).members) == ["customers", "orders"]
    status = topics.loop_statuses(alive=True)[0]
    assert status.errors == 1 and "broker down" in (status.last_error or "")
    calls = broker.calls
    clock.advance(1)
    topics.tables("shop", spec)
    assert broker.calls == calls  # backing off
    broker.down = False
    clock.advance(60)
    broker.topics.append("db.shop.items")
    assert list(topics.tables("shop", spec).members) == ["customers", "items", "orders"]


def test_a_topic_refused_a_table_is_reported_and_the_others_run() -> None:
    clock = ManualClock(start=1_000.0)
    broker = Broker()
    broker.topics = ["db.shop.a.orders", "db.shop.b.orders", "db.shop.items"]
    topics = Topics(clock=clock, lister=broker)
    found = topics.tables("shop", _spec())
    assert sorted(found.members) == ["items", "orders"]
    assert "both map to table 'orders'" in topics.refused["shop"]["db.shop.b.orders"]
    topics.forget("shop")
    assert "shop" not in topics.refused and "shop" not in topics.found


def test_a_member_key_names_its_datastream() -> None:
    key = member_key("shop", "orders-2")
    assert key == "shop.orders-2"
    assert datastream_of(key) == "shop" and datastream_of("shop") == "shop"
