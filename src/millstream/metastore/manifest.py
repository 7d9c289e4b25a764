"""Every mutation of a table's manifest, in one place.

The manifest is the ``ms_tables`` row (its ``manifest_version``), the shards, the entries
(segments) and the delete vectors. Each operation here is one transaction whose writes are
compare-and-sets on the rows' ``version`` with a rowcount check, under an explicit
precondition that the operation re-reads inside the transaction:

=====================  ==============================================================
operation              precondition (checked in the transaction)
=====================  ==============================================================
append                 per shard: :func:`millstream.core.frontier.decide` on the current
                       upper and epoch (``MetadataStore.commit_batch``)
ensure shards          a table's and its dead-letter table's shards are created together
claim a run            every entry live; CONSUMING or ERROR, or COMMITTING with an expired
                       claim
release a run          each entry still at the version its claim gave it
replace a run (seal)   the claimed entries unchanged since the claim; the partition's live
                       sealed entries and delete vectors are the ones the seal's key index
                       reflects
replace an entry       the entry live and unchanged since it was read (re-ingestion)
roll back              the segments to remove are live; the shard unchanged since read
publish a version      the table row unchanged since read (every change above ends here)
=====================  ==============================================================

A lost compare-and-set raises :class:`CommitConflictError` and the store retries the whole
transaction from a fresh read (``MetadataStore.retrying``). A failed precondition that a retry
cannot fix raises a typed error instead (:class:`SegmentChangedError`). An unknown commit
outcome (:class:`CommitStateUnknownError`) is reconciled here by re-reading whether the change
landed; it never licenses deleting a file: a caller that gets it back keeps its files and
leaves them to garbage collection, which deletes only what nothing references.

Nothing outside ``millstream.metastore`` issues ``insert``/``update``/``delete`` on these
tables (``tests/unit/test_manifest_mutations_live_in_metastore.py`` enforces it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Connection, insert, select

from millstream.errors import CommitStateUnknownError, SegmentChangedError
from millstream.metastore import schema as s
from millstream.metastore.cas import cas_update
from millstream.metastore.models import DeleteVector, Entry, SegmentState, TableInfo

if TYPE_CHECKING:
    from millstream.metastore.store import MetadataStore

log = logging.getLogger(__name__)

T = TypeVar("T")

#: How long a seal claim holds before another sealer may take the run over (seconds).
DEFAULT_CLAIM_TTL = 600.0


# -- rows ----------------------------------------------------------------------------------


def entry_of(r: Any) -> Entry:
    return Entry(
        id=r["id"],
        table=r["table_name"],
        partition=r["partition"],
        seq=r["seq"],
        file_path=r["file_path"],
        start=r["start_offset"],
        end=r["end_offset"],
        state=SegmentState(r["state"]),
        row_count=r["row_count"],
        size_bytes=r["size_bytes"],
        added_version=r["added_version"],
        removed_version=r["removed_version"],
        writer_id=r["writer_id"],
        batch_id=r["batch_id"],
        created_at=r["created_at"],
        last_error=r["last_error"],
        claimed_by=r["claimed_by"],
        claim_expires_at=r["claim_expires_at"],
        row_version=r["version"],
    )


def delete_vector_of(r: Any) -> DeleteVector:
    return DeleteVector(
        id=r["id"],
        table=r["table_name"],
        partition=r["partition"],
        source_seq=r["source_seq"],
        file_path=r["file_path"],
        row_count=r["row_count"],
        added_version=r["added_version"],
        removed_version=r["removed_version"],
    )


def get_entry(conn: Connection, entry_id: int) -> Entry | None:
    row = conn.execute(select(s.entries).where(s.entries.c.id == entry_id)).mappings().first()
    return None if row is None else entry_of(row)


def live_entries(conn: Connection, table: str, partition: int) -> list[Entry]:
    """The partition's entries not removed in any version, by sequence number."""
    e = s.entries
    q = (
        select(e)
        .where(e.c.table_name == table, e.c.partition == partition, e.c.removed_version.is_(None))
        .order_by(e.c.seq)
    )
    return [entry_of(r) for r in conn.execute(q).mappings()]


