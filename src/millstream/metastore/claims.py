"""Seal claims: a sealer claims a run of entries (CONSUMING|ERROR -> COMMITTING, with an owner
and an expiry) before it builds, and puts the run back if its seal fails. Each is one
transaction of compare-and-sets (the operations table is in :mod:`millstream.metastore.manifest`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlalchemy import Connection

from millstream.clock import SYSTEM_CLOCK, Clock
from millstream.metastore.manifest import update_entries
from millstream.metastore.models import Entry, SegmentState
from millstream.metastore.reads import get_entries

#: How long a seal claim holds before another sealer may take the run over (seconds).
DEFAULT_CLAIM_TTL = 600.0


def claim_run(
    conn: Connection,
    clock: Clock,
    run: Sequence[Entry],
    *,
    owner: str,
    ttl: float = DEFAULT_CLAIM_TTL,
) -> dict[int, int] | None:
    """Claim ``run`` for a seal: every entry CONSUMING|ERROR -> COMMITTING, owned by ``owner``
    until the store's now + ``ttl``. Returns ``{entry id: version after the claim}``, or None
    when another sealer's claim on any entry is still live or an entry is gone (removed or
    re-ingested).

    Precondition per entry: live, and CONSUMING or ERROR, or COMMITTING whose claim expired (its
    sealer is presumed dead; if it comes back, its swap finds the version moved and is
    discarded). A claim without an expiry (schema v3) counts as expired. Whether a claim is
    live, and when the new one expires, are judged on the metadata store's clock
    (:func:`store_now`), never the sealer's: two sealers whose clocks disagree by more than the
    TTL still agree on who holds a run. One transaction (``conn``'s)."""
    now = store_now(conn, clock)
    # Every entry's precondition first: returning None after claiming some entries would
    # commit a partial claim that nobody releases until it expires. One read for the run.
    current = get_entries(conn, (e.id for e in run))
    checked: dict[int, int] = {}
    for e in run:
        cur = current.get(e.id)
        if cur is None or cur.removed_version is not None:
            return None
        if cur.claim_held(now):
            return None
        checked[e.id] = cur.row_version
    # The versions the check saw, in one compare-and-set of the run: a claim committed since
    # then makes it fail (its row count short of the run's) and nothing is claimed.
    values = {
        "state": SegmentState.COMMITTING.value,
        "claimed_by": owner,
        "claim_expires_at": now + ttl,
    }
    return update_entries(conn, [(i, v, values) for i, v in checked.items()])


def release_run(
    conn: Connection, claimed: Mapping[int, int], *, error: str, fail_first: bool
) -> int | None:
    """Put a run whose seal failed back: CONSUMING with ``error`` (the first entry ERROR when
    ``fail_first``), claim cleared. Only entries still at their claimed version are touched (a
    re-ingested or taken-over entry is someone else's now). Returns the partition, or None if
    no entry was still ours."""
    current = get_entries(conn, claimed)
    ours = [
        cur
        for entry_id, version in claimed.items()
        if (cur := current.get(entry_id)) is not None
        and cur.removed_version is None
        and cur.row_version == version
    ]
    ours.sort(key=lambda e: e.seq)  # the run's first segment is the lowest sequence number
    if not ours:
        return None
    update_entries(
        conn,
        [
            (
                cur.id,
                cur.row_version,
                {
                    "state": (
                        SegmentState.ERROR
                        if fail_first and cur is ours[0]
                        else SegmentState.CONSUMING
                    ).value,
                    "last_error": error,
                    "claimed_by": None,
                    "claim_expires_at": None,
                },
            )
            for cur in ours
        ],
    )
    return ours[-1].partition


def store_now(conn: Connection, clock: Clock) -> float:
    """The metadata store's time (epoch seconds), read in ``conn``'s transaction: the
    database server's clock (PostgreSQL's ``clock_timestamp()``; SQLite's ``julianday``, on
    the host of its file), so every sealer's claim, take-over, renewal and swap is judged on
    one clock whatever its own host's says. A store given its own ``clock`` (tests,
    simulations) uses that instead."""
    if clock is not SYSTEM_CLOCK:
        return clock.now()
    if conn.dialect.name == "sqlite":
        sql = "SELECT (julianday('now') - 2440587.5) * 86400.0"
    else:
        sql = "SELECT EXTRACT(EPOCH FROM clock_timestamp())"
    return float(conn.exec_driver_sql(sql).scalar_one())


def renew_claim(
    conn: Connection,
    clock: Clock,
    claimed: Mapping[int, int],
    *,
    owner: str,
    ttl: float = DEFAULT_CLAIM_TTL,
) -> dict[int, int] | None:
    """Extend ``owner``'s claim on a run it is sealing to the store's now + ``ttl``
    (:func:`store_now`). Returns the entries' versions after the renewal, or None (nothing
    changed) unless every entry is live, still at its claimed version, claimed by ``owner``
    and its claim not yet expired on the store's clock: a claim that expired (a sealer frozen
    past its claim) is never brought back, as another sealer may hold the run, or GC may have
    taken the files uploaded under it; that seal's swap is then refused."""
    now = store_now(conn, clock)
    entries = get_entries(conn, claimed)
    for entry_id, version in claimed.items():
        cur = entries.get(entry_id)
        if (
            cur is None
            or cur.removed_version is not None
            or cur.row_version != version
            or cur.claimed_by != owner
            or not cur.claim_held(now)
        ):
            return None
    values = {"claim_expires_at": now + ttl}
    return update_entries(conn, [(i, v, values) for i, v in claimed.items()])
