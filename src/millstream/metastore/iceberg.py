"""Where a table's Iceberg view stands: one pointer row per table (schema v11).

The pointer names the current Iceberg table metadata file of the table (a path relative to
the deep store root) and the manifest version its newest snapshot shows. A publisher writes
every file of a new Iceberg metadata version first (new names, never overwritten) and then
moves the pointer with :func:`swap_pointer`, a compare-and-set on the row's ``version`` with
a rowcount check: of two publishers that read the same pointer, one moves it and the other
learns it lost (its files are then unreferenced, and garbage collection removes them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Connection, func, insert, select
from sqlalchemy.exc import IntegrityError

from millstream.clock import Clock
from millstream.errors import CommitConflictError, VersionExpiredError
from millstream.metastore import schema as s
from millstream.metastore.cas import cas_update
from millstream.metastore.reads import oldest_kept_version
from millstream.metastore.tables import find_table

#: What :func:`swap_pointer` raises when another publisher moved the pointer first: its
#: compare-and-set found another version, or its insert of the first pointer found a row.
LOST_RACE = (CommitConflictError, IntegrityError)


@dataclass(frozen=True, slots=True)
class IcebergPointer:
    table: str
    #: The current Iceberg table metadata file, relative to the deep store root.
    metadata_location: str
    #: The manifest version the metadata's current snapshot shows.
    manifest_version: int
    published_at: float
    #: The row's compare-and-set version.
    version: int


def read_pointer(conn: Connection, table: str) -> IcebergPointer | None:
    """The table's Iceberg pointer, or None if nothing was published yet."""
    p = s.iceberg_pointers
    row = conn.execute(select(p).where(p.c.table_name == table)).first()
    if row is None:
        return None
    return IcebergPointer(
        row.table_name,
        row.metadata_location,
        int(row.manifest_version),
        float(row.published_at),
        int(row.version),
    )


def swap_pointer(
    conn: Connection,
    table: str,
    expected: IcebergPointer | None,
    *,
    metadata_location: str,
    manifest_version: int,
    now: float,
    precondition: Callable[[], None] | None = None,
) -> IcebergPointer:
    """Move ``table``'s pointer from ``expected`` (None: there is none yet) to
    ``metadata_location``: a compare-and-set on the row version ``expected`` was read at (an
    insert that the primary key refuses when there is no row yet). Returns the new pointer;
    raises one of :data:`LOST_RACE` when another publisher moved it first (the transaction
    must then be rolled back: nothing changes here).

    Raises :class:`~millstream.errors.VersionExpiredError` (nothing changed) when retention
    expired ``manifest_version`` since the publisher read it: garbage collection may have
    deleted its files already. Expiry never passes the version the pointer shows, but before a
    table's first publish no pointer keeps anything; the check runs under the table row's lock,
    which expiry takes too, so either the pointer moves first (and expiry keeps the version)
    or expiry does (and the pointer stays).

    ``precondition`` (the publish's files still younger than the view's garbage collection
    allows) runs last, with the locks held, right before COMMIT: if it raises, nothing moved."""
    p = s.iceberg_pointers
    values = {
        "metadata_location": metadata_location,
        "manifest_version": manifest_version,
        "published_at": now,
    }
    find_table(conn, table, for_update=True)
    oldest = oldest_kept_version(conn, table)
    if manifest_version < oldest:
        raise VersionExpiredError(table, manifest_version, oldest)
    if expected is None:
        conn.execute(insert(p).values(table_name=table, version=1, **values))
        new_version = 1
    else:
        new_version = cas_update(conn, p, {"table_name": table}, expected.version, values)
    if precondition is not None:
        precondition()  # last: a swap that waited on a lock is judged by when it lands
    return IcebergPointer(table, metadata_location, manifest_version, now, new_version)


def version_committed_at(conn: Connection, clock: Clock, table: str, version: int) -> float:
    """When ``table``'s manifest version ``version`` was committed (now, if its row is gone)."""
    tv = s.table_versions
    row = conn.execute(
        select(tv.c.committed_at).where(tv.c.table_name == table, tv.c.manifest_version == version)
    ).first()
    return float(row[0]) if row is not None else clock.now()


def publish_lag(conn: Connection, table: str, now: float) -> float | None:
    """How far ``table``'s Iceberg view lags: seconds since the oldest committed manifest
    version its newest snapshot does not cover was committed (0 when it covers the current
    version; None when the table has no committed version yet). A record committed more than
    this long ago is in the view."""
    tv = s.table_versions
    pointer = read_pointer(conn, table)
    shown = pointer.manifest_version if pointer is not None else 0
    row = conn.execute(
        select(func.min(tv.c.committed_at)).where(
            tv.c.table_name == table, tv.c.manifest_version > shown
        )
    ).first()
    if row is None or row[0] is None:
        return None if pointer is None else 0.0
    return max(0.0, now - float(row[0]))
