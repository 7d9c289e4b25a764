"""The ``kafka`` source: any Kafka-protocol broker through confluent-kafka.

A read ``assign()``s and ``seek()``s one partition range and reads exactly ``[lo, hi)``;
latest offsets come from the broker's high watermarks. ``client_options`` are passed to the
client as they are (``security.protocol``, ``sasl.*`` ...).

Consumers are expensive to create (a connection and a metadata round trip), so a process keeps
them in a :class:`ConsumerPool`. The pool lends each consumer to one caller at a time: a worker
process runs several writers on threads, and two threads must never ``assign()`` the same
consumer.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer, TopicPartition

from millstream.errors import InvalidSpecError, SourceReadError
from millstream.ingest.formats import format_config
from millstream.ingest.sources.base import PartitionReader, records_batch

CONSUME_BATCH = 10_000
STALL_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class KafkaConfig:
    bootstrap_servers: str
    topic: str
    client_options: dict[str, str] = field(default_factory=dict)
    #: the record format (:func:`millstream.ingest.formats.format_config`); the reader passes
    #: values through, the sink decodes them with it
    format: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.bootstrap_servers:
            raise InvalidSpecError("source.bootstrap_servers", "is required for a kafka source")
        if not self.topic:
            raise InvalidSpecError("source.topic", "is required for a kafka source")

    def client_config(self) -> dict[str, Any]:
        return {
            "group.id": "millstream-reader",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            # A range is read only below the high watermark, so its records exist: a fetch
            # never needs to wait for data. With librdkafka's default (500 ms) a broker that
            # holds a fetch until the wait is up (Tansu does) added ~0.5 s per range read.
            # Not much lower than 100 ms, though: a broker that needs longer than the wait to
            # gather a fetch answers empty every time, and the reader never moves. At 10 ms,
            # Tansu did so once its partitions held ~85k records under load (the process
            # campaign's third long run: a range of 1000 records read nothing in 15 s, while
            # 50-500 ms read it in 0.05-0.09 s).
            "fetch.wait.max.ms": 100,
            "log.connection.close": False,
            "bootstrap.servers": self.bootstrap_servers,
            **self.client_options,
        }


class ConsumerPool:
    """Idle consumers per client config; :meth:`lease` lends one to a single caller."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: dict[str, list[Any]] = {}

    @contextmanager
    def lease(self, conf: dict[str, Any]) -> Iterator[Any]:
        """A consumer for ``conf``, exclusively the caller's until the block ends. A consumer
        whose use raised is closed, not returned: it may be stuck retrying a broker that is
        down."""
        key = json.dumps(conf, sort_keys=True)
        with self._lock:
            idle = self._idle.get(key)
            consumer = idle.pop() if idle else None
        if consumer is None:
            consumer = Consumer(conf)
        try:
            yield consumer
        except BaseException:
            consumer.close()
            raise
        with self._lock:
            self._idle.setdefault(key, []).append(consumer)

    def close(self) -> None:
        """Close the idle consumers (before stopping a broker they talk to)."""
        with self._lock:
            consumers = [c for idle in self._idle.values() for c in idle]
            self._idle.clear()
        for c in consumers:
            c.close()

    def __len__(self) -> int:
        with self._lock:
            return sum(len(idle) for idle in self._idle.values())


#: The pool of this process; a reader uses it unless it is given its own.
CONSUMERS = ConsumerPool()


#: confluent_kafka's ``TIMESTAMP_NOT_AVAILABLE`` (a record without a timestamp).
_NO_TIMESTAMP = 0


