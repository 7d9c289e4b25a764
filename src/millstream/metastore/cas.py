"""Compare-and-set helpers: every mutation of shared state goes through here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from sqlalchemy import Connection, Table, bindparam, update

from millstream.errors import CommitConflictError, InvalidSpecError


def cas_update(
    conn: Connection,
    table: Table,
    key: dict[str, Any],
    expected_version: int,
    values: dict[str, Any],
) -> int:
    """``UPDATE table SET values, version = expected + 1 WHERE key AND version = expected``.

    Returns the new version; raises :class:`CommitConflictError` if the row changed (or is
    gone) since it was read at ``expected_version``.
    """
    cond = [table.c[k] == v for k, v in key.items()]
    stmt = (
        update(table)
        .where(*cond, table.c.version == expected_version)
        .values(**values, version=expected_version + 1)
    )
    if conn.execute(stmt).rowcount != 1:
        ident = ", ".join(f"{k}={v!r}" for k, v in key.items())
        raise CommitConflictError(
            f"{table.name} row ({ident}) changed since version {expected_version}; refresh and retry",
            table=table.name,
            key={k: str(v) for k, v in key.items()},
            expected_version=expected_version,
        )
    return expected_version + 1


class CasRow(NamedTuple):
    """One compare-and-set of :func:`cas_update_many`: the row's key, the version it was read
    at, and the values to set."""

    key: Mapping[str, Any]
    expected_version: int
    values: Mapping[str, Any]


def cas_update_many(conn: Connection, table: Table, rows: Sequence[CasRow]) -> None:
    """:func:`cas_update` of several rows of ``table`` in one statement executed for every
    row (one round trip on PostgreSQL, one prepared statement on SQLite, instead of one
    statement built, compiled and sent per row: a commit of 256 partitions updates 512
    shards). Every row must name the same key and value columns, and each key must name one
    row.

    Raises :class:`CommitConflictError` unless every row matched, i.e. unless the rows
    updated add up to ``len(rows)`` (the driver's ``executemany`` row count; where a dialect
    cannot count those, the rows are updated one :func:`cas_update` at a time). Nothing is
    committed here: the caller's transaction is retried from a fresh read."""
    if not rows:
        return
    keys, names = list(rows[0].key), list(rows[0].values)
    for r in rows:
        if list(r.key) != keys or list(r.values) != names:
            raise InvalidSpecError(
                "rows", "every row of one cas_update_many names the same columns"
            )
    if len(rows) == 1 or not conn.dialect.supports_sane_multi_rowcount:
        for r in rows:
            cas_update(conn, table, dict(r.key), r.expected_version, dict(r.values))
        return
    stmt = (
        update(table)
        .where(
            *(table.c[k] == bindparam(f"k_{k}") for k in keys),
            table.c.version == bindparam("k_version"),
        )
        .values(
            **{n: bindparam(f"v_{n}") for n in names},
            version=bindparam("v_version"),
        )
    )
    params = [
        {
            **{f"k_{k}": v for k, v in r.key.items()},
            "k_version": r.expected_version,
            **{f"v_{n}": v for n, v in r.values.items()},
            "v_version": r.expected_version + 1,
        }
        for r in rows
    ]
    matched = conn.execute(stmt, params).rowcount
    if matched != len(rows):
        first = rows[0].key
        raise CommitConflictError(
            f"{table.name}: {len(rows) - matched} of {len(rows)} rows changed since they were "
            "read; refresh and retry",
            table=table.name,
            key={k: str(v) for k, v in first.items()},
            expected_version=rows[0].expected_version,
            rows=len(rows),
            matched=matched,
        )
