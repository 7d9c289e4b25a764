"""Tables in the metadata store: creation, listing, schema version, durability across opens."""

from __future__ import annotations

import pytest

from harness.contract_support import EVENTS, TABLE, Backend, commit, expected_rows, table_rows
from millstream.catalog import Catalog
from millstream.errors import AlreadyExistsError, TableNotFoundError
from millstream.metastore import schema
from millstream.metastore.store import MetadataStore
from millstream.spec import TableSpec

ORDERS = {
    "name": "orders",
    "schema": {"order_id": "long", "status": "string", "amount": "double", "ts": "timestamp"},
    "primary_key": ["order_id"],
    "mode": "upsert",
    "comparison_column": "ts",
}


def test_create_table_returns_the_table_at_manifest_version_zero(catalog: Catalog) -> None:
    info = catalog.create_table(ORDERS)

    assert info.name == "orders"
    assert info.manifest_version == 0
    assert info.spec == TableSpec.parse(ORDERS)
    assert catalog.table("orders").spec == TableSpec.parse(ORDERS)
    assert catalog.read_table("orders").num_rows == 0


def test_create_table_is_idempotent_for_the_same_spec(catalog: Catalog) -> None:
    first = catalog.create_table(ORDERS)
    again = catalog.create_table(dict(ORDERS))

    assert again == first
    assert [t.name for t in catalog.store.list_tables()] == ["orders"]


def test_create_table_with_a_different_spec_raises_already_exists(catalog: Catalog) -> None:
    catalog.create_table(ORDERS)
    changed = {**ORDERS, "schema": {**ORDERS["schema"], "note": "string"}}

    with pytest.raises(AlreadyExistsError, match="orders"):
        catalog.create_table(changed)
    assert catalog.table("orders").spec == TableSpec.parse(ORDERS)


def test_create_table_without_exist_ok_raises_already_exists_even_for_the_same_spec(
    catalog: Catalog,
) -> None:
    catalog.create_table(ORDERS)

    with pytest.raises(AlreadyExistsError):
        catalog.create_table(ORDERS, exist_ok=False)


def test_list_tables_returns_every_table_by_name(catalog: Catalog) -> None:
    catalog.create_table(ORDERS)
    catalog.create_table(EVENTS)
    catalog.create_table({**EVENTS, "name": "audit-log"})

    assert [t.name for t in catalog.store.list_tables()] == ["audit-log", "events", "orders"]


def test_an_unknown_table_raises_table_not_found(catalog: Catalog) -> None:
    with pytest.raises(TableNotFoundError, match="nope"):
        catalog.read_table("nope")
    with pytest.raises(TableNotFoundError):
        catalog.store.get_shard("nope", 0)


def test_the_metadata_schema_version_is_recorded(catalog: Catalog) -> None:
    assert catalog.store.schema_version() == schema.LATEST_SCHEMA_VERSION


def test_opening_the_store_again_sees_tables_shards_and_rows(
    catalog: Catalog, backend: Backend
) -> None:
    spec = catalog.create_table(EVENTS).spec
    catalog.create_table(ORDERS)
    commit(catalog, {0: (0, 5), 1: (10, 13)})
    before = catalog.manifest(TABLE)
    catalog.close()

    # A second store on the same URL finds the schema in place and migrates nothing.
    again = MetadataStore(backend.metadata_url)
    assert again.schema_version() == schema.LATEST_SCHEMA_VERSION
    again.dispose()

    with backend.open() as reopened:
        assert [t.name for t in reopened.store.list_tables()] == ["events", "orders"]
        assert reopened.table("orders").spec == TableSpec.parse(ORDERS)
        assert reopened.manifest(TABLE) == before
        assert [(s.partition, s.upper) for s in reopened.store.list_shards(TABLE)] == [
            (0, 5),
            (1, 13),
        ]
        assert table_rows(reopened) == expected_rows(spec, [{0: (0, 5), 1: (10, 13)}])
