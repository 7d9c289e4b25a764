"""Every mutation of a table's manifest: the index of them all, and the primitives they share.

The manifest is the ``ms_tables`` row (its ``manifest_version``), the shards, the entries
(segments) and the delete vectors. Each operation is one transaction whose writes are
compare-and-sets on the rows' ``version`` with a rowcount check, under an explicit
precondition that the operation re-reads inside the transaction:

=====================  ==============================================================
operation              precondition (checked in the transaction)
=====================  ==============================================================
append                 per shard: :func:`millstream.core.frontier.decide` on the current
                       upper and epoch (``MetadataStore.commit_batch``, :mod:`.append`)
ensure shards          a table's and its dead-letter table's shards are created together
                       (:mod:`.shards`)
claim a run            every entry live; CONSUMING or ERROR, or COMMITTING with an expired
                       claim (:mod:`.claims`)
release a run          each entry still at the version its claim gave it (:mod:`.claims`)
replace a run (seal)   the claimed entries unchanged since the claim; the partition's live
                       sealed entries and delete vectors are the ones the seal's key index
                       reflects (:mod:`.swaps`)
compact (sealed)       the partition's live sealed entries and delete vectors are the ones
                       the compaction planned from; each replaced entry at the version read;
                       the swap lands before the compaction's deadline (:mod:`.swaps`)
replace an entry       the entry live and unchanged since it was read (re-ingestion,
                       :mod:`.swaps`)
roll back              the segments to remove are live; the shard unchanged since read
                       (:func:`remove_segments`, planned by :mod:`.rollback`)
publish a version      the table row unchanged since read (every change above ends here,
                       :func:`publish_version`; several tables' at once: :func:`publish_versions`)
expire versions        the table row unchanged since read; only rows removed at or before
                       the new floor are deleted, each delete's row count checked
                       (:mod:`.expiry`)
change retention       the table row unchanged since read; the rest of the spec equal
                       (:mod:`.tables`)
=====================  ==============================================================

A lost compare-and-set raises :class:`CommitConflictError` and the store retries the whole
transaction from a fresh read (``MetadataStore.retrying``). A failed precondition that a retry
cannot fix raises a typed error instead (:class:`SegmentChangedError`). An unknown commit
outcome (:class:`CommitStateUnknownError`) is reconciled by re-reading whether the change
landed (:func:`reconcile`); it never licenses deleting a file: a caller that gets it back keeps
its files and leaves them to garbage collection, which deletes only what nothing references.

Only the modules listed in ``tests/unit/test_manifest_mutations_live_in_metastore.py`` issue
``insert``/``update``/``delete`` on these tables; that test enforces it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sqlalchemy import Connection, insert, select
from sqlalchemy.exc import IntegrityError

from millstream.errors import (
    CommitConflictError,
    CommitStateUnknownError,
    MillstreamError,
    SegmentChangedError,
)
from millstream.metastore import schema as s
from millstream.metastore.cas import CasRow, cas_update, cas_update_many
from millstream.metastore.engine import Transactions
from millstream.metastore.models import Entry, SegmentState, TableInfo
from millstream.metastore.reads import get_entry, live_delete_vectors

log = logging.getLogger(__name__)

T = TypeVar("T")


# -- primitives (inside a caller's transaction) ---------------------------------------------


def _entry_row(
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
) -> dict[str, Any]:
    """The ``ms_entries`` row of a new entry visible from ``added_version`` on."""
    return {
        "table_name": table,
        "partition": partition,
        "seq": seq,
        "file_path": file_path,
        "start_offset": start,
        "end_offset": end,
        "state": SegmentState(state).value,
        "row_count": row_count,
        "size_bytes": size_bytes,
        "added_version": added_version,
        "removed_version": None,
        "writer_id": writer_id,
        "batch_id": batch_id,
        "created_at": now,
        "version": 1,
    }


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
    row = _entry_row(
        table=table,
        partition=partition,
        seq=seq,
        file_path=file_path,
        start=start,
        end=end,
        state=state,
        row_count=row_count,
        size_bytes=size_bytes,
        added_version=added_version,
        now=now,
        writer_id=writer_id,
        batch_id=batch_id,
    )
    key = conn.execute(insert(s.entries).values(**row)).inserted_primary_key
    assert key is not None
    return int(key[0])


def insert_entries(conn: Connection, entries: Sequence[Mapping[str, Any]]) -> None:
    """:func:`insert_entry` for several entries in one statement executed for each (a commit
    adds one entry per partition with records: a statement built and sent per entry cost
    ~0.4 ms each). Each mapping holds :func:`insert_entry`'s keyword arguments."""
    if entries:
        conn.execute(insert(s.entries), [_entry_row(**e) for e in entries])


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


