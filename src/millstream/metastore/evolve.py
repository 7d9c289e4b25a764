"""A schema change of a table, its dead-letter table and the datastream that writes it, in ONE
transaction: the manual update (:meth:`millstream.control.registry.Registry.update`) and a
writer's ``schema_evolution: auto`` (:func:`absorb`) both go through
:func:`evolve_with_dead_letter`, so the rules, the compare-and-set on the table row and the
schema version are the same; the datastream's spec and its table never disagree."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Connection, select

from millstream.clock import Clock
from millstream.core.evolution import Change
from millstream.metastore import schema as s
from millstream.metastore import tables
from millstream.metastore.cas import cas_update
from millstream.metastore.models import TableInfo
from millstream.spec import TableSpec


def evolve_with_dead_letter(
    conn: Connection, clock: Clock, new_table: TableSpec
) -> tuple[TableInfo, list[Change]]:
    """:func:`~millstream.metastore.tables.evolve_table` of the table and, if it exists, of
    its dead-letter table (which follows the table's retention), inside ``conn``'s
    transaction."""
    # lazy: the datastream spec (YAML, pydantic models) loads only where a schema changes,
    # not in every process that opens the store (`millstream query`)
    from millstream.datastream import dead_letter_spec

    info, changes = tables.evolve_table(conn, clock, new_table)
    dl = dead_letter_spec(new_table)
    if tables.find_table(conn, dl.name, missing_ok=True) is not None:
        tables.evolve_table(conn, clock, dl)
    return info, changes


def _datastreams_follow(conn: Connection, table: TableSpec, now: float) -> None:
    """The spec of every datastream writing ``table`` takes the table's columns (a
    compare-and-set on its row, in the caller's transaction). A datastream of many topics
    keeps its spec: each of its tables has its own columns, stored with the table."""
    # lazy: as in evolve_with_dead_letter
    from millstream.datastream import DatastreamSpec

    rows = conn.execute(
        select(s.datastreams.c.name, s.datastreams.c.spec, s.datastreams.c.version)
    ).all()
    for name, spec, version in rows:
        parsed = DatastreamSpec.parse_stored(spec)
        if (
            parsed.multi_table
            or parsed.table_name != table.name
            or spec.get("schema") == table.columns
        ):
            continue
        cas_update(
            conn,
            s.datastreams,
            {"name": name},
            version,
            {"spec": {**spec, "schema": dict(table.columns)}, "updated_at": now},
        )


def absorb(
    conn: Connection, clock: Clock, table: str, propose: Callable[[TableSpec], TableSpec]
) -> tuple[TableInfo, list[Change]]:
    """``schema_evolution: auto``: make ``propose(current spec)`` the table's spec, in ONE
    transaction with its dead-letter table and its datastream's row, through the same
    :func:`evolve_with_dead_letter` as a manual update (rules checked, compare-and-set on the
    table row, schema version + 1). ``propose`` is called on the spec read INSIDE the
    transaction, so a writer that lost the race to another (its compare-and-set lost, the
    transaction retried) proposes against the winner's spec, finds the columns there and
    changes nothing. Returns the table as it now is and the changes (none: nothing written).

    A :class:`~millstream.errors.CommitStateUnknownError` propagates: the caller reconciles
    by re-reading the table (:func:`propose` of the re-read spec is that spec when it landed),
    never by running this again blindly. One transaction (``conn``'s)."""
    existing = tables.find_table(conn, table)
    assert existing is not None
    wanted = propose(existing.spec)
    if wanted == existing.spec:
        return existing, []
    info, changes = evolve_with_dead_letter(conn, clock, wanted)
    if changes:
        _datastreams_follow(conn, info.spec, clock.now())
    return info, changes
