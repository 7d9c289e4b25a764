"""The Spark batch data source ``millstream``: ``spark.read.format("millstream").load("orders")``.

Register it once per SparkSession::

    from millstream.spark.table_source import register
    register(spark)
    spark.read.format("millstream").load("orders")                    # current rows
    spark.read.format("millstream").option("asOf", 12).load("orders")  # manifest version 12

Options (all optional): ``home``, ``metadataUrl``, ``deepStore``, ``s3Endpoint`` (default:
the ``MILLSTREAM_*`` environment of the process), ``asOf`` (a manifest version),
``pinSeconds`` (default 3600), ``pushFilters`` (set by :func:`read_dataframe` when the session
allows filter pushdown). The manifest version is chosen and pinned (:meth:`Catalog.pin`) when
the query is planned, so every task reads the same snapshot and retention keeps it for
``pinSeconds`` even past the table's window.

Tasks: an append table is read by one task per partition (its rows do not interact across
partitions), and so is a keyed table declared ``partitioned_by_key``; another keyed table by
one task (a key's rows may span partitions, and the merge must see them all). Filters: with ``spark.sql.python.filterPushdown.enabled`` (Millstream's own
sessions set it), filters on a keyed table's key columns, and on any column of an append
table, of plain types, are applied before the merge, so a lookup by key merges that key
only; a filter on another column of a keyed table is applied by Spark after the merge (before
it, it could drop a key's newest row and bring back an older one). Spark re-applies every
filter either way.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamWriter,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.types import StructType

from millstream.catalog import PIN_SECONDS, Catalog
from millstream.config import Settings
from millstream.errors import InvalidSpecError
from millstream.spark.options import Options, SinkOptions
from millstream.spark.sink import SegmentSink, group_sink
from millstream.spark.sources import GROUP_DDL, GroupStreamSource, StreamSource
from millstream.spec import TableSpec
from millstream.table.read import Condition
from millstream.types import DecimalType, ListType, MapType, Scalar, Type, parse_type

SPARK_TYPES = {
    "string": "string",
    "long": "bigint",
    "int": "int",
    "double": "double",
    "boolean": "boolean",
    "timestamp": "timestamp",
    "date": "date",
    "binary": "binary",
}


def spark_type(t: Type) -> str:
    """The Spark DDL of a column type (``decimal(10,2)``, ``array<...>``, ``struct<...>``,
    ``map<string,...>``)."""
    if isinstance(t, Scalar):
        return SPARK_TYPES[t.name]
    if isinstance(t, DecimalType):
        return f"decimal({t.precision},{t.scale})"
    if isinstance(t, ListType):
        return f"array<{spark_type(t.element)}>"
    if isinstance(t, MapType):
        return f"map<string,{spark_type(t.value)}>"
    return "struct<" + ",".join(f"`{n}`:{spark_type(ft)}" for n, ft in t.fields) + ">"


def spark_ddl(spec: TableSpec) -> str:
    return ", ".join(f"`{c}` {spark_type(parse_type(t))}" for c, t in spec.columns.items())


def _options(options: Any) -> Options:
    return Options(options)


def _table_name(options: dict[str, str]) -> str:
    name = options.get("path") or options.get("table")
    if not name:
        raise InvalidSpecError(
            "path", 'name the table: spark.read.format("millstream").load("orders")'
        )
    return name


def _positive(options: dict[str, str], key: str, default: float) -> float:
    raw = options.get(key)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise InvalidSpecError(key, f"{raw!r} is not a number of seconds") from None
    if value <= 0:
        raise InvalidSpecError(key, f"must be positive, got {raw}")
    return value


class _Snapshot(InputPartition):
    """One task's share of a query: a version of the table, and (an append table) the
    partitions whose rows the task reads (None: every partition)."""

    def __init__(self, table: str, version: int, partitions: tuple[int, ...] | None) -> None:
        super().__init__((version, partitions))
        self.table = table
        self.version = version
        self.partitions = partitions


#: Spark's pushed filters that :func:`_condition` turns into read conditions.
_COMPARISONS: dict[type[Filter], str] = {
    EqualTo: "==",
    GreaterThan: ">",
    GreaterThanOrEqual: ">=",
    LessThan: "<",
    LessThanOrEqual: "<=",
}
#: Column types whose Spark literals compare with the Arrow column as they are.
_PUSHABLE_TYPES = {"string", "long", "int", "double", "boolean"}


def _condition(f: Filter, spec: TableSpec) -> Condition | None:
    """The read condition of Spark filter ``f``, if the read can apply it before the merge
    without changing the answer (a key column of a keyed table, any column of an append
    table; a top-level column of a plain type), else None."""
    path: tuple[str, ...] = tuple(getattr(f, "attribute", ()))
    if len(path) != 1:
        return None
    column = path[0]
    if spec.columns.get(column) not in _PUSHABLE_TYPES:
        return None
    if spec.keyed and column not in spec.primary_key:
        return None  # it could drop a key's newest row and bring back an older one
    op = _COMPARISONS.get(type(f))
    if op is not None:
        return (column, op, f.value)  # type: ignore[attr-defined]
    if isinstance(f, In):
        return (column, "in", tuple(f.value))
    if isinstance(f, IsNull):
        return (column, "is_null", None)
    if isinstance(f, IsNotNull):
        return (column, "not_null", None)
    return None


#: The session setting that lets the source take Spark's filters (Millstream's own sessions
#: set it; with it off, reads work the same, with every filter applied after the merge).
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


class MillstreamDataSource(DataSource):
    """Batch reads of Millstream tables at a consistent manifest version."""

    @classmethod
    def name(cls) -> str:
        return "millstream"

    def schema(self) -> str:
        opts = _options(self.options)
        with Catalog.open(settings=Settings.from_options(opts)) as cat:
            return spark_ddl(cat.table(_table_name(opts)).spec)

    def reader(self, schema: StructType | None) -> DataSourceReader:
        options = _options(self.options)
        columns = None if schema is None else [f.name for f in schema.fields]
        if options.get("pushFilters", "false").lower() == "true":
            return PushdownReader(options, columns)
        return MillstreamReader(options, columns)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return SegmentSink(SinkOptions.from_options(self.options))


#: The Spark format name of a shared query's sink.
GROUP_SINK_FORMAT = "millstream_group"


class MillstreamGroupSink(DataSource):
    """The streaming sink of a shared query (several datastreams in one query), with
    :class:`~millstream.spark.options.GroupSinkOptions`."""

    @classmethod
    def name(cls) -> str:
        return GROUP_SINK_FORMAT

    def schema(self) -> str:
        return GROUP_DDL

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return group_sink(self.options)


class MillstreamReader(DataSourceReader):
    def __init__(self, options: dict[str, str], columns: list[str] | None = None) -> None:
        self.options = options
        self.table = _table_name(options)
        #: The columns of the schema Spark planned with: a column added to the table since
        #: (schema evolution) is left out, so the rows match the plan.
        self.columns = columns
        #: Conditions the read applies before the merge (from Spark's pushed filters).
        self.conditions: list[Condition] = []

    def partitions(self) -> list[InputPartition]:
        return _plan(self.options, self.table)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, _Snapshot)
        with Catalog.open(settings=Settings.from_options(self.options)) as cat:
            table = cat.read_table(
                partition.table,
                as_of=partition.version,
                partitions=partition.partitions,
                conditions=self.conditions,
            )
        if self.columns is not None and table.column_names != self.columns:
            table = table.select(self.columns)
        yield from table.to_batches(max_chunksize=65536)


class PushdownReader(MillstreamReader):
    """The reader with filter pushdown, when the session enables it
    (:data:`PUSHDOWN_CONF`; Spark refuses a reader that implements ``pushFilters`` otherwise,
    so the plain reader is the default and :func:`read_dataframe` asks for this one with the
    ``pushFilters`` option when the session allows it)."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        """Take the filters the read can apply before the merge (on key columns of a keyed
        table; any column of an append table): the merge then works on the matching keys
        only. Spark still evaluates every filter on the result (all are returned)."""
        with Catalog.open(settings=Settings.from_options(self.options)) as cat:
            spec = cat.table(self.table).spec
        for f in filters:
            cond = _condition(f, spec)
            if cond is not None:
                self.conditions.append(cond)
        return filters


def _plan(options: dict[str, str], table: str) -> list[InputPartition]:
    """Pin the version the query reads (``asOf`` or the current one) for ``pinSeconds``
    (default an hour): the tasks read it later, and expiry keeps it for them. Spark says
    nothing when a query ends, so the pin runs out rather than being released.

    An append table, or a keyed one ``partitioned_by_key``, is read by one task per partition
    that has rows (its rows do not interact across partitions); another keyed table by one
    task, as a key's rows may span partitions and the merge must see them all."""
    as_of = options.get("asOf")
    version: int | None = None
    if as_of is not None:
        try:
            version = int(as_of)
        except ValueError:
            raise InvalidSpecError("asOf", f"{as_of!r} is not a manifest version") from None
    seconds = _positive(options, "pinSeconds", PIN_SECONDS)
    with Catalog.open(settings=Settings.from_options(options)) as cat:
        pin = cat.pin(table, as_of=version, seconds=seconds, holder="spark read")
        manifest = cat.manifest(table, as_of=pin.version)
    if manifest.table.spec.keyed and not manifest.table.spec.partitioned_by_key:
        return [_Snapshot(table, pin.version, None)]
    parts = sorted({e.partition for e in manifest.entries if e.row_count})
    return [_Snapshot(table, pin.version, (p,)) for p in parts] or [
        _Snapshot(table, pin.version, None)
    ]


