"""Controller leases: a TTL and a fencing token that grows when the lease changes hands,
and writes on the leader's behalf that are refused once the lease moved on."""

from __future__ import annotations

import pytest

from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.control.leases import acquire_or_renew, check_fence, release
from millstream.control.workers import CONTROLLER_LEASE, write_assignments
from millstream.core.assignment import ACTIVE, STANDBY
from millstream.errors import LeaseLostError

TTL = 10.0
LEASE = CONTROLLER_LEASE


def test_a_free_lease_is_taken_with_token_one(catalog: Catalog, clock: ManualClock) -> None:
    lease = acquire_or_renew(catalog.store, LEASE, "c1", TTL, clock)
    assert lease is not None
    assert (lease.holder, lease.token, lease.expires_at) == ("c1", 1, clock.now() + TTL)
    assert lease.held_by("c1", clock.now())
    assert not lease.held_by("c2", clock.now())


def test_renewing_extends_the_lease_and_keeps_the_token(
    catalog: Catalog, clock: ManualClock
) -> None:
    acquire_or_renew(catalog.store, LEASE, "c1", TTL, clock)
    clock.advance(TTL - 1)
    renewed = acquire_or_renew(catalog.store, LEASE, "c1", TTL, clock)
    assert renewed is not None
    assert renewed.token == 1
    assert renewed.expires_at == clock.now() + TTL


def test_a_held_lease_cannot_be_taken(catalog: Catalog, clock: ManualClock) -> None:
    acquire_or_renew(catalog.store, LEASE, "c1", TTL, clock)
    clock.advance(TTL - 0.001)
    assert acquire_or_renew(catalog.store, LEASE, "c2", TTL, clock) is None


def test_an_expired_lease_is_taken_over_with_the_next_token(
    catalog: Catalog, clock: ManualClock
) -> None:
    acquire_or_renew(catalog.store, LEASE, "c1", TTL, clock)
    clock.advance(TTL)  # expires_at <= now: expired
    taken = acquire_or_renew(catalog.store, LEASE, "c2", TTL, clock)
    assert taken is not None
    assert (taken.holder, taken.token) == ("c2", 2)
    # The old holder cannot renew what it lost.
    assert acquire_or_renew(catalog.store, LEASE, "c1", TTL, clock) is None


def test_a_holder_whose_lease_lapsed_gets_a_new_token_so_its_old_writes_stay_fenced(
    catalog: Catalog, clock: ManualClock
) -> None:
    acquire_or_renew(catalog.store, LEASE, "c1", TTL, clock)
    clock.advance(TTL + 1)
    again = acquire_or_renew(catalog.store, LEASE, "c1", TTL, clock)
    assert again is not None and again.token == 2
    with catalog.store.read() as conn, pytest.raises(LeaseLostError):
        check_fence(conn, LEASE, "c1", 1, clock.now())


def test_released_lease_is_free_at_once_for_the_next_holder(
    catalog: Catalog, clock: ManualClock
) -> None:
    acquire_or_renew(catalog.store, LEASE, "c1", TTL, clock)
    release(catalog.store, LEASE, "c1", clock)
    taken = acquire_or_renew(catalog.store, LEASE, "c2", TTL, clock)
    assert taken is not None and taken.token == 2


def test_releasing_someone_elses_lease_does_nothing(catalog: Catalog, clock: ManualClock) -> None:
    acquire_or_renew(catalog.store, LEASE, "c1", TTL, clock)
    release(catalog.store, LEASE, "c2", clock)
    assert acquire_or_renew(catalog.store, LEASE, "c2", TTL, clock) is None


def test_check_fence_accepts_only_the_current_holder_and_token(
    catalog: Catalog, clock: ManualClock
) -> None:
    acquire_or_renew(catalog.store, LEASE, "c1", TTL, clock)
    with catalog.store.read() as conn:
        check_fence(conn, LEASE, "c1", 1, clock.now())
        for holder, token, now in [
            ("c2", 1, clock.now()),
            ("c1", 2, clock.now()),
            ("c1", 1, clock.now() + TTL),
        ]:
            with pytest.raises(LeaseLostError) as err:
                check_fence(conn, LEASE, holder, token, now)
            assert err.value.fields == {"lease": LEASE, "holder": holder, "token": token}
        with pytest.raises(LeaseLostError):
            check_fence(conn, "no-such-lease", "c1", 1, clock.now())


def test_an_old_leaders_assignment_write_is_fenced_and_changes_nothing(
    catalog: Catalog, clock: ManualClock
) -> None:
    store = catalog.store
    old = acquire_or_renew(store, LEASE, "c1", TTL, clock)
    assert old is not None
    first = {"a": [("w1", ACTIVE), ("w2", STANDBY)]}
    assert write_assignments(store, first, holder="c1", token=old.token, clock=clock)
    assert not write_assignments(store, first, holder="c1", token=old.token, clock=clock)

    clock.advance(TTL + 1)  # c1 pauses past its TTL; c2 takes over and assigns
    new = acquire_or_renew(store, LEASE, "c2", TTL, clock)
    assert new is not None and new.token == old.token + 1
    second = {"a": [("w2", ACTIVE)]}
    assert write_assignments(store, second, holder="c2", token=new.token, clock=clock)

    with pytest.raises(LeaseLostError):
        write_assignments(store, first, holder="c1", token=old.token, clock=clock)
    with pytest.raises(LeaseLostError):  # same holder id, stale token: still refused
        write_assignments(store, first, holder="c2", token=old.token, clock=clock)
    assert store.read_assignments() == second
