"""Millstream: reliable nearline ingestion on Apache Spark.

``Catalog``, ``MillstreamError``, ``TableSpec`` and ``read_table`` are imported on first use
(PEP 562): Spark starts a fresh Python process for every streaming query's source runner, and
importing SQLAlchemy and pydantic there for nothing cost about 0.45 s per query start.
"""

from __future__ import annotations

import importlib
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from millstream.catalog import Catalog
    from millstream.errors import MillstreamError
    from millstream.spec import TableSpec

__all__ = ["Catalog", "MillstreamError", "TableSpec", "read_table"]
__version__ = "0.1.0"

_LAZY = {
    "Catalog": "millstream.catalog",
    "MillstreamError": "millstream.errors",
    "TableSpec": "millstream.spec",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'millstream' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


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
        # lazy: `import millstream` stays light (see the module docstring)
        from millstream.catalog import Catalog

        name = table_or_spark
        if catalog is not None:
            return catalog.read_table(name, as_of=as_of)
        with Catalog.open(home=home) as cat:
            return cat.read_table(name, as_of=as_of)
    # lazy: `import millstream` stays light (see the module docstring)
    from millstream.spark.table_source import read_dataframe

    if table is None:
        raise TypeError("read_table(spark, table): the table name is missing")
    settings = catalog.settings if catalog is not None else None
    return read_dataframe(table_or_spark, table, home=home, as_of=as_of, settings=settings)
