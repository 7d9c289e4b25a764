"""The tables of a worker's multi-table datastreams (``source.topics`` or
``source.topic_pattern``): which topics each reads now, and so which tables it writes.

A ``topics`` list is fixed. A ``topic_pattern`` is matched against the broker's topics, listed
again every ``topic_poll_interval`` (30 s by default; Kafka Connect's ``topics.regex`` relies
on the consumer's metadata refresh, 5 minutes): a topic created later joins the running
shared query as a table of its own at the next listing, without a restart. A listing that
fails keeps the topics found before (no table stops because the broker did not answer once),
is logged with the datastream, counted, retried with backoff and shown in the worker's loops
(``debugInfo``, ``millstream_loop_*``).

With no ``schema`` (a Debezium Avro or a Protobuf source with a registry,
:attr:`~millstream.datastream.DatastreamSpec.schema_from_registry`), a topic's table is made
from its latest writer schemas (:func:`~millstream.ingest.formats.envelope.debezium_table`,
:func:`~millstream.ingest.formats.protobuf.protobuf_table`) once the registry has them, or
taken as it is stored once it exists (its schema may have grown since); a topic without a
schema yet waits, asked again every ``topic_poll_interval``, and a registry that does not
answer makes its topics wait likewise (logged). A topic whose writer schemas make no table is
refused until it is asked again.

A topic whose table cannot be made (two topics mapping to one table name, an invalid name) is
refused: logged once, and listed with the reason in the worker's status; the other topics'
tables run on.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from millstream.clock import SYSTEM_CLOCK, Clock
from millstream.datastream import (
    DatastreamSpec,
    DerivedTable,
    KafkaSource,
    TopicTables,
)
from millstream.errors import InvalidSpecError
from millstream.ingest.formats.envelope import debezium_table
from millstream.ingest.formats.protobuf import protobuf_table
from millstream.ingest.formats.registry import RegistryClient
from millstream.ingest.sources.kafka import list_topics
from millstream.spec import TableSpec, parse_duration
from millstream.supervise import Backoff, LoopStatus, Supervisor

log = logging.getLogger(__name__)

#: The broker's topics for a source: what a pattern is matched against.
Lister = Callable[[KafkaSource], list[str]]
#: A table's stored spec (None: no such table yet).
Stored = Callable[[str], TableSpec | None]
#: How long a worker's tick waits for a registry that does not answer (the topic then waits
#: for the next try).
REGISTRY_WAIT_S = 5.0


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


def current_tables(
    spec: DatastreamSpec,
    *,
    stored: Stored,
    lister: Lister = broker_topics,
) -> dict[str, DatastreamSpec]:
    """A multi-table datastream's tables that exist now, table -> its single-topic spec, for
    the API and the CLI (the worker keeps its own, :class:`Topics`): its listed topics', or
    those its pattern matches on the broker now (raises when the broker does not answer)."""
    source = spec.source
    assert isinstance(source, KafkaSource)
    topics = (
        list(source.topics)
        if source.topics is not None
        else [t for t in lister(source) if source.matches(t)]
    )

    def derive(topic: str, table: str) -> DerivedTable | None:
        st = stored(table)
        return DerivedTable(dict(st.columns), st.primary_key) if st is not None else None

    found = spec.tables(topics, derive if spec.schema_from_registry else None)
    return {n: m for n, m in found.members.items() if stored(n) is not None}


class Topics:
    """Per multi-table datastream: its topics (listed from the broker for a pattern) and the
    tables they map to."""

    def __init__(
        self,
        *,
        clock: Clock = SYSTEM_CLOCK,
        lister: Lister = broker_topics,
        stored: Stored = lambda _: None,
    ) -> None:
        self.clock = clock
        self.lister = lister
        self.stored = stored
        #: per (datastream, topic): its table made from the writer schemas, and when a topic
        #: without one was last asked
        self.derived: dict[tuple[str, str], DerivedTable] = {}
        self._asked: dict[tuple[str, str], float] = {}
        #: per (datastream, topic): why its writer schemas made no table, until asked again
        self._refusals: dict[tuple[str, str], InvalidSpecError] = {}
        self._registries: dict[tuple[str, str | None], RegistryClient] = {}
        self._made: dict[str, tuple[tuple[str, tuple[str, ...]], TopicTables]] = {}
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
        if spec.schema_from_registry:
            found = spec.tables(topics, self._deriver(datastream, spec))
        else:  # the same spec and topics make the same tables: made once, not at each tick
            key = (spec.model_dump_json(), tuple(topics))
            cached = self._made.get(datastream)
            if cached is None or cached[0] != key:
                cached = self._made[datastream] = (key, spec.tables(topics))
            found = cached[1]
        refused = {t: e.message for t, e in found.refused.items()}
        with self._lock:
            before = self.refused.get(datastream, {})
            for topic, why in refused.items():
                if before.get(topic) != why:
                    log.error("datastream %s: topic %s gets no table: %s", datastream, topic, why)
            self.refused[datastream] = refused
        return found

    def _deriver(
        self, datastream: str, spec: DatastreamSpec
    ) -> Callable[[str, str], DerivedTable | None]:
        source = spec.source
        assert isinstance(source, KafkaSource) and source.schema_registry is not None
        reg = source.schema_registry

        def client_for(fmt: str | None) -> RegistryClient:
            client = self._registries.get((reg.url, fmt))
            if client is None:
                client = self._registries[(reg.url, fmt)] = RegistryClient(
                    reg.url, user_info=reg.basic_auth_user_info, fmt=fmt, max_wait=REGISTRY_WAIT_S
                )
            return client

        plain = client_for(None)
        if source.format == "protobuf":  # a Protobuf schema as its FileDescriptorProto

            def derive_from(topic: str) -> DerivedTable | None:
                return protobuf_table(client_for("serialized"), topic, keys=plain)
        else:

            def derive_from(topic: str) -> DerivedTable | None:
                return debezium_table(plain, topic)

        every = _seconds(source)

        def derive(topic: str, table: str) -> DerivedTable | None:
            key = (datastream, topic)
            if key in self.derived:
                return self.derived[key]
            stored = self.stored(table)
            if stored is not None:  # as it is (its schema may have grown): not derived again
                as_is = self.derived[key] = DerivedTable(dict(stored.columns), stored.primary_key)
                return as_is
            now = self.clock.now()
            if now - self._asked.get(key, -every) < every:
                refused = self._refusals.get(key)
                if refused is not None:  # still refused, not asked again yet
                    raise refused
                return None
            self._asked[key] = now
            self._refusals.pop(key, None)
            try:
                found = derive_from(topic)
            except InvalidSpecError as exc:
                self._refusals[key] = exc
                raise
            except Exception as exc:  # the registry did not answer: the topic waits
                log.warning(
                    "datastream %s: topic %s waits for its writer schema: %s",
                    datastream,
                    topic,
                    exc,
                )
                return None
            if found is not None:
                self.derived[key] = found
            return found

        return derive

    def _list_if_due(self, datastream: str, source: KafkaSource) -> None:
        every = _seconds(source)
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
        for d in (self.found, self.listed_at, self.refused, self.supervisors, self._made):
            d.pop(datastream, None)
        for cache in (self.derived, self._asked, self._refusals):
            for key in [k for k in cache if k[0] == datastream]:
                del cache[key]

    def loop_statuses(self, *, alive: bool) -> list[LoopStatus]:
        return [s.status(alive=alive) for _, s in sorted(self.supervisors.items())]


def _seconds(source: KafkaSource) -> float:
    interval = parse_duration(source.topic_poll_interval, field="source.topic_poll_interval")
    assert interval is not None
    return interval.total_seconds()
