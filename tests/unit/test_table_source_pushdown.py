"""What the ``millstream`` Spark source takes from Spark's filters, without a JVM: Spark's
planning calls ``pushFilters``, then ``partitions`` and ``read`` on the same reader, as here.
Only conditions that cannot change the merged answer are applied before the merge."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.datasource import EqualTo, GreaterThan, In, IsNull

from millstream.catalog import Catalog
from millstream.spark.table_source import MillstreamDataSource, PushdownReader
from millstream.spec import OFFSET_COL, PARTITION_COL, TOMBSTONE_COL
from millstream.table.read import check_conditions
from millstream.table.writer import commit_staged, stage_rows

SPEC = {
    "name": "orders",
    "schema": {"id": "long", "status": "string", "at": "timestamp"},
    "primary_key": ["id"],
    "mode": "upsert",
}


@pytest.fixture
def cat(tmp_path: Path) -> Iterator[Catalog]:
    with Catalog.open(home=tmp_path / "home") as catalog:
        yield _filled(catalog)


def _filled(catalog: Catalog) -> Catalog:
    spec = catalog.create_table(SPEC).spec
    for start, rows in ((0, [(1, "new"), (2, "new")]), (2, [(2, "paid"), (3, "new")])):
        data = pa.table(
            {
                "id": [r[0] for r in rows],
                "status": [r[1] for r in rows],
                "at": pa.array([None] * len(rows), pa.timestamp("us", tz="UTC")),
                PARTITION_COL: pa.array([0] * len(rows), pa.int32()),
                OFFSET_COL: list(range(start, start + len(rows))),
                TOMBSTONE_COL: [False] * len(rows),
            }
        ).cast(spec.arrow_schema(system_columns=True))
        staged = stage_rows(catalog.deep, spec, data, name_hint="t")
        commit_staged(catalog.store, catalog.deep, "orders", staged, {0: (start, start + 2)}, {})
    return catalog


def reader(cat: Catalog) -> PushdownReader:
    options = {"path": "orders", "pushFilters": "true", **cat.settings.as_options()}
    r = MillstreamDataSource(options).reader(None)  # type: ignore[arg-type]
    assert isinstance(r, PushdownReader)
    return r


def test_key_filters_are_applied_before_the_merge_and_others_are_left_to_spark(
    cat: Catalog,
) -> None:
    r = reader(cat)
    filters = [
        EqualTo(("status",), "new"),  # not a key: applying it first would bring back 2 'new'
        In(("id",), (2, 3)),
        GreaterThan(("id",), 1),
        IsNull(("at",)),  # a timestamp column: left to Spark
    ]
    assert list(r.pushFilters(filters)) == filters  # Spark still applies every filter
    assert r.conditions == [("id", "in", (2, 3)), ("id", ">", 1)]

    (task,) = r.partitions()
    rows = pa.Table.from_batches(list(r.read(task)))
    assert sorted(zip(rows["id"].to_pylist(), rows["status"].to_pylist(), strict=True)) == [
        (2, "paid"),
        (3, "new"),
    ]


def test_a_condition_on_a_value_column_of_a_keyed_table_is_refused(cat: Catalog) -> None:
    spec = cat.table("orders").spec
    with pytest.raises(ValueError, match="cannot be applied before merging"):
        check_conditions(spec, [("status", "==", "new")])
    with pytest.raises(ValueError, match="not in table"):
        check_conditions(spec, [("nope", "==", 1)])
    with pytest.raises(ValueError, match="a key's rows may span partitions"):
        cat.read_table("orders", partitions=[0])
