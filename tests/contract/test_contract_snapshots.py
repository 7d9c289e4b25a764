"""Reads are snapshots of one manifest version: time travel, consistency under concurrent
commits, and refusing to return partial rows when a data file is gone."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import pytest

from harness.contract_support import EVENTS, TABLE, Backend, commit, expected_rows, table_rows
from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.errors import InvalidSpecError, SegmentUnavailableError
from millstream.metastore.store import MetadataStore
from millstream.reference.model import canonical
from millstream.table.read import read_manifest

BATCHES = [{0: (0, 10)}, {0: (10, 15), 1: (0, 5)}, {1: (5, 20)}]


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)


def test_reading_as_of_an_older_version_returns_the_rows_of_that_version(
    catalog: Catalog,
) -> None:
    spec = catalog.create_table(EVENTS).spec
    for b in BATCHES:
        commit(catalog, b)

    for version in range(len(BATCHES) + 1):
        assert catalog.manifest(TABLE, as_of=version).version == version
        assert table_rows(catalog, as_of=version) == expected_rows(spec, BATCHES[:version])
    assert table_rows(catalog) == expected_rows(spec, BATCHES)


def test_reading_as_of_a_point_in_time_returns_the_last_version_committed_by_then(
    catalog: Catalog,
) -> None:
    clock = ManualClock(1_700_000_000.0)
    store = MetadataStore(catalog.settings.metadata_url, clock=clock)
    timed = Catalog(catalog.settings, store, catalog.deep)
    try:
        created = clock.now()
        spec = timed.create_table(EVENTS).spec
        commit_times = []
        for b in BATCHES:
            clock.advance(10)
            commit_times.append(clock.now())
            commit(timed, b)

        assert table_rows(timed, as_of=at(created + 5)) == []
        assert table_rows(timed, as_of=at(commit_times[0] + 5)) == expected_rows(spec, BATCHES[:1])
        # "At or before": a commit at exactly that instant is included.
        assert timed.manifest(TABLE, as_of=at(commit_times[1])).version == 2
        # Epoch seconds (a float) work the same as a datetime.
        assert timed.manifest(TABLE, as_of=commit_times[1] + 9.5).version == 2
        assert table_rows(timed, as_of=commit_times[2] + 1000.0) == expected_rows(spec, BATCHES)
        with pytest.raises(InvalidSpecError) as info:
            timed.read_table(TABLE, as_of=at(created - 1))
        assert info.value.field == "as_of"
    finally:
        timed.close()


def test_as_of_a_version_that_does_not_exist_is_invalid(catalog: Catalog) -> None:
    catalog.create_table(EVENTS)
    commit(catalog, BATCHES[0])

    for bad in (2, -1, True):
        with pytest.raises(InvalidSpecError) as info:
            catalog.read_table(TABLE, as_of=bad)
        assert info.value.field == "as_of"


def test_a_manifest_read_while_another_writer_commits_is_a_consistent_snapshot(
    catalog: Catalog, backend: Backend
) -> None:
    """Every read sees whole commits only: version v holds exactly batches 1..v."""
    spec = catalog.create_table(EVENTS).spec
    batches = [{0: (lo, lo + 10), 1: (lo, lo + 10)} for lo in range(0, 150, 10)]
    done = threading.Event()
    errors: list[BaseException] = []

    def write() -> None:
        try:
            with backend.open() as writer:
                for b in batches:
                    commit(writer, b)
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=write)
    thread.start()
    versions_seen = set()
    try:
        while True:
            finished = done.is_set()
            manifest = catalog.manifest(TABLE)
            v = manifest.version
            versions_seen.add(v)
            assert all(e.added_version <= v for e in manifest.entries)
            assert {(e.partition, e.start, e.end) for e in manifest.entries} == {
                (p, lo, hi) for b in batches[:v] for p, (lo, hi) in b.items()
            }
            rows = read_manifest(catalog.deep, manifest)
            assert rows.num_rows == manifest.row_count == 20 * v
            assert canonical(rows.to_pylist()) == expected_rows(spec, batches[:v])
            if finished:
                break
    finally:
        thread.join(timeout=120)
    assert not errors, errors
    assert max(versions_seen) == len(batches)


def test_a_missing_data_file_fails_the_read_naming_the_segment(catalog: Catalog) -> None:
    spec = catalog.create_table(EVENTS).spec
    commit(catalog, {0: (0, 10)})
    commit(catalog, {1: (0, 5)})
    (lost,) = [e for e in catalog.manifest(TABLE).entries if e.partition == 1]
    assert lost.file_path is not None

    catalog.deep.delete(lost.file_path)

    with pytest.raises(SegmentUnavailableError) as info:
        catalog.read_table(TABLE)
    assert lost.name == "events__1__0"
    assert info.value.fields["segment"] == lost.name
    assert info.value.fields["path"] == lost.file_path
    assert lost.name in str(info.value)
    # The version before the lost segment was committed is still whole.
    assert table_rows(catalog, as_of=1) == expected_rows(spec, [{0: (0, 10)}])


def test_a_missing_file_of_a_multi_partition_batch_fails_the_read_not_returns_part_of_it(
    catalog: Catalog,
) -> None:
    catalog.create_table(EVENTS)
    commit(catalog, {0: (0, 10)})
    commit(catalog, {0: (10, 20), 1: (0, 5), 2: (0, 5)})
    shared = [e for e in catalog.manifest(TABLE).entries if e.added_version == 2]
    (path,) = {e.file_path for e in shared}
    assert path is not None

    catalog.deep.delete(path)

    with pytest.raises(SegmentUnavailableError) as info:
        catalog.read_table(TABLE)
    assert info.value.fields["segment"] in {e.name for e in shared}
    assert info.value.fields["path"] == path
