"""What changed in a manifest since a version (``MetadataStore.manifest_changes``, what a
sealing pass judges a busy table from instead of its whole manifest), on every backend: the
entries added since, and how many were removed, account exactly for the difference between
the two manifests; and the same read of several tables at once, with their force commits
(``MetadataStore.sealing_reads``), answers each table as its own reads do."""

from __future__ import annotations

from harness.contract_support import EVENTS, TABLE, commit
from millstream.catalog import Catalog
from millstream.metastore.models import SegmentState
from millstream.sealing.sealer import Sealer


def test_the_changes_since_a_version_account_for_the_manifests_difference(
    catalog: Catalog,
) -> None:
    catalog.create_table(EVENTS)
    commit(catalog, {0: (0, 10), 1: (0, 10)})
    before = catalog.manifest(TABLE)
    assert catalog.store.manifest_changes(TABLE, after=before.version).added == ()

    commit(catalog, {0: (10, 20)})
    commit(catalog, {1: (10, 15)})
    appended = catalog.store.manifest_changes(TABLE, after=before.version)
    assert appended.version == before.version + 2
    assert [(e.partition, e.start, e.end) for e in appended.added] == [(0, 10, 20), (1, 10, 15)]
    assert {e.state for e in appended.added} == {SegmentState.CONSUMING}
    assert appended.removed == 0

    assert Sealer(catalog, TABLE).seal_partition(0, force=True) is not None
    after = catalog.manifest(TABLE)
    changes = catalog.store.manifest_changes(TABLE, after=before.version)
    assert changes.version == after.version
    assert changes.removed == 2  # partition 0's two consuming entries, sealed into one
    assert len(after.entries) == len(before.entries) + len(changes.added) - changes.removed
    # The sealed entry is among those added; the appended one is there too, removed since.
    sealed = [e for e in changes.added if e.state is SegmentState.ONLINE]
    assert [(e.partition, e.start, e.end) for e in sealed] == [(0, 0, 20)]
    assert [e.removed_version for e in changes.added if e.partition == 0 and e not in sealed] == [
        after.version
    ]
    assert catalog.store.manifest_changes(TABLE, after=after.version).added == ()


def test_one_read_of_several_tables_answers_each_as_its_own_reads_do(catalog: Catalog) -> None:
    other = {**EVENTS, "name": "events_b"}
    catalog.create_table(EVENTS)
    catalog.create_table(other)
    commit(catalog, {0: (0, 10), 1: (0, 10)})
    commit(catalog, {0: (0, 5)}, table="events_b")
    before, before_b = catalog.manifest(TABLE), catalog.manifest("events_b")
    commit(catalog, {0: (10, 20)})
    commit(catalog, {1: (10, 15)})
    assert Sealer(catalog, "events_b").seal_partition(0, force=True) is not None
    commit(catalog, {0: (5, 8)}, table="events_b")
    catalog.store.submit_force_commit(catalog.manifest(TABLE), now=0.0)

    got = catalog.store.sealing_reads(
        {TABLE: before.version, "events_b": before_b.version, "missing": 3}
    )
    assert set(got) == {TABLE, "events_b"}
    for name, after in ((TABLE, before.version), ("events_b", before_b.version)):
        assert got[name].after == after
        assert got[name].changes == catalog.store.manifest_changes(name, after=after)
        assert got[name].forced == catalog.store.force_commit_targets(name)
    assert set(got[TABLE].forced) == {0, 1}  # the force commit named both unsealed runs
    assert got["events_b"].forced == {}
    assert got["events_b"].changes is not None and got["events_b"].changes.removed == 1
    # Without a remembered version: the force commits alone.
    assert catalog.store.sealing_reads({"events_b": None})["events_b"].changes is None
