"""A shared query asks every Kafka member's end offsets in ONE ListOffsets request
(``offsets_for_times`` at ``OFFSET_END``) instead of a metadata request and a watermark request
per partition per member: 8 datastreams of 4 partitions waited 180-350 ms a batch for a busy
broker. A topic's partition list is reused for ``PARTITIONS_TTL_S`` and then listed again, so
a partition added to a topic is planned (its records are not left behind); a topic that fails
fails its own datastream alone."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, KafkaError, KafkaException, TopicPartition
from kafka_fakes import OneConsumerPool

from millstream.errors import SourceReadError
from millstream.ingest.sources import kafka as kafka_source
from millstream.ingest.sources.base import (
    PartitionReader,
    earliest_offsets_of,
    latest_offsets_of,
)
from millstream.ingest.sources.kafka import KafkaConfig, KafkaReader


class _Consumer:
    """A broker's topics as ``{topic: {partition: end offset}}``; counts the requests."""

    def __init__(
        self, topics: dict[str, dict[int, int]], starts: dict[str, dict[int, int]] | None = None
    ) -> None:
        self.topics = topics
        #: each partition's first offset still held (0 unless given: nothing deleted yet)
        self.starts = starts or {}
        self.metadata = 0
        self.list_offsets: list[list[tuple[str, int, int]]] = []
        self.down = False
        #: what a fetch serves past the watermark answered: ``{topic: {partition: end}}``
        #: (a broker whose watermark lags its last produce batch, as Tansu's does)
        self.served: dict[str, dict[int, int]] = {}
        #: the partitions and offsets each probe (an assignment) fetched from
        self.probes: list[dict[tuple[str, int], int]] = []
        self._fetching: dict[tuple[str, int], int] = {}
        #: the partitions that answered their end (EOF) in this assignment
        self._ended: set[tuple[str, int]] = set()
        #: paused partitions: as librdkafka's, a pause outlives ``unassign()``
        self.paused: set[tuple[str, int]] = set()
        #: called before each poll (records arriving while a probe runs)
        self.arriving: Any = None
        #: records served of a partition after it answered its end, per partition
        self.after_end: dict[tuple[str, int], int] = {}
        #: whether a fetch answers the partition's high watermark (what it serves up to), as
        #: a Kafka fetch response does; False: none is known (librdkafka's -1001)
        self.fetch_watermark = True
        #: records served (polled) per partition
        self.served_records: dict[tuple[str, int], int] = {}

    def assign(self, tps: list[TopicPartition]) -> None:
        self._fetching = {(tp.topic, tp.partition): tp.offset for tp in tps}
        self._ended = set()
        self.probes.append(dict(self._fetching))

    def unassign(self) -> None:
        self._fetching = {}

    def pause(self, tps: list[TopicPartition]) -> None:
        self.paused |= {(tp.topic, tp.partition) for tp in tps}

    def resume(self, tps: list[TopicPartition]) -> None:
        self.paused -= {(tp.topic, tp.partition) for tp in tps}

    def poll(self, timeout: float) -> Any:
        """The next record of an assigned, unpaused partition, else its end (a partition
        EOF) once; a partition fetched on after its end serves what arrived since."""
        if self.arriving is not None:
            self.arriving(self)
        for (t, p), at in self._fetching.items():
            if (t, p) in self.paused:
                continue
            end = self.served.get(t, {}).get(p, self.topics[t][p])
            if at < end:
                self._fetching[(t, p)] = at + 1
                self.served_records[(t, p)] = self.served_records.get((t, p), 0) + 1
                if (t, p) in self._ended:
                    self.after_end[(t, p)] = self.after_end.get((t, p), 0) + 1
                return _Message(t, p, at, None)
            if (t, p) not in self._ended:
                self._ended.add((t, p))
                return _Message(t, p, at, KafkaError(KafkaError._PARTITION_EOF))
        return None

    def get_watermark_offsets(
        self, tp: TopicPartition, timeout: float | None = None, cached: bool = False
    ) -> tuple[int, int]:
        """``cached``: the high watermark the partition's last fetch answered (what it serves
        up to), once fetched in this assignment."""
        assert cached, "the probe reads the fetched watermark, it sends no request"
        key = (tp.topic, tp.partition)
        if not self.fetch_watermark or key not in self._fetching:
            return (-1001, -1001)
        return (
            0,
            self.served.get(tp.topic, {}).get(tp.partition, self.topics[tp.topic][tp.partition]),
        )

    def list_topics(self, topic: str, timeout: float) -> Any:
        self.metadata += 1
        if self.down:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))
        parts = self.topics.get(topic)
        if parts is None:
            t = SimpleNamespace(error=KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART), partitions={})
        else:
            t = SimpleNamespace(error=None, partitions=dict.fromkeys(parts))
        return SimpleNamespace(topics={topic: t})

    def offsets_for_times(self, tps: list[TopicPartition], timeout: float) -> list[Any]:
        if self.down:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))
        self.list_offsets.append([(tp.topic, tp.partition, tp.offset) for tp in tps])
        out = []
        for tp in tps:
            end = self.topics.get(tp.topic, {}).get(tp.partition)
            error = KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART) if end is None else None
            if end is not None and tp.offset == OFFSET_BEGINNING:
                end = self.starts.get(tp.topic, {}).get(tp.partition, 0)
            out.append(
                SimpleNamespace(
                    topic=tp.topic,
                    partition=tp.partition,
                    offset=-1 if end is None else end,
                    error=error,
                )
            )
        return out


