"""A multi-table Protobuf datastream's tables made from its topics' writer schemas in the test
schema registry (registered by confluent-kafka's own ``ProtobufSerializer``), as the worker
makes them (:class:`millstream.control.topics.Topics`), and what the write tasks then do with
them (:func:`millstream.ingest.formats.decoder_for` and ``absorber``, what the sink calls):

* the columns are the value message's fields, the key the key message's fields (or the
  spec's ``primary_key``; an append table needs none), no comparison column (a plain message
  has no ``source.ts_ms``), and later writer schemas grow the table (``auto``);
* a tombstone deletes the key its Protobuf record key holds; a key its schema cannot read
  is dead-lettered, never applied to another key;
* a topic whose writer schema makes no table is refused alone, naming the topic, the schema
  id and the field, and stays refused until asked again;
* a writer schema the rules refuse leaves the table as it is and dead-letters its records,
  naming the topic, the field and the schema id.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from harness.formats import ProtobufRowEncoder
from harness.schema_registry import TestSchemaRegistry
from millstream.clock import ManualClock
from millstream.control.topics import Topics
from millstream.datastream import DatastreamSpec
from millstream.ingest.decode import decode_records
from millstream.ingest.formats import absorber, decoder_for
from millstream.ingest.sources import config_for

V1 = [("id", "int64"), ("name", "string"), ("qty", "int32")]
V2 = [*V1, ("note", "string")]
KEY = [("id", "int64")]
#: a field no column type holds
NOTHING = [*V1, ("nothing", "empty")]


@pytest.fixture
def registry() -> Iterator[TestSchemaRegistry]:
    with TestSchemaRegistry() as reg:
        yield reg


def _spec(url: str, topics: list[str], **extra: Any) -> DatastreamSpec:
    return DatastreamSpec.parse(
        {
            "name": "shop",
            "source": {
                "kind": "kafka",
                "bootstrap_servers": "127.0.0.1:1",
                "topics": topics,
                "format": "protobuf",
                "schema_registry": {"url": url},
            },
            **extra,
        }
    )


def _raw(values: list[bytes | None], keys: list[bytes | None]) -> pa.Table:
    n = len(values)
    return pa.table(
        {
            "partition": pa.array([0] * n, pa.int32()),
            "offset": pa.array(range(n), pa.int64()),
            "key": pa.array(keys, pa.binary()),
            "value": pa.array(values, pa.binary()),
        }
    )


def test_a_protobuf_topics_table_is_made_from_its_writer_schemas_and_grows_with_them(
    registry: TestSchemaRegistry,
) -> None:
    topic = "db.shop.items"
    spec = _spec(registry.url, [topic], table={"mode": "upsert"})
    assert spec.schema_from_registry
    clock = ManualClock(0.0)
    topics = Topics(clock=clock)
    assert not topics.tables("shop", spec).members, "nothing registered yet: the topic waits"

    v1 = ProtobufRowEncoder(registry.url, topic, "pt.items.v1", V1, KEY)
    first = v1.value({"id": 1, "name": "a", "qty": 3})
    key1 = v1.key({"id": 1})
    clock.advance(31.0)  # asked again at the next topic_poll_interval
    member = topics.tables("shop", spec).members["items"]
    table = member.table_spec()
    assert table.columns == {"id": "long", "name": "string", "qty": "int"}
    assert (table.mode, table.primary_key, table.comparison_column) == ("upsert", ("id",), None)

    config = config_for(member.source)[1]
    auto = absorber(config)
    assert auto is not None, "a table made from writer schemas evolves with them"
    assert auto.absorbing(table, pa.array([first], pa.binary())) == table

    v2 = ProtobufRowEncoder(registry.url, topic, "pt.items.v2", V2, KEY)
    later = v2.value({"id": 2, "name": "b", "qty": 4, "note": "hello"})
    grown = auto.absorbing(table, pa.array([first, later], pa.binary()))
    assert list(grown.columns) == ["id", "name", "qty", "note"]
    assert grown.columns["note"] == "string" and grown.primary_key == ("id",)

    # the rows, and a tombstone whose Protobuf key deletes id 1
    decoded = decode_records(
        grown, _raw([first, later, None], [key1, None, key1]), decoder_for(config)
    )
    assert decoded.dead == []
    got = [
        {k: r[k] for k in ("id", "name", "note", "_ms_tombstone")} for r in decoded.rows.to_pylist()
    ]
    assert got == [
        {"id": 1, "name": "a", "note": None, "_ms_tombstone": False},
        {"id": 2, "name": "b", "note": "hello", "_ms_tombstone": False},
        {"id": 1, "name": None, "note": None, "_ms_tombstone": True},
    ]


@pytest.mark.parametrize(
    ("key", "value", "text"),
    [(("id", "int64"), 300, 7), (("name", "string"), "a", "plain-text-key")],
    ids=["long-key", "string-key"],
)
def test_a_tombstone_whose_protobuf_key_cannot_be_read_is_dead_lettered(
    registry: TestSchemaRegistry, key: tuple[str, str], value: Any, text: Any
) -> None:
    """A key in the wire format that its schema does not read (cut inside a field, an id the
    registry does not know) deletes nothing: the tombstone is dead-lettered naming why, never
    applied to whatever the JSON rules make of its bytes (for a string key, another key). A
    text key (no wire header) still deletes by the JSON rules."""
    column = key[0]
    topic = f"db.shop.keys_{column}"
    spec = _spec(registry.url, [topic], table={"mode": "upsert"})
    enc = ProtobufRowEncoder(registry.url, topic, f"pt.keys_{column}.v1", V1, [key])
    good = enc.key({column: value})
    cut = good[:-1]  # cut inside the key's field
    unknown = b"\x00\x00\x00\x7f\xff" + good[5:]
    topics = Topics(clock=ManualClock(0.0))
    member = topics.tables("shop", spec).members[f"keys_{column}"]
    assert member.table_spec().primary_key == (column,)
    fmt = decoder_for(config_for(member.source)[1])
    keys = [good, cut, unknown, str(text).encode()]
    decoded = decode_records(member.table_spec(), _raw([None] * 4, keys), fmt)
    assert sorted(str(r[column]) for r in decoded.rows.to_pylist()) == sorted(
        [str(value), str(text)]
    )
    dead = {o: e for _, o, _, _, e in decoded.dead}
    assert set(dead) == {1, 2}, dead
    assert dead[1].startswith("tombstone without a usable record key: the Protobuf key")
    assert "key schema id 32767 is unknown" in dead[2]


def test_a_table_without_a_key_schema_takes_the_specs_key_or_is_an_append_table(
    registry: TestSchemaRegistry,
) -> None:
    topic = "db.shop.logs"
    enc = ProtobufRowEncoder(registry.url, topic, "pt.logs.v1", V1)  # no key schema
    enc.value({"id": 1, "name": "a", "qty": 1})
    clock = ManualClock(0.0)

    appended = Topics(clock=clock).tables("shop", _spec(registry.url, [topic]))
    table = appended.members["logs"].table_spec()
    assert (table.mode, table.primary_key) == ("append", ())

    keyed = _spec(registry.url, [topic], table={"mode": "upsert"})
    refused = Topics(clock=clock).tables("shop", keyed)
    assert not refused.members
    error = refused.refused[topic]
    assert error.field == "table.primary_key"
    assert f"topic {topic!r}: the registry holds no record key schema ({topic}-key)" in str(error)

    overridden = _spec(
        registry.url,
        [topic],
        table={"mode": "upsert"},
        overrides={topic: {"primary_key": ["name"]}},
    )
    table = Topics(clock=clock).tables("shop", overridden).members["logs"].table_spec()
    assert (table.mode, table.primary_key) == ("upsert", ("name",))


def test_a_topic_whose_writer_schema_makes_no_table_is_refused_alone_until_asked_again(
    registry: TestSchemaRegistry,
) -> None:
    good, bad = "db.shop.good", "db.shop.bad"
    for topic, package, fields in ((good, "pt.good.v1", V1), (bad, "pt.bad.v1", NOTHING)):
        ProtobufRowEncoder(registry.url, topic, package, fields, KEY)
    sid = registry.subjects[f"{bad}-value"][-1]
    spec = _spec(registry.url, [good, bad], table={"mode": "upsert"})
    clock = ManualClock(0.0)
    topics = Topics(clock=clock)
    for _ in range(2):  # the next tick, before the topic is asked again: still refused
        found = topics.tables("shop", spec)
        assert list(found.members) == ["good"]
        error = found.refused[bad]
        assert error.field == "schema.nothing"
        assert f"topic {bad!r}: writer schema id {sid}: field 'nothing'" in str(error)
        assert topics.refused["shop"] == {bad: error.message}
        clock.advance(1.0)


def test_a_writer_schema_the_rules_refuse_dead_letters_its_records_naming_topic_field_and_id(
    registry: TestSchemaRegistry,
) -> None:
    topic = "db.shop.refused"
    v1 = ProtobufRowEncoder(registry.url, topic, "pt.refused.v1", V1, KEY)
    ok = v1.value({"id": 1, "name": "a", "qty": 1})
    member = (
        Topics(clock=ManualClock(0.0))
        .tables("shop", _spec(registry.url, [topic], table={"mode": "upsert"}))
        .members["refused"]
    )
    table = member.table_spec()
    changed = [("id", "int64"), ("name", "string"), ("qty", "string")]
    v2 = ProtobufRowEncoder(registry.url, topic, "pt.refused.v2", changed, KEY)
    bad = v2.value({"id": 2, "name": "b", "qty": "many"})
    sid = registry.subjects[f"{topic}-value"][-1]
    config = config_for(member.source)[1]
    auto = absorber(config)
    assert auto is not None
    values = pa.array([ok, bad], pa.binary())
    assert auto.absorbing(table, values) == table, "the table is left as it is"
    decoded = decode_records(table, _raw([ok, bad], [None, None]), decoder_for(config))
    assert [r["id"] for r in decoded.rows.to_pylist()] == [1]
    [(_, offset, _, _, error)] = decoded.dead
    assert offset == 1
    assert error.startswith("field 'qty': Protobuf type string does not fit column 'qty' (int)")
    assert f"writer schema id {sid} of topic {topic!r} (schema.qty)" in error