def update_entries(
    conn: Connection, updates: Sequence[tuple[int, int, Mapping[str, Any]]]
) -> dict[int, int]:
    """Compare-and-set several entries, each ``(id, expected version, values)`` with the same
    value columns, in one statement executed for every entry (``cas_update_many``): unless
    every entry is still at its expected version, :class:`CommitConflictError` and nothing of
    the caller's transaction commits. Returns each entry's new version."""
    cas_update_many(
        conn, s.entries, [CasRow({"id": i}, version, values) for i, version, values in updates]
    )
    return {i: version + 1 for i, version, _ in updates}


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


@dataclass(frozen=True, slots=True)
class Publication:
    """One table's new version among several published together (:func:`publish_versions`)."""

    info: TableInfo
    operation: str
    now: float
    writer_id: str | None = None
    batch_id: int | None = None


def publish_versions(conn: Connection, published: Sequence[Publication]) -> None:
    """:func:`publish_version` of several tables (the tables of a shared query's batch) with
    one statement for their rows' compare-and-sets (``cas_update_many``: its row count must
    equal the tables', else :class:`CommitConflictError`) and one for their version rows."""
    if len(published) <= 1:
        for p in published:
            publish_version(
                conn, p.info, p.operation, p.now, writer_id=p.writer_id, batch_id=p.batch_id
            )
        return
    cas_update_many(
        conn,
        s.tables,
        [
            CasRow(
                {"name": p.info.name},
                p.info.version,
                {"manifest_version": p.info.manifest_version + 1},
            )
            for p in published
        ],
    )
    conn.execute(
        insert(s.table_versions),
        [
            {
                "table_name": p.info.name,
                "manifest_version": p.info.manifest_version + 1,
                "committed_at": p.now,
                "operation": p.operation,
                "writer_id": p.writer_id,
                "batch_id": p.batch_id,
            }
            for p in published
        ],
    )


# -- several writers' changes in one transaction ---------------------------------------------

K = TypeVar("K")


def each_isolated(
    conn: Connection, work: Mapping[K, Callable[[Connection], T]]
) -> dict[K, T | MillstreamError]:
    """Run each of ``work`` (its compare-and-sets and preconditions, as its own transaction
    would) in a savepoint of ``conn``'s transaction, one after the other: one whose
    precondition fails (a stale epoch, a lost compare-and-set, a staged file too old, a
    duplicate row) is rolled back to its savepoint alone and its error is returned in its
    place, while the others' writes stay in the transaction and commit with it. An error of
    the transaction itself (the store unreachable, a deadlock) propagates: the whole
    transaction is rolled back (and retried by its caller)."""
    out: dict[K, T | MillstreamError] = {}
    for key, fn in work.items():
        savepoint = conn.begin_nested()
        try:
            out[key] = fn(conn)
        except MillstreamError as exc:
            savepoint.rollback()
            out[key] = exc
            continue
        except IntegrityError as exc:  # a row another writer inserted first: a lost race
            savepoint.rollback()
            out[key] = CommitConflictError(f"a row was inserted concurrently: {exc.orig}")
            continue
        savepoint.commit()
    return out


# -- unknown outcomes ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reconcilable(Generic[T]):
    """A write whose unknown outcome is settled by re-reading: its transaction function
    ``txn`` (compare-and-sets, run in a write transaction) and ``landed``, which tells from a
    fresh read whether ``txn`` took effect (its result) or not (None). A metastore module
    builds one from plain values; the facade runs it with :func:`reconcile`."""

    txn: Callable[[Connection], T]
    landed: Callable[[Connection], T | None]
    #: what the write is, for errors: "seal of t partition 0"
    what: str
    #: what an unknown outcome that did not land leaves behind, for errors
    aftermath: str = "its files are kept for garbage collection"


def reconcile(store: Transactions, write: Reconcilable[T]) -> T:
    """Run ``write.txn`` (retrying lost compare-and-sets); if its COMMIT has an unknown
    outcome, re-read with ``write.landed`` whether it took effect and return that result.
    Raises :class:`CommitStateUnknownError` if it did not land (or the re-read fails): the
    caller must then keep every file it wrote, because nothing proves the manifest does not
    use them."""
    txn, landed, what, aftermath = write.txn, write.landed, write.what, write.aftermath
    try:
        result, _ = store.retrying(txn)
        return result
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
        # The last committed record is gone with its segment: unknown until the next commit.
        {"upper": new_upper, "epoch": epoch + 1, "last_record_ms": None},
    )
    return publish_version(conn, info, "rollback", now)