class KafkaReader(PartitionReader):
    kind = "kafka"
    Config = KafkaConfig
    record_timestamps = True

    def __init__(
        self,
        config: KafkaConfig,
        *,
        start_offsets: dict[int, int] | None = None,
        consumers: ConsumerPool | None = None,
    ) -> None:
        super().__init__(config, start_offsets=start_offsets)
        self.config: KafkaConfig = config
        self.topic = config.topic
        self.conf = config.client_config()
        self.consumers = consumers
        #: read record headers only when a metadata column holds them (a JSON per record)
        self.headers = "headers" in (config.format.get("metadata") or {})

    @classmethod
    def config_from_spec(cls, fields: dict[str, Any]) -> KafkaConfig:
        return KafkaConfig(
            fields["bootstrap_servers"],
            fields["topic"],
            dict(fields.get("options") or {}),
            format_config(fields),
        )

    def __getstate__(self) -> dict[str, Any]:
        # A pool holds live clients: a reader shipped to another process uses that one's.
        return {**self.__dict__, "consumers": None}

    @property
    def _pool(self) -> ConsumerPool:
        return self.consumers if self.consumers is not None else CONSUMERS

    def _list_partitions(self, c: Any) -> list[int]:
        md = c.list_topics(self.topic, timeout=10)
        t = md.topics.get(self.topic)
        if t is None or t.error is not None or not t.partitions:
            raise SourceReadError(
                f"kafka topic {self.topic!r} on {self.conf['bootstrap.servers']}",
                "the topic was not found" + (f" ({t.error})" if t is not None and t.error else ""),
                topic=self.topic,
            )
        return sorted(t.partitions)

    def list_partitions(self) -> list[int]:
        with self._pool.lease(self.conf) as c:
            return self._list_partitions(c)

    def _watermarks(self) -> dict[int, tuple[int, int]]:
        with self._pool.lease(self.conf) as c:
            return {
                p: c.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10)
                for p in self._list_partitions(c)
            }

    def earliest_offsets(self) -> dict[int, int]:
        return {p: lo for p, (lo, _) in self._watermarks().items()}

    def latest_offsets(self) -> dict[int, int]:
        return {p: hi for p, (_, hi) in self._watermarks().items()}

    def read_range(self, partition: int, lo: int, hi: int) -> Iterator[pa.RecordBatch]:
        with self._pool.lease(self.conf) as c:
            c.assign([TopicPartition(self.topic, partition, lo)])
            try:
                yield from self._consume(c, partition, lo, hi)
            finally:
                c.unassign()

    def _consume(self, c: Any, partition: int, lo: int, hi: int) -> Iterator[pa.RecordBatch]:
        tp = TopicPartition(self.topic, partition)
        last_progress = time.monotonic()
        position = lo
        while position < hi:
            msgs = c.consume(num_messages=min(CONSUME_BATCH, hi - position), timeout=0.5)
            offsets: list[int] = []
            keys: list[bytes | None] = []
            values: list[bytes | None] = []
            stamps: list[int | None] = []
            headers: list[str | None] | None = [] if self.headers else None
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
                kind, stamp = m.timestamp()
                stamps.append(None if kind == _NO_TIMESTAMP else int(stamp))
                if headers is not None:
                    headers.append(headers_json(m.headers()))
            if offsets:
                position = offsets[-1] + 1
                last_progress = time.monotonic()
                yield records_batch(partition, offsets, keys, values, stamps, headers)
            elif msgs:
                last_progress = time.monotonic()
            elif c.position([tp])[0].offset >= hi:
                break  # the rest of the range is control records (transaction markers)
            elif time.monotonic() - last_progress > STALL_TIMEOUT_S:
                # Offsets below the high watermark that never arrive (compacted, or
                # transaction markers at the end): the range holds no more records.
                low, high = c.get_watermark_offsets(tp, timeout=10)
                if position >= low and high >= hi:
                    break
                raise SourceReadError(
                    f"kafka topic {self.topic!r}",
                    f"no progress at offset {position} for {STALL_TIMEOUT_S:.0f}s "
                    f"(watermarks {low}..{high})",
                    partition=partition,
                    topic=self.topic,
                )


def headers_json(headers: list[tuple[str, bytes | None]] | None) -> str:
    """A record's headers as a JSON object (the ``headers`` metadata column): values as UTF-8
    text (bytes that are not UTF-8 become U+FFFD), a null value as null; of a name repeated,
    the last value."""
    return json.dumps(
        {k: None if v is None else v.decode("utf-8", errors="replace") for k, v in headers or []},
        separators=(",", ":"),
    )