class _Message:
    def __init__(self, topic: str, partition: int, offset: int, error: Any) -> None:
        self._t, self._p, self._o, self._e = topic, partition, offset, error

    def topic(self) -> str:
        return self._t

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o

    def error(self) -> Any:
        return self._e


def _readers(consumer: _Consumer, *topics: str) -> dict[str, PartitionReader]:
    pool = OneConsumerPool(consumer)
    return {t: KafkaReader(KafkaConfig("127.0.0.1:1", t), consumers=pool) for t in topics}


def test_every_members_end_offsets_come_from_one_request() -> None:
    broker = _Consumer({f"t{i}": {p: 100 * i + p for p in range(4)} for i in range(8)})
    readers = _readers(broker, *broker.topics)

    got = latest_offsets_of(readers)

    assert got == broker.topics
    assert len(broker.list_offsets) == 1  # one ListOffsets for 32 partitions
    assert {o for _, _, o in broker.list_offsets[0]} == {OFFSET_END}
    assert broker.metadata == 8  # each topic's partitions listed once ...
    latest_offsets_of(readers)
    assert broker.metadata == 8  # ... and reused within PARTITIONS_TTL_S
    assert len(broker.list_offsets) == 2


def test_every_members_first_offsets_come_from_one_request_each_its_own_topics() -> None:
    """A shared query's joining members ask where their partitions start in ONE ListOffsets
    request (``OFFSET_BEGINNING``) through one consumer, each answered with its own topic's
    offsets; a missing topic fails its member alone, naming it."""
    topics = {f"t{i}": {p: 100 * i + p for p in range(4)} for i in range(8)}
    starts = {t: {p: 10 * i + p for p in range(4)} for i, t in enumerate(topics)}
    broker = _Consumer(topics, starts)
    readers = _readers(broker, *topics, "gone")

    got = earliest_offsets_of(readers)

    err = got.pop("gone")
    assert isinstance(err, SourceReadError) and "'gone'" in str(err), err
    assert got == starts, "each member's first offsets are its own topic's"
    assert len(broker.list_offsets) == 1  # one ListOffsets for 32 partitions
    assert {o for _, _, o in broker.list_offsets[0]} == {OFFSET_BEGINNING}
    assert {(t, p) for t, p, _ in broker.list_offsets[0]} == {
        (t, p) for t in topics for p in range(4)
    }


