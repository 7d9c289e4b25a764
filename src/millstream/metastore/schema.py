"""The metadata schema (SQLAlchemy Core) and its versioned migrations.

Every mutable row carries a ``version``; every mutation is ``UPDATE ... WHERE <id> AND
version = :expected`` with a rowcount check (see :mod:`millstream.metastore.cas`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    Connection,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    inspect,
    select,
    text,
)

metadata = MetaData()

_T = TypeVar("_T")


def in_list(values: Iterable[_T]) -> list[_T]:
    """``values`` for an ``IN (...)``, padded to the next power of two by repeating the last
    one (a duplicate does not change what ``IN`` matches). Each length of a list is a statement
    text of its own, and a connection keeps every text it ran: SQLite's cache of 128 prepared
    statements a connection, psycopg's prepared statements. A seal's run of 1-150 entries by
    id made up to 150 texts a connection (1.8 MB at lengths 1-128: bench/sqlite_in_statements.py);
    padded, lengths up to 1,024 make 11."""
    out = list(values)
    n = len(out)
    if n > 1:
        out.extend([out[-1]] * ((1 << (n - 1).bit_length()) - n))
    return out


meta = Table(
    "ms_meta",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("value", String(256), nullable=False),
)

tables = Table(
    "ms_tables",
    metadata,
    Column("name", String(128), primary_key=True),
    Column("spec", JSON, nullable=False),
    Column("manifest_version", BigInteger, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("version", BigInteger, nullable=False),
    # Schema v9: the table's schema version, bumped by every compatible schema change (the
    # spec is that version's; its history is in ``ms_table_schemas``).
    Column("schema_version", BigInteger, nullable=False, server_default="1"),
)

#: One row per manifest version of a table: what changed it and when (time travel by time).
table_versions = Table(
    "ms_table_versions",
    metadata,
    Column("table_name", String(128), primary_key=True),
    Column("manifest_version", BigInteger, primary_key=True),
    Column("committed_at", Float, nullable=False),
    Column("operation", String(32), nullable=False),
    Column("writer_id", String(128), nullable=True),
    Column("batch_id", BigInteger, nullable=True),
)

shards = Table(
    "ms_shards",
    metadata,
    Column("table_name", String(128), primary_key=True),
    Column("partition", Integer, primary_key=True, autoincrement=False),
    Column("upper", BigInteger, nullable=False),
    Column("epoch", BigInteger, nullable=False),
    Column("next_seq", BigInteger, nullable=False),
    Column("version", BigInteger, nullable=False),
    # Schema v8: the source timestamp (epoch ms; Kafka's record timestamp, or the time the
    # write task read the record for sources without one) of the last record of the last
    # commit that advanced the upper over records. NULL until such a commit, and after a
    # rollback moved the upper below it. The ingestion delay is measured from it.
    Column("last_record_ms", BigInteger, nullable=True),
)

#: Manifest entries: segment `seq` of a shard is the rows of `file_path` for this partition
#: whose offsets are in `[start_offset, end_offset)`. Visible in manifest versions
#: `added_version <= v < removed_version`.
entries = Table(
    "ms_entries",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("table_name", String(128), nullable=False),
    Column("partition", Integer, nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("file_path", Text, nullable=True),
    Column("start_offset", BigInteger, nullable=False),
    Column("end_offset", BigInteger, nullable=False),
    Column("state", String(16), nullable=False),
    Column("row_count", BigInteger, nullable=False),
    Column("size_bytes", BigInteger, nullable=False),
    Column("added_version", BigInteger, nullable=False),
    Column("removed_version", BigInteger, nullable=True),
    Column("writer_id", String(128), nullable=True),
    Column("batch_id", BigInteger, nullable=True),
    Column("created_at", Float, nullable=False),
    Column("last_error", Text, nullable=True),
    Column("version", BigInteger, nullable=False),
    # Schema v4: who claimed the entry for a seal (state COMMITTING) and until when. A claim
    # whose expiry has passed belongs to a sealer presumed dead and may be taken over.
    Column("claimed_by", String(128), nullable=True),
    Column("claim_expires_at", Float, nullable=True),
    UniqueConstraint("table_name", "partition", "seq", "added_version", name="uq_entry_seq"),
)
Index("ix_entries_table_version", entries.c.table_name, entries.c.added_version)
Index("ix_entries_file", entries.c.table_name, entries.c.file_path)
#: Schema v13: a table's live entries (``removed_version IS NULL``) and those removed in a range
#: of versions, found without a scan of its removed rows, which a table keeps until retention
#: expires them (24 h by default: ~86,000 rows a day for a table committing every second). A
#: sealing pass counts each busy table's removals since its last read and a seal's claim reads
#: a partition's live entries: both scanned every row of the table (issue 38).
ix_entries_removed = Index(
    "ix_entries_removed", entries.c.table_name, entries.c.removed_version, entries.c.partition
)
#: Schema v14: a table's live entries in manifest order, and only those (a partial index: a
#: removed entry leaves it). A manifest read finds the entries live now here and those removed
#: after its version in :data:`ix_entries_removed`, and the rows of every table are counted from
#: their live entries, so neither scans the removed rows a table keeps for a day.
ix_entries_live = Index(
    "ix_entries_live",
    entries.c.table_name,
    entries.c.partition,
    entries.c.seq,
    sqlite_where=entries.c.removed_version.is_(None),
)


def _live_index_partial(conn: Connection) -> None:
    """:data:`ix_entries_live`'s ``WHERE`` on PostgreSQL, set when a PostgreSQL store creates
    it: a ``postgresql_where`` argument in its definition imports SQLAlchemy's PostgreSQL
    dialect in every process that imports this module (a SQLite ``millstream query`` too)."""
    if conn.dialect.name == "postgresql":
        ix_entries_live.dialect_kwargs["postgresql_where"] = entries.c.removed_version.is_(None)


#: Schema v14: a partition's entries by the offset they end at, removed ones included: when a
#: partition last advanced is the earliest entry reaching its furthest end offset, found with
#: two index seeks a partition instead of a scan of every entry the table keeps.
ix_entries_end = Index(
    "ix_entries_end", entries.c.table_name, entries.c.partition, entries.c.end_offset
)

# -- control plane (schema version 2) -----------------------------------------------------------

control = MetaData()

#: Datastreams: the spec and the lifecycle state, changed only by compare-and-set on version.
datastreams = Table(
    "ms_datastreams",
    control,
    Column("name", String(64), primary_key=True),
    Column("spec", JSON, nullable=False),
    Column("state", String(16), nullable=False),
    Column("last_error", Text, nullable=True),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    Column("version", BigInteger, nullable=False),
    # Schema v12: the tables of a multi-table datastream paused on their own (a JSON list of
    # names; NULL: none), changed with the record's compare-and-set like its state.
    Column("paused_tables", JSON, nullable=True),
)

#: The leader's event queue. Unprocessed events of one kind for one datastream are coalesced.
events = Table(
    "ms_events",
    control,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("datastream", String(64), nullable=True),
    Column("kind", String(32), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("processed_at", Float, nullable=True),
    Column("version", BigInteger, nullable=False),
)
Index("ix_events_pending", events.c.processed_at, events.c.id)

#: Leases with a TTL and a fencing token that only grows (controller leadership).
leases = Table(
    "ms_leases",
    control,
    Column("name", String(64), primary_key=True),
    Column("holder", String(128), nullable=True),
    Column("token", BigInteger, nullable=False),
    Column("expires_at", Float, nullable=False),
    Column("version", BigInteger, nullable=False),
)

workers = Table(
    "ms_workers",
    control,
    Column("id", String(128), primary_key=True),
    Column("url", String(256), nullable=True),
    Column("status", String(16), nullable=False),
    Column("started_at", Float, nullable=False),
    Column("heartbeat_at", Float, nullable=False),
    Column("info", JSON, nullable=False),
    Column("version", BigInteger, nullable=False),
)

#: Which worker runs which writer: one active plus standbys per datastream. `token` is the
#: leader's fencing token when it was written.
assignments = Table(
    "ms_assignments",
    control,
    Column("datastream", String(64), primary_key=True),
    Column("worker_id", String(128), primary_key=True),
    Column("role", String(16), nullable=False),
    Column("token", BigInteger, nullable=False),
    Column("version", BigInteger, nullable=False),
)

# -- sealing (schema version 3) -------------------------------------------------------------

sealing = MetaData()

#: Delete vectors: offsets of rows in a partition's older sealed segments that a seal found
#: superseded (row identity is (partition, offset), so they hold whichever file the rows are
#: in). ``source_seq`` is the sequence number of the sealed segment whose seal wrote it: a
#: rollback from sequence N removes every vector with ``source_seq >= N``. Visible in manifest
#: versions ``added_version <= v < removed_version``, like entries.
delete_vectors = Table(
    "ms_delete_vectors",
    sealing,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("table_name", String(128), nullable=False),
    Column("partition", Integer, nullable=False),
    Column("source_seq", BigInteger, nullable=False),
    Column("file_path", Text, nullable=False),
    Column("row_count", BigInteger, nullable=False),
    Column("added_version", BigInteger, nullable=False),
    Column("removed_version", BigInteger, nullable=True),
    Column("version", BigInteger, nullable=False),
)
Index("ix_delete_vectors_table", delete_vectors.c.table_name, delete_vectors.c.partition)

retention = MetaData()

#: Read pins: a reader that will read ``version`` of ``table`` for a while (a Spark query
#: between its planning and its tasks, ``Catalog.pinned``) keeps expiry from removing that
#: version (and so anything it sees) until ``expires_at`` or until it releases the pin.
read_pins = Table(
    "ms_read_pins",
    retention,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("table_name", String(128), nullable=False),
    Column("manifest_version", BigInteger, nullable=False),
    Column("holder", String(256), nullable=False),
    Column("pinned_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),
)
Index("ix_read_pins_table", read_pins.c.table_name, read_pins.c.expires_at)

jobs = MetaData()

#: Operator jobs that outlive the request and the controller that took it (Pinot's controller
#: jobs): a force commit names the segments to seal now; workers' sealers read them, and the
#: job's status is computed from the manifest. The newest 100 per table and kind are kept.
#: A re-ingest job (schema v7) is updated while it runs: ``version`` makes every update a
#: compare-and-set, and ``active_key`` (the segment's name while a job for it runs, else NULL)
#: is unique, so two controllers can never both run a job for the same segment.
controller_jobs = Table(
    "ms_controller_jobs",
    jobs,
    Column("id", String(64), primary_key=True),
    Column("kind", String(32), nullable=False),
    Column("table_name", String(128), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("payload", JSON, nullable=False),
    Column("version", Integer, nullable=False, server_default="0"),
    Column("active_key", String(256), nullable=True),
)
Index("ix_controller_jobs_table", controller_jobs.c.table_name, controller_jobs.c.kind)
Index("ux_controller_jobs_active", controller_jobs.c.active_key, unique=True)

evolution = MetaData()

#: Schema v9: every schema version of a table, the first (its creation) included: the spec in
#: force from ``manifest_version`` on. Written in the same transaction as the table row's
#: compare-and-set that makes it current (:func:`millstream.metastore.tables.evolve_table`);
#: the primary key makes a second writer of the same version fail (and re-check).
table_schemas = Table(
    "ms_table_schemas",
    evolution,
    Column("table_name", String(128), primary_key=True),
    Column("schema_version", BigInteger, primary_key=True, autoincrement=False),
    Column("spec", JSON, nullable=False),
    Column("manifest_version", BigInteger, nullable=False),
    Column("created_at", Float, nullable=False),
)

# -- table ownership (schema version 10) ----------------------------------------------------------

ownership = MetaData()

#: Which datastream writes a table: a datastream owns its table and its dead-letter table
#: from its creation until it is removed. The primary key makes a second owner impossible
#: even for two creates racing on two connections (one insert fails with IntegrityError).
table_owners = Table(
    "ms_table_owners",
    ownership,
    Column("table_name", String(128), primary_key=True),
    Column("datastream", String(64), nullable=False, index=True),
    Column("created_at", Float, nullable=False),
)

# -- the Iceberg view (schema version 11) ---------------------------------------------------------

open_tables = MetaData()

#: Schema v11: where each table's Iceberg view stands (:mod:`millstream.metastore.iceberg`):
#: the location of its current Iceberg table metadata file and the manifest version that file's
#: newest snapshot shows. Publishers write new files, then move this row by compare-and-set on
#: ``version``, so two publishers never both become current.
iceberg_pointers = Table(
    "ms_iceberg_pointers",
    open_tables,
    Column("table_name", String(128), primary_key=True),
    Column("metadata_location", Text, nullable=False),
    Column("manifest_version", BigInteger, nullable=False),
    Column("published_at", Float, nullable=False),
    Column("version", BigInteger, nullable=False),
)

LATEST_SCHEMA_VERSION = 14


def _v1(conn: Connection) -> None:
    _live_index_partial(conn)
    metadata.create_all(conn, checkfirst=True)


def _v2(conn: Connection) -> None:
    control.create_all(conn, checkfirst=True)


def _v3(conn: Connection) -> None:
    sealing.create_all(conn, checkfirst=True)


def _v4(conn: Connection) -> None:
    """Seal claims get an owner and an expiry (a database created at v1 by this code already
    has the columns: ``entries`` declares them)."""
    have = {c["name"] for c in inspect(conn).get_columns(entries.name)}
    for name, sql_type in (("claimed_by", "VARCHAR(128)"), ("claim_expires_at", "FLOAT")):
        if name not in have:
            conn.execute(text(f"ALTER TABLE {entries.name} ADD COLUMN {name} {sql_type}"))


def _v5(conn: Connection) -> None:
    """Read pins (:data:`read_pins`)."""
    retention.create_all(conn, checkfirst=True)


def _v6(conn: Connection) -> None:
    """Controller jobs (:data:`controller_jobs`)."""
    jobs.create_all(conn, checkfirst=True)


def _v7(conn: Connection) -> None:
    """Re-ingest jobs in :data:`controller_jobs`: a row version and the unique ``active_key``
    (a database created at v6 by this code already has them: the table declares them)."""
    table = controller_jobs.name
    have = {c["name"] for c in inspect(conn).get_columns(table)}
    if "version" not in have:
        conn.execute(text(f"ALTER TABLE {table} ADD COLUMN version INTEGER NOT NULL DEFAULT 0"))
    if "active_key" not in have:
        conn.execute(text(f"ALTER TABLE {table} ADD COLUMN active_key VARCHAR(256)"))
    conn.execute(
        text(f"CREATE UNIQUE INDEX IF NOT EXISTS ux_controller_jobs_active ON {table} (active_key)")
    )


def _v8(conn: Connection) -> None:
    """Shards record their last committed record's timestamp (the ingestion delay). A
    database created by this code at v1 already has the column: ``shards`` declares it."""
    have = {c["name"] for c in inspect(conn).get_columns(shards.name)}
    if "last_record_ms" not in have:
        conn.execute(text(f"ALTER TABLE {shards.name} ADD COLUMN last_record_ms BIGINT"))


def _v9(conn: Connection) -> None:
    """Schema versions: ``ms_tables.schema_version`` (a database created at v1 by this code
    already has it: ``tables`` declares it) and :data:`table_schemas`, where every existing
    table gets its current spec as schema version 1."""
    have = {c["name"] for c in inspect(conn).get_columns(tables.name)}
    if "schema_version" not in have:
        conn.execute(
            text(f"ALTER TABLE {tables.name} ADD COLUMN schema_version BIGINT NOT NULL DEFAULT 1")
        )
    evolution.create_all(conn, checkfirst=True)
    conn.execute(
        text(
            "INSERT INTO ms_table_schemas "
            "(table_name, schema_version, spec, manifest_version, created_at) "
            "SELECT name, schema_version, spec, manifest_version, created_at FROM ms_tables "
            "WHERE name NOT IN (SELECT table_name FROM ms_table_schemas)"
        )
    )


def _v10(conn: Connection) -> None:
    """Table owners (:data:`table_owners`): every existing datastream owns its table and its
    dead-letter table (where two already share one, the first by name keeps it)."""
    # lazy: only this migration needs the datastream spec (pydantic models of every source
    # kind, YAML); every process that opens the store (`millstream query`) would load it
    from millstream.datastream import DatastreamSpec

    ownership.create_all(conn, checkfirst=True)
    owned = {r[0] for r in conn.execute(select(table_owners.c.table_name))}
    for name, spec, created_at in conn.execute(
        select(datastreams.c.name, datastreams.c.spec, datastreams.c.created_at).order_by(
            datastreams.c.name
        )
    ):
        ds = DatastreamSpec.parse_stored(spec)
        for t in (ds.table_name, ds.dead_letter_table):
            if t not in owned:
                conn.execute(
                    table_owners.insert().values(
                        table_name=t, datastream=name, created_at=created_at
                    )
                )
                owned.add(t)


def _v11(conn: Connection) -> None:
    """The Iceberg view's pointers (:data:`iceberg_pointers`)."""
    open_tables.create_all(conn, checkfirst=True)


