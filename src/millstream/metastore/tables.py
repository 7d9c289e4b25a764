"""Table rows of the metadata store: creating a table and looking one up."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, insert, select

from millstream.errors import AlreadyExistsError, TableNotFoundError
from millstream.metastore import schema as s
from millstream.metastore.cas import cas_update
from millstream.metastore.models import TableInfo
from millstream.spec import TableSpec, validate_table_name

if TYPE_CHECKING:
    from millstream.metastore.store import MetadataStore


def create_table(store: MetadataStore, spec: TableSpec, *, exist_ok: bool) -> TableInfo:
    """Create a table at manifest version 0; an identical existing one is returned when
    ``exist_ok`` (else :class:`AlreadyExistsError`)."""

    def _create(conn: Connection) -> TableInfo:
        existing = find_table(conn, spec.name, missing_ok=True)
        if existing is not None:
            if not (exist_ok and existing.spec.same_table(spec)):
                raise AlreadyExistsError("table", spec.name)
            if existing.spec.retention == spec.retention:
                return existing
            # Retention is the one part of a table's spec that may change (compare-and-set on
            # the table row, so a concurrent commit retries on the new row).
            row_version = cas_update(
                conn,
                s.tables,
                {"name": spec.name},
                existing.version,
                {"spec": spec.to_json_dict()},
            )
            return TableInfo(spec, existing.manifest_version, existing.created_at, row_version)
        now = store.clock.now()
        conn.execute(
            insert(s.tables).values(
                name=spec.name,
                spec=spec.to_json_dict(),
                manifest_version=0,
                created_at=now,
                version=1,
            )
        )
        conn.execute(
            insert(s.table_versions).values(
                table_name=spec.name, manifest_version=0, committed_at=now, operation="create"
            )
        )
        return TableInfo(spec, 0, now, 1)

    info, _ = store.retrying(_create)
    return info  # type: ignore[no-any-return]


def find_table(
    conn: Connection, name: str, *, missing_ok: bool = False, for_update: bool = False
) -> TableInfo | None:
    """The table row (:class:`TableNotFoundError` if missing, or None when ``missing_ok``).
    ``for_update`` reads it ``FOR UPDATE``, taking its row lock."""
    validate_table_name(name, field="table")
    q = select(s.tables).where(s.tables.c.name == name)
    if for_update:
        q = q.with_for_update()
    row = conn.execute(q).mappings().first()
    if row is None:
        if missing_ok:
            return None
        raise TableNotFoundError(name)
    return table_info(row)


def list_tables(conn: Connection) -> list[TableInfo]:
    rows = conn.execute(select(s.tables).order_by(s.tables.c.name)).mappings().all()
    return [table_info(r) for r in rows]


def table_info(r: Any) -> TableInfo:
    return TableInfo(
        TableSpec.parse(r["spec"]), r["manifest_version"], r["created_at"], r["version"]
    )