def live_delete_vectors(conn: Connection, table: str, partition: int) -> list[DeleteVector]:
    dv = s.delete_vectors
    q = (
        select(dv)
        .where(
            dv.c.table_name == table, dv.c.partition == partition, dv.c.removed_version.is_(None)
        )
        .order_by(dv.c.id)
    )
    return [delete_vector_of(r) for r in conn.execute(q).mappings()]


def sealed_state(conn: Connection, table: str, partition: int) -> tuple[tuple[int, ...], ...]:
    """(ids of the partition's live sealed entries, ids of its live delete vectors): what a key
    index must reflect for a seal built on it to be swapped in."""
    sealed = tuple(
        sorted(e.id for e in live_entries(conn, table, partition) if e.state is SegmentState.ONLINE)
    )
    vectors = tuple(sorted(d.id for d in live_delete_vectors(conn, table, partition)))
    return sealed, vectors


# -- primitives (inside a caller's transaction) ---------------------------------------------


def insert_entry(
    conn: Connection,
    *,
    table: str,
    partition: int,
    seq: int,
    file_path: str | None,
    start: int,
    end: int,
    state: SegmentState,
    row_count: int,
    size_bytes: int,
    added_version: int,
    now: float,
    writer_id: str | None = None,
    batch_id: int | None = None,
) -> int:
    """Add a manifest entry visible from ``added_version`` on; returns its id."""
    res = conn.execute(
        insert(s.entries).values(
            table_name=table,
            partition=partition,
            seq=seq,
            file_path=file_path,
            start_offset=start,
            end_offset=end,
            state=state.value,
            row_count=row_count,
            size_bytes=size_bytes,
            added_version=added_version,
            removed_version=None,
            writer_id=writer_id,
            batch_id=batch_id,
            created_at=now,
            version=1,
        )
    )
    key = res.inserted_primary_key
    assert key is not None
    return int(key[0])


def insert_delete_vector(
    conn: Connection,
    *,
    table: str,
    partition: int,
    source_seq: int,
    file_path: str,
    row_count: int,
    added_version: int,
) -> int:
    """Record a delete vector visible from ``added_version`` on; returns its id."""
    res = conn.execute(
        insert(s.delete_vectors).values(
            table_name=table,
            partition=partition,
            source_seq=source_seq,
            file_path=file_path,
            row_count=row_count,
            added_version=added_version,
            removed_version=None,
            version=1,
        )
    )
    key = res.inserted_primary_key
    assert key is not None
    return int(key[0])


def update_entry(
    conn: Connection, entry_id: int, expected_version: int, values: Mapping[str, Any]
) -> int:
    """Compare-and-set one entry; returns its new version (CommitConflictError if it moved)."""
    return cas_update(conn, s.entries, {"id": entry_id}, expected_version, dict(values))


def remove_delete_vector(conn: Connection, dv_id: int, version: int) -> None:
    """Mark a live delete vector removed as of manifest ``version`` (compare-and-set)."""
    row = (
        conn.execute(select(s.delete_vectors).where(s.delete_vectors.c.id == dv_id))
        .mappings()
        .first()
    )
    assert row is not None and row["removed_version"] is None, dv_id
    cas_update(conn, s.delete_vectors, {"id": dv_id}, row["version"], {"removed_version": version})


def publish_version(
    conn: Connection,
    info: TableInfo,
    operation: str,
    now: float,
    *,
    writer_id: str | None = None,
    batch_id: int | None = None,
) -> int:
    """Make ``info.manifest_version + 1`` the table's current version (compare-and-set on the
    table row) and record who made it and when (time travel by time). Every manifest change
    goes through here: appends, seals, rollbacks, re-ingestion."""
    version = info.manifest_version + 1
    cas_update(conn, s.tables, {"name": info.name}, info.version, {"manifest_version": version})
    conn.execute(
        insert(s.table_versions).values(
            table_name=info.name,
            manifest_version=version,
            committed_at=now,
            operation=operation,
            writer_id=writer_id,
            batch_id=batch_id,
        )
    )
    return version


