"""``millstream up``'s broker across restarts: the bootstrap address saved specs name keeps
working (the port is recorded under the home and reused), and with durable storage
(``s3://``) topics and records survive the restart too.

These drive :func:`millstream.local.tansu.start_home_broker`, which ``up`` calls.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from harness.servers import MotoS3Server
from millstream.local.process import HOST, ServerStartError, free_port
from millstream.local.tansu import MEMORY_STORAGE, start_home_broker

pytestmark = pytest.mark.kafka


def _count(bootstrap: str, topic: str, partition: int) -> int:
    """Records a consumer reads from the start of ``topic``/``partition`` (not the watermark)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "test-up-broker",
            "enable.auto.commit": False,
            "log.connection.close": False,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, partition, 0)])
        seen, idle = 0, 0
        while idle < 6:
            msg = consumer.poll(0.5)
            if msg is None:
                idle += 1
            elif msg.error() is None:
                seen, idle = seen + 1, 0
        return seen
    finally:
        consumer.close()


def test_restarted_broker_keeps_the_port_it_was_given(tmp_path: Path) -> None:
    base = tmp_path / "home" / "broker"
    port = free_port()
    broker, settings = start_home_broker(base, port=port)
    try:
        assert broker.port == port and settings.storage == MEMORY_STORAGE
        assert not settings.durable  # `up` says so: topics are lost when it stops
    finally:
        broker.stop()
    assert json.loads((base / "broker.json").read_text()) == {
        "port": port,
        "storage": MEMORY_STORAGE,
    }

    again, _ = start_home_broker(base)  # the next `up`, without --broker-port
    try:
        assert again.bootstrap == f"{HOST}:{port}"  # saved specs still reach it
        again.create_topic("t", 1)
    finally:
        again.stop()


def test_recorded_port_taken_is_an_error_naming_it(tmp_path: Path) -> None:
    base = tmp_path / "broker"
    port = free_port()
    broker, _ = start_home_broker(base, port=port)
    broker.stop()
    with socket.socket() as squatter:
        squatter.bind((HOST, port))
        squatter.listen()
        with pytest.raises(ServerStartError, match=rf"port {port} \(recorded in .*broker.json\)"):
            start_home_broker(base)
    # the record is unchanged: it still names the port the specs point at
    assert json.loads((base / "broker.json").read_text())["port"] == port


@pytest.mark.s3
def test_durable_storage_keeps_topics_and_records_across_restarts(
    tmp_path: Path, moto_server: MotoS3Server
) -> None:
    moto_server.create_bucket("up-broker")
    base = tmp_path / "broker"
    storage = "s3://up-broker/"
    # a free port, not `up`'s default 9092: another test may run `up` at the same time (xdist)
    broker, settings = start_home_broker(
        base, port=free_port(), storage=storage, s3_endpoint=moto_server.endpoint
    )
    try:
        assert settings.durable
        broker.create_topic("orders", 2)
        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
        for i in range(3):
            producer.produce("orders", key=b"k%d" % i, value=b"v%d" % i, partition=1)
            producer.flush(10)
    finally:
        broker.stop()

    again, again_settings = start_home_broker(base, s3_endpoint=moto_server.endpoint)
    try:
        assert again_settings == settings  # port and storage both recorded
        topics = again.admin().list_topics(timeout=10).topics
        assert "orders" in topics and len(topics["orders"].partitions) == 2
        assert _count(again.bootstrap, "orders", 1) == 3
    finally:
        again.stop()
