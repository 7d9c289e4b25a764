"""Garbage collection of staged data files that no manifest entry references.

File ages come from the deep store (on S3, from the server's LastModified), so each test sets
its ManualClock from the listed modification times instead of sleeping.
"""

from __future__ import annotations

import pytest

from harness.contract_support import (
    EVENTS,
    TABLE,
    commit,
    data_files,
    expected_rows,
    stage,
    table_rows,
)
from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.errors import TableNotFoundError
from millstream.storage.deepstore import table_data_prefix
from millstream.table.gc import collect_garbage

GRACE = 600.0


def mtime_of(cat: Catalog, path: str) -> float:
    (f,) = [f for f in cat.deep.list_files(table_data_prefix(TABLE)) if f.path == path]
    assert f.mtime is not None
    return f.mtime.timestamp()


def test_gc_deletes_unreferenced_files_once_older_than_the_grace_period(
    catalog: Catalog,
) -> None:
    spec = catalog.create_table(EVENTS).spec
    commit(catalog, {0: (0, 10), 1: (0, 10)})
    referenced = catalog.store.referenced_files(TABLE)
    orphan = stage(catalog, {0: (10, 20)}).path  # staged by a writer that never committed
    assert orphan is not None
    clock = ManualClock(mtime_of(catalog, orphan))

    # Younger than the grace period: a writer may still be about to commit it.
    assert (
        collect_garbage(catalog.store, catalog.deep, TABLE, grace_seconds=GRACE, clock=clock) == []
    )
    assert catalog.deep.exists(orphan)

    clock.advance(GRACE + 5)
    removed = collect_garbage(catalog.store, catalog.deep, TABLE, grace_seconds=GRACE, clock=clock)

    assert removed == [orphan]
    assert not catalog.deep.exists(orphan)
    assert data_files(catalog) == referenced
    assert table_rows(catalog) == expected_rows(spec, [{0: (0, 10), 1: (0, 10)}])


def test_gc_never_deletes_referenced_files_however_old(catalog: Catalog) -> None:
    spec = catalog.create_table(EVENTS).spec
    commit(catalog, {0: (0, 10)})
    commit(catalog, {0: (10, 20), 1: (0, 5)})
    before = data_files(catalog)

    removed = collect_garbage(catalog.store, catalog.deep, TABLE, grace_seconds=-1e9)

    assert removed == []
    assert data_files(catalog) == before == catalog.store.referenced_files(TABLE)
    assert table_rows(catalog) == expected_rows(spec, [{0: (0, 20), 1: (0, 5)}])


def test_gc_dry_run_reports_what_it_would_delete_and_deletes_nothing(catalog: Catalog) -> None:
    catalog.create_table(EVENTS)
    commit(catalog, {0: (0, 10)})
    orphans = {stage(catalog, {0: (10, 20)}).path, stage(catalog, {1: (0, 5)}).path}
    before = data_files(catalog)

    would = collect_garbage(catalog.store, catalog.deep, TABLE, grace_seconds=-1e9, dry_run=True)

    assert set(would) == orphans
    assert data_files(catalog) == before
    assert set(collect_garbage(catalog.store, catalog.deep, TABLE, grace_seconds=-1e9)) == orphans
    assert data_files(catalog) == catalog.store.referenced_files(TABLE)


def test_gc_only_touches_the_files_of_its_own_table(catalog: Catalog) -> None:
    catalog.create_table(EVENTS)
    catalog.create_table({**EVENTS, "name": "other"})
    other_orphan = stage(catalog, {0: (0, 5)}, table="other").path
    assert other_orphan is not None

    assert collect_garbage(catalog.store, catalog.deep, TABLE, grace_seconds=-1e9) == []
    assert catalog.deep.exists(other_orphan)


def test_gc_of_an_unknown_table_raises_table_not_found(catalog: Catalog) -> None:
    with pytest.raises(TableNotFoundError):
        collect_garbage(catalog.store, catalog.deep, "nope")
