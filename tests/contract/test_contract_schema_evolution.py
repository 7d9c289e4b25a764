"""Schema versions in the manifest, on every metadata store: a compatible change is one
transaction (the table row's compare-and-set plus the new version's history row), a refused
one changes nothing, and a concurrent update re-checks against the winner."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, text

from harness.contract_support import EVENTS, TABLE, Backend, commit
from millstream.catalog import Catalog
from millstream.errors import IncompatibleChangeError
from millstream.metastore import schema
from millstream.metastore.store import MetadataStore
from millstream.spec import TableSpec

V1 = TableSpec.parse(EVENTS)
#: v1 plus a nullable column at the end
WITH_AMOUNT = TableSpec.parse({**EVENTS, "schema": {**EVENTS["schema"], "amount": "double"}})


def spec_with(**columns: str) -> TableSpec:
    return TableSpec.parse({**EVENTS, "schema": {**EVENTS["schema"], **columns}})


def test_a_new_table_is_at_schema_version_1_with_its_spec_in_the_history(
    catalog: Catalog,
) -> None:
    info = catalog.create_table(EVENTS)
    assert info.schema_version == 1
    assert catalog.table(TABLE).schema_version == 1
    assert catalog.store.schema_history(TABLE) == [(1, V1, 0)]


def test_adding_a_column_bumps_the_schema_version_and_records_it(catalog: Catalog) -> None:
    catalog.create_table(EVENTS)
    commit(catalog, {0: (0, 5)})
    before = catalog.table(TABLE)

    info, changes = catalog.store.evolve_table(WITH_AMOUNT)

    assert [c.describe() for c in changes] == ["+ column amount double"]
    assert (info.spec, info.schema_version) == (WITH_AMOUNT, 2)
    now = catalog.table(TABLE)
    assert (now.spec, now.schema_version) == (WITH_AMOUNT, 2)
    assert now.version == before.version + 1
    # A schema change is not a manifest version: no entry changed.
    assert now.manifest_version == before.manifest_version
    assert catalog.store.schema_history(TABLE) == [
        (1, V1, 0),
        (2, WITH_AMOUNT, before.manifest_version),
    ]


def test_an_incompatible_change_is_refused_and_nothing_changes(catalog: Catalog) -> None:
    catalog.create_table(EVENTS)
    catalog.store.evolve_table(WITH_AMOUNT)
    before = catalog.table(TABLE)

    narrowed = spec_with(amount="long")  # double -> long
    with pytest.raises(IncompatibleChangeError) as info:
        catalog.store.evolve_table(narrowed)

    assert info.value.column == "amount"
    assert catalog.table(TABLE) == before
    assert [v for v, _, _ in catalog.store.schema_history(TABLE)] == [1, 2]


def test_the_same_spec_again_changes_nothing(catalog: Catalog) -> None:
    catalog.create_table(EVENTS)
    catalog.store.evolve_table(WITH_AMOUNT)
    before = catalog.table(TABLE)
    info, changes = catalog.store.evolve_table(WITH_AMOUNT)
    assert changes == []
    assert info == before == catalog.table(TABLE)


def test_a_retention_change_alone_keeps_the_schema_version(catalog: Catalog) -> None:
    catalog.create_table(EVENTS)
    longer = TableSpec.parse({**EVENTS, "retention": {"time": "7d"}})
    info, changes = catalog.store.evolve_table(longer)
    assert [c.kind for c in changes] == ["retention"]
    assert (info.schema_version, catalog.table(TABLE).spec) == (1, longer)
    assert len(catalog.store.schema_history(TABLE)) == 1


def test_creating_the_table_again_with_an_older_schema_keeps_the_evolved_table(
    catalog: Catalog,
) -> None:
    """A writer started before the change restarts with its datastream's older spec."""
    catalog.create_table(EVENTS)
    catalog.store.evolve_table(WITH_AMOUNT)
    evolved = catalog.table(TABLE)
    assert catalog.create_table(EVENTS) == evolved
    assert catalog.table(TABLE) == evolved
    # A definition the table never had is still refused.
    from millstream.errors import AlreadyExistsError

    with pytest.raises(AlreadyExistsError):
        catalog.create_table({**EVENTS, "schema": {"id": "long", "other": "string"}})


