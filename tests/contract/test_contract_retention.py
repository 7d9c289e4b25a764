"""Retention: expiring old manifest versions and collecting the files only they used, on every
backend (SQLite/PostgreSQL x local/S3).

Versions are committed at controlled times (the store's ManualClock); file ages for garbage
collection come from the deep store, so GC is given a clock past every file's mtime.
"""

from __future__ import annotations

import threading
import time

import pytest

from harness.contract_support import (
    EVENTS,
    TABLE,
    Backend,
    commit,
    data_files,
    expected_rows,
    table_rows,
)
from harness.fault_points import at_commit
from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.errors import AlreadyExistsError, CommitStateUnknownError, VersionExpiredError
from millstream.sealing.sealer import Sealer
from millstream.table.maintain import maintain

HOUR = 3600.0
T0 = 1_800_000_000.0


def _table(catalog: Catalog, *, window: str = "1h", min_versions: int = 2) -> None:
    catalog.store.clock = ManualClock(T0)
    catalog.create_table({**EVENTS, "retention": {"time": window, "min_versions": min_versions}})


def _at(catalog: Catalog, t: float) -> None:
    clock = catalog.store.clock
    assert isinstance(clock, ManualClock)
    clock.advance(t - clock.now())


def _after_every_file(catalog: Catalog) -> ManualClock:
    """A clock later than every file's mtime (GC judges age by the deep store's clock)."""
    newest = max(f.mtime.timestamp() for f in catalog.deep.list_files(f"tables/{TABLE}") if f.mtime)
    return ManualClock(max(newest, time.time()) + 10)


def test_expiry_keeps_the_window_and_min_versions_and_refuses_reads_below_it(
    catalog: Catalog,
) -> None:
    _table(catalog, window="1h", min_versions=2)
    spec = catalog.table(TABLE).spec
    batches = [{0: (0, 10)}, {0: (10, 20)}, {1: (0, 5)}, {0: (20, 30)}]
    for i, ranges in enumerate(batches):
        _at(catalog, T0 + (i + 1) * HOUR)  # versions 1..4 at T0+1h .. T0+4h
        commit(catalog, ranges)

    # At T0+4.5h the window starts at T0+3.5h, when version 3 was current: 3 and 4 stay,
    # and min_versions (2) keeps no more than that.
    expiry = catalog.store.expire_versions(TABLE, now=T0 + 4.5 * HOUR)
    assert (expiry.floor_before, expiry.floor, expiry.versions) == (0, 3, 3)
    assert catalog.store.oldest_kept_version(TABLE) == 3

    assert table_rows(catalog, as_of=3) == expected_rows(spec, batches[:3])
    assert table_rows(catalog) == expected_rows(spec, batches)
    with pytest.raises(VersionExpiredError, match=r"version 2 .* the oldest kept is 3"):
        catalog.read_table(TABLE, as_of=2)
    with pytest.raises(VersionExpiredError):
        catalog.read_table(TABLE, as_of=T0 + 2.5 * HOUR)  # a time when version 2 was current
    # Inside the window, time travel still works.
    assert table_rows(catalog, as_of=T0 + 3.5 * HOUR) == expected_rows(spec, batches[:3])

    # Nothing more is due: the second run changes nothing.
    again = catalog.store.expire_versions(TABLE, now=T0 + 4.5 * HOUR)
    assert (again.floor_before, again.floor, again.versions) == (3, 3, 0)


def test_min_versions_keeps_history_however_old(catalog: Catalog) -> None:
    _table(catalog, window="1h", min_versions=3)
    for i in range(5):
        _at(catalog, T0 + (i + 1) * 60)
        commit(catalog, {0: (i * 10, i * 10 + 10)})
    expiry = catalog.store.expire_versions(TABLE, now=T0 + 100 * HOUR)
    assert expiry.floor == 3  # versions 3, 4, 5 kept
    assert catalog.store.oldest_kept_version(TABLE) == 3


def test_a_dry_run_expires_nothing(catalog: Catalog) -> None:
    _table(catalog, window="1h", min_versions=1)
    spec = catalog.table(TABLE).spec
    batches = [{0: (i * 10, i * 10 + 10)} for i in range(3)]
    for i, ranges in enumerate(batches):
        _at(catalog, T0 + (i + 1) * HOUR)
        commit(catalog, ranges)
    dry = catalog.store.expire_versions(TABLE, now=T0 + 10 * HOUR, dry_run=True)
    assert dry.floor == 3 and dry.versions == 3
    assert catalog.store.oldest_kept_version(TABLE) == 0
    assert table_rows(catalog, as_of=1) == expected_rows(spec, batches[:1])


