"""Millstream: reliable nearline ingestion on Apache Spark."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from millstream.catalog import Catalog
from millstream.errors import MillstreamError
from millstream.spec import TableSpec

__all__ = ["Catalog", "MillstreamError", "TableSpec", "read_table"]
__version__ = "0.1.0"


def read_table(
    table_or_spark: Any,
    table: str | None = None,
    *,
    home: str | Path | None = None,
    as_of: int | float | datetime | None = None,
    catalog: Catalog | None = None,
) -> Any:
    """Read a table's current rows.

    * ``millstream.read_table("orders", home=..., as_of=None)`` returns a ``pyarrow.Table``
      without Spark.
    * ``millstream.read_table(spark, "orders")`` returns a Spark DataFrame through the
      ``millstream`` data source (registered on the session if needed).
    """
    if isinstance(table_or_spark, str):
        name = table_or_spark
        if catalog is not None:
            return catalog.read_table(name, as_of=as_of)
        with Catalog.open(home=home) as cat:
            result: pa.Table = cat.read_table(name, as_of=as_of)
            return result
    from millstream.table.spark_source import read_dataframe

    if table is None:
        raise TypeError("read_table(spark, table): the table name is missing")
    settings = catalog.settings if catalog is not None else None
    return read_dataframe(table_or_spark, table, home=home, as_of=as_of, settings=settings)