def reconcile(
    store: MetadataStore,
    txn: Callable[[Connection], T],
    landed: Callable[[Connection], T | None],
    what: str,
    *,
    aftermath: str = "its files are kept for garbage collection",
) -> T:
    """Run ``txn`` (retrying lost compare-and-sets); if its COMMIT has an unknown outcome,
    re-read with ``landed`` whether it took effect and return that result. Raises
    :class:`CommitStateUnknownError` if it did not land (or the re-read fails): the caller must
    then keep every file it wrote, because nothing proves the manifest does not use them."""
    try:
        result, _ = store.retrying(txn)
        return result  # type: ignore[no-any-return]
    except CommitStateUnknownError as exc:
        try:
            with store.read() as conn:
                found = landed(conn)
        except Exception as reread:
            raise CommitStateUnknownError(
                f"{what}: the commit's outcome is unknown and re-reading the manifest failed "
                f"({reread}); {aftermath}",
                operation=what,
            ) from exc
        if found is not None:
            log.warning("%s: the commit's outcome was unknown; re-read: it landed", what)
            return found
        raise CommitStateUnknownError(
            f"{what}: the commit's outcome was unknown and a re-read shows it did not land; "
            f"{aftermath}",
            operation=what,
        ) from exc


# -- seal claims -----------------------------------------------------------------------------


def claim_run(
    store: MetadataStore,
    run: Sequence[Entry],
    *,
    owner: str,
    ttl: float = DEFAULT_CLAIM_TTL,
    now: float | None = None,
) -> dict[int, int] | None:
    """Claim ``run`` for a seal: every entry CONSUMING|ERROR -> COMMITTING, owned by ``owner``
    until ``now + ttl``. Returns ``{entry id: version after the claim}``, or None when another
    sealer's claim on any entry is still live or an entry is gone (removed or re-ingested).

    Precondition per entry: live, and CONSUMING or ERROR, or COMMITTING whose claim expired (its
    sealer is presumed dead; if it comes back, its swap finds the version moved and is
    discarded). A claim without an expiry (schema v3) counts as expired."""

    at = store.clock.now() if now is None else now

    def _txn(conn: Connection) -> dict[int, int] | None:
        # Every entry's precondition first: returning None after claiming some entries would
        # commit a partial claim that nobody releases until it expires.
        checked: dict[int, int] = {}
        for e in run:
            cur = get_entry(conn, e.id)
            if cur is None or cur.removed_version is not None:
                return None
            if cur.claim_held(at):
                return None
            checked[e.id] = cur.row_version
        versions: dict[int, int] = {}
        for e in run:
            # The version the check saw: a claim committed since then makes this fail.
            versions[e.id] = update_entry(
                conn,
                e.id,
                checked[e.id],
                {
                    "state": SegmentState.COMMITTING.value,
                    "claimed_by": owner,
                    "claim_expires_at": at + ttl,
                },
            )
        return versions

    claimed, _ = store.retrying(_txn)
    return claimed  # type: ignore[no-any-return]


def release_run(
    store: MetadataStore, claimed: Mapping[int, int], *, error: str, fail_first: bool
) -> int | None:
    """Put a run whose seal failed back: CONSUMING with ``error`` (the first entry ERROR when
    ``fail_first``), claim cleared. Only entries still at their claimed version are touched (a
    re-ingested or taken-over entry is someone else's now). Returns the partition, or None if
    no entry was still ours."""

    def _txn(conn: Connection) -> int | None:
        ours = []
        for entry_id, version in claimed.items():
            cur = get_entry(conn, entry_id)
            if cur is not None and cur.removed_version is None and cur.row_version == version:
                ours.append(cur)
        ours.sort(key=lambda e: e.seq)  # the run's first segment is the lowest sequence number
        partition = None
        for cur in ours:
            entry_id, version = cur.id, cur.row_version
            state = SegmentState.ERROR if fail_first and cur is ours[0] else SegmentState.CONSUMING
            update_entry(
                conn,
                entry_id,
                version,
                {
                    "state": state.value,
                    "last_error": error,
                    "claimed_by": None,
                    "claim_expires_at": None,
                },
            )
            partition = cur.partition
        return partition

    released, _ = store.retrying(_txn)
    return released  # type: ignore[no-any-return]