def _v12(conn: Connection) -> None:
    """Tables paused on their own (``ms_datastreams.paused_tables``; a database created at v2
    by this code already has the column: :data:`datastreams` declares it)."""
    have = {c["name"] for c in inspect(conn).get_columns(datastreams.name)}
    if "paused_tables" not in have:
        conn.execute(text(f"ALTER TABLE {datastreams.name} ADD COLUMN paused_tables JSON"))


def _v13(conn: Connection) -> None:
    """The index of a table's entries by the version that removed them
    (:data:`ix_entries_removed`; a database created at v1 by this code already has it)."""
    ix_entries_removed.create(conn, checkfirst=True)


def _v14(conn: Connection) -> None:
    """A table's live entries (:data:`ix_entries_live`, partial) and its entries by their end
    offset (:data:`ix_entries_end`); a database created at v1 by this code already has them."""
    _live_index_partial(conn)
    ix_entries_live.create(conn, checkfirst=True)
    ix_entries_end.create(conn, checkfirst=True)


#: Migration N takes the schema from version N-1 to N. Append; never edit a released one.
MIGRATIONS: dict[int, Callable[[Connection], None]] = {
    1: _v1,
    2: _v2,
    3: _v3,
    4: _v4,
    5: _v5,
    6: _v6,
    7: _v7,
    8: _v8,
    9: _v9,
    10: _v10,
    11: _v11,
    12: _v12,
    13: _v13,
    14: _v14,
}


def current_schema_version(conn: Connection) -> int:
    if not conn.dialect.has_table(conn, meta.name):
        return 0
    row = conn.execute(select(meta.c.value).where(meta.c.key == "schema_version")).first()
    return int(row[0]) if row else 0
