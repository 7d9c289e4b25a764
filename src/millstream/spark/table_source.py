"""The Spark batch data source ``millstream``: ``spark.read.format("millstream").load("orders")``.

Register it once per SparkSession::

    from millstream.spark.table_source import register
    register(spark)
    spark.read.format("millstream").load("orders")                    # current rows
    spark.read.format("millstream").option("asOf", 12).load("orders")  # manifest version 12

Options (all optional): ``home``, ``metadataUrl``, ``deepStore``, ``s3Endpoint`` (default:
the ``MILLSTREAM_*`` environment of the process), ``asOf`` (a manifest version). The manifest
version is pinned when the query is planned, so every task reads the same snapshot.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamWriter,
    InputPartition,
)
from pyspark.sql.types import StructType

from millstream.catalog import Catalog
from millstream.config import Settings
from millstream.errors import InvalidSpecError
from millstream.spark.options import Options, SinkOptions
from millstream.spark.sink import SegmentSink
from millstream.spark.sources import StreamSource
from millstream.spec import TableSpec

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


def spark_ddl(spec: TableSpec) -> str:
    return ", ".join(f"`{c}` {SPARK_TYPES[t]}" for c, t in spec.columns.items())


def _options(options: Any) -> Options:
    return Options(options)


def _table_name(options: dict[str, str]) -> str:
    name = options.get("path") or options.get("table")
    if not name:
        raise InvalidSpecError(
            "path", 'name the table: spark.read.format("millstream").load("orders")'
        )
    return name


class _Snapshot(InputPartition):
    def __init__(self, table: str, version: int) -> None:
        super().__init__(version)
        self.table = table
        self.version = version


class MillstreamDataSource(DataSource):
    """Batch reads of Millstream tables at a consistent manifest version."""

    @classmethod
    def name(cls) -> str:
        return "millstream"

    def schema(self) -> str:
        opts = _options(self.options)
        with Catalog.open(settings=Settings.from_options(opts)) as cat:
            return spark_ddl(cat.table(_table_name(opts)).spec)

    def reader(self, schema: StructType) -> DataSourceReader:
        return MillstreamReader(_options(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return SegmentSink(SinkOptions.from_options(self.options))


class MillstreamReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        self.table = _table_name(options)

    def partitions(self) -> list[InputPartition]:
        as_of = self.options.get("asOf")
        with Catalog.open(settings=Settings.from_options(self.options)) as cat:
            if as_of is not None:
                try:
                    version = int(as_of)
                except ValueError:
                    raise InvalidSpecError("asOf", f"{as_of!r} is not a manifest version") from None
                version = cat.manifest(self.table, as_of=version).version
            else:
                version = cat.table(self.table).manifest_version
        return [_Snapshot(self.table, version)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, _Snapshot)
        with Catalog.open(settings=Settings.from_options(self.options)) as cat:
            table = cat.read_table(partition.table, as_of=partition.version)
        yield from table.to_batches(max_chunksize=65536)


#: Spark's registration checks "registered already?" and then "does the name resolve?": a
#: second thread registering the same name in between makes the first fail with
#: DATA_SOURCE_ALREADY_EXISTS (a worker starts its writers on threads of their own).
_REGISTER_LOCK = threading.Lock()


def register(spark: SparkSession) -> None:
    """Register the ``millstream`` data source (batch reads, streaming sink) and the stream
    source ``millstream_source`` (idempotent; one thread at a time)."""
    with _REGISTER_LOCK:
        for ds in (MillstreamDataSource, StreamSource):
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
    if as_of is not None:
        if not isinstance(as_of, int):
            with Catalog.open(settings=settings) as cat:
                as_of = cat.manifest(table, as_of=as_of).version
        reader = reader.option("asOf", str(as_of))
    return reader.load(table)
