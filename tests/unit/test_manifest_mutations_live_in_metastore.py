"""Every mutation of the manifest (tables, table versions, shards, entries, delete vectors)
lives in a few named modules of ``millstream.metastore``, as a compare-and-set with a
precondition. A stray ``update(s.entries)`` elsewhere once skipped its rowcount check and
duplicated rows on PostgreSQL; this test keeps such code from coming back."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import millstream

MANIFEST_TABLES = {
    "tables",
    "table_versions",
    "table_schemas",
    "shards",
    "entries",
    "delete_vectors",
}
MANIFEST_SQL = re.compile(
    r"\b(insert\s+into|update|delete\s+from)\s+ms_(tables|table_versions|table_schemas|"
    r"shards|entries|delete_vectors)\b",
    re.IGNORECASE,
)
PACKAGE = Path(millstream.__file__).parent
#: The modules that change manifest rows (the operations table is in ``manifest.py``'s
#: docstring and in docs/design.md, "The manifest module").
MUTATING_MODULES = {
    "metastore/manifest.py": "the shared primitives, publish_version, rollback's removal",
    "metastore/claims.py": "claim and release a run for a seal",
    "metastore/swaps.py": "swap a seal's or a re-ingestion's file in",
    "metastore/append.py": "compare-and-append (a writer's commit)",
    "metastore/shards.py": "bootstrap missing shards",
    "metastore/tables.py": "create a table, evolve its schema, change its retention",
    "metastore/schema.py": "migration v9 records every existing table's schema version 1",
    "metastore/expiry.py": "expire versions retention no longer keeps",
    "metastore/rollback.py": "roll a partition back (through remove_segments)",
}
#: The mutations ``manifest.py`` offers other code inside a transaction: calling one is
#: changing manifest rows too.
PRIMITIVES = {
    "insert_entry",
    "insert_entries",
    "insert_delete_vector",
    "update_entry",
    "update_entries",
    "remove_delete_vector",
    "publish_version",
    "remove_segments",
}


def _names_manifest_table(node: ast.AST) -> bool:
    """``s.entries``, ``schema.shards``, ``entries`` ... (any expression ending in one)."""
    if isinstance(node, ast.Attribute):
        return node.attr in MANIFEST_TABLES
    return isinstance(node, ast.Name) and node.id in MANIFEST_TABLES


def _mutates_manifest(call: ast.Call) -> bool:
    f = call.func
    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
    if name in PRIMITIVES:
        return True
    if name in ("cas_update", "cas_update_many"):  # cas_update(conn, table, ...)
        return len(call.args) > 1 and _names_manifest_table(call.args[1])
    if name not in ("insert", "update", "delete"):
        return False
    on_arg = bool(call.args) and _names_manifest_table(call.args[0])
    on_table = isinstance(f, ast.Attribute) and _names_manifest_table(f.value)
    return on_arg or on_table


def manifest_mutations(source: str) -> list[str]:
    """Where ``source`` inserts, updates or deletes manifest rows: SQLAlchemy's
    ``insert(t)``/``update(t)``/``delete(t)``, ``t.insert()``/``t.update()``/``t.delete()``,
    ``cas_update(conn, t, ...)``, a call of one of ``manifest.py``'s primitives, or SQL
    text."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and _mutates_manifest(node):
            found.append(f"line {node.lineno}: {ast.unparse(node)[:80]}")
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and MANIFEST_SQL.search(node.value)
        ):
            found.append(f"line {node.lineno}: SQL text {node.value[:60]!r}")
    return found


def test_the_check_finds_every_form_of_manifest_mutation() -> None:
    for snippet in (
        "conn.execute(update(s.entries).where(x).values(y))",
        "conn.execute(insert(schema.shards).values(a=1))",
        "conn.execute(s.delete_vectors.delete())",
        "conn.exec_driver_sql('UPDATE ms_entries SET state = 1')",
        "conn.execute(sqlalchemy.delete(s.tables))",
        "cas_update(conn, s.shards, {'table_name': t}, 3, {'upper': 9})",
        "cas_update_many(conn, s.shards, rows)",
        "update_entry(conn, e.id, e.row_version, {'state': 'ONLINE'})",
        "update_entries(conn, [(e.id, e.row_version, {'state': 'ONLINE'})])",
        "insert_entries(conn, entries)",
        "manifest.publish_version(conn, info, 'seal', now)",
    ):
        assert manifest_mutations(snippet), snippet
    assert not manifest_mutations("conn.execute(update(s.datastreams).values(state='X'))")
    assert not manifest_mutations("cas_update(conn, s.leases, {'name': n}, 3, {'owner': o})")
    assert not manifest_mutations("d = {}; d.update(entries=1)")


def test_no_manifest_table_is_mutated_outside_the_named_metastore_modules() -> None:
    offenders = {
        rel: hits
        for path in sorted(PACKAGE.rglob("*.py"))
        if (rel := path.relative_to(PACKAGE).as_posix()) not in MUTATING_MODULES
        and (hits := manifest_mutations(path.read_text()))
    }
    assert offenders == {}, (
        "manifest rows are changed outside the modules named in MUTATING_MODULES; add an "
        f"operation to millstream/metastore/manifest.py (or its siblings there) instead: {offenders}"
    )


def test_every_named_module_exists_and_mutates_the_manifest() -> None:
    """The list cannot rot: a module that was moved or no longer changes manifest rows is
    taken off it."""
    for rel in MUTATING_MODULES:
        path = PACKAGE / rel
        assert path.is_file(), rel
        assert manifest_mutations(path.read_text()), f"{rel} changes no manifest row"