# -- seal swap ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SealedSegment:
    """What a seal uploaded: the sealed file and, if it superseded older rows, their vector."""

    file_path: str
    row_count: int
    size_bytes: int
    #: (sealed entry ids, delete vector ids) the seal's key index reflects, or None (no index)
    reflects: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    delete_vector: tuple[str, int] | None = None  # (path, rows)


def replace_run(
    store: MetadataStore,
    table: str,
    partition: int,
    claimed: Mapping[int, int],
    sealed: SealedSegment,
) -> tuple[Entry, int | None]:
    """Swap a sealed segment in for the claimed run, in one transaction: the run's entries are
    removed, one ONLINE entry covering ``[run start, run end)`` with the run's first sequence
    number is added, with its delete vector. Returns (the new entry, the vector's id or None).

    Preconditions: every claimed entry is live and still at its claimed version; with a key
    index, the partition's live sealed entries and delete vectors are the ones it reflects.
    Either failing raises :class:`SegmentChangedError` (the seal is discarded)."""
    where = f"seal of {table} partition {partition}"

    def _txn(conn: Connection) -> tuple[Entry, int | None]:
        info = store.table_row(conn, table)
        if sealed.reflects is not None and sealed_state(conn, table, partition) != sealed.reflects:
            raise SegmentChangedError(
                f"the sealed segments of {table} partition {partition} changed while this seal "
                "was built (rolled back, re-ingested or sealed elsewhere); the seal is "
                "discarded and retried with a current key index",
                table=table,
                partition=partition,
            )
        entries = []
        for entry_id, version in claimed.items():
            cur = get_entry(conn, entry_id)
            if cur is None or cur.removed_version is not None or cur.row_version != version:
                raise SegmentChangedError(
                    f"the run being sealed in {table} partition {partition} changed (rolled "
                    "back, re-ingested, or claimed by another sealer after this one's claim "
                    "expired); the seal is discarded",
                    table=table,
                    partition=partition,
                )
            entries.append(cur)
        entries.sort(key=lambda e: e.seq)
        new_version = info.manifest_version + 1
        now = store.clock.now()
        for e in entries:
            update_entry(
                conn,
                e.id,
                claimed[e.id],
                {"removed_version": new_version, "claimed_by": None, "claim_expires_at": None},
            )
        new_id = insert_entry(
            conn,
            table=table,
            partition=partition,
            seq=entries[0].seq,
            file_path=sealed.file_path,
            start=entries[0].start,
            end=entries[-1].end,
            state=SegmentState.ONLINE,
            row_count=sealed.row_count,
            size_bytes=sealed.size_bytes,
            added_version=new_version,
            now=now,
            writer_id="sealer",
        )
        dv_id = None
        if sealed.delete_vector is not None:
            dv_id = insert_delete_vector(
                conn,
                table=table,
                partition=partition,
                source_seq=entries[0].seq,
                file_path=sealed.delete_vector[0],
                row_count=sealed.delete_vector[1],
                added_version=new_version,
            )
        publish_version(conn, info, "seal", now)
        new = get_entry(conn, new_id)
        assert new is not None
        return new, dv_id

    def _landed(conn: Connection) -> tuple[Entry, int | None] | None:
        new = _live_entry_with_file(conn, table, partition, sealed.file_path)
        if new is None:
            return None
        dv_id = None
        if sealed.delete_vector is not None:
            dv_id = next(
                (
                    d.id
                    for d in live_delete_vectors(conn, table, partition)
                    if d.file_path == sealed.delete_vector[0]
                ),
                None,
            )
        return new, dv_id

    return reconcile(store, _txn, _landed, where)


