"""Reading the manifest: entry and delete-vector rows as models, a partition's live entries, a
table's manifest at a version or a point in time, the files a table references, and what the
status pages count (when each partition last advanced, the rows of each table)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    Executable,
    and_,
    bindparam,
    func,
    literal_column,
    or_,
    select,
    union_all,
)

from millstream.errors import InvalidSpecError, VersionExpiredError
from millstream.metastore import schema as s
from millstream.metastore.models import (
    DeleteVector,
    Entry,
    Manifest,
    ManifestChanges,
    SegmentState,
    TableInfo,
)

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


# -- the live state of a partition ---------------------------------------------------------


def get_entry(conn: Connection, entry_id: int) -> Entry | None:
    row = conn.execute(select(s.entries).where(s.entries.c.id == entry_id)).mappings().first()
    return None if row is None else entry_of(row)


def get_entries(conn: Connection, ids: Iterable[int]) -> dict[int, Entry]:
    """The entries of ``ids`` that exist, by id, in one read (a seal's run of 100-150 entries:
    one statement instead of one a entry)."""
    wanted = list(ids)
    if not wanted:
        return {}
    q = select(s.entries).where(s.entries.c.id.in_(s.in_list(wanted)))
    return {e.id: e for e in (entry_of(r) for r in conn.execute(q).mappings())}


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


def live_entry_with_file(
    conn: Connection, table: str, partition: int, file_path: str
) -> Entry | None:
    return next((e for e in live_entries(conn, table, partition) if e.file_path == file_path), None)


# -- a table's manifest --------------------------------------------------------------------


_e = s.entries
#: :func:`manifest_at`'s entries at a version V (visible in ``added_version <= V <
#: removed_version``), found one of two ways, each returning the same rows:
#:
#: * from the removed version (:data:`_LIVE_AT`): the entries live now and those removed after
#:   V, each added at or before V, found in :data:`schema.ix_entries_live` and
#:   :data:`schema.ix_entries_removed`: it costs the entries live at V plus those removed since,
#:   not every row the table keeps until retention expires them (~86,000 a day for a table
#:   committing every second), which the added version's index scans at the head. The added
#:   version only filters what these find: ``+ 0`` keeps SQLite's planner, which has no
#:   statistics, from driving a part by ``ix_entries_table_version`` instead;
#: * from the added version (:data:`_ADDED_BY`): every entry added at or before V, those
#:   removed at or before it left out: cheaper for a version in the older half of the kept
#:   history (time travel far back), where the rows removed since outnumber those added before.
_LIVE_AT = union_all(
    select(_e).where(
        _e.c.table_name == bindparam("table"),
        _e.c.removed_version.is_(None),
        _e.c.added_version + literal_column("0") <= bindparam("version"),
    ),
    select(_e).where(
        _e.c.table_name == bindparam("table"),
        _e.c.removed_version > bindparam("version"),
        _e.c.added_version + literal_column("0") <= bindparam("version"),
    ),
).order_by(_e.c.partition, _e.c.seq)
_ADDED_BY = (
    select(_e)
    .where(
        _e.c.table_name == bindparam("table"),
        _e.c.added_version <= bindparam("version"),
        or_(_e.c.removed_version.is_(None), _e.c.removed_version > bindparam("version")),
    )
    .order_by(_e.c.partition, _e.c.seq)
)


def _entries_at(conn: Connection, info: TableInfo, version: int) -> Executable:
    """The statement of :func:`manifest_at`'s entries: on SQLite :data:`_LIVE_AT` unless
    ``version`` is nearer the oldest kept version than the head (:data:`_ADDED_BY` then). On
    PostgreSQL always :data:`_ADDED_BY`: its planner, with the statistics autovacuum keeps,
    combines the removed version's two indexes for it near the head (a ``BitmapOr``) and takes
    the added version's far back, where it plans :data:`_LIVE_AT`'s second part as a scan of
    the table (2.3x the server's time halfway back through 86,000 removed rows)."""
    if conn.dialect.name != "sqlite":
        return _ADDED_BY
    if version >= info.manifest_version:
        return _LIVE_AT
    oldest = oldest_kept_version(conn, info.name)
    return _LIVE_AT if info.manifest_version - version <= version - oldest else _ADDED_BY


def manifest_at(conn: Connection, info: TableInfo, version: int) -> Manifest:
    """The table's entries and delete vectors visible at manifest ``version``."""
    table = info.name
    params = {"table": table, "version": version}
    found = conn.execute(_entries_at(conn, info, version), params)
    entries = tuple(entry_of(r) for r in found.mappings())
    dv = s.delete_vectors
    q = (
        select(dv)
        .where(
            dv.c.table_name == table,
            dv.c.added_version <= version,
            or_(dv.c.removed_version.is_(None), dv.c.removed_version > version),
        )
        .order_by(dv.c.partition, dv.c.source_seq, dv.c.id)
    )
    dvs = tuple(delete_vector_of(r) for r in conn.execute(q).mappings())
    return Manifest(info, version, entries, dvs)


#: :func:`changes_since`'s two statements, built once (a sealing pass runs them for every busy
#: table every pass: building them each time was a quarter of the pass's CPU).
_ADDED_SINCE = (
    select(_e)
    .where(
        _e.c.table_name == bindparam("table"),
        _e.c.added_version > bindparam("after"),
        _e.c.added_version <= bindparam("version"),
    )
    .order_by(_e.c.partition, _e.c.seq)
)
_REMOVED_SINCE = (
    select(func.count())
    .select_from(_e)
    .where(
        _e.c.table_name == bindparam("table"),
        _e.c.removed_version > bindparam("after"),
        _e.c.removed_version <= bindparam("version"),
    )
)


def changes_since(conn: Connection, table: str, after: int, version: int) -> ManifestChanges:
    """What changed in ``table``'s manifest in versions ``(after, version]``: the entries added
    in them (by partition and sequence number) and how many entries were removed in them. Both
    bounded by ``version`` (the table row's, read in the same transaction), so a commit landing
    meanwhile is left for the next read rather than seen twice."""
    if version <= after:
        return ManifestChanges(version)
    params = {"table": table, "after": after, "version": version}
    added = tuple(entry_of(r) for r in conn.execute(_ADDED_SINCE, params).mappings())
    removed = conn.execute(_REMOVED_SINCE, params).scalar()
    return ManifestChanges(version, added, int(removed or 0))


def resolve_version(conn: Connection, info: TableInfo, as_of: int | float | datetime | None) -> int:
    """The manifest version ``as_of`` names: the current one (None), a version number (int),
    or the last version committed at or before a point in time (datetime or epoch seconds)."""
    if as_of is None:
        return info.manifest_version
    if isinstance(as_of, bool):
        raise InvalidSpecError("as_of", "must be a version number or a point in time")
    oldest = oldest_kept_version(conn, info.name)
    if isinstance(as_of, int):
        if not 0 <= as_of <= info.manifest_version:
            raise InvalidSpecError(
                "as_of",
                f"table {info.name!r} has versions 0..{info.manifest_version}, not {as_of}",
            )
        if as_of < oldest:
            raise VersionExpiredError(info.name, as_of, oldest)
        return as_of
    ts = as_of.timestamp() if isinstance(as_of, datetime) else float(as_of)
    row = conn.execute(
        select(func.max(s.table_versions.c.manifest_version)).where(
            and_(
                s.table_versions.c.table_name == info.name,
                s.table_versions.c.committed_at <= ts,
            )
        )
    ).first()
    if row is None or row[0] is None:
        if oldest > 0:  # the versions current at that time expired
            raise VersionExpiredError(info.name, f"as of {as_of}", oldest)
        raise InvalidSpecError("as_of", f"table {info.name!r} did not exist at {as_of}")
    return int(row[0])


def operations_between(conn: Connection, table: str, after: int, upto: int) -> list[str]:
    """What made each kept manifest version of ``table`` in ``(after, upto]`` (append, seal,
    compact, reingest, rollback), in version order; versions retention expired are missing."""
    tv = s.table_versions
    rows = conn.execute(
        select(tv.c.operation)
        .where(tv.c.table_name == table, tv.c.manifest_version > after)
        .where(tv.c.manifest_version <= upto)
        .order_by(tv.c.manifest_version)
    )
    return [str(r[0]) for r in rows]


def oldest_kept_version(conn: Connection, table: str) -> int:
    """The oldest manifest version ``table`` keeps (0 until retention expired any)."""
    v = conn.execute(
        select(func.min(s.table_versions.c.manifest_version)).where(
            s.table_versions.c.table_name == table
        )
    ).scalar()
    return int(v or 0)


def referenced_files(conn: Connection, table: str) -> set[str]:
    """Every data file any entry or delete vector of ``table`` references (removed ones
    included: time travel may still read them)."""
    q = select(s.entries.c.file_path).where(
        s.entries.c.table_name == table, s.entries.c.file_path.is_not(None)
    )
    files = {r[0] for r in conn.execute(q)}
    q = select(s.delete_vectors.c.file_path).where(s.delete_vectors.c.table_name == table)
    return files | {r[0] for r in conn.execute(q)}


def _last_commit_times() -> Executable:
    e, reach, sh = s.entries.alias("e"), s.entries.alias("reach"), s.shards
    furthest = (
        select(func.max(reach.c.end_offset))
        .where(reach.c.table_name == sh.c.table_name, reach.c.partition == sh.c.partition)
        .correlate(sh)
        .scalar_subquery()
    )
    first = (
        select(func.min(e.c.created_at))
        .where(
            e.c.table_name == sh.c.table_name,
            e.c.partition == sh.c.partition,
            e.c.end_offset == furthest,
        )
        .correlate(sh)
        .scalar_subquery()
    )
    return select(sh.c.partition, first).where(sh.c.table_name == bindparam("table"))


#: :func:`last_commit_times`'s statement, built once: per shard of the table, two seeks of
#: :data:`schema.ix_entries_end` (the furthest end, then the segments ending there), not a scan
#: of every entry the table keeps (removed ones included, a day of them by default).
_LAST_COMMIT_TIMES = _last_commit_times()


def last_commit_times(conn: Connection, table: str) -> dict[int, float]:
    """Per partition: when the shard last advanced through a segment, i.e. the earliest
    ``created_at`` among the segments reaching its furthest end offset (a sealed segment
    rewritten later over the same range does not count as an advance), removed segments
    included."""
    found = conn.execute(_LAST_COMMIT_TIMES, {"table": table})
    return {int(p): float(t) for p, t in found if t is not None}


def rows_per_table(conn: Connection) -> dict[str, int]:
    """Rows in each table's current manifest: its segments' row counts minus the rows its
    delete vectors mark superseded. The live segments are those of :data:`schema.ix_entries_live`
    (partial: the removed rows every table keeps are not in it)."""
    e, dv = s.entries, s.delete_vectors
    q = (
        select(e.c.table_name, func.coalesce(func.sum(e.c.row_count), 0))
        .where(e.c.removed_version.is_(None))
        .group_by(e.c.table_name)
    )
    q_dv = (
        select(dv.c.table_name, func.coalesce(func.sum(dv.c.row_count), 0))
        .where(dv.c.removed_version.is_(None))
        .group_by(dv.c.table_name)
    )
    rows = {str(t): int(n) for t, n in conn.execute(q)}
    for t, n in conn.execute(q_dv):
        rows[str(t)] = rows.get(str(t), 0) - int(n)
    return rows
