"""A seal renews its claim while it builds (issue 35), judged on the metadata store's clock: a
seal that runs longer than the claim's TTL is not taken over while it renews, and a sealer
frozen past its claim (its renewals stopped) loses it: another sealer takes the run over, and
a late renewal never brings the expired claim back, so the frozen seal's swap is refused."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from harness.fault_points import at_sealer
from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.config import Settings
from millstream.errors import SegmentChangedError
from millstream.metastore.models import SegmentState
from millstream.metastore.store import MetadataStore
from millstream.sealing.sealer import Sealer
from millstream.spec import TableSpec
from millstream.storage.deepstore import DeepStore
from millstream.table.writer import commit_staged, stage_rows

SPEC = TableSpec.parse({"name": "t", "schema": {"id": "long"}})
TTL = 10.0


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def cat(tmp_path: Path, clock: ManualClock) -> Iterator[Catalog]:
    """A catalog whose metadata store keeps ``clock`` (the store's clock, shared by every
    sealer here, as one database server's clock is)."""
    settings = Settings.load(home=tmp_path)
    store = MetadataStore(settings.metadata_url, clock=clock)
    with Catalog(settings, store, DeepStore.from_uri(settings.deep_store)) as c:
        c.create_table(SPEC)
        yield c


def _ingest(cat: Catalog) -> list[int]:
    for lo in range(0, 30, 10):
        rows = pa.table(
            {
                "id": pa.array(range(lo, lo + 10), pa.int64()),
                "_ms_partition": pa.array([0] * 10, pa.int32()),
                "_ms_offset": pa.array(range(lo, lo + 10), pa.int64()),
                "_ms_tombstone": pa.array([False] * 10),
            }
        )
        staged = stage_rows(cat.deep, SPEC, rows)
        commit_staged(cat.store, cat.deep, "t", staged, {0: (lo, lo + 10)}, {0: 0})
    return list(range(30))


def _until(done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 60
    while not done():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def _sealer(cat: Catalog, clock: ManualClock, hook: Callable[[str, int], None] | None) -> Sealer:
    sealer = Sealer(cat, "t", clock=clock, claim_ttl=TTL)
    at_sealer(sealer, hook=hook)
    sealer.claim_renew_seconds = 0.01  # real seconds: the test moves the store's clock itself
    return sealer


def _check(cat: Catalog, ids: list[int]) -> None:
    assert [e.state for e in cat.manifest("t").entries] == [SegmentState.ONLINE]
    assert sorted(cat.read_table("t").column("id").to_pylist()) == ids


def test_a_seal_longer_than_its_claim_is_not_taken_over_while_it_renews(
    cat: Catalog, clock: ManualClock
) -> None:
    ids = _ingest(cat)
    other = _sealer(cat, clock, None)
    took_over: list[object] = []

    def slow_build(point: str, partition: int) -> None:
        if point != "before_upload":
            return
        for _ in range(3):  # 18 s of the store's clock in all, the claim's TTL is 10 s
            before = sealer.claim_renewals
            clock.advance(TTL * 0.6)
            _until(lambda b=before: sealer.claim_renewals > b, "the claim was renewed")
            took_over.append(other.seal_partition(0, force=True))

    sealer = _sealer(cat, clock, slow_build)
    result = sealer.seal_partition(0, force=True)

    assert took_over == [None, None, None], "a renewed claim is respected"
    assert result is not None and result.rows_out == 30
    assert sealer.claims_lost == 0
    _check(cat, ids)


def _freeze(sealer_box: list[Sealer], on_frozen: Callable[[], None]) -> Callable[[str, int], None]:
    """A hook that, at the seal's upload, freezes its renewals (as a stopped process would),
    runs ``on_frozen``, then lets the renewer go on and waits for its next attempt."""
    frozen, blocked, thaw = threading.Event(), threading.Event(), threading.Event()

    def hook(point: str, partition: int) -> None:
        if point == "renew_claim" and frozen.is_set():
            blocked.set()
            thaw.wait(60)
        elif point == "before_upload":
            sealer = sealer_box[0]
            frozen.set()
            _until(blocked.is_set, "the renewer is frozen")
            on_frozen()
            tried = sealer.claims_lost + sealer.claim_renewals
            thaw.set()
            _until(lambda: sealer.claims_lost + sealer.claim_renewals > tried, "it renewed")

    return hook


def test_a_frozen_sealers_claim_expires_and_another_sealer_takes_the_run_over(
    cat: Catalog, clock: ManualClock
) -> None:
    ids = _ingest(cat)
    box: list[Sealer] = []
    taken: list[object] = []

    def past_the_claim() -> None:
        clock.advance(TTL + 1)
        taken.append(_sealer(cat, clock, None).seal_partition(0, force=True))

    sealer = _sealer(cat, clock, _freeze(box, past_the_claim))
    box.append(sealer)
    with pytest.raises(SegmentChangedError):
        sealer.seal_partition(0, force=True)

    assert taken and taken[0] is not None, "the expired claim was taken over"
    assert sealer.claims_lost == 1
    _check(cat, ids)


def test_a_late_renewal_never_brings_an_expired_claim_back(
    cat: Catalog, clock: ManualClock
) -> None:
    """Nobody took the run over while the sealer was frozen; its claim expired all the same
    (its uploaded files may be collected), so the late renewal is refused and so is the swap.
    The next seal seals the run."""
    ids = _ingest(cat)
    box: list[Sealer] = []
    sealer = _sealer(cat, clock, _freeze(box, lambda: clock.advance(TTL + 1)))
    box.append(sealer)
    with pytest.raises(SegmentChangedError, match="expired"):
        sealer.seal_partition(0, force=True)
    assert sealer.claims_lost == 1

    assert _sealer(cat, clock, None).seal_partition(0, force=True) is not None
    _check(cat, ids)


def test_a_seal_stalled_past_a_claims_ttl_between_its_upload_and_swap_is_refused(
    cat: Catalog, clock: ManualClock
) -> None:
    """The renewer keeps the claim alive while the seal stalls after its upload, so the claim
    no longer bounds the uploaded files' age: garbage collection may delete them (unreferenced,
    past its grace period) before a late swap would reference them. The swap is refused at its
    deadline (one claim's TTL after the upload began), the uploaded files are deleted, the run
    stays as it was, and the next seal seals it."""
    ids = _ingest(cat)
    box: list[Sealer] = []

    def stall(point: str, partition: int) -> None:
        if point != "before_swap":
            return
        sealer = box[0]
        for _ in range(2):  # 12 s of the store's clock after the upload; the TTL is 10 s
            before = sealer.claim_renewals
            clock.advance(TTL * 0.6)
            _until(lambda b=before: sealer.claim_renewals > b, "the claim was renewed")

    files = {f.path for f in cat.deep.list_files("tables/t")}
    sealer = _sealer(cat, clock, stall)
    box.append(sealer)
    with pytest.raises(SegmentChangedError, match="deadline"):
        sealer.seal_partition(0, force=True)
    assert sealer.claims_lost == 0, "the claim held throughout: the deadline refused the swap"
    assert {f.path for f in cat.deep.list_files("tables/t")} == files
    assert {e.state for e in cat.manifest("t").entries} == {SegmentState.CONSUMING}

    assert _sealer(cat, clock, None).seal_partition(0, force=True) is not None
    _check(cat, ids)


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
)
def test_a_renewal_is_judged_on_the_database_servers_clock(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A store on the system clock reads the time from the database server itself: the
    renewed expiry is the server's now + TTL (test_claim_clock_skew.py skews the sealers')."""
    import uuid

    from millstream.metastore.claims import store_now

    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'm.db'}"
    else:
        server = request.getfixturevalue("postgres_server")
        url = server.create_database(f"ms_renew_{uuid.uuid4().hex[:12]}")
    with Catalog.open(metadata_url=url, deep_store=str(tmp_path / "deep")) as c:
        c.create_table(SPEC)
        _ingest(c)
        run = list(c.manifest("t").entries)
        claimed = c.store.claim_run(run, owner="me", ttl=TTL)
        assert claimed is not None
        renewed = c.store.renew_claim(claimed, owner="me", ttl=TTL)
        assert renewed is not None and set(renewed) == set(claimed)
        with c.store.read() as conn:
            server_now = store_now(conn, c.store.clock)
        assert abs(server_now - time.time()) < 60, "the server's clock, not the sealer's"
        expiries = {e.claim_expires_at for e in c.manifest("t").entries}
        assert all(x is not None and x <= server_now + TTL for x in expiries), expiries
        assert c.store.renew_claim(claimed, owner="me", ttl=TTL) is None, "old versions"
        assert c.store.renew_claim(renewed, owner="someone else", ttl=TTL) is None
