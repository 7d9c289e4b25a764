"""The ``kafka`` source: any Kafka-protocol broker through confluent-kafka.

A read ``assign()``s and ``seek()``s one partition range and reads exactly ``[lo, hi)``;
latest offsets come from the broker's high watermarks, asked for every partition of every
topic in one request (:meth:`KafkaReader.latest_offsets_of`), and are never below the
highest offset the source has shown: a watermark that moved and then held still is checked by
fetching from it (:meth:`KafkaReader._probe`), since a broker may answer a watermark short of records it
serves (Tansu answers the base offset of a partition's last produce batch plus one, so a
default-batching producer's last records were never planned). ``client_options`` are passed
to the client as they are (``security.protocol``, ``sasl.*`` ...).

Consumers are expensive to create (a connection and a metadata round trip), so a process keeps
them in a :class:`ConsumerPool`. The pool lends each consumer to one caller at a time: a worker
process runs several writers on threads, and two threads must never ``assign()`` the same
consumer. A range read leases a consumer of its topic: one that knows the topic starts
fetching at once.
"""

from __future__ import annotations

import atexit
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, TopicPartition

from millstream.errors import InvalidSpecError, SourceGapError, SourceReadError
from millstream.ingest.sources.base import (
    EXTRA_NAMES,
    RECORD_NAMES,
    PartitionReader,
    last_timestamp,
    raw_columns,
    records_batch,
)

log = logging.getLogger(__name__)

#: Where librdkafka's own log lines go (every client Millstream creates passes it as
#: confluent-kafka's ``logger``), instead of the process's stderr: a datastream whose topic
#: was missing made 793 of 889 lines of ``millstream up``'s log in two minutes. Without a
#: logging configuration they are dropped (its NullHandler keeps Python's last-resort
#: handler from printing them); with one they reach its handlers, rate limited
#: (:class:`RateLimit`). The errors they repeat reach the writer as exceptions anyway.
CLIENT_LOG = logging.getLogger("millstream.kafka.client")
#: A librdkafka message is logged at most once per this many seconds per client.
CLIENT_LOG_EVERY_S = 60.0


