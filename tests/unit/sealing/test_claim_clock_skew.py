"""Seal claims are judged on the metadata store's clock, never a sealer's own (issue 35): the
first claim, the take-over of another sealer's claim and the expiry check at the swap. Sealers
whose clocks are a day ahead of or behind the database server (far more than a claim's TTL)
still agree on who holds a run: a live claim is not taken over, an expired one is, and a swap
after the claim expired is refused. The store here reads the time from the server itself
(SQLite's ``julianday('now')``, PostgreSQL's ``clock_timestamp()``), as in production."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from harness.fault_points import at_sealer
from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.errors import SegmentChangedError
from millstream.metastore.claims import store_now
from millstream.metastore.models import SegmentState
from millstream.sealing.sealer import Sealer
from millstream.spec import TableSpec
from millstream.table.writer import commit_staged, stage_rows

SPEC = TableSpec.parse({"name": "t", "schema": {"id": "long"}})
DAY = 86_400.0
#: A claim that expires soon on the server's clock, and one that holds for the whole test.
SHORT_TTL, LONG_TTL = 1.0, 600.0
IDS = list(range(30))


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def cat(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Catalog]:
    """A catalog on a metadata store that keeps the server's clock, with three segments of
    partition 0 to seal."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'm.db'}"
    else:
        server = request.getfixturevalue("postgres_server")
        url = server.create_database(f"ms_skew_{uuid.uuid4().hex[:12]}")
    with Catalog.open(metadata_url=url, deep_store=str(tmp_path / "deep")) as c:
        c.create_table(SPEC)
        for lo in range(0, 30, 10):
            rows = pa.table(
                {
                    "id": pa.array(range(lo, lo + 10), pa.int64()),
                    "_ms_partition": pa.array([0] * 10, pa.int32()),
                    "_ms_offset": pa.array(range(lo, lo + 10), pa.int64()),
                    "_ms_tombstone": pa.array([False] * 10),
                }
            )
            staged = stage_rows(c.deep, SPEC, rows)
            commit_staged(c.store, c.deep, "t", staged, {0: (lo, lo + 10)}, {0: 0})
        yield c


def _sealer(
    cat: Catalog,
    skew: float,
    *,
    ttl: float,
    at: str | None = None,
    then: Callable[[], None] | None = None,
) -> Sealer:
    """A sealer whose own clock is ``skew`` seconds off the server's, that runs ``then`` when
    its seal reaches the fault point ``at``. It never renews its claim during the test (a
    frozen sealer's renewals stop too)."""

    def hook(point: str, partition: int) -> None:
        if point == at and then is not None:
            then()

    sealer = Sealer(cat, "t", clock=ManualClock(time.time() + skew), claim_ttl=ttl)
    at_sealer(sealer, hook=hook)
    sealer.claim_renew_seconds = 3600.0
    return sealer


def _claimed_by(cat: Catalog) -> set[str | None]:
    return {e.claimed_by for e in cat.manifest("t").entries}


def _until_the_claim_expired_on_the_server(cat: Catalog) -> None:
    """Wait until the server's clock passes every claim's expiry (SHORT_TTL after the claim,
    on the server's clock: a claim set on the sealer's would expire a day off)."""
    expiry = max(e.claim_expires_at or 0.0 for e in cat.manifest("t").entries)
    deadline = time.monotonic() + 60
    while True:
        with cat.store.read() as conn:
            now = store_now(conn, cat.store.clock)
        assert expiry <= now + SHORT_TTL, "the claim's expiry is not on the server's clock"
        if now > expiry:
            return
        assert time.monotonic() < deadline, "the server's clock never passed the claim"
        time.sleep(0.05)


def _check_sealed(cat: Catalog) -> None:
    assert [e.state for e in cat.manifest("t").entries] == [SegmentState.ONLINE]
    assert sorted(cat.read_table("t").column("id").to_pylist()) == IDS


SKEWS = pytest.mark.parametrize("skew", [DAY, -DAY], ids=["a-day-ahead", "a-day-behind"])


@SKEWS
def test_a_live_claim_is_not_taken_over_by_a_sealer_whose_clock_is_skewed(
    cat: Catalog, skew: float
) -> None:
    """The holder's clock is skewed one way and the other sealer's the other way: on its own
    clock the other sealer may find the claim a day expired; on the server's it is live."""
    other = _sealer(cat, skew, ttl=LONG_TTL)
    tried: list[object] = []
    holder = _sealer(
        cat,
        -skew,
        ttl=LONG_TTL,
        at="before_upload",
        then=lambda: tried.append(other.seal_partition(0, force=True)),
    )

    result = holder.seal_partition(0, force=True)

    assert tried == [None], "the live claim was left alone"
    assert result is not None and result.rows_out == 30
    assert _claimed_by(cat) == {None}
    _check_sealed(cat)


@SKEWS
def test_an_expired_claim_is_taken_over_by_a_sealer_whose_clock_is_skewed(
    cat: Catalog, skew: float
) -> None:
    """The holder froze past its claim on the server's clock; the other sealer, whose own clock
    may say the claim has a day left, takes the run over, and the holder's swap is refused."""
    other = _sealer(cat, skew, ttl=LONG_TTL)
    taken: list[object] = []

    def freeze_past_the_claim() -> None:
        _until_the_claim_expired_on_the_server(cat)
        taken.append(other.seal_partition(0, force=True))

    holder = _sealer(cat, -skew, ttl=SHORT_TTL, at="before_upload", then=freeze_past_the_claim)
    with pytest.raises(SegmentChangedError):
        holder.seal_partition(0, force=True)

    assert taken and taken[0] is not None, "the expired claim was taken over"
    _check_sealed(cat)


@SKEWS
def test_a_swap_after_the_claim_expired_is_refused_whatever_the_sealers_clock(
    cat: Catalog, skew: float
) -> None:
    """Nobody took the run over, but the claim expired on the server's clock before the swap
    (GC may have collected the upload): the swap is refused even though the sealer's own clock,
    which has not moved, says the claim is live. The run goes back, and seals next time."""
    stalled = _sealer(
        cat,
        skew,
        ttl=SHORT_TTL,
        at="before_swap",
        then=lambda: _until_the_claim_expired_on_the_server(cat),
    )
    with pytest.raises(SegmentChangedError, match="expired before the swap"):
        stalled.seal_partition(0, force=True)
    assert {e.state for e in cat.manifest("t").entries} == {SegmentState.CONSUMING}
    assert sorted(cat.read_table("t").column("id").to_pylist()) == IDS

    assert _sealer(cat, skew, ttl=LONG_TTL).seal_partition(0, force=True) is not None
    _check_sealed(cat)
