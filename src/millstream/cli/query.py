"""``millstream query``: SQL over Millstream tables, without a JVM by default.

The DuckDB engine reads each table the SQL names with Millstream's own Arrow reader
(:meth:`millstream.catalog.Catalog.read_table`: the current snapshot, merged by the table's
engine) and registers it in an in-process DuckDB under the table's name; tables the SQL does
not name are not read. Top-level ``AND`` conditions of a one-table query that compare a column
with a constant (``=``, ``<``, ``<=``, ``>``, ``>=``, ``IN``, ``IS [NOT] NULL``) are handed to
the reader, which applies them before the merge where that cannot change the answer (any
column of an append table, the key columns of a keyed one); DuckDB applies the whole ``WHERE``
again either way. The reader reads every column (the merge needs them); DuckDB projects.

The Spark engine runs Spark SQL over the ``millstream`` data source (every table a view): for
SQL only Spark speaks, or tables larger than this process's memory.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import sys
from collections.abc import Callable
from typing import Any

from millstream.core import no_pandas
from millstream.errors import InvalidSpecError, TableNotFoundError

#: DuckDB's comparison node types -> the reader's operators (:data:`millstream.table.read.Condition`)
_COMPARISONS = {
    "COMPARE_EQUAL": "==",
    "COMPARE_LESSTHAN": "<",
    "COMPARE_LESSTHANOREQUALTO": "<=",
    "COMPARE_GREATERTHAN": ">",
    "COMPARE_GREATERTHANOREQUALTO": ">=",
}
#: ``5 < qty`` is ``qty > 5``
_MIRRORED = {"==": "==", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_INTEGER_TYPES = {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER"}
#: the constants a column of each type may be compared with before the merge, with the same
#: answer in Arrow as in DuckDB (anything else is left to DuckDB)
_CONSTANTS_FOR = {
    "long": _INTEGER_TYPES,
    "int": _INTEGER_TYPES,
    "double": _INTEGER_TYPES | {"DOUBLE", "FLOAT"},
    "string": {"VARCHAR"},
    "boolean": {"BOOLEAN"},
}
_MISSING_TABLE = re.compile(r"Table with name (.+?) does not exist")


def _constant(node: dict[str, Any], column_type: str) -> tuple[bool, Any]:
    """(True, value) when ``node`` is a non-null constant of a kind ``column_type`` takes."""
    if node.get("class") != "CONSTANT":
        return False, None
    value = node.get("value") or {}
    kind = (value.get("type") or {}).get("id")
    if value.get("is_null") or kind not in _CONSTANTS_FOR.get(column_type, ()):
        return False, None
    v = value.get("value")
    if kind in _INTEGER_TYPES and (not isinstance(v, int) or isinstance(v, bool)):
        return False, None
    return True, v


def _column(node: dict[str, Any], names: set[str], allowed: dict[str, str]) -> str | None:
    """The column ``node`` references (bare, or qualified by the table's name or alias) if a
    condition on it may be applied before the merge."""
    if node.get("class") != "COLUMN_REF":
        return None
    parts = node.get("column_names") or []
    if len(parts) == 2 and parts[0] in names:
        parts = parts[1:]
    if len(parts) != 1 or parts[0] not in allowed:
        return None
    return str(parts[0])


def _conjuncts(node: dict[str, Any] | None) -> list[dict[str, Any]]:
    if node is None:
        return []
    if node.get("class") == "CONJUNCTION" and node.get("type") == "CONJUNCTION_AND":
        return [c for child in node.get("children", []) for c in _conjuncts(child)]
    return [node]


def _condition(
    node: dict[str, Any], names: set[str], allowed: dict[str, str]
) -> tuple[str, str, Any] | None:
    cls, kind = node.get("class"), node.get("type")
    if cls == "COMPARISON" and kind in _COMPARISONS:
        op = _COMPARISONS[kind]
        left, right = node.get("left") or {}, node.get("right") or {}
        column = _column(left, names, allowed)
        if column is None:
            column, op, right = _column(right, names, allowed), _MIRRORED[op], left
        if column is None:
            return None
        ok, value = _constant(right, allowed[column])
        return (column, op, value) if ok else None
    if cls == "OPERATOR" and kind in ("OPERATOR_IS_NULL", "OPERATOR_IS_NOT_NULL"):
        children = node.get("children") or []
        column = _column(children[0], names, allowed) if len(children) == 1 else None
        if column is None:
            return None
        return (column, "is_null" if kind == "OPERATOR_IS_NULL" else "not_null", None)
    if cls == "OPERATOR" and kind == "COMPARE_IN":
        children = node.get("children") or []
        column = _column(children[0], names, allowed) if children else None
        if column is None or len(children) < 2:
            return None
        values = []
        for child in children[1:]:
            ok, value = _constant(child, allowed[column])
            if not ok:
                return None
            values.append(value)
        return (column, "in", tuple(values))
    return None


def hold_off_pandas() -> Callable[[], None]:
    """Make pandas unimportable in this process until the returned function is called (a
    ``millstream run --available-now``, until its JVM has ended). PySpark imports pandas in
    the driver as its session starts only to ask, in ``pyspark.testing.utils``, whether numpy
    is there (and takes its absence in its stride), and pyarrow on its first ``pa.array()``;
    none of the run's work before its final seal uses it, whose key index hashes keys with it.
    Not loading it before then keeps ~36 MiB out of the driver while the write tasks run
    beside it, the run's peak memory (docs/performance.md, "The batch run's end: the process
    exits when its work is durable")."""
    finder = no_pandas.skip_pandas()
    if finder is None:
        return lambda: None

    def allow() -> None:
        with contextlib.suppress(ValueError):  # allowed already
            sys.meta_path.remove(finder)

    return allow


def skip_pandas() -> None:
    """Make pandas unimportable in this process (a DuckDB ``millstream query``, ``table list``
    or ``table describe``, from :func:`millstream.cli.app.main`): pyarrow imports it on its
    first ``pa.array()`` just to ask whether the argument is a DataFrame, which costs 0.5-4 s
    of a one-second command, and nothing those commands run uses it."""
    no_pandas.skip_pandas()


def pushdown(sql: str, table: str, spec: Any) -> list[tuple[str, str, Any]]:
    """The conditions of ``sql`` the reader may apply to ``table`` (its :class:`TableSpec`
    ``spec``) before the merge: only for a single SELECT from that one table (no join, no
    CTE, no set operation), only its top-level ``AND``-ed comparisons of a column the reader
    may filter (every column of an append table, the key columns of a keyed one) with a
    constant of a matching type. Empty when in doubt: DuckDB applies the full ``WHERE`` anyway."""
    # lazy: only `millstream query` needs it
    import duckdb

    try:
        row = duckdb.execute("SELECT json_serialize_sql(?::VARCHAR)", [sql]).fetchone()
        tree = json.loads(row[0]) if row else {}
    except (duckdb.Error, ValueError):
        return []
    statements = tree.get("statements") or []
    if tree.get("error") or len(statements) != 1:
        return []
    node = statements[0].get("node") or {}
    source = node.get("from_table") or {}
    if (
        node.get("type") != "SELECT_NODE"
        or (node.get("cte_map") or {}).get("map")
        or source.get("type") != "BASE_TABLE"
        or source.get("table_name") != table
        or source.get("schema_name")
        or source.get("catalog_name")
    ):
        return []
    names = {table} | ({source["alias"]} if source.get("alias") else set())
    columns = spec.primary_key if spec.keyed else tuple(spec.columns)
    allowed = {c: spec.columns[c] for c in columns if spec.columns[c] in _CONSTANTS_FOR}
    found = (_condition(c, names, allowed) for c in _conjuncts(node.get("where_clause")))
    return [c for c in found if c is not None]


def duckdb_query(catalog: Any, sql: str, limit: int) -> list[dict[str, Any]]:
    """Run ``sql`` in DuckDB over the tables it names; at most ``limit`` rows, as dicts. A
    table that does not exist raises :class:`TableNotFoundError`; SQL DuckDB cannot parse or
    run raises :class:`InvalidSpecError` naming ``sql``."""
    # lazy: only `millstream query` needs it
    import duckdb

    try:
        named = duckdb.get_table_names(sql)
    except duckdb.Error as exc:
        raise InvalidSpecError("sql", _first_line(exc)) from None
    tables = {t.name: t for t in catalog.store.list_tables()}
    folded = {name.lower(): name for name in tables}
    con = duckdb.connect()
    try:
        con.execute("SET TimeZone = 'UTC'")
        for name in sorted(named):
            real = name if name in tables else folded.get(name.lower())
            if real is None:
                continue  # not ours (a DuckDB catalog view, or missing: DuckDB says which)
            conditions = pushdown(sql, name, tables[real].spec)
            con.register(name, catalog.read_table(real, conditions=conditions))
        try:
            relation = con.sql(sql)
            if relation is None:  # a statement without a result
                return []
            result = relation.limit(limit).fetch_arrow_table()
        except duckdb.CatalogException as exc:
            missing = _MISSING_TABLE.search(str(exc))
            if missing:
                raise TableNotFoundError(missing.group(1)) from None
            raise InvalidSpecError("sql", _first_line(exc)) from None
        except duckdb.Error as exc:
            raise InvalidSpecError("sql", _first_line(exc)) from None
        rows: list[dict[str, Any]] = result.to_pylist()
        return rows
    finally:
        con.close()


def spark_query(catalog: Any, sql: str, limit: int, master: str | None) -> list[dict[str, Any]]:
    """Run ``sql`` as Spark SQL, every table of ``catalog`` a view. A table that does not
    exist raises :class:`TableNotFoundError`; SQL Spark cannot analyse raises
    :class:`InvalidSpecError` naming ``sql``."""
    # lazy: only `millstream query --engine spark` needs Spark
    from pyspark.errors import AnalysisException, ParseException
    from pyspark.logger import PySparkLogger

    from millstream.spark.session import spark_session
    from millstream.spark.table_source import read_dataframe

    # PySpark logs every failed analysis at ERROR, Java stack included, before raising it;
    # the one sentence below says what the user needs.
    PySparkLogger.getLogger("SQLQueryContextLogger").setLevel(logging.CRITICAL)
    spark = spark_session(master=master)
    try:
        for info in catalog.store.list_tables():
            read_dataframe(spark, info.name, settings=catalog.settings).createOrReplaceTempView(
                info.name
            )
        try:
            df = spark.sql(sql)
        except ParseException as exc:
            raise InvalidSpecError("sql", _first_line(exc)) from None
        except AnalysisException as exc:
            if exc.getCondition() == "TABLE_OR_VIEW_NOT_FOUND":
                name = (exc.getMessageParameters() or {}).get("relationName", "?")
                raise TableNotFoundError(name.replace("`", "")) from None
            raise InvalidSpecError("sql", _first_line(exc)) from None
        return [r.asDict(recursive=True) for r in df.limit(limit).collect()]
    finally:
        spark.stop()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