# -- re-ingestion ------------------------------------------------------------------------------


def replace_entry(
    store: MetadataStore, old: Entry, *, file_path: str, row_count: int, size_bytes: int
) -> Entry:
    """Swap a rebuilt file in for segment ``old`` (same partition, sequence number and offset
    range). A sealed segment stays ONLINE; any other becomes CONSUMING with no claim: if a
    sealer held ``old``, its swap now finds the run changed and is discarded, and the next seal
    takes the fresh entry (copying COMMITTING would leave it claimed by nobody, forever).

    Precondition: ``old`` is live and unchanged since this transaction read it (compare-and-set
    with a rowcount check); else :class:`SegmentChangedError`."""
    where = f"re-ingestion of segment {old.name}"

    def _txn(conn: Connection) -> Entry:
        info = store.table_row(conn, old.table)
        cur = get_entry(conn, old.id)
        if cur is None or cur.removed_version is not None:
            raise SegmentChangedError(
                f"segment {old.name} changed while it was re-ingested (sealed or rolled back); "
                "nothing was swapped",
                segment=old.name,
            )
        version = info.manifest_version + 1
        now = store.clock.now()
        update_entry(
            conn,
            old.id,
            cur.row_version,  # the version the check saw: a seal since then makes this fail
            {"removed_version": version, "claimed_by": None, "claim_expires_at": None},
        )
        state = SegmentState.ONLINE if cur.state is SegmentState.ONLINE else SegmentState.CONSUMING
        new_id = insert_entry(
            conn,
            table=old.table,
            partition=old.partition,
            seq=old.seq,
            file_path=file_path,
            start=old.start,
            end=old.end,
            state=state,
            row_count=row_count,
            size_bytes=size_bytes,
            added_version=version,
            now=now,
            writer_id="reingest",
        )
        publish_version(conn, info, "reingest", now)
        new = get_entry(conn, new_id)
        assert new is not None
        return new

    def _landed(conn: Connection) -> Entry | None:
        return _live_entry_with_file(conn, old.table, old.partition, file_path)

    return reconcile(store, _txn, _landed, where)


# -- rollback ----------------------------------------------------------------------------------


def remove_segments(
    conn: Connection,
    info: TableInfo,
    shard_key: tuple[int, int, int],
    doomed: Sequence[Entry],
    new_upper: int,
    now: float,
) -> int:
    """Roll a shard back (inside the caller's transaction): remove the ``doomed`` entries and
    the delete vectors their seals wrote, move the upper to ``new_upper`` and bump the epoch
    (fencing every writer), then publish the new manifest version, which it returns.

    ``shard_key`` is (partition, epoch, version) as read. Preconditions: each doomed entry is
    live and at the version read; the shard is unchanged since read (compare-and-sets)."""
    partition, epoch, shard_version = shard_key
    version = info.manifest_version + 1
    for e in doomed:
        cur = get_entry(conn, e.id)
        if cur is None or cur.removed_version is not None:
            raise SegmentChangedError(
                f"segment {e.name} changed during the rollback; nothing was rolled back",
                segment=e.name,
            )
        update_entry(
            conn,
            e.id,
            cur.row_version,
            {"removed_version": version, "claimed_by": None, "claim_expires_at": None},
        )
    if doomed:
        # Rows the removed seals had superseded in older segments are current again.
        first = min(e.seq for e in doomed)
        for dv in live_delete_vectors(conn, info.name, partition):
            if dv.source_seq >= first:
                remove_delete_vector(conn, dv.id, version)
    cas_update(
        conn,
        s.shards,
        {"table_name": info.name, "partition": partition},
        shard_version,
        {"upper": new_upper, "epoch": epoch + 1},
    )
    return publish_version(conn, info, "rollback", now)


# -- helpers -----------------------------------------------------------------------------------


def _live_entry_with_file(
    conn: Connection, table: str, partition: int, file_path: str
) -> Entry | None:
    return next((e for e in live_entries(conn, table, partition) if e.file_path == file_path), None)