class RateLimit(logging.Filter):
    """Lets a client's message through at most once per ``every`` seconds; the next one that
    gets through says how many like it were dropped. Messages are compared with their numbers
    masked (``after 11013ms``, ports, counters), per client (librdkafka's client name, the
    record's second argument: confluent-kafka logs ``"%s [%s] %s"``, facility, client,
    message)."""

    _NUMBERS = re.compile(r"\d+")
    #: at most this many message kinds are remembered (older ones are forgotten first)
    KEEP = 1000

    def __init__(self, every: float, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.every = every
        self._clock = clock
        self._lock = threading.Lock()
        #: (client, level, masked message) -> (when last let through, dropped since)
        self._seen: dict[tuple[str, int, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        client = str(args[1]) if len(args) > 1 else ""
        key = (client, record.levelno, self._NUMBERS.sub("#", record.getMessage()))
        now = self._clock()
        with self._lock:
            last = self._seen.get(key)
            if last is not None and now - last[0] < self.every:
                self._seen[key] = (last[0], last[1] + 1)
                return False
            self._seen.pop(key, None)
            self._seen[key] = (now, 0)
            while len(self._seen) > self.KEEP:
                del self._seen[next(iter(self._seen))]
        if last is not None and last[1]:
            record.msg = f"{record.msg} (%d more like it in the last %.0fs)"
            record.args = (*args, last[1], now - last[0])
        return True


CLIENT_LOG.addHandler(logging.NullHandler())
CLIENT_LOG.addFilter(RateLimit(CLIENT_LOG_EVERY_S))

CONSUME_BATCH = 10_000
#: The errors of a fetch at an offset the broker no longer holds (with ``auto.offset.reset``
#: ``error``: librdkafka's own code, or the broker's).
_OUT_OF_RANGE = (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE)
STALL_TIMEOUT_S = 60.0
#: How long a topic's partition list is reused by :meth:`KafkaReader.latest_offsets` before
#: the broker is asked again: partitions are only ever added, and a new one is planned this
#: much later at most (a Kafka consumer's own metadata refresh is 5 minutes).
PARTITIONS_TTL_S = 5.0
#: How long a probe past the watermarks (:meth:`KafkaReader._probe`) waits for every partition
#: probed to reach its end; a partition that did not is probed again at the next request.
PROBE_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class KafkaConfig:
    bootstrap_servers: str
    topic: str
    client_options: dict[str, str] = field(default_factory=dict)
    #: the record format (:func:`millstream.ingest.formats.format_config`); the reader passes
    #: values through, the sink decodes them with it
    format: dict[str, Any] = field(default_factory=dict)
    #: records the broker deleted before they were read: ``fail`` (:class:`SourceGapError`)
    #: or ``accept`` (go on from the first offset held; the loss is in :attr:`KafkaReader.losses`)
    on_data_loss: str = "fail"
    #: the datastream reading the topic, named in the reader's errors
    datastream: str = ""

    def __post_init__(self) -> None:
        if not self.bootstrap_servers:
            raise InvalidSpecError("source.bootstrap_servers", "is required for a kafka source")
        if not self.topic:
            raise InvalidSpecError("source.topic", "is required for a kafka source")
        if self.on_data_loss not in ("fail", "accept"):
            raise InvalidSpecError(
                "source.on_data_loss", f"{self.on_data_loss!r} is not fail or accept"
            )

    def client_config(self) -> dict[str, Any]:
        return {
            "group.id": "millstream-reader",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            # A range's start the broker no longer holds (retention) is an error the read
            # handles (on_data_loss), never a silent jump to the earliest offset held.
            "auto.offset.reset": "error",
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


#: A pooled consumer idle this long is closed at the pool's next return after it (the pool
#: looks for such consumers at most every tenth of this), so a topic no longer read (a
#: datastream removed or moved) does not keep its connections open.
IDLE_CLOSE_S = 300.0


class ConsumerPool:
    """Idle consumers per client config and topic; :meth:`lease` lends one to a single caller.

    A consumer is lent again for the topic it read last. librdkafka starts fetching a topic
    it has no metadata for only when its broker thread next wakes, up to a second later: a
    pool that lent any idle consumer for any topic made a task's read of a few hundred
    records take 0.5-1 s whenever its consumer had last read another topic (bench/scale.py
    (b): 8 datastreams in a shared query, 4.5% of the member reads; a batch waits for its
    slowest read, so 30% of the batches), against 5-10 ms for a consumer that knows it."""

    def __init__(
        self, *, idle_close_s: float = IDLE_CLOSE_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._lock = threading.Lock()
        #: key -> idle consumers and when each was returned, the most recent last
        self._idle: dict[str, list[tuple[Any, float]]] = {}
        self.idle_close_s = idle_close_s
        self._clock = clock
        #: when the idle consumers were last looked over for stale ones
        self._swept = clock()

    @contextmanager
    def lease(self, conf: dict[str, Any], topic: str | None = None) -> Iterator[Any]:
        """A consumer for ``conf``, exclusively the caller's until the block ends; one that
        last read ``topic`` (None: a consumer for requests about several topics). A consumer
        whose use raised is closed, not returned: it may be stuck retrying a broker that is
        down."""
        key = json.dumps([conf, topic], sort_keys=True)
        with self._lock:
            idle = self._idle.get(key)
            consumer = idle.pop()[0] if idle else None
        if consumer is None:
            consumer = Consumer({**conf, "logger": CLIENT_LOG})
        try:
            yield consumer
        except BaseException:
            consumer.close()
            raise
        now = self._clock()
        with self._lock:
            self._idle.setdefault(key, []).append((consumer, now))
            stale = self._take_stale(now) if now - self._swept >= self.idle_close_s / 10 else []
        for c in stale:
            c.close()

    def _take_stale(self, now: float) -> list[Any]:
        """The idle consumers unused for :attr:`idle_close_s`, taken out of the pool (the
        lock is held). It looks at every idle consumer, so a return calls it at most every
        tenth of :attr:`idle_close_s`: at every return, a shared query's write task over 100
        topics (a consumer each) looked all 100 over for each topic it read, the largest
        fixed cost of a table in its write (docs/performance.md, "(c) What a batch of small
        busy tables costs")."""
        self._swept = now
        stale: list[Any] = []
        for key in list(self._idle):
            keep = [(c, at) for c, at in self._idle[key] if now - at < self.idle_close_s]
            stale.extend(c for c, at in self._idle[key] if now - at >= self.idle_close_s)
            if keep:
                self._idle[key] = keep
            else:
                del self._idle[key]
        return stale

    def close(self) -> None:
        """Close the idle consumers (before stopping a broker they talk to)."""
        with self._lock:
            consumers = [c for idle in self._idle.values() for c, _ in idle]
            self._idle.clear()
        for c in consumers:
            c.close()

    def __len__(self) -> int:
        with self._lock:
            return sum(len(idle) for idle in self._idle.values())


#: The pool of this process; a reader uses it unless it is given its own. Its consumers are
#: closed when the process exits (a service closes them before it stops a broker it runs).
CONSUMERS = ConsumerPool()
atexit.register(CONSUMERS.close)


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
        #: the topic's partitions and when they were listed (monotonic seconds)
        self._partitions: tuple[float, list[int]] | None = None
        #: per partition, one past the highest offset the source has shown (a record read,
        #: or the end a fetch reached): the latest offset is never below it
        self.shown: dict[int, int] = {}
        #: per partition, the watermark last answered and the offset last probed to its end
        self._marks: dict[int, int] = {}
        self._probed: dict[int, int] = {}
        #: ``(partition, first, end)`` of the offsets a read skipped because the broker no
        #: longer held them (``on_data_loss: accept``); the sink reports them with its commit
        self.losses: list[tuple[int, int, int]] = []

    @classmethod
    def config_from_spec(cls, fields: dict[str, Any]) -> KafkaConfig:
        # lazy: the decoders' libraries (fastavro, protobuf, pydantic) are not for the
        # query's source process, which plans offsets only
        from millstream.ingest.formats import format_config

        return KafkaConfig(
            fields["bootstrap_servers"],
            fields["topic"],
            dict(fields.get("options") or {}),
            format_config(fields),
            on_data_loss=fields.get("on_data_loss") or "fail",
            datastream=fields.get("datastream") or "",
        )

    def __getstate__(self) -> dict[str, Any]:
        # A pool holds live clients: a reader shipped to another process uses that one's.
        return {
            **self.__dict__,
            "consumers": None,
            "_partitions": None,
            "_probed": {},
            "losses": [],
        }

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
        with self._pool.lease(self.conf, self.topic) as c:
            return self._list_partitions(c)

    def earliest_offsets(self) -> dict[int, int]:
        """Every partition's first offset still held, in ONE ListOffsets request
        (``offsets_for_times`` at ``OFFSET_BEGINNING``, the protocol's "earliest" timestamp,
        -2), as :meth:`latest_offsets_of` asks the ends: a watermark request per partition
        made a re-ingestion's check per entry cost a round trip per partition of the topic."""
        with self._pool.lease(self.conf, self.topic) as c:
            parts = self._list_partitions(c)
            tps = [TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in parts]
            answers = {(a.topic, a.partition): a for a in c.offsets_for_times(tps, timeout=10)}
        got = self._answered(answers, parts, "first")
        if isinstance(got, Exception):
            raise got
        return got

    def latest_offsets(self) -> dict[int, int]:
        (got,) = self.latest_offsets_of([self])
        if isinstance(got, Exception):
            raise got
        return got

    @classmethod
    def earliest_offsets_of(
        cls, readers: Sequence[PartitionReader]
    ) -> list[dict[int, int] | Exception]:
        """Every reader's first offsets still held in ONE ListOffsets request per client
        config (``offsets_for_times`` at ``OFFSET_BEGINNING``), through one consumer: the 100
        tables of a multi-table datastream joining a shared query each asked theirs through a
        consumer of their own topic (a connection and two round trips each), 1.2-2.6 s on
        this machine against one request for all (docs/performance.md, "(c) Backlog
        catch-up: where the first batch's wait goes"). A topic that is missing or does not
        answer fails its reader alone (:class:`SourceReadError`)."""
        kafka = [r for r in readers if isinstance(r, KafkaReader)]
        assert len(kafka) == len(readers), "earliest_offsets_of takes readers of its own kind"
        out: list[dict[int, int] | Exception | None] = [None] * len(kafka)
        groups: dict[str, list[int]] = {}
        for i, r in enumerate(kafka):
            groups.setdefault(json.dumps(r.conf, sort_keys=True), []).append(i)
        for members in groups.values():
            first = kafka[members[0]]
            parts: dict[int, list[int]] = {}
            try:
                with first._pool.lease(first.conf) as c:
                    asked: dict[tuple[str, int], None] = {}
                    for i in members:
                        try:
                            parts[i] = kafka[i]._list_partitions(c)
                        except SourceReadError as exc:  # its topic alone
                            out[i] = exc
                            continue
                        asked.update(dict.fromkeys((kafka[i].topic, p) for p in parts[i]))
                    tps = [TopicPartition(t, p, OFFSET_BEGINNING) for t, p in asked]
                    answers = c.offsets_for_times(tps, timeout=10) if tps else []
            except Exception as exc:  # the brokers did not answer: each reader its own error
                for i in members:
                    if out[i] is None:
                        err = kafka[i]._unanswered(None, exc, "first")
                        err.__cause__ = exc
                        out[i] = err
                continue
            firsts = {(a.topic, a.partition): a for a in answers}
            for i in members:
                if out[i] is None:
                    out[i] = kafka[i]._answered(firsts, parts[i], "first")
        assert all(o is not None for o in out)
        return [o for o in out if o is not None]

    def _known_partitions(self, c: Any) -> list[int]:
        """The topic's partitions, listed again once :data:`PARTITIONS_TTL_S` old."""
        now = time.monotonic()
        if self._partitions is None or now - self._partitions[0] >= PARTITIONS_TTL_S:
            self._partitions = (now, self._list_partitions(c))
        return self._partitions[1]

    @classmethod
    def latest_offsets_of(
        cls, readers: Sequence[PartitionReader]
    ) -> list[dict[int, int] | Exception]:
        """Every reader's high watermarks in ONE request per broker: the readers of one
        client config share a consumer, and ``offsets_for_times`` at ``OFFSET_END`` (the
        protocol's "latest" timestamp, -1) asks a ListOffsets of all their partitions at
        once, as ``get_watermark_offsets`` does one partition at a time. A shared query's 8
        datastreams of 4 partitions asked one partition at a time waited 180-350 ms a batch
        (bench/scale.py (b), 40 round trips to a busy broker). A topic that is missing or
        answers with an error fails its readers alone (:class:`SourceReadError`)."""
        kafka = [r for r in readers if isinstance(r, KafkaReader)]
        assert len(kafka) == len(readers), "latest_offsets_of takes readers of its own kind"
        out: list[dict[int, int] | Exception | None] = [None] * len(kafka)
        groups: dict[str, list[int]] = {}
        for i, r in enumerate(kafka):
            groups.setdefault(json.dumps(r.conf, sort_keys=True), []).append(i)
        for members in groups.values():
            first = kafka[members[0]]
            try:
                with first._pool.lease(first.conf) as c:
                    # each partition once: two datastreams may read one topic
                    asked: dict[tuple[str, int], None] = {}
                    for i in members:
                        try:
                            parts = kafka[i]._known_partitions(c)
                        except SourceReadError as exc:  # its topic alone
                            out[i] = exc
                            continue
                        asked.update(dict.fromkeys((kafka[i].topic, p) for p in parts))
                    tps = [TopicPartition(t, p, OFFSET_END) for t, p in asked]
                    answers = c.offsets_for_times(tps, timeout=10) if tps else []
            except Exception as exc:  # the brokers did not answer: each reader its own error
                for i in members:
                    if out[i] is None:
                        err = kafka[i]._unanswered(None, exc)
                        err.__cause__ = exc
                        out[i] = err
                continue
            ends = {(a.topic, a.partition): a for a in answers}
            for i in members:
                if out[i] is None:
                    out[i] = kafka[i]._ends(ends)
            answered = [(kafka[i], got) for i in members if isinstance(got := out[i], dict)]
            first._probe_past(answered)
            for i in members:
                got = out[i]
                if isinstance(got, dict):
                    shown = kafka[i].shown
                    out[i] = {p: max(o, shown.get(p, o)) for p, o in got.items()}
        assert all(o is not None for o in out)
        return [o for o in out if o is not None]

    def _probe_past(self, answered: list[tuple[KafkaReader, dict[int, int]]]) -> None:
        """Raise each reader's :attr:`shown` to what its partitions hold past the watermarks
        just ``answered``, probing (one fetch for all, :meth:`_probe`) only where the end to
        probe from moved since a probe last reached it: a caught-up, idle source costs
        nothing. A watermark below the last one answered (the topic deleted and created
        again, the broker restarted empty) forgets what the partition showed before.

        A partition whose watermark rose since the last answer is not probed: records are
        arriving, and what lies past this watermark (the rest of its last produce batch)
        lies below the next batch's. Its probe waits until the watermark holds still (the
        next answer after the producer paused), so the records of a produce batch that ends
        a burst are planned one trigger after their watermark at most. Probing every moving
        partition cost a streaming batch the whole :data:`PROBE_TIMEOUT_S` (a busy partition
        never answers its end) and the broker a fetch stream beside the batch's reads."""
        todo: dict[tuple[str, int], int] = {}
        for r, got in answered:
            for p, w in got.items():
                last = r._marks.get(p)
                if last is not None and w < last:
                    r.shown.pop(p, None)
                    r._probed.pop(p, None)
                r._marks[p] = w
                if last is not None and w > last:
                    continue  # still moving: probed once it holds still
                at = max(w, r.shown.get(p, w))
                if r._probed.get(p) != at:
                    todo[(r.topic, p)] = max(at, todo.get((r.topic, p), at))
        if not todo:
            return
        try:
            reached = self._probe(todo)
        except Exception as exc:  # the watermarks (and what was shown before) stand
            log.warning("kafka probe past the watermarks of %s failed: %r", sorted(todo), exc)
            return
        for r, got in answered:
            for p in got:
                end, settled = reached.get((r.topic, p), (None, False))
                if end is not None:
                    r.shown[p] = max(r.shown.get(p, end), end)
                if settled and end is not None:
                    r._probed[p] = end

    def _probe(self, at: dict[tuple[str, int], int]) -> dict[tuple[str, int], tuple[int, bool]]:
        """Fetch every ``(topic, partition)`` from its offset in ``at`` to its end (a fetch
        answering nothing more: librdkafka's partition EOF). Per partition: one past the last
        offset reached (a record, or the end), and whether the end was reached within
        :data:`PROBE_TIMEOUT_S`. A broker whose watermark is exact answers the end at once
        (one fetch's wait, ``fetch.wait.max.ms``); a partition the probe cannot fetch (an
        error) is settled where it is, as its watermark says.

        A partition whose first fetch brings records is settled at the high watermark that
        fetch answered (:meth:`_fetched_end`) when it is known and not below what was read:
        the end its EOF would report once every record up to it were fetched (librdkafka
        answers EOF where a fetch reaches that watermark), without reading them one by one.
        A broker whose ListOffsets answer lags its last produce batch (Tansu: that batch's
        base offset + 1) made a probe of a backlog read the whole last batch of every
        partition: 100 topics produced in one batch each took the whole
        :data:`PROBE_TIMEOUT_S` at a datastream's start, twice (its entries and its query's
        first offsets), unsettled (docs/performance.md, "(c) Catch-up of a 100-topic
        backlog")."""
        conf = {**self.conf, "enable.partition.eof": True, "auto.offset.reset": "error"}
        reached = {tp: (o, False) for tp, o in at.items()}
        with self._pool.lease(conf) as c:
            tps = [TopicPartition(t, p, o) for (t, p), o in at.items()]
            c.assign(tps)
            try:
                deadline = time.monotonic() + PROBE_TIMEOUT_S
                while (left := deadline - time.monotonic()) > 0 and not all(
                    done for _, done in reached.values()
                ):
                    m = c.poll(min(left, 0.5))
                    if m is None:
                        continue
                    tp = (m.topic(), m.partition())
                    if tp not in reached:
                        continue
                    err = m.error()
                    end, _ = reached[tp]
                    if err is None:
                        end = max(end, m.offset() + 1)
                        high = self._fetched_end(c, tp)
                        if high is None or high < end:
                            reached[tp] = (end, False)  # read on to its end (EOF)
                            continue
                        reached[tp] = (high, True)
                    elif err.code() == KafkaError._PARTITION_EOF:
                        reached[tp] = (max(end, m.offset()), True)
                    elif m.partition() is not None and m.partition() >= 0:
                        reached[tp] = (end, True)  # cannot fetch it: its watermark stands
                    else:
                        continue
                    # Settled: fetched no more. A partition left in the fetch kept every fetch
                    # of the probe going while records arrived on it (and on the others still
                    # probed): 100 busy topics' probe cost the bundled broker 1.2 CPU-s and
                    # 1.4 s of wall a batch, 0.4 CPU-s paused (bench/kafka_probe.py).
                    c.pause([TopicPartition(*tp)])
            finally:
                c.resume(tps)  # a pooled consumer keeps a partition's pause past unassign()
                c.unassign()
        return reached

    @staticmethod
    def _fetched_end(c: Any, tp: tuple[str, int]) -> int | None:
        """The high watermark the last fetch of ``tp`` answered (librdkafka keeps it per
        partition: ``get_watermark_offsets(cached=True)``), or None while none is known."""
        _, high = c.get_watermark_offsets(TopicPartition(*tp), cached=True)
        return int(high) if high is not None and high >= 0 else None

    def _ends(self, answers: dict[tuple[str, int], Any]) -> dict[int, int] | Exception:
        assert self._partitions is not None
        got = self._answered(answers, self._partitions[1], "end")
        if isinstance(got, Exception):
            self._partitions = None  # list them again next time
        return got

    def _answered(
        self, answers: dict[tuple[str, int], Any], partitions: list[int], which: str
    ) -> dict[int, int] | SourceReadError:
        """``{partition: offset}`` of a ListOffsets answer (keyed by topic and partition)
        for this topic's ``partitions``, or the error naming the first partition not
        answered."""
        got: dict[int, int] = {}
        for p in partitions:
            a = answers.get((self.topic, p))
            if a is None or a.error is not None or a.offset < 0:
                return self._unanswered(p, a.error if a is not None else None, which)
            got[p] = a.offset
        return got

    def _unanswered(self, partition: int | None, why: Any, which: str = "end") -> SourceReadError:
        return SourceReadError(
            f"kafka topic {self.topic!r} on {self.conf['bootstrap.servers']}",
            f"its {which} offsets were not answered" + (f" ({why})" if why else ""),
            partition=partition,
            topic=self.topic,
        )

    def read_range(self, partition: int, lo: int, hi: int) -> Iterator[pa.RecordBatch]:
        with self._pool.lease(self.conf, self.topic) as c:
            c.assign([TopicPartition(self.topic, partition, lo)])
            try:
                yield from self._consume(c, partition, lo, hi)
            finally:
                c.unassign()

    def read_records(
        self,
        ranges: list[tuple[int, int, int]],
        *,
        last_record_ms: dict[int, int] | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """Every range of a write task through ONE assignment of one consumer: the client
        fetches all the task's partitions in each fetch request, so a task waits for the
        broker about once, not once per range. Read one range at a time, each cost at least a
        fetch round trip (a broker that holds a fetch for ``fetch.wait.max.ms``, as Tansu
        does, made that 100 ms per range), and a task's time grew with its partitions rather
        than its records (bench/scale.py: 4 datastreams of 4 partitions held the worker's two
        task slots ~0.2 s per task for a few hundred records). Batches come out per range, in
        the order of ``ranges``, as :meth:`read_range` would give them."""
        todo = [(p, lo, hi) for p, lo, hi in ranges if hi > lo]
        if len({p for p, _, _ in todo}) != len(todo):  # a partition twice: one at a time
            yield from super().read_records(ranges, last_record_ms=last_record_ms)
            return
        if not todo:
            return
        with self._pool.lease(self.conf, self.topic) as c:
            tps = [TopicPartition(self.topic, p, lo) for p, lo, _ in todo]
            c.assign(tps)
            try:
                got = self._consume_all(c, todo)
            finally:
                c.resume(tps)  # a pooled consumer keeps a partition's pause past unassign()
                c.unassign()
        for p, _, _ in todo:
            for batch in got[p]:
                if last_record_ms is not None:
                    stamp = last_timestamp(batch)
                    if stamp is not None:
                        last_record_ms[p] = stamp
                yield pa.RecordBatch.from_arrays(
                    [
                        *raw_columns(batch),
                        *(batch.column(n) for n in EXTRA_NAMES if n in batch.schema.names),
                    ],
                    names=[*RECORD_NAMES, *(n for n in EXTRA_NAMES if n in batch.schema.names)],
                )

    def _consume_all(
        self, c: Any, ranges: list[tuple[int, int, int]]
    ) -> dict[int, list[pa.RecordBatch]]:
        """The records of ``ranges`` (one per partition, all assigned to ``c``) as
        :meth:`read_range` batches per partition."""
        bounds = {p: (lo, hi) for p, lo, hi in ranges}
        position = {p: lo for p, lo, _ in ranges}
        rows: dict[
            int, tuple[list[int], list[Any], list[Any], list[Any], list[str | None] | None]
        ] = {p: ([], [], [], [], [] if self.headers else None) for p in bounds}
        got: dict[int, list[pa.RecordBatch]] = {p: [] for p in bounds}

        def flush(p: int) -> None:
            offsets, keys, values, stamps, headers = rows[p]
            if offsets:
                got[p].append(records_batch(p, offsets, keys, values, stamps, headers))
                rows[p] = ([], [], [], [], [] if self.headers else None)

        last_progress = time.monotonic()
        while any(position[p] < hi for p, (_, hi) in bounds.items()):
            # consume() returns once it has num_messages: ask for what the ranges still lack
            # (a finished partition is paused, so the rest of its fetch does not count)
            left = sum(max(0, hi - position[p]) for p, (_, hi) in bounds.items())
            msgs = c.consume(num_messages=min(CONSUME_BATCH, left), timeout=0.5)
            done_before = {p for p, (_, hi) in bounds.items() if position[p] >= hi}
            for m in msgs:
                p = m.partition()
                if m.error() is not None:
                    if m.error().code() in _OUT_OF_RANGE and p in position:
                        position[p] = self._past_lost(c, p, position[p], bounds[p][1])
                        continue
                    raise SourceReadError(
                        f"kafka topic {self.topic!r}", str(m.error()), partition=p, topic=self.topic
                    )
                o = m.offset()
                lo, hi = bounds.get(p, (0, 0))
                if o < lo or o >= hi:
                    if p in position:
                        position[p] = max(position[p], o + 1)
                    continue
                _append(m, *rows[p])
                position[p] = o + 1
                if len(rows[p][0]) >= CONSUME_BATCH:
                    flush(p)
            done = [
                p for p, (_, hi) in bounds.items() if position[p] >= hi and p not in done_before
            ]
            if done:  # no more fetches of what is read: the others' fetches get the bytes
                c.pause([TopicPartition(self.topic, p) for p in done])
            if msgs:
                last_progress = time.monotonic()
                continue
            open_ = [p for p, (_, hi) in bounds.items() if position[p] < hi]
            at = c.position([TopicPartition(self.topic, p) for p in open_])
            for tp in at:  # the rest of a range is control records (transaction markers)
                if tp.offset >= bounds[tp.partition][1]:
                    position[tp.partition] = bounds[tp.partition][1]
            if time.monotonic() - last_progress > STALL_TIMEOUT_S:
                for p in open_:
                    if position[p] >= bounds[p][1]:
                        continue
                    tp = TopicPartition(self.topic, p)
                    low, high = c.get_watermark_offsets(tp, timeout=10)
                    if low > position[p]:  # deleted without the broker saying so
                        position[p] = self._past_lost(c, p, position[p], bounds[p][1], low)
                        last_progress = time.monotonic()
                        continue
                    if position[p] >= low and high >= bounds[p][1]:
                        position[p] = bounds[p][1]  # compacted or markers: nothing more
                        continue
                    raise SourceReadError(
                        f"kafka topic {self.topic!r}",
                        f"no progress at offset {position[p]} for {STALL_TIMEOUT_S:.0f}s "
                        f"(watermarks {low}..{high})",
                        partition=p,
                        topic=self.topic,
                    )
        for p in bounds:
            flush(p)
        return got

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
                    if m.error().code() in _OUT_OF_RANGE and not offsets:
                        position = self._past_lost(c, partition, position, hi)
                        last_progress = time.monotonic()
                        break
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
                _append(m, offsets, keys, values, stamps, headers)
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
                if low > position:  # deleted without the broker saying so
                    position = self._past_lost(c, partition, position, hi, low)
                    last_progress = time.monotonic()
                    continue
                if position >= low and high >= hi:
                    break
                raise SourceReadError(
                    f"kafka topic {self.topic!r}",
                    f"no progress at offset {position} for {STALL_TIMEOUT_S:.0f}s "
                    f"(watermarks {low}..{high})",
                    partition=partition,
                    topic=self.topic,
                )

    def _past_lost(
        self, c: Any, partition: int, position: int, hi: int, low: int | None = None
    ) -> int:
        """Where the read of ``partition`` (assigned to ``c``, up to ``hi``) goes on when the
        broker no longer holds ``position``: its first offset held (``low`` if known). The
        offsets between are lost: :class:`SourceGapError` with ``on_data_loss: fail``, the
        default; with ``accept`` they are recorded in :attr:`losses` and logged, and the read
        seeks past them."""
        tp = TopicPartition(self.topic, partition)
        if low is None:
            low, _ = c.get_watermark_offsets(tp, timeout=10)
        end = min(low, hi)
        if low <= position:  # nothing deleted below it: the broker's error stands
            raise SourceReadError(
                f"kafka topic {self.topic!r}",
                f"offset {position} is out of range although the first offset held is {low}",
                partition=partition,
                topic=self.topic,
            )
        name = self.config.datastream or "?"
        if self.config.on_data_loss != "accept":
            raise SourceGapError(name, self.topic, partition, position, end, low)
        log.warning(
            "datastream %s: kafka topic %r partition %d no longer holds offsets %d..%d "
            "(%d records lost; on_data_loss: accept)",
            name,
            self.topic,
            partition,
            position,
            end - 1,
            end - position,
        )
        self.losses.append((partition, position, end))
        if end < hi:
            c.seek(TopicPartition(self.topic, partition, end))
        return end


def list_topics(
    bootstrap_servers: str, options: dict[str, str] | None = None, *, timeout: float = 10.0
) -> list[str]:
    """The topics the broker at ``bootstrap_servers`` holds, by name (its internal topics,
    ``__consumer_offsets`` and the like, left out): what a ``topic_pattern`` is matched
    against. A broker that does not answer in ``timeout`` seconds raises
    :class:`SourceReadError`."""
    conf = KafkaConfig(bootstrap_servers, "-", dict(options or {})).client_config()
    try:
        with CONSUMERS.lease(conf) as c:
            md = c.list_topics(timeout=timeout)
    except Exception as exc:
        raise SourceReadError(
            f"kafka broker {bootstrap_servers}", f"listing its topics failed: {exc}"
        ) from exc
    return sorted(
        name for name, t in md.topics.items() if t.error is None and not name.startswith("__")
    )


def _append(
    m: Any,
    offsets: list[int],
    keys: list[Any],
    values: list[Any],
    stamps: list[Any],
    headers: list[str | None] | None,
) -> None:
    """One consumed message into a batch's columns (see :func:`records_batch`)."""
    offsets.append(m.offset())
    keys.append(m.key())
    values.append(m.value())
    kind, stamp = m.timestamp()
    stamps.append(None if kind == _NO_TIMESTAMP else int(stamp))
    if headers is not None:
        headers.append(headers_json(m.headers()))


def headers_json(headers: list[tuple[str, bytes | None]] | None) -> str:
    """A record's headers as a JSON object (the ``headers`` metadata column): values as UTF-8
    text (bytes that are not UTF-8 become U+FFFD), a null value as null; of a name repeated,
    the last value."""
    return json.dumps(
        {k: None if v is None else v.decode("utf-8", errors="replace") for k, v in headers or []},
        separators=(",", ":"),
    )
