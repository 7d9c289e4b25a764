"""Expiring old manifest versions (the table's ``retention``): the history a table keeps is
bounded by its retention window, not by its age.

A version ``v`` is kept while it is one of the newest ``retention.min_versions`` or was still
current at some moment inside the window ``[now - retention.time, now]``. So the oldest kept
version (the *floor*) is the lower of:

* the version that was current at the window's start (time travel to any instant inside the
  window resolves to it or a newer one), and
* ``current - min_versions + 1``.

A version a reader pinned (:mod:`millstream.metastore.pins`) is kept too, until its pin is
released or expires: the floor never passes the oldest unexpired pin. So is the version the
table's Iceberg pointer shows (:mod:`millstream.metastore.iceberg`): engines load that
snapshot by name until the next publish moves the pointer, so its files must stay.

Expiring removes, in one transaction, the version rows below the floor and every entry and
delete vector that no kept version can see (removed at or before the floor: a row is visible
in versions ``added_version <= v < removed_version``). Their files are then referenced by
nothing and garbage collection may delete them after its grace period. Reads below the floor
raise :class:`~millstream.errors.VersionExpiredError`.

The transaction is a compare-and-set on the table row (a concurrent commit or a second expiry
makes it retry from a fresh read) and every delete checks its row count; rows to delete are
removed rows, which nothing changes again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import Connection, Delete, Table, delete, func, select

from millstream.errors import CommitConflictError
from millstream.metastore import schema as s
from millstream.metastore.cas import cas_update
from millstream.metastore.pins import drop_expired_pins, oldest_pinned
from millstream.metastore.reads import oldest_kept_version
from millstream.metastore.tables import find_table


@dataclass(frozen=True, slots=True)
class Expiry:
    """What an expiry removed (or would remove, in a dry run)."""

    table: str
    #: the oldest version kept before and after
    floor_before: int
    floor: int
    versions: int = 0
    entries: int = 0
    delete_vectors: int = 0
    #: files that only expired rows referenced (garbage collection may now delete them)
    released_files: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, object]:
        return {
            "table": self.table,
            "floor_before": self.floor_before,
            "floor": self.floor,
            "versions": self.versions,
            "entries": self.entries,
            "delete_vectors": self.delete_vectors,
            "released_files": len(self.released_files),
        }


def expiry_floor(
    conn: Connection,
    table: str,
    current: int,
    oldest: int,
    *,
    now: float,
    seconds: float,
    min_versions: int,
) -> int:
    """The oldest version to keep under a retention of ``seconds`` and ``min_versions``;
    ``oldest`` is the oldest version kept now (the floor never moves back)."""
    at_window_start = conn.execute(
        select(func.max(s.table_versions.c.manifest_version)).where(
            s.table_versions.c.table_name == table,
            s.table_versions.c.committed_at <= now - seconds,
        )
    ).scalar()
    if at_window_start is None:
        return oldest  # every kept version is inside the window
    return max(0, min(int(at_window_start), current - min_versions + 1))


def _rows(conn: Connection, t: Table, table: str) -> list[tuple[int, str | None, int | None]]:
    """(id, file path, removed version) of every row of ``t`` (entries or delete vectors) of
    ``table``."""
    q = select(t.c.id, t.c.file_path, t.c.removed_version).where(t.c.table_name == table)
    return [(int(r[0]), r[1], r[2]) for r in conn.execute(q)]


def _expired(removed_version: int | None, floor: int) -> bool:
    """Visible in no kept version: removed at or before the floor (a row is visible in
    versions ``added_version <= v < removed_version``)."""
    return removed_version is not None and removed_version <= floor


def _shown_version(conn: Connection, table: str) -> int | None:
    """The manifest version the table's Iceberg pointer shows (None: never published)."""
    p = s.iceberg_pointers
    v = conn.execute(select(p.c.manifest_version).where(p.c.table_name == table)).scalar()
    return None if v is None else int(v)


def _delete_counted(conn: Connection, stmt: Delete, expected: int, what: str) -> None:
    n = conn.execute(stmt).rowcount
    if n != expected:
        raise CommitConflictError(
            f"expiry deleted {n} {what} rows, expected {expected}; refresh and retry",
            table=what,
            expected=expected,
        )


def expire_versions(conn: Connection, table: str, *, now: float, dry_run: bool = False) -> Expiry:
    """Expire the versions of ``table`` its retention no longer keeps (see the module doc), in
    ``conn``'s transaction."""
    info = find_table(conn, table, for_update=True)
    assert info is not None
    retention = info.spec.retention
    before = oldest_kept_version(conn, table)
    floor = expiry_floor(
        conn,
        table,
        info.manifest_version,
        before,
        now=now,
        seconds=retention.seconds,
        min_versions=retention.min_versions,
    )
    pinned = oldest_pinned(conn, table, now)
    if pinned is not None and pinned < floor:
        floor = max(before, pinned)  # a reader holds that version: keep it
    shown = _shown_version(conn, table)
    if shown is not None and shown < floor:
        floor = max(before, shown)  # the Iceberg view's current snapshot: keep it
    if not dry_run:
        drop_expired_pins(conn, table, now)
    if floor <= before:
        return Expiry(table, before, before)
    e, dv, tv = s.entries, s.delete_vectors, s.table_versions
    entry_rows, vector_rows = _rows(conn, e, table), _rows(conn, dv, table)
    gone_ids = {i for i, _, removed in entry_rows if _expired(removed, floor)}
    gone_dv_ids = {i for i, _, removed in vector_rows if _expired(removed, floor)}
    remaining = {p for i, p, _ in entry_rows if i not in gone_ids} | {
        p for i, p, _ in vector_rows if i not in gone_dv_ids
    }
    gone_files = {p for i, p, _ in entry_rows if i in gone_ids} | {
        p for i, p, _ in vector_rows if i in gone_dv_ids
    }
    released = tuple(sorted(p for p in gone_files if p is not None and p not in remaining))
    n_versions = conn.execute(
        select(func.count()).where(tv.c.table_name == table, tv.c.manifest_version < floor)
    ).scalar_one()
    result = Expiry(
        table,
        before,
        floor,
        versions=int(n_versions),
        entries=len(gone_ids),
        delete_vectors=len(gone_dv_ids),
        released_files=released,
    )
    if dry_run:
        return result
    # The table row is the lock: a commit or another expiry in between makes this retry.
    cas_update(conn, s.tables, {"name": table}, info.version, {})
    for t, ids in ((e, gone_ids), (dv, gone_dv_ids)):
        if ids:
            removed = t.c.removed_version
            _delete_counted(
                conn,
                delete(t).where(t.c.table_name == table, removed.is_not(None), removed <= floor),
                len(ids),
                t.name,
            )
    _delete_counted(
        conn,
        delete(tv).where(tv.c.table_name == table, tv.c.manifest_version < floor),
        int(n_versions),
        "ms_table_versions",
    )
    return result
