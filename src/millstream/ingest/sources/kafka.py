"""The ``kafka`` source: any Kafka-protocol broker through confluent-kafka.

Each Spark task ``assign()``s and ``seek()``s one partition range and reads exactly
``[lo, hi)``; latest offsets come from the broker's high watermarks. Client options
(``kafka.<name>`` options, e.g. ``kafka.security.protocol``) are passed through.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader

from millstream.errors import InvalidSpecError, SourceReadError
from millstream.ingest.sources.base import RAW_DDL, PartitionedStreamReader, records_batch
from millstream.options import Options

CONSUME_BATCH = 10_000
STALL_TIMEOUT_S = 60.0
_CONSUMERS: dict[str, Any] = {}  # per worker process, keyed by client config


def client_config(options: dict[str, str]) -> dict[str, Any]:
    servers = options.get("bootstrap_servers") or options.get("bootstrap.servers")
    if not servers:
        raise InvalidSpecError("source.bootstrap_servers", "is required for a kafka source")
    conf: dict[str, Any] = {"bootstrap.servers": servers}
    conf.update(json.loads(options.get("clientOptions") or "{}"))
    for k, v in options.items():
        if k.startswith("kafka."):
            conf[k.removeprefix("kafka.")] = v
    return conf


def _consumer(conf: dict[str, Any]) -> Any:
    from confluent_kafka import Consumer

    full = {
        "group.id": "millstream-reader",
        "enable.auto.commit": False,
        "enable.partition.eof": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": 6000,
        # A range is read only below the high watermark, so its records exist: a fetch never
        # needs to wait for data. With librdkafka's default (500 ms) a broker that holds a
        # fetch until the wait is up (Tansu does) added ~0.5 s per partition range read.
        "fetch.wait.max.ms": 10,
        "log.connection.close": False,
        **conf,
    }
    key = json.dumps(full, sort_keys=True)
    if key not in _CONSUMERS:
        _CONSUMERS[key] = Consumer(full)
    return _CONSUMERS[key]


def _drop_consumer(consumer: Any) -> None:
    for key, c in list(_CONSUMERS.items()):
        if c is consumer:
            del _CONSUMERS[key]
            consumer.close()


def close_consumers() -> None:
    """Close this process's cached consumers (before stopping a broker they talk to)."""
    while _CONSUMERS:
        _, consumer = _CONSUMERS.popitem()
        consumer.close()


class KafkaStreamReader(PartitionedStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.topic = options.get("topic") or ""
        if not self.topic:
            raise InvalidSpecError("source.topic", "is required for a kafka source")
        self.conf = client_config(options)

    def _tp(self, partition: int, offset: int | None = None) -> Any:
        from confluent_kafka import TopicPartition

        return (
            TopicPartition(self.topic, partition)
            if offset is None
            else TopicPartition(self.topic, partition, offset)
        )

    def list_partitions(self) -> list[int]:
        md = _consumer(self.conf).list_topics(self.topic, timeout=10)
        t = md.topics.get(self.topic)
        if t is None or t.error is not None or not t.partitions:
            raise SourceReadError(
                f"kafka topic {self.topic!r} on {self.conf['bootstrap.servers']}",
                "the topic was not found" + (f" ({t.error})" if t is not None and t.error else ""),
                topic=self.topic,
            )
        return sorted(t.partitions)

    def _watermarks(self) -> dict[int, tuple[int, int]]:
        c = _consumer(self.conf)
        try:
            return {
                p: c.get_watermark_offsets(self._tp(p), timeout=10) for p in self.list_partitions()
            }
        except Exception:
            _drop_consumer(c)  # do not keep a client retrying a broker that is down
            raise

    def earliest_offsets(self) -> dict[int, int]:
        return {p: lo for p, (lo, _) in self._watermarks().items()}

    def latest_offsets(self) -> dict[int, int]:
        return {p: hi for p, (_, hi) in self._watermarks().items()}

    def read_range(self, partition: int, lo: int, hi: int) -> Iterator[pa.RecordBatch]:
        c = _consumer(self.conf)
        c.assign([self._tp(partition, lo)])
        try:
            last_progress = time.monotonic()
            position = lo
            while position < hi:
                msgs = c.consume(num_messages=min(CONSUME_BATCH, hi - position), timeout=0.5)
                offsets: list[int] = []
                keys: list[bytes | None] = []
                values: list[bytes | None] = []
                for m in msgs:
                    if m.error() is not None:
                        raise SourceReadError(
                            f"kafka topic {self.topic!r}",
                            str(m.error()),
                            partition=partition,
                            topic=self.topic,
                        )
                    o = m.offset()
                    if o < lo or o >= hi:
                        position = max(position, o + 1)
                        continue
                    offsets.append(o)
                    keys.append(m.key())
                    values.append(m.value())
                if offsets:
                    position = offsets[-1] + 1
                    last_progress = time.monotonic()
                    yield records_batch(partition, offsets, keys, values)
                elif msgs:
                    last_progress = time.monotonic()
                elif c.position([self._tp(partition)])[0].offset >= hi:
                    break  # the rest of the range is control records (transaction markers)
                elif time.monotonic() - last_progress > STALL_TIMEOUT_S:
                    # Offsets below the high watermark that never arrive (compacted, or
                    # transaction markers at the end): the range holds no more records.
                    low, high = c.get_watermark_offsets(self._tp(partition), timeout=10)
                    if position >= low and high >= hi:
                        break
                    raise SourceReadError(
                        f"kafka topic {self.topic!r}",
                        f"no progress at offset {position} for {STALL_TIMEOUT_S:.0f}s "
                        f"(watermarks {low}..{high})",
                        partition=partition,
                        topic=self.topic,
                    )
        finally:
            c.unassign()


class KafkaDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "millstream_kafka"

    def schema(self) -> str:
        return RAW_DDL

    def streamReader(self, schema: object) -> DataSourceStreamReader:
        return KafkaStreamReader(Options(self.options))
