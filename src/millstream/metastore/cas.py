"""Compare-and-set helpers: every mutation of shared state goes through here."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Table, update

from millstream.errors import CommitConflictError


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