#: Spark's registration checks "registered already?" and then "does the name resolve?": a
#: second thread registering the same name in between makes the first fail with
#: DATA_SOURCE_ALREADY_EXISTS (a worker starts its writers on threads of their own).
_REGISTER_LOCK = threading.Lock()


def register(spark: SparkSession) -> None:
    """Register the ``millstream`` data source (batch reads, streaming sink) and the stream
    sources, each once per session (registering again would make Spark warn "replaced a
    previously registered data source"; one thread at a time)."""
    with _REGISTER_LOCK:
        manager = spark._jsparkSession.sessionState().dataSourceManager()
        for ds in (MillstreamDataSource, StreamSource, MillstreamGroupSink, GroupStreamSource):
            if not manager.dataSourceExists(ds.name()):
                spark.dataSource.register(ds)


def read_dataframe(
    spark: SparkSession,
    table: str,
    *,
    home: str | Path | None = None,
    as_of: int | float | datetime | None = None,
    settings: Settings | None = None,
) -> DataFrame:
    register(spark)
    settings = settings or Settings.load(home=home)
    reader = spark.read.format("millstream").options(**settings.as_options())
    if (spark.conf.get(PUSHDOWN_CONF, "false") or "").lower() == "true":
        reader = reader.option("pushFilters", "true")
    if as_of is not None:
        if not isinstance(as_of, int):
            with Catalog.open(settings=settings) as cat:
                as_of = cat.manifest(table, as_of=as_of).version
        reader = reader.option("asOf", str(as_of))
    return reader.load(table)