def test_migrating_a_version_8_store_records_each_tables_spec_as_schema_version_1(
    backend: Backend,
) -> None:
    store = MetadataStore(backend.metadata_url)
    store.create_table(V1)
    with store.write() as conn:
        # What a version 8 database looks like: no schema versions anywhere.
        conn.execute(text("DROP TABLE ms_table_schemas"))
        conn.execute(text("ALTER TABLE ms_tables DROP COLUMN schema_version"))
        conn.execute(text("UPDATE ms_meta SET value = '8' WHERE key = 'schema_version'"))
    store.dispose()

    again = MetadataStore(backend.metadata_url)
    try:
        assert again.schema_version() == schema.LATEST_SCHEMA_VERSION
        assert again.get_table(TABLE).schema_version == 1
        assert again.schema_history(TABLE) == [(1, V1, 0)]
        info, _ = again.evolve_table(WITH_AMOUNT)
        assert info.schema_version == 2
    finally:
        again.dispose()


# -- concurrent updates on PostgreSQL (real transactions) -----------------------------------


@pytest.fixture
def pg_catalog(postgres_server: Any, tmp_path: Path) -> Iterator[Catalog]:
    url = postgres_server.create_database(f"ms_evolve_{uuid.uuid4().hex[:12]}")
    with Catalog.open(metadata_url=url, deep_store=str(tmp_path / "deep")) as cat:
        yield cat


def _evolve_with_a_peer_first(cat: Catalog, mine: TableSpec, theirs: TableSpec) -> Any:
    """Run ``evolve_table(mine)`` where, right before its UPDATE of the table row (after its
    read), a peer's ``evolve_table(theirs)`` commits from another connection."""
    peer = Catalog.open(metadata_url=cat.store.url, deep_store=cat.deep.uri)
    me = threading.get_ident()
    done: list[Any] = []

    def peer_first(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if done or threading.get_ident() != me:
            return
        if not statement.lstrip().upper().startswith("UPDATE MS_TABLES"):
            return
        t = threading.Thread(target=lambda: done.append(peer.store.evolve_table(theirs)))
        t.start()
        t.join(timeout=60)

    event.listen(cat.store.engine, "before_cursor_execute", peer_first)
    try:
        return cat.store.evolve_table(mine)
    finally:
        event.remove(cat.store.engine, "before_cursor_execute", peer_first)
        peer.close()
        assert done, "the peer's update committed in between"


@pytest.mark.postgres
def test_two_updates_at_once_on_postgres_one_wins_and_the_other_is_rechecked_and_refused(
    pg_catalog: Catalog,
) -> None:
    pg_catalog.create_table(EVENTS)
    conflicts = pg_catalog.store.conflicts
    winner = spec_with(amount="double")
    loser = spec_with(region="string")  # written against v1: it does not know `amount`

    with pytest.raises(IncompatibleChangeError) as info:
        _evolve_with_a_peer_first(pg_catalog, loser, winner)

    assert pg_catalog.store.conflicts > conflicts, "the loser's compare-and-set lost"
    assert info.value.column == "amount"
    assert "removed" in info.value.rule
    now = pg_catalog.table(TABLE)
    assert (now.spec, now.schema_version) == (winner, 2)
    assert [(v, sp) for v, sp, _ in pg_catalog.store.schema_history(TABLE)] == [
        (1, V1),
        (2, winner),
    ]


@pytest.mark.postgres
def test_two_identical_updates_at_once_on_postgres_apply_once(pg_catalog: Catalog) -> None:
    pg_catalog.create_table(EVENTS)
    info, changes = _evolve_with_a_peer_first(pg_catalog, WITH_AMOUNT, WITH_AMOUNT)
    assert changes == []  # re-checked against the winner: nothing left to do
    assert info.schema_version == 2
    assert [v for v, _, _ in pg_catalog.store.schema_history(TABLE)] == [1, 2]


@pytest.mark.postgres
def test_a_retention_change_racing_a_schema_change_on_postgres_cannot_drop_the_new_column(
    pg_catalog: Catalog,
) -> None:
    """A retention change written against v1 loses its compare-and-set to a schema change;
    re-checked against the winner, it would remove the new column: refused. (Without the
    compare-and-set it would overwrite the table's spec with v1's columns.)"""
    pg_catalog.create_table(EVENTS)
    winner = spec_with(amount="double")
    loser = TableSpec.parse({**EVENTS, "retention": {"time": "7d"}})

    with pytest.raises(IncompatibleChangeError) as info:
        _evolve_with_a_peer_first(pg_catalog, loser, winner)

    assert info.value.column == "amount"
    now = pg_catalog.table(TABLE)
    assert (now.spec, now.schema_version) == (winner, 2)