def test_a_partition_added_to_a_topic_is_planned_once_its_list_is_old(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [1000.0]
    monkeypatch.setattr("millstream.ingest.sources.kafka.time.monotonic", lambda: now[0])
    broker = _Consumer({"t": {0: 5, 1: 7}})
    (reader,) = _readers(broker, "t").values()
    assert reader.latest_offsets() == {0: 5, 1: 7}

    broker.topics["t"][2] = 3  # a partition added
    now[0] += kafka_source.PARTITIONS_TTL_S / 2
    assert reader.latest_offsets() == {0: 5, 1: 7}
    now[0] += kafka_source.PARTITIONS_TTL_S / 2
    assert reader.latest_offsets() == {0: 5, 1: 7, 2: 3}


def test_a_missing_topic_fails_its_reader_alone_and_names_it() -> None:
    broker = _Consumer({"a": {0: 4}, "b": {0: 2, 1: 9}})
    got = latest_offsets_of(_readers(broker, "a", "gone", "b"))

    assert got["a"] == {0: 4} and got["b"] == {0: 2, 1: 9}
    err = got["gone"]
    assert isinstance(err, SourceReadError)
    assert "'gone'" in str(err) and "not found" in str(err)


def test_an_unanswered_partition_fails_its_reader_and_its_partitions_are_listed_again() -> None:
    broker = _Consumer({"a": {0: 4, 1: 6}, "b": {0: 1}})
    readers = _readers(broker, "a", "b")
    latest_offsets_of(readers)
    del broker.topics["a"][1]  # the broker no longer answers for a partition it listed

    got = latest_offsets_of(readers)

    assert got["b"] == {0: 1}
    err = got["a"]
    assert isinstance(err, SourceReadError)
    assert "partition 1" in str(err) and "'a'" in str(err)
    before = broker.metadata
    broker.topics["a"][1] = 6
    assert latest_offsets_of(readers)["a"] == {0: 4, 1: 6}
    assert broker.metadata == before + 1  # "a" listed again, "b" not


def test_a_broker_that_does_not_answer_gives_each_reader_its_own_error() -> None:
    broker = _Consumer({"a": {0: 4}, "b": {0: 1}})
    readers = _readers(broker, "a", "b")
    latest_offsets_of(readers)
    broker.down = True

    got = latest_offsets_of(readers)

    errors = [e for e in (got["a"], got["b"]) if isinstance(e, SourceReadError)]
    assert len(errors) == 2
    assert errors[0] is not errors[1]  # a shared query notes each member on its own error
    assert all("127.0.0.1:1" in str(e) and isinstance(e.__cause__, KafkaException) for e in errors)
    with pytest.raises(SourceReadError, match="'a'"):
        readers["a"].latest_offsets()


def test_readers_of_other_client_configs_are_asked_apart() -> None:
    broker = _Consumer({"a": {0: 4}, "b": {0: 1}})
    pool = OneConsumerPool(broker)
    readers: dict[str, PartitionReader] = {
        "a": KafkaReader(KafkaConfig("127.0.0.1:1", "a"), consumers=pool),
        "b": KafkaReader(
            KafkaConfig("127.0.0.1:1", "b", {"security.protocol": "plaintext"}), consumers=pool
        ),
    }

    assert latest_offsets_of(readers) == {"a": {0: 4}, "b": {0: 1}}
    assert len(broker.list_offsets) == 2


def test_a_shared_querys_source_asks_every_kafka_members_ends_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from millstream.spark.options import GroupSourceOptions, SourceOptions
    from millstream.spark.sources import MEMBER_NOTE, GroupStreamReader

    broker = _Consumer({f"t{i}": {0: 10 + i, 1: 20 + i} for i in range(3)})
    monkeypatch.setattr("millstream.ingest.sources.kafka.CONSUMERS", OneConsumerPool(broker))
    members = {
        f"ds{i}": SourceOptions("kafka", {"bootstrap_servers": "127.0.0.1:1", "topic": t})
        for i, t in enumerate([*broker.topics, "gone"])
    }
    reader = GroupStreamReader(GroupSourceOptions(members))
    start = {f"ds{i}": {"0": 0, "1": 0} for i in range(4)}

    with pytest.raises(SourceReadError) as failed:
        reader.latestOffset(start, reader.getDefaultReadLimit())
    assert MEMBER_NOTE.format("ds3") in failed.value.__notes__
    assert len(broker.list_offsets) == 1

    del reader.members["ds3"]
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert end == {f"ds{i}": {"0": 10 + i, "1": 20 + i} for i in range(3)}
    assert len(broker.list_offsets) == 2  # one request for the three members' six partitions


def test_two_datastreams_of_one_topic_ask_each_partition_once() -> None:
    broker = _Consumer({"a": {0: 4, 1: 6}})
    pool = OneConsumerPool(broker)
    readers: dict[str, PartitionReader] = {
        n: KafkaReader(KafkaConfig("127.0.0.1:1", "a"), consumers=pool) for n in ("x", "y")
    }

    assert latest_offsets_of(readers) == {"x": {0: 4, 1: 6}, "y": {0: 4, 1: 6}}
    (request,) = broker.list_offsets
    assert sorted(request) == [("a", 0, OFFSET_END), ("a", 1, OFFSET_END)]


def test_a_topics_first_offsets_come_from_one_request() -> None:
    """Re-ingestion asks a topic's first offsets for every entry it checks: one request, not a
    watermark request per partition of the topic."""
    broker = _Consumer(
        {"orders": {p: 1000 for p in range(64)}}, starts={"orders": {3: 250, 40: 999}}
    )
    reader = _readers(broker, "orders")["orders"]

    got = reader.earliest_offsets()

    assert got == {p: {3: 250, 40: 999}.get(p, 0) for p in range(64)}
    assert len(broker.list_offsets) == 1
    assert {o for _, _, o in broker.list_offsets[0]} == {OFFSET_BEGINNING}


def test_an_unanswered_first_offset_fails_naming_the_partition() -> None:
    class _Silent(_Consumer):
        def offsets_for_times(self, tps: list[TopicPartition], timeout: float) -> list[Any]:
            return [a for a in super().offsets_for_times(tps, timeout) if a.partition != 2]

    reader = _readers(_Silent({"orders": dict.fromkeys(range(4), 10)}), "orders")["orders"]
    with pytest.raises(SourceReadError, match="first offsets were not answered") as err:
        reader.earliest_offsets()
    assert "'orders'" in str(err.value) and "partition 2" in str(err.value)


def test_the_latest_offset_is_what_the_broker_serves_past_a_short_watermark() -> None:
    """A broker may answer a watermark short of the records it serves (Tansu: the base offset
    of a partition's last produce batch plus one). Planned to that watermark, the batch's other
    records were never read and the lag said 0. The reader probes past a watermark that moved
    and never answers an end below what the source has shown."""
    broker = _Consumer({"t": {0: 1, 1: 4}})
    broker.served = {"t": {0: 3}}  # offsets 1 and 2 of partition 0 lie past its watermark
    (reader,) = _readers(broker, "t").values()

    assert reader.latest_offsets() == {0: 3, 1: 4}
    assert broker.probes == [{("t", 0): 1, ("t", 1): 4}]

    assert reader.latest_offsets() == {0: 3, 1: 4}  # nothing moved: no probe
    assert len(broker.probes) == 1

    broker.topics["t"][0] = 4  # a new batch of 3 at offset 3: its base offset + 1
    broker.served["t"][0] = 6
    assert reader.latest_offsets() == {0: 4, 1: 4}  # moving: the watermark, no probe
    assert len(broker.probes) == 1
    assert reader.latest_offsets() == {0: 6, 1: 4}  # it held still: probed past it
    assert broker.probes[-1] == {("t", 0): 4}  # only the partition that moved

    broker.topics["t"] = {0: 1, 1: 1}  # deleted and created again: offsets went backwards
    broker.served = {"t": {0: 2}}
    assert reader.latest_offsets() == {0: 2, 1: 1}  # what it showed before is forgotten


def test_a_partition_whose_watermark_keeps_rising_is_not_probed_until_it_holds_still() -> None:
    """While records arrive, the watermark rises at every request and what lies past it (the
    rest of the last produce batch) lies below the next one: a probe then never reached a
    busy partition's end and made every streaming batch wait its whole timeout (2 s of a
    2.3-s batch at 1,000 records/s). A partition that moved is probed once its watermark holds
    still, so the last produce batch of a burst is planned whole at the next request."""
    broker = _Consumer({"t": {0: 1, 1: 1}})
    broker.served = {"t": {0: 1, 1: 1}}
    (reader,) = _readers(broker, "t").values()
    assert reader.latest_offsets() == {0: 1, 1: 1}
    assert len(broker.probes) == 1  # a reader's first answer is probed

    for base in range(5, 50, 5):  # batches of 5 on partition 0: the watermark is base + 1
        broker.topics["t"][0] = base + 1
        broker.served["t"][0] = base + 5
        assert reader.latest_offsets() == {0: base + 1, 1: 1}
    assert len(broker.probes) == 1  # nothing probed while partition 0 moved

    # the producer paused: the watermark holds still and the batch's other 4 records are planned
    assert reader.latest_offsets() == {0: 50, 1: 1}
    assert broker.probes[-1] == {("t", 0): 46}
    assert reader.latest_offsets() == {0: 50, 1: 1}  # reached: not probed again
    assert len(broker.probes) == 2


def test_a_probe_that_does_not_reach_the_end_is_tried_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class _Slow(_Consumer):
        slow = True

        def poll(self, timeout: float) -> Any:
            return None if self.slow else super().poll(timeout)

    monkeypatch.setattr(kafka_source, "PROBE_TIMEOUT_S", 0.01)
    broker = _Slow({"t": {0: 1}})
    broker.served = {"t": {0: 5}}
    (reader,) = _readers(broker, "t").values()
    assert reader.latest_offsets() == {0: 1}
    broker.slow = False
    assert reader.latest_offsets() == {0: 5}
    assert len(broker.probes) == 2


def test_a_probe_that_fails_leaves_the_watermarks_and_what_was_shown() -> None:
    class _Flaky(_Consumer):
        broken = False

        def assign(self, tps: list[TopicPartition]) -> None:
            if self.broken:
                raise KafkaException(KafkaError(KafkaError._TRANSPORT))
            super().assign(tps)

    broker = _Flaky({"t": {0: 1, 1: 2}})
    broker.served = {"t": {0: 3}}
    (reader,) = _readers(broker, "t").values()
    assert reader.latest_offsets() == {0: 3, 1: 2}
    broker.broken = True
    broker.topics["t"][1] = 5  # moved: probed, and the probe fails
    assert reader.latest_offsets() == {0: 3, 1: 5}


def test_a_partition_that_reached_its_end_is_fetched_no_more_while_the_probe_runs() -> None:
    """A probe fetches every moved partition to its end; one that reached it is paused, so
    records still arriving on it do not keep the probe's fetches (and the broker) busy: with
    a hundred busy topics the probe cost the bundled broker three times the CPU. Its end is
    the one it reached; what arrives after is the next request's."""
    broker = _Consumer({"t": {0: 1, 1: 1}})
    broker.served = {"t": {0: 3, 1: 6}}
    broker.fetch_watermark = False  # each partition read to its end (EOF)

    def arriving(b: _Consumer) -> None:  # records arrive on partition 0 after its end
        if ("t", 0) in b._ended and b.served["t"][0] < 20:
            b.served["t"][0] += 1

    (reader,) = _readers(broker, "t").values()
    broker.arriving = arriving
    ends = reader.latest_offsets()
    assert broker.after_end.get(("t", 0), 0) == 0
    assert ends[1] == 6
    assert 3 <= ends[0] < broker.served["t"][0]


def test_a_probes_pause_does_not_outlive_it() -> None:
    """The probe's consumer goes back to the pool: a partition it paused and left paused
    would serve nothing to the next probe, whose end would stay at the short watermark."""
    broker = _Consumer({"t": {0: 1}})
    broker.served = {"t": {0: 3}}
    (reader,) = _readers(broker, "t").values()
    assert reader.latest_offsets() == {0: 3}
    assert not broker.paused
    broker.topics["t"][0] = 4  # a new batch of 3 at offset 3: its base offset + 1
    broker.served["t"][0] = 6
    assert reader.latest_offsets() == {0: 4}  # moving: probed once it holds still
    assert reader.latest_offsets() == {0: 6}


def test_a_probe_settles_at_the_watermark_its_first_fetch_answers() -> None:
    """A broker whose ListOffsets answer lags its last produce batch (Tansu: the batch's base
    offset + 1) hides a backlog's last batch from the watermark: the probe read it record by
    record, and 100 topics produced in one batch each took the probe's whole timeout at a
    datastream's start. A fetch answers the partition's high watermark with its first
    records: the probe settles there (the end its EOF would report), one record read. Where
    no fetched watermark is known, it reads on to the end, as before."""
    broker = _Consumer({"t": {0: 1, 1: 4}})
    broker.served = {"t": {0: 3000, 1: 9}}
    (reader,) = _readers(broker, "t").values()

    assert reader.latest_offsets() == {0: 3000, 1: 9}
    assert broker.served_records == {("t", 0): 1, ("t", 1): 1}
    assert not broker.paused

    unknown = _Consumer({"t": {0: 1, 1: 4}})
    unknown.served = {"t": {0: 3000, 1: 9}}
    unknown.fetch_watermark = False
    (reader,) = _readers(unknown, "t").values()

    assert reader.latest_offsets() == {0: 3000, 1: 9}, "read to the end, not settled short"
    assert unknown.served_records == {("t", 0): 2999, ("t", 1): 5}
