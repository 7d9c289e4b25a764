"""Table rows of the metadata store: creating a table, evolving its schema, looking one up."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, insert, select

from millstream.clock import Clock
from millstream.core.evolution import Change, check_evolution
from millstream.errors import AlreadyExistsError, TableNotFoundError
from millstream.metastore import schema as s
from millstream.metastore.cas import cas_update
from millstream.metastore.models import TableInfo
from millstream.spec import TableSpec, validate_table_name


def create_table(conn: Connection, clock: Clock, spec: TableSpec, *, exist_ok: bool) -> TableInfo:
    """In ``conn``'s transaction: create a table at manifest version 0; an identical existing
    one is returned when ``exist_ok`` (else :class:`AlreadyExistsError`)."""
    existing = find_table(conn, spec.name, missing_ok=True)
    if existing is not None:
        if exist_ok and not existing.spec.same_table(spec) and _had_schema(conn, spec):
            # A writer started before the table's schema evolved (its datastream spec is
            # an older one) restarts: the table stays as it is, the writer reads its
            # current spec per batch.
            return existing
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
        return TableInfo(
            spec,
            existing.manifest_version,
            existing.created_at,
            row_version,
            existing.schema_version,
        )
    now = clock.now()
    conn.execute(
        insert(s.tables).values(
            name=spec.name,
            spec=spec.to_json_dict(),
            manifest_version=0,
            created_at=now,
            version=1,
            schema_version=1,
        )
    )
    conn.execute(
        insert(s.table_schemas).values(
            table_name=spec.name,
            schema_version=1,
            spec=spec.to_json_dict(),
            manifest_version=0,
            created_at=now,
        )
    )
    conn.execute(
        insert(s.table_versions).values(
            table_name=spec.name, manifest_version=0, committed_at=now, operation="create"
        )
    )
    return TableInfo(spec, 0, now, 1)


def evolve_table(conn: Connection, clock: Clock, spec: TableSpec) -> tuple[TableInfo, list[Change]]:
    """Make ``spec`` the table's spec inside ``conn``'s transaction, if
    :func:`~millstream.core.evolution.check_evolution` allows the change from the current one
    (else :class:`~millstream.errors.IncompatibleChangeError`, nothing changed). Returns the
    table as it now is and the changes (none: nothing was written).

    A schema change is ONE compare-and-set on the table row (new spec, ``schema_version`` + 1)
    plus the insert of that version's ``ms_table_schemas`` row; a retention change alone is
    the compare-and-set only. The row is read without a lock: an update (or a writer's commit)
    that lands in between makes the compare-and-set lose, and the caller's retry re-reads the
    winner's spec and checks the change against it."""
    existing = find_table(conn, spec.name)
    assert existing is not None
    changes = check_evolution(existing.spec, spec)
    if not changes:
        return existing, []
    schema_changed = any(c.kind != "retention" for c in changes)
    schema_version = existing.schema_version + (1 if schema_changed else 0)
    row_version = cas_update(
        conn,
        s.tables,
        {"name": spec.name},
        existing.version,
        {"spec": spec.to_json_dict(), "schema_version": schema_version},
    )
    if schema_changed:
        conn.execute(
            insert(s.table_schemas).values(
                table_name=spec.name,
                schema_version=schema_version,
                spec=spec.to_json_dict(),
                manifest_version=existing.manifest_version,
                created_at=clock.now(),
            )
        )
    info = TableInfo(
        spec, existing.manifest_version, existing.created_at, row_version, schema_version
    )
    return info, changes


def schema_history(conn: Connection, name: str) -> list[tuple[int, TableSpec, int]]:
    """Every schema version of the table, oldest first: (schema version, spec, the manifest
    version it took effect at)."""
    rows = conn.execute(
        select(
            s.table_schemas.c.schema_version,
            s.table_schemas.c.spec,
            s.table_schemas.c.manifest_version,
        )
        .where(s.table_schemas.c.table_name == name)
        .order_by(s.table_schemas.c.schema_version)
    ).all()
    return [(int(v), TableSpec.parse(sp), int(mv)) for v, sp, mv in rows]


def _had_schema(conn: Connection, spec: TableSpec) -> bool:
    """Whether ``spec`` (retention aside) is one of the table's earlier schema versions."""
    return any(old.same_table(spec) for _, old, _ in schema_history(conn, spec.name))


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


def find_tables(
    conn: Connection, names: Sequence[str], *, for_update: bool = False
) -> dict[str, TableInfo]:
    """The rows of the tables ``names`` that exist, by name, in ONE read; ``for_update``
    takes their row locks (in name order, as every multi-table writer takes them)."""
    for name in names:
        validate_table_name(name, field="table")
    if not names:
        return {}
    q = (
        select(s.tables)
        .where(s.tables.c.name.in_(s.in_list(sorted(set(names)))))
        .order_by(s.tables.c.name)
    )
    if for_update:
        q = q.with_for_update()
    return {str(r["name"]): table_info(r) for r in conn.execute(q).mappings()}


def manifest_version(conn: Connection, name: str) -> int:
    """The table's current manifest version alone (:class:`TableNotFoundError` if missing):
    one column of its row, without its spec or any entry, for a caller that only asks whether
    the manifest changed since it last read it."""
    validate_table_name(name, field="table")
    v = conn.execute(select(s.tables.c.manifest_version).where(s.tables.c.name == name)).scalar()
    if v is None:
        raise TableNotFoundError(name)
    return int(v)


def manifest_versions(conn: Connection, names: Sequence[str]) -> dict[str, int]:
    """:func:`manifest_version` of each of the tables ``names`` that exist, in ONE query (a
    table missing is left out)."""
    t = s.tables
    rows = conn.execute(
        select(t.c.name, t.c.manifest_version).where(t.c.name.in_(s.in_list(names)))
    )
    return {str(name): int(v) for name, v in rows}


def table_specs(conn: Connection, names: Sequence[str]) -> dict[str, TableSpec]:
    """The specs of the tables ``names`` that exist, in ONE read (a table missing is left
    out: the caller decides what its absence means)."""
    for name in names:
        validate_table_name(name, field="table")
    if not names:
        return {}
    rows = conn.execute(
        select(s.tables.c.name, s.tables.c.spec).where(
            s.tables.c.name.in_(s.in_list(sorted(set(names))))
        )
    ).all()
    return {str(n): parsed_spec(str(n), sp) for n, sp in rows}


def list_tables(conn: Connection) -> list[TableInfo]:
    rows = conn.execute(select(s.tables).order_by(s.tables.c.name)).mappings().all()
    return [table_info(r) for r in rows]


#: Table specs parsed by this process: name -> (the stored spec, parsed). Bounded: past this
#: many tables it starts again.
_PARSED_MAX = 4096
_parsed: dict[str, tuple[Any, TableSpec]] = {}


def parsed_spec(name: str, stored: Any) -> TableSpec:
    """``stored`` (a table row's spec as read) parsed, reusing the spec this process parsed
    from the SAME stored spec: a row read at every batch for each of a shared query's tables
    (its write tasks' spec, its commit's rows) parsed each again (7% of a write task over
    100 small tables), though it changes only with a schema or spec change. Anything changed in the stored spec (a
    column added, a mode) is unequal to what was parsed, so it is parsed anew."""
    hit = _parsed.get(name)
    if hit is not None and hit[0] == stored:
        return hit[1]
    spec = TableSpec.parse(stored)
    if len(_parsed) >= _PARSED_MAX:
        _parsed.clear()
    _parsed[name] = (copy.deepcopy(stored), spec)
    return spec


def table_info(r: Any) -> TableInfo:
    return TableInfo(
        parsed_spec(str(r["name"]), r["spec"]),
        r["manifest_version"],
        r["created_at"],
        r["version"],
        r["schema_version"],
    )
