"""The tables of a worker's multi-table datastreams (``source.topics`` or
``source.topic_pattern``): which topics each reads now, and so which tables it writes.

A ``topics`` list is fixed. A ``topic_pattern`` is matched against the broker's topics, listed
again every ``topic_poll_interval`` (30 s by default; Kafka Connect's ``topics.regex`` relies
on the consumer's metadata refresh, 5 minutes): a topic created later joins the running
shared query as a table of its own at the next listing, without a restart. A listing that
fails keeps the topics found before (no table stops because the broker did not answer once),
is logged with the datastream, counted, retried with backoff and shown in the worker's loops
(``debugInfo``, ``millstream_loop_*``).

A topic whose table cannot be made (two topics mapping to one table name, an invalid name) is
refused: logged once, and listed with the reason in the worker's status; the other topics'
tables run on.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from millstream.clock import SYSTEM_CLOCK, Clock
from millstream.datastream import DatastreamSpec, KafkaSource, TopicTables
from millstream.ingest.sources.kafka import list_topics
from millstream.spec import parse_duration
from millstream.supervise import Backoff, LoopStatus, Supervisor

log = logging.getLogger(__name__)

#: The broker's topics for a source: what a pattern is matched against.
Lister = Callable[[KafkaSource], list[str]]


def broker_topics(source: KafkaSource) -> list[str]:
    return list_topics(source.bootstrap_servers, source.options)


def member_key(datastream: str, table: str) -> str:
    """A multi-table datastream's table as a member of the worker's shared query (and the
    name of its writer's state directory): ``<datastream>.<table>``. Neither name holds a
    '.', so the key is unambiguous."""
    return f"{datastream}.{table}"


def datastream_of(key: str) -> str:
    """The datastream of a shared query's member (a datastream's name, or a member key)."""
    return key.split(".", 1)[0]


class Topics:
    """Per multi-table datastream: its topics (listed from the broker for a pattern) and the
    tables they map to."""

    def __init__(self, *, clock: Clock = SYSTEM_CLOCK, lister: Lister = broker_topics) -> None:
        self.clock = clock
        self.lister = lister
        #: per datastream, the topics a pattern matched at the last listing, and when
        self.found: dict[str, list[str]] = {}
        self.listed_at: dict[str, float] = {}
        #: per datastream, the topics refused a table and why (logged once each)
        self.refused: dict[str, dict[str, str]] = {}
        self.supervisors: dict[str, Supervisor] = {}
        self._lock = threading.Lock()

    def tables(self, datastream: str, spec: DatastreamSpec) -> TopicTables:
        """The tables of ``spec`` (multi-table) now: its listed topics', or those of the
        topics its pattern matched at the latest listing (listed again when due)."""
        source = spec.source
        assert isinstance(source, KafkaSource)
        if source.topics is not None:
            topics = list(source.topics)
        else:
            self._list_if_due(datastream, source)
            topics = self.found.get(datastream, [])
        found = spec.tables(topics)
        refused = {t: e.message for t, e in found.refused.items()}
        with self._lock:
            before = self.refused.get(datastream, {})
            for topic, why in refused.items():
                if before.get(topic) != why:
                    log.error("datastream %s: topic %s gets no table: %s", datastream, topic, why)
            self.refused[datastream] = refused
        return found

    def _list_if_due(self, datastream: str, source: KafkaSource) -> None:
        interval = parse_duration(source.topic_poll_interval, field="source.topic_poll_interval")
        assert interval is not None
        every = interval.total_seconds()
        now = self.clock.now()
        last = self.listed_at.get(datastream)
        if last is not None and now - last < every:
            return
        sup = self.supervisors.get(datastream)
        if sup is None:
            sup = self.supervisors[datastream] = Supervisor(
                "topic-discovery",
                table=datastream,
                clock=self.clock,
                backoff=Backoff(base=min(5.0, every), cap=max(every, 60.0)),
            )
        if sup.due():
            sup.attempt(self._list, datastream, source)

    def _list(self, datastream: str, source: KafkaSource) -> None:
        topics = sorted(t for t in self.lister(source) if source.matches(t))
        new = sorted(set(topics) - set(self.found.get(datastream, [])))
        if new and datastream in self.found:
            log.info("datastream %s: new topics matching its pattern %s", datastream, new)
        self.found[datastream] = topics
        self.listed_at[datastream] = self.clock.now()

    def forget(self, datastream: str) -> None:
        """A datastream no longer run here: its listing is dropped (listed afresh if it comes
        back)."""
        for d in (self.found, self.listed_at, self.refused, self.supervisors):
            d.pop(datastream, None)

    def loop_statuses(self, *, alive: bool) -> list[LoopStatus]:
        return [s.status(alive=alive) for _, s in sorted(self.supervisors.items())]