def test_gc_after_expiry_deletes_exactly_the_files_no_kept_version_references(
    catalog: Catalog,
) -> None:
    _table(catalog, window="1h", min_versions=1)
    spec = catalog.table(TABLE).spec
    batches = [{0: (0, 10)}, {0: (10, 20)}, {0: (20, 30)}]
    for i, ranges in enumerate(batches):
        _at(catalog, T0 + (i + 1) * 60)
        commit(catalog, ranges)
    consuming_files = data_files(catalog)
    # The seal replaces the three consuming segments with one sealed file (version 4).
    _at(catalog, T0 + 5 * 60)
    Sealer(catalog, TABLE, clock=ManualClock(T0 + 5 * 60)).seal_partition(0, force=True)
    sealed = {e.file_path for e in catalog.manifest(TABLE).entries}
    assert len(sealed) == 1 and not sealed & consuming_files

    # Inside the window nothing expires, and GC removes nothing time travel may still read.
    report = maintain(
        catalog.store, catalog.deep, TABLE, grace_seconds=0, clock=_after_every_file(catalog)
    )
    assert report.expiry.versions == 0 and report.files_removed == ()
    assert table_rows(catalog, as_of=3) == expected_rows(spec, batches)

    # Past the window: versions 0..3 expire and exactly the consuming files go.
    _at(catalog, T0 + 3 * HOUR)
    expiry = catalog.store.expire_versions(TABLE, now=T0 + 3 * HOUR)
    assert expiry.floor == 4 and set(expiry.released_files) == consuming_files
    report = maintain(
        catalog.store, catalog.deep, TABLE, grace_seconds=0, clock=_after_every_file(catalog)
    )
    assert set(report.files_removed) == consuming_files
    assert report.bytes_removed > 0
    assert data_files(catalog) == sealed
    assert table_rows(catalog) == expected_rows(spec, batches)
    with pytest.raises(VersionExpiredError):
        catalog.read_table(TABLE, as_of=3)


def test_a_read_of_a_version_that_expired_under_it_says_so(catalog: Catalog) -> None:
    _table(catalog, window="1h", min_versions=1)
    for i in range(2):
        _at(catalog, T0 + (i + 1) * 60)
        commit(catalog, {0: (i * 10, i * 10 + 10)})
    Sealer(catalog, TABLE, clock=ManualClock(T0 + 180)).seal_partition(0, force=True)
    pinned = catalog.manifest(TABLE, as_of=2)  # a reader planned version 2 ...
    catalog.store.expire_versions(TABLE, now=T0 + 10 * HOUR)  # ... which then expired
    maintain(catalog.store, catalog.deep, TABLE, grace_seconds=0, clock=_after_every_file(catalog))
    with pytest.raises(VersionExpiredError):
        catalog.read_table(TABLE, as_of=pinned.version)


def test_retention_may_change_but_the_schema_may_not(catalog: Catalog) -> None:
    _table(catalog, window="1h", min_versions=2)
    info = catalog.create_table({**EVENTS, "retention": {"time": "7d", "min_versions": 5}})
    assert info.spec.retention.time == "7d"
    assert catalog.table(TABLE).spec.retention.min_versions == 5
    with pytest.raises(AlreadyExistsError):
        catalog.create_table({**EVENTS, "schema": {"id": "long"}})


@pytest.mark.parametrize("landed", [True, False], ids=["landed", "not-landed"])
def test_an_expiry_whose_commit_outcome_is_unknown_loses_nothing_and_converges(
    catalog: Catalog, landed: bool
) -> None:
    """A failure during the expiry's COMMIT (the connection dropped: did it land?) surfaces as
    CommitStateUnknownError and deletes no file; the next run (a worker's next turn) finishes
    the job, and every kept version still reads whole."""
    _table(catalog, window="1h", min_versions=1)
    spec = catalog.table(TABLE).spec
    batches = [{0: (i * 10, i * 10 + 10)} for i in range(3)]
    for i, ranges in enumerate(batches):
        _at(catalog, T0 + (i + 1) * 60)
        commit(catalog, ranges)
    Sealer(catalog, TABLE, clock=ManualClock(T0 + 240)).seal_partition(0, force=True)
    files = data_files(catalog)

    def drop_connection(at_landing: bool) -> None:
        if at_landing == landed:
            uninstall()
            raise ConnectionError("connection reset during COMMIT")

    # Ten hours on: the three consuming versions are past the window; so is every file's mtime.
    later = ManualClock(T0 + 10 * HOUR)
    assert later.now() > _after_every_file(catalog).now()
    uninstall = at_commit(catalog.store, drop_connection)
    with pytest.raises(CommitStateUnknownError):
        maintain(catalog.store, catalog.deep, TABLE, grace_seconds=0, clock=later)
    assert data_files(catalog) == files  # GC did not run on an unknown outcome
    assert table_rows(catalog) == expected_rows(spec, batches)

    report = maintain(catalog.store, catalog.deep, TABLE, grace_seconds=0, clock=later)
    assert catalog.store.oldest_kept_version(TABLE) == 4
    assert report.expiry.floor == 4
    assert data_files(catalog) == {e.file_path for e in catalog.manifest(TABLE).entries}
    assert table_rows(catalog) == expected_rows(spec, batches)


