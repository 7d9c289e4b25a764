"""A multi-table Debezium datastream's table made from its topic's writer schemas in the test
schema registry (as Debezium's Avro converter registers them, through confluent-kafka's own
serializer), and grown by a later writer schema (``schema_evolution: auto`` now reads the
envelope's row record, not the envelope's own fields)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from harness.formats import DebeziumAvroEncoder, debezium_envelope
from harness.schema_registry import TestSchemaRegistry
from millstream.catalog import Catalog
from millstream.control.registry import Registry
from millstream.datastream import SOURCE_TS_COLUMN, DatastreamSpec
from millstream.errors import InvalidSpecError
from millstream.ingest.formats import absorber
from millstream.ingest.formats.envelope import debezium_table
from millstream.ingest.formats.registry import RegistryClient
from millstream.ingest.sources import config_for

V1 = [
    {"name": "id", "type": "long"},
    {"name": "name", "type": ["null", "string"], "default": None},
    {"name": "qty", "type": ["null", "int"], "default": None},
]
V2 = [*V1, {"name": "note", "type": ["null", "string"], "default": None}]
KEY = {"type": "record", "name": "Key", "namespace": "db.shop.items", "fields": [V1[0]]}


@pytest.fixture
def registry() -> Iterator[TestSchemaRegistry]:
    with TestSchemaRegistry() as reg:
        yield reg


def _spec(url: str) -> DatastreamSpec:
    return DatastreamSpec.parse(
        {
            "name": "shop",
            "source": {
                "kind": "kafka",
                "bootstrap_servers": "127.0.0.1:1",
                "topic_pattern": r"db\.shop\..*",
                "format": "avro",
                "schema_registry": {"url": url},
                "envelope": "debezium",
            },
            "table": {"mode": "upsert"},
        }
    )


def _event(k: int, ts: int, **extra: object) -> dict[str, object]:
    after = {"id": k, "name": f"k{k}", "qty": ts, **extra}
    return {"before": None, "after": after, "op": "c", "ts_ms": ts, "source": {"ts_ms": ts}}


def test_a_topics_table_is_made_from_its_writer_schemas_and_grows_with_them(
    registry: TestSchemaRegistry, tmp_path: Path
) -> None:
    topic = "db.shop.items"
    client = RegistryClient(registry.url, max_wait=1.0)
    assert debezium_table(client, topic) is None  # nothing registered yet: the topic waits
    v1 = DebeziumAvroEncoder(registry.url, topic, debezium_envelope(V1, "db.shop.items"), KEY)
    first = v1.value(_event(1, 1))
    v1.key({"id": 1})
    derived = debezium_table(client, topic)
    assert derived is not None
    assert derived.columns == {"id": "long", "name": "string", "qty": "int"}
    assert derived.key == ("id",)

    spec = _spec(registry.url)
    member = spec.tables([topic], lambda t, table: derived).members["items"]
    table = member.table_spec()
    assert list(table.columns) == ["id", "name", "qty", SOURCE_TS_COLUMN]
    auto = absorber(config_for(member.source)[1])
    assert auto is not None, "a table made from writer schemas evolves with them"
    assert auto.absorbing(table, pa.array([first], pa.binary())) == table

    v2 = DebeziumAvroEncoder(registry.url, topic, debezium_envelope(V2, "db.shop.items"), KEY)
    later = v2.value(_event(2, 2, note="hello"))
    grown = auto.absorbing(table, pa.array([first, later], pa.binary()))
    assert list(grown.columns) == ["id", "name", "qty", SOURCE_TS_COLUMN, "note"]
    assert grown.columns["note"] == "string"
    assert (grown.primary_key, grown.comparison_column) == (("id",), SOURCE_TS_COLUMN)

    # the writer's evolution, in the store, beside the datastream's own row (whose spec has no
    # columns of its tables to follow)
    with Catalog.open(home=tmp_path / "home") as cat:
        Registry(cat.store).create(spec)
        cat.create_table(table)
        info, changes = cat.store.absorb("items", lambda current: grown)
        assert list(info.spec.columns) == list(grown.columns) and changes
        assert Registry(cat.store).get("shop").spec == spec


def test_a_topic_whose_schemas_make_no_table_is_refused_naming_why(
    registry: TestSchemaRegistry,
) -> None:
    client = RegistryClient(registry.url, max_wait=1.0)
    keyless = DebeziumAvroEncoder(registry.url, "db.shop.logs", debezium_envelope(V1, "db.l"))
    keyless.value(_event(1, 1))  # a value schema, no key schema registered
    with pytest.raises(InvalidSpecError, match="no record key schema") as err:
        debezium_table(client, "db.shop.logs")
    assert err.value.field == "table.primary_key"
    spec = _spec(registry.url)
    found = spec.tables(["db.shop.logs"], lambda t, table: debezium_table(client, t))
    assert not found.members and "no record key schema" in str(found.refused["db.shop.logs"])
