"""Every mutation of the manifest (tables, table versions, shards, entries, delete vectors)
lives in ``millstream.metastore``, as a compare-and-set with a precondition. A stray
``update(s.entries)`` elsewhere once skipped its rowcount check and duplicated rows on
PostgreSQL; this test keeps such code from coming back."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import millstream

MANIFEST_TABLES = {"tables", "table_versions", "shards", "entries", "delete_vectors"}
MANIFEST_SQL = re.compile(
    r"\b(insert\s+into|update|delete\s+from)\s+ms_(tables|table_versions|shards|entries|"
    r"delete_vectors)\b",
    re.IGNORECASE,
)
PACKAGE = Path(millstream.__file__).parent


def _names_manifest_table(node: ast.AST) -> bool:
    """``s.entries``, ``schema.shards``, ``entries`` ... (any expression ending in one)."""
    if isinstance(node, ast.Attribute):
        return node.attr in MANIFEST_TABLES
    return isinstance(node, ast.Name) and node.id in MANIFEST_TABLES


def _mutates_manifest(call: ast.Call) -> bool:
    f = call.func
    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
    if name not in ("insert", "update", "delete"):
        return False
    on_arg = bool(call.args) and _names_manifest_table(call.args[0])
    on_table = isinstance(f, ast.Attribute) and _names_manifest_table(f.value)
    return on_arg or on_table


def manifest_mutations(source: str) -> list[str]:
    """Where ``source`` inserts, updates or deletes manifest rows: SQLAlchemy's
    ``insert(t)``/``update(t)``/``delete(t)``, ``t.insert()``/``t.update()``/``t.delete()``,
    or SQL text."""
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
    ):
        assert manifest_mutations(snippet), snippet
    assert not manifest_mutations("conn.execute(update(s.datastreams).values(state='X'))")
    assert not manifest_mutations("d = {}; d.update(entries=1)")


def test_no_manifest_table_is_mutated_outside_the_metastore_package() -> None:
    offenders = {
        str(path.relative_to(PACKAGE)): hits
        for path in sorted(PACKAGE.rglob("*.py"))
        if "metastore" not in path.relative_to(PACKAGE).parts
        and (hits := manifest_mutations(path.read_text()))
    }
    assert offenders == {}, (
        "manifest rows are changed outside millstream.metastore; add an operation to "
        f"millstream/metastore/manifest.py instead: {offenders}"
    )