# -- read pins -------------------------------------------------------------------------------


def _three_batches_then_a_seal(catalog: Catalog) -> list[dict[int, tuple[int, int]]]:
    """Versions 1-3 commit a batch each (minutes after T0); version 4 seals them into one
    file. Retention: a 1-hour window, 1 version."""
    _table(catalog, window="1h", min_versions=1)
    batches = [{0: (i * 10, i * 10 + 10)} for i in range(3)]
    for i, ranges in enumerate(batches):
        _at(catalog, T0 + (i + 1) * 60)
        commit(catalog, ranges)
    _at(catalog, T0 + 5 * 60)
    Sealer(catalog, TABLE, clock=ManualClock(T0 + 5 * 60)).seal_partition(0, force=True)
    return batches


def test_a_pinned_version_outlives_the_window_until_its_pin_is_released(
    catalog: Catalog,
) -> None:
    batches = _three_batches_then_a_seal(catalog)
    spec = catalog.table(TABLE).spec
    pin = catalog.pin(TABLE, as_of=2, seconds=100 * HOUR, holder="a long export")
    assert (pin.version, pin.holder) == (2, "a long export")

    # Ten hours on, the window keeps only version 4; the pin keeps 2 and 3 (and their files).
    expiry = catalog.store.expire_versions(TABLE, now=T0 + 10 * HOUR)
    assert expiry.floor == 2
    maintain(catalog.store, catalog.deep, TABLE, grace_seconds=0, clock=_after_every_file(catalog))
    assert table_rows(catalog, as_of=2) == expected_rows(spec, batches[:2])
    with pytest.raises(VersionExpiredError):
        catalog.read_table(TABLE, as_of=1)

    assert catalog.unpin(pin) is True
    assert catalog.unpin(pin) is False  # gone already
    expiry = catalog.store.expire_versions(TABLE, now=T0 + 10 * HOUR)
    assert expiry.floor == 4
    with pytest.raises(VersionExpiredError):
        catalog.read_table(TABLE, as_of=2)
    assert table_rows(catalog) == expected_rows(spec, batches)


def test_pinned_holds_the_version_for_the_block_and_a_pin_past_its_time_holds_nothing(
    catalog: Catalog,
) -> None:
    _three_batches_then_a_seal(catalog)
    with catalog.pinned(TABLE, as_of=3, seconds=100 * HOUR) as manifest:
        assert manifest.version == 3
        assert catalog.store.expire_versions(TABLE, now=T0 + 10 * HOUR).floor == 3
        assert [p.version for p in catalog.store.list_pins(TABLE)] == [3]
    assert catalog.store.list_pins(TABLE) == []

    catalog.pin(TABLE, as_of=3, seconds=60)  # runs out a minute after T0+5min
    expiry = catalog.store.expire_versions(TABLE, now=T0 + 10 * HOUR)
    assert expiry.floor == 4
    assert catalog.store.list_pins(TABLE) == []  # the expired pin is gone with the versions
    with pytest.raises(VersionExpiredError, match="the oldest kept is 4"):
        catalog.pin(TABLE, as_of=3)


def test_a_pin_racing_an_expiry_either_keeps_its_version_or_is_refused(
    backend: Backend, catalog: Catalog
) -> None:
    """Real concurrency: another process expires versions 1-3 and, inside its transaction,
    this one pins version 2. Pinning waits on the table row the expiry holds and then finds
    version 2 expired: it never records a pin on a version being deleted (without the lock, on
    PostgreSQL, the pin commits first and the expiry deletes the version under it)."""
    _three_batches_then_a_seal(catalog)
    outcome: dict[str, object] = {}

    def pin() -> None:
        try:
            outcome["pin"] = catalog.pin(TABLE, as_of=2, seconds=100 * HOUR)
        except VersionExpiredError as exc:
            outcome["refused"] = exc

    pinner = threading.Thread(target=pin, name="pinner")
    with backend.open() as other:

        def pin_meanwhile(landed: bool) -> None:
            if landed:
                return
            uninstall()
            pinner.start()
            pinner.join(1.0)  # the pin runs (or waits) while the expiry is uncommitted

        uninstall = at_commit(other.store, pin_meanwhile)
        assert other.store.expire_versions(TABLE, now=T0 + 10 * HOUR).floor == 4
    pinner.join(30)
    assert not pinner.is_alive()

    oldest = catalog.store.oldest_kept_version(TABLE)
    pins = catalog.store.list_pins(TABLE)
    assert all(p.version >= oldest for p in pins), f"a pin on an expired version: {pins}"
    assert isinstance(outcome.get("refused"), VersionExpiredError), outcome
