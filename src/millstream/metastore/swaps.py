"""Swapping a new file in for existing entries: a seal's sealed segment for its claimed run
(:func:`replace_run`), a compaction's merged segment for sealed segments
(:func:`replace_sealed`), and a re-ingested file for one segment (:func:`replace_entry`). Each is
one transaction of compare-and-sets whose unknown outcome is reconciled by re-reading (the
operations table is in :mod:`millstream.metastore.manifest`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import Connection

from millstream.clock import Clock
from millstream.errors import SegmentChangedError
from millstream.metastore.claims import store_now
from millstream.metastore.manifest import (
    Reconcilable,
    insert_delete_vector,
    insert_entry,
    publish_version,
    remove_delete_vector,
    update_entries,
    update_entry,
)
from millstream.metastore.models import DeleteVector, Entry, SegmentState
from millstream.metastore.reads import (
    get_entries,
    get_entry,
    live_delete_vectors,
    live_entry_with_file,
    sealed_state,
)
from millstream.metastore.tables import find_table

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
    clock: Clock,
    table: str,
    partition: int,
    claimed: Mapping[int, int],
    sealed: SealedSegment,
    *,
    deadline: float | None = None,
    sealer_clock: Clock | None = None,
) -> Reconcilable[tuple[Entry, int | None]]:
    """Swap a sealed segment in for the claimed run, in one transaction (for
    :func:`~millstream.metastore.manifest.reconcile` to run): the run's entries are
    removed, one ONLINE entry covering ``[run start, run end)`` with the run's first sequence
    number is added, with its delete vector. Returns (the new entry, the vector's id or None).

    Preconditions: every claimed entry is live and still at its claimed version, and its claim
    has not expired when the transaction ends, on the metadata store's clock
    (:func:`~millstream.metastore.claims.store_now`, never the sealer's); with a key index, the
    partition's live sealed entries and delete vectors are the ones it reflects. Any failing raises
    :class:`SegmentChangedError` (the seal is discarded).

    Why an expired claim is refused even when nobody took the run over: the sealed file was
    uploaded after the claim was taken, and garbage collection deletes unreferenced files
    older than its grace period (1 h, longer than any claim). A sealer stalled past its claim
    (a GC pause, SIGSTOP) could otherwise swap in a file GC has already deleted.

    And the transaction ends before ``deadline`` (by ``sealer_clock``; set when the sealed
    file began to upload, a claim's TTL later): the claim is renewed while the seal builds (a
    large run may take longer than one TTL), so a live claim no longer bounds the uploaded
    file's age. A sealer stalled between its upload and its swap while its renewer kept the
    claim alive would otherwise swap in a file garbage collection, finding it unreferenced and
    past its grace period, has already deleted (the commit-path campaign's seed 1041809141 on
    PostgreSQL did: the current version lost its sealed segment and its delete vector)."""
    where = f"seal of {table} partition {partition}"

    def _txn(conn: Connection) -> tuple[Entry, int | None]:
        info = find_table(conn, table)
        assert info is not None
        if sealed.reflects is not None and sealed_state(conn, table, partition) != sealed.reflects:
            raise SegmentChangedError(
                f"the sealed segments of {table} partition {partition} changed while this seal "
                "was built (rolled back, re-ingested or sealed elsewhere); the seal is "
                "discarded and retried with a current key index",
                table=table,
                partition=partition,
            )
        entries = []
        current = get_entries(conn, claimed)
        for entry_id, version in claimed.items():
            cur = current.get(entry_id)
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
        now = clock.now()
        removed = {"removed_version": new_version, "claimed_by": None, "claim_expires_at": None}
        update_entries(conn, [(e.id, claimed[e.id], removed) for e in entries])
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
        # Last, right before COMMIT: a swap that waited on locks is judged by when it lands.
        at = store_now(conn, clock)
        if not all(e.claim_held(at) for e in entries):
            raise SegmentChangedError(
                f"the claim on the run being sealed in {table} partition {partition} expired "
                "before the swap landed (the sealer stalled); its uploaded files may already "
                "be collected, so the seal is discarded and retried",
                table=table,
                partition=partition,
            )
        if deadline is not None and (sealer_clock or clock).now() >= deadline:
            raise SegmentChangedError(
                f"the seal of {table} partition {partition} ran past its deadline between its "
                "upload and its swap (the sealer stalled while its claim was renewed); its "
                "uploaded files may already be collected, so the seal is discarded and retried",
                table=table,
                partition=partition,
            )
        return new, dv_id

    def _landed(conn: Connection) -> tuple[Entry, int | None] | None:
        return _landed_with_vector(conn, table, partition, sealed.file_path, sealed.delete_vector)

    return Reconcilable(_txn, _landed, where)


def _landed_with_vector(
    conn: Connection,
    table: str,
    partition: int,
    file_path: str,
    delete_vector: tuple[str, int] | None,
) -> tuple[Entry, int | None] | None:
    """After an unknown outcome: the live entry of ``file_path`` (None: the swap did not land)
    and the id of the live vector of ``delete_vector``'s path, if any."""
    new = live_entry_with_file(conn, table, partition, file_path)
    if new is None:
        return None
    dv_id = None
    if delete_vector is not None:
        dv_id = next(
            (
                d.id
                for d in live_delete_vectors(conn, table, partition)
                if d.file_path == delete_vector[0]
            ),
            None,
        )
    return new, dv_id


# -- compaction of sealed segments ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CompactedSegment:
    """What a compaction uploaded: the merged file of its window of sealed segments and, if
    the delete vectors it replaces also name rows older than the window, one vector of those."""

    file_path: str
    row_count: int
    size_bytes: int
    delete_vector: tuple[str, int] | None = None  # (path, rows)


def replace_sealed(
    store_clock: Clock,
    table: str,
    partition: int,
    window: Sequence[Entry],
    vectors: Sequence[DeleteVector],
    reflects: tuple[tuple[int, ...], tuple[int, ...]],
    merged: CompactedSegment,
    *,
    deadline: float,
    clock: Clock,
) -> Reconcilable[tuple[Entry, int | None]]:
    """Swap a compaction's merged segment in for ``window`` (a suffix of the partition's sealed
    segments, in sequence order) and ``vectors`` (the live delete vectors written by the seals
    of the window's segments), in one transaction. The merged entry covers ``[first start, last
    end)`` with the first sequence number; the replacement vector (if any) takes that sequence
    number as its source, so a rollback to before the window removes it with the entry.
    Returns (the merged entry, the vector's id or None).

    Preconditions: the partition's live sealed entries and delete vectors are exactly
    ``reflects`` (what the compaction planned and built from: a seal, rollback, re-ingestion or
    other compaction since then refuses it), every window entry is at the version read, and the
    transaction ends before ``deadline`` (by ``clock``; the rows' times are ``store_clock``'s):
    garbage collection deletes unreferenced files older than its grace period, so a compactor
    stalled past that could swap in a file already collected. Any failing raises
    :class:`SegmentChangedError`."""
    where = f"compaction of {table} partition {partition}"
    first, last = window[0], window[-1]

    def _txn(conn: Connection) -> tuple[Entry, int | None]:
        info = find_table(conn, table)
        assert info is not None
        if sealed_state(conn, table, partition) != reflects:
            raise SegmentChangedError(
                f"the sealed segments of {table} partition {partition} changed while they "
                "were compacted (sealed, rolled back, re-ingested or compacted elsewhere); the "
                "compaction is discarded and planned again",
                table=table,
                partition=partition,
            )
        new_version = info.manifest_version + 1
        for e in window:
            cur = get_entry(conn, e.id)
            if cur is None or cur.removed_version is not None or cur.row_version != e.row_version:
                raise SegmentChangedError(
                    f"segment {e.name} changed while it was compacted; the compaction is discarded",
                    table=table,
                    partition=partition,
                )
            update_entry(conn, e.id, e.row_version, {"removed_version": new_version})
        for dv in vectors:
            remove_delete_vector(conn, dv.id, new_version)
        now = store_clock.now()
        new_id = insert_entry(
            conn,
            table=table,
            partition=partition,
            seq=first.seq,
            file_path=merged.file_path,
            start=first.start,
            end=last.end,
            state=SegmentState.ONLINE,
            row_count=merged.row_count,
            size_bytes=merged.size_bytes,
            added_version=new_version,
            now=now,
            writer_id="compactor",
        )
        dv_id = None
        if merged.delete_vector is not None:
            dv_id = insert_delete_vector(
                conn,
                table=table,
                partition=partition,
                source_seq=first.seq,
                file_path=merged.delete_vector[0],
                row_count=merged.delete_vector[1],
                added_version=new_version,
            )
        publish_version(conn, info, "compact", now)
        new = get_entry(conn, new_id)
        assert new is not None
        # Last, right before COMMIT: a swap that waited on locks is judged by when it lands.
        if clock.now() >= deadline:
            raise SegmentChangedError(
                f"the compaction of {table} partition {partition} ran past its deadline before "
                "its swap landed (the compactor stalled); its uploaded files may already be "
                "collected, so it is discarded",
                table=table,
                partition=partition,
            )
        return new, dv_id

    def _landed(conn: Connection) -> tuple[Entry, int | None] | None:
        return _landed_with_vector(conn, table, partition, merged.file_path, merged.delete_vector)

    return Reconcilable(_txn, _landed, where)


# -- re-ingestion ------------------------------------------------------------------------------


def replace_entry(
    clock: Clock,
    old: Entry,
    *,
    file_path: str,
    row_count: int,
    size_bytes: int,
    precondition: Callable[[], None] | None = None,
) -> Reconcilable[Entry]:
    """Swap a rebuilt file in for segment ``old`` (same partition, sequence number and offset
    range). A sealed segment stays ONLINE; any other becomes CONSUMING with no claim: if a
    sealer held ``old``, its swap now finds the run changed and is discarded, and the next seal
    takes the fresh entry (copying COMMITTING would leave it claimed by nobody, forever).

    Precondition: ``old`` is live and unchanged since this transaction read it (compare-and-set
    with a rowcount check); else :class:`SegmentChangedError`. ``precondition`` (the rebuilt
    file still younger than garbage collection's grace allows) runs last, right before COMMIT,
    so a swap is judged by when it lands, not by when its caller last looked."""
    where = f"re-ingestion of segment {old.name}"

    def _txn(conn: Connection) -> Entry:
        info = find_table(conn, old.table)
        assert info is not None
        cur = get_entry(conn, old.id)
        if cur is None or cur.removed_version is not None:
            raise SegmentChangedError(
                f"segment {old.name} changed while it was re-ingested (sealed or rolled back); "
                "nothing was swapped",
                segment=old.name,
            )
        version = info.manifest_version + 1
        now = clock.now()
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
        if precondition is not None:
            precondition()  # last, with every lock held: right before COMMIT
        return new

    def _landed(conn: Connection) -> Entry | None:
        return live_entry_with_file(conn, old.table, old.partition, file_path)

    return Reconcilable(_txn, _landed, where)
