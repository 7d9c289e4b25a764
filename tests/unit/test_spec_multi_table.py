"""A datastream of many topics (``source.topics`` or ``source.topic_pattern``), a table each:
what its spec says, what it refuses (naming the field), and which tables it claims."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from millstream.catalog import Catalog
from millstream.control.controller import Controller
from millstream.control.registry import Registry
from millstream.datastream import SOURCE_TS_COLUMN, DatastreamSpec, DerivedTable
from millstream.errors import InvalidSpecError, TableOwnedError

BASE: dict[str, Any] = {
    "name": "inventory",
    "source": {
        "kind": "kafka",
        "bootstrap_servers": "127.0.0.1:9092",
        "topics": ["dbserver1.inventory.customers", "dbserver1.inventory.orders"],
    },
    "table": {"mode": "upsert", "primary_key": ["id"]},
    "schema": {"id": "long", "name": "string"},
}


def _spec(**changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        at = data
        for p in parents:
            at = at.setdefault(p, {})
        if value is None:
            at.pop(leaf, None)
        else:
            at[leaf] = value
    return data


def _error(data: dict[str, Any]) -> InvalidSpecError:
    with pytest.raises(InvalidSpecError) as info:
        DatastreamSpec.parse(data)
    return info.value


def test_each_listed_topic_gets_a_table_named_by_the_template() -> None:
    spec = DatastreamSpec.parse(BASE)
    assert spec.multi_table
    tables = spec.declared_tables()
    assert sorted(tables) == ["customers", "orders"]  # {topic_last}, the default template
    orders = tables["orders"]
    assert orders.name == "inventory"  # the datastream owns every table
    assert orders.source.kind == "kafka" and orders.source.topic == "dbserver1.inventory.orders"
    table = orders.table_spec()
    assert (table.mode, table.primary_key, table.columns) == (
        "upsert",
        ("id",),
        {"id": "long", "name": "string"},
    )
    assert orders.dead_letter_table == "orders__dead_letter"

    named = DatastreamSpec.parse(_spec(table__name="{datastream}_{topic_safe}"))
    assert sorted(named.declared_tables()) == [
        "inventory_dbserver1_inventory_customers",
        "inventory_dbserver1_inventory_orders",
    ]
    # a single-table question of a multi-table spec is refused, naming the field
    with pytest.raises(InvalidSpecError, match="writes a table per topic"):
        spec.table_spec()


def test_exactly_one_of_topic_topics_and_topic_pattern() -> None:
    both = _error(_spec(source__topic="a"))
    assert both.field == "source.topics"
    assert "exactly one of topic, topics or topic_pattern (the spec gives topic, topics)" in str(
        both
    )
    assert _error(_spec(source__topics=None)).field == "source.topic"
    assert _error(_spec(source__topics=["a", "b", "a"])).field == "source.topics.2"
    bad = _error(_spec(source__topics=None, source__topic_pattern="db(["))
    assert bad.field == "source.topic_pattern"
    assert "is not a regular expression" in str(bad)


def test_two_topics_mapping_to_one_table_are_refused_naming_both() -> None:
    err = _error(_spec(source__topics=["db1.shop.orders", "db2.shop.orders"]))
    assert err.field == "table.name"
    assert "topics 'db1.shop.orders' and 'db2.shop.orders' both map to table 'orders'" in str(err)
    # a table that would be another topic's dead-letter table is refused likewise
    dl = _error(_spec(source__topics=["a.orders", "b.orders__dead_letter"]))
    assert "'a.orders' and 'b.orders__dead_letter'" in str(dl)
    # an override's name resolves it
    ok = DatastreamSpec.parse(
        _spec(
            source__topics=["db1.shop.orders", "db2.shop.orders"],
            overrides={"db2.shop.orders": {"name": "orders_2"}},
        )
    )
    assert sorted(ok.declared_tables()) == ["orders", "orders_2"]


def test_the_template_and_its_names_are_checked() -> None:
    unknown = _error(_spec(table__name="{topik}"))
    assert unknown.field == "table.name"
    assert "{topik} is not a variable" in str(unknown) and "{topic_last}" in str(unknown)
    fixed = _error(_spec(table__name="orders"))
    assert "names every topic's table alike" in str(fixed)
    dotted = _error(_spec(table__name="{topic}"))  # a topic's dots are not a table name's
    assert dotted.field == "table.name"
    assert "topic 'dbserver1.inventory.customers'" in str(dotted)


def test_a_topic_override_changes_its_table_alone() -> None:
    spec = DatastreamSpec.parse(
        _spec(
            overrides={
                "dbserver1.inventory.orders": {
                    "mode": "append",
                    "schema": {"order_id": "long", "total": "double"},
                    "retention": {"time": "1h"},
                },
                "dbserver1.inventory.customers": {
                    "schema": {"cid": "long", "ts": "long"},
                    "primary_key": ["cid"],
                    "comparison_column": "ts",
                },
            }
        )
    )
    tables = spec.declared_tables()
    orders = tables["orders"].table_spec()
    assert (orders.mode, orders.primary_key, orders.retention.time) == ("append", (), "1h")
    assert list(orders.columns) == ["order_id", "total"]
    customers = tables["customers"].table_spec()
    assert (customers.mode, customers.primary_key, customers.comparison_column) == (
        "upsert",
        ("cid",),
        "ts",
    )


def test_an_override_error_names_the_topic_and_its_field() -> None:
    err = _error(_spec(overrides={"dbserver1.inventory.orders": {"primary_key": ["nope"]}}))
    assert err.field == "overrides.dbserver1.inventory.orders.primary_key"
    assert "topic 'dbserver1.inventory.orders': column 'nope' is not in the schema" in str(err)
    typo = _error(_spec(overrides={"dbserver1.inventory.orderz": {"mode": "append"}}))
    assert typo.field == "overrides.dbserver1.inventory.orderz"
    assert "is not a topic of source.topics" in str(typo)
    outside = _error(
        _spec(
            source__topics=None,
            source__topic_pattern=r"dbserver1\.inventory\..*",
            overrides={"dbserver2.inventory.orders": {"mode": "append"}},
        )
    )
    assert "does not match source.topic_pattern" in str(outside)
    single = _error(
        _spec(source__topics=None, source__topic="t", overrides={"t": {"mode": "append"}})
    )
    assert single.field == "overrides"


def test_a_pattern_takes_the_topics_it_matches_whole() -> None:
    spec = DatastreamSpec.parse(
        _spec(source__topics=None, source__topic_pattern=r"dbserver1\.inventory\..*")
    )
    assert spec.declared_tables() == {}  # found by the worker, on the broker
    found = spec.tables(
        [
            "dbserver1.inventory.customers",
            "dbserver1.inventoryx.orders",  # no match
            "xdbserver1.inventory.orders",  # a match must be whole
            "dbserver1.inventory.products",
        ]
    )
    assert found.topics() == {
        "customers": "dbserver1.inventory.customers",
        "products": "dbserver1.inventory.products",
    }
    clash = spec.tables(["dbserver1.inventory.a.x", "dbserver1.inventory.b.x"])
    assert list(clash.members) == ["x"]  # the first topic by name keeps the table
    assert "both map to table 'x'" in str(clash.refused["dbserver1.inventory.b.x"])
    with pytest.raises(InvalidSpecError, match="topic_poll_interval"):
        DatastreamSpec.parse(
            _spec(
                source__topics=None,
                source__topic_pattern="x.*",
                source__topic_poll_interval="soon",
            )
        )


def test_the_datastream_owns_every_listed_topics_table(tmp_path: Path) -> None:
    catalog = Catalog.open(home=tmp_path / "home")
    registry = Registry(catalog.store)
    registry.create(DatastreamSpec.parse(BASE))
    Controller(catalog, controller_id="c1").tick()  # the leader creates the tables
    assert {"customers", "orders", "orders__dead_letter"} <= {
        t.name for t in catalog.store.list_tables()
    }
    other = {**copy.deepcopy(BASE), "name": "other"}
    other["source"]["topics"] = ["x.orders"]
    with pytest.raises(TableOwnedError, match="table 'orders' belongs to datastream 'inventory'"):
        registry.create(DatastreamSpec.parse(other))
    # an update of the same spec changes nothing (what may change: test_api_datastream_update_multi)
    assert registry.update("inventory", DatastreamSpec.parse(BASE))[1] == []


DEBEZIUM: dict[str, Any] = {
    "name": "inventory",
    "source": {
        "kind": "kafka",
        "bootstrap_servers": "127.0.0.1:9092",
        "topic_pattern": r"dbserver1\.inventory\..*",
        "format": "avro",
        "schema_registry": {"url": "http://127.0.0.1:1"},
        "envelope": "debezium",
    },
    "table": {"mode": "upsert"},
}


def test_without_a_schema_each_table_takes_its_topics_writer_schemas() -> None:
    spec = DatastreamSpec.parse(DEBEZIUM)
    assert spec.schema_from_registry and spec.declared_tables() == {}
    derived = DerivedTable({"id": "long", "name": "string"}, ("id",))
    member = spec.table_for("dbserver1.inventory.customers", derived)
    table = member.table_spec()
    assert (table.name, table.primary_key, table.comparison_column) == (
        "customers",
        ("id",),
        SOURCE_TS_COLUMN,
    )
    assert list(table.columns) == ["id", "name", SOURCE_TS_COLUMN]
    assert member.source.kind == "kafka"
    assert member.source.metadata_columns == {"source_ts_ms": SOURCE_TS_COLUMN}
    assert member.source.schema_evolution == "auto"  # later writer schemas grow it
    # a topic with no writer schema yet has no table yet; one whose schema makes none is refused
    found = spec.tables(
        ["dbserver1.inventory.customers", "dbserver1.inventory.orders"],
        lambda topic, table: derived if table == "customers" else None,
    )
    assert list(found.members) == ["customers"] and not found.refused
    with pytest.raises(InvalidSpecError, match="no writer schema"):
        spec.table_for("dbserver1.inventory.orders")
    # the user's own key, comparison column and schema_evolution win
    own = DatastreamSpec.parse(
        {
            **DEBEZIUM,
            "source": {**DEBEZIUM["source"], "schema_evolution": "none"},
            "table": {"mode": "upsert", "primary_key": ["name"], "comparison_column": "id"},
        }
    )
    mine = own.table_for("dbserver1.inventory.customers", derived)
    assert mine.table_spec().primary_key == ("name",)
    assert list(mine.table_spec().columns) == ["id", "name"]
    assert mine.source.schema_evolution == "none"


def test_a_schema_may_be_left_out_only_where_the_registry_gives_it() -> None:
    for change in (
        {"envelope": None},
        {"format": "json", "schema_registry": None},
        {"topic_pattern": None, "topic": "dbserver1.inventory.customers"},
    ):
        source = {k: v for k, v in {**DEBEZIUM["source"], **change}.items() if v is not None}
        err = _error({**DEBEZIUM, "source": source})
        assert err.field == "schema" and "is required" in str(err), change


def test_a_stored_spec_makes_the_same_tables_as_the_one_created() -> None:
    """The registry stores a spec with every field (defaults included) and the worker reads
    that: its tables must be the ones the user's spec makes (tables made from the registry
    evolve by default, unless the user said ``none``)."""
    derived = DerivedTable({"id": "long"}, ("id",))
    for source in (DEBEZIUM["source"], {**DEBEZIUM["source"], "schema_evolution": "none"}):
        spec = DatastreamSpec.parse({**DEBEZIUM, "source": source})
        stored = DatastreamSpec.parse(spec.model_dump(mode="json", by_alias=True))
        topic = "dbserver1.inventory.customers"
        assert stored.table_for(topic, derived) == spec.table_for(topic, derived)
    assert (
        DatastreamSpec.parse(BASE).declared_tables()
        == DatastreamSpec.parse(
            DatastreamSpec.parse(BASE).model_dump(mode="json", by_alias=True)
        ).declared_tables()
    )


def test_a_spec_stored_before_schema_evolution_could_be_unset_compares_equal() -> None:
    """A single-table spec stored with ``schema_evolution: none`` (every spec stored so far
    has it: the default was dumped) and the same spec sent again without the field are the
    same spec, so an update does not read it as a change of the source."""
    sent = {**BASE, "source": {**BASE["source"], "topic": "t"}}
    del sent["source"]["topics"]
    stored = {**sent, "source": {**sent["source"], "schema_evolution": "none"}}
    assert DatastreamSpec.parse(sent) == DatastreamSpec.parse(stored)
    assert DatastreamSpec.parse(sent).source.schema_evolution == "none"
