"""The Spark batch source (``millstream.read_table(spark, ...)``,
``spark.read.format("millstream")``): a query reads the merged current rows, or an older
version with ``asOf``, and pins the version it planned so that retention keeps it for the
query's tasks; a bad option names itself."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

import millstream
from millstream.catalog import Catalog
from millstream.spark.table_source import register
from millstream.spec import OFFSET_COL, PARTITION_COL, TOMBSTONE_COL, TableSpec
from millstream.table.writer import commit_staged, stage_rows

pytestmark = pytest.mark.spark

TABLE = "orders"
SPEC = {
    "name": TABLE,
    "schema": {"id": "long", "status": "string"},
    "primary_key": ["id"],
    "mode": "upsert",
}


def _commit(cat: Catalog, spec: TableSpec, start: int, rows: list[tuple[int, str | None]]) -> None:
    """Commit ``rows`` (id, status; None status: a tombstone) at offsets from ``start`` of
    partition 0."""
    n = len(rows)
    data = pa.table(
        {
            "id": [r[0] for r in rows],
            "status": [r[1] for r in rows],
            PARTITION_COL: pa.array([0] * n, pa.int32()),
            OFFSET_COL: list(range(start, start + n)),
            TOMBSTONE_COL: [r[1] is None for r in rows],
        }
    ).cast(spec.arrow_schema(system_columns=True))
    staged = stage_rows(cat.deep, spec, data, name_hint="test")
    out = commit_staged(cat.store, cat.deep, TABLE, staged, {0: (start, start + n)}, {})
    assert out.version is not None


def _rows(df: Any) -> list[tuple[int, str]]:
    return sorted((int(r["id"]), r["status"]) for r in df.collect())


@pytest.fixture
def cat(tmp_path: Path) -> Any:
    with Catalog.open(home=tmp_path / "home") as catalog:
        spec = catalog.create_table(SPEC).spec
        _commit(catalog, spec, 0, [(1, "new"), (2, "new"), (3, "new")])  # version 1
        _commit(catalog, spec, 3, [(2, "paid"), (3, None), (4, "new")])  # version 2
        yield catalog


def test_a_query_reads_the_merged_rows_and_pins_the_version_it_planned(
    spark: SparkSession, cat: Catalog
) -> None:
    before = time.time()
    current = millstream.read_table(spark, TABLE, catalog=cat)

    assert _rows(current) == [(1, "new"), (2, "paid"), (4, "new")]
    pins = cat.store.list_pins(TABLE)
    assert [(p.version, p.holder) for p in pins] == [(2, "spark read")]
    assert before + 3500 < pins[0].expires_at < time.time() + 3700  # an hour, by default

    older = millstream.read_table(spark, TABLE, catalog=cat, as_of=1)
    assert _rows(older) == [(1, "new"), (2, "new"), (3, "new")]
    assert sorted(p.version for p in cat.store.list_pins(TABLE)) == [1, 2]


def test_pin_seconds_sets_how_long_and_a_bad_value_names_the_option(
    spark: SparkSession, cat: Catalog
) -> None:
    register(spark)
    reader = spark.read.format("millstream").options(**cat.settings.as_options())
    before = time.time()
    assert len(reader.option("pinSeconds", "60").load(TABLE).collect()) == 3
    (pin,) = cat.store.list_pins(TABLE)
    assert before + 50 < pin.expires_at < time.time() + 70

    with pytest.raises(Exception, match="invalid pinSeconds: must be positive"):
        reader.option("pinSeconds", "-5").load(TABLE).collect()


def test_a_filter_on_a_key_narrows_the_merge_and_one_on_another_column_waits_for_it(
    spark: SparkSession, cat: Catalog
) -> None:
    """Key 2 was 'new', then 'paid': a filter on status must see the merged row (no 'new'
    for key 2), and one on the key gives that key's merged row."""
    df = millstream.read_table(spark, TABLE, catalog=cat)

    assert _rows(df.filter("status = 'new'")) == [(1, "new"), (4, "new")]
    assert _rows(df.filter("id = 2")) == [(2, "paid")]
    assert _rows(df.filter("id in (2, 3, 4)")) == [(2, "paid"), (4, "new")]


@pytest.mark.parametrize(
    "table",
    [
        {"primary_key": [], "mode": "append"},
        {"primary_key": ["id"], "mode": "upsert", "partitioned_by_key": True},
    ],
    ids=["append", "upsert-partitioned-by-key"],
)
def test_an_append_or_partitioned_by_key_table_is_read_by_one_task_per_partition(
    spark: SparkSession, tmp_path: Path, table: dict[str, Any]
) -> None:
    with Catalog.open(home=tmp_path / "append-home") as catalog:
        spec = catalog.create_table({**SPEC, "name": "clicks", **table}).spec
        for p in range(3):
            n = 4
            data = pa.table(
                {
                    "id": list(range(p * 10, p * 10 + n)),
                    "status": ["x"] * n,
                    PARTITION_COL: pa.array([p] * n, pa.int32()),
                    OFFSET_COL: list(range(n)),
                    TOMBSTONE_COL: [False] * n,
                }
            ).cast(spec.arrow_schema(system_columns=True))
            staged = stage_rows(catalog.deep, spec, data, name_hint="test")
            commit_staged(catalog.store, catalog.deep, "clicks", staged, {p: (0, n)}, {})

        df = millstream.read_table(spark, "clicks", catalog=catalog)

        assert df.rdd.getNumPartitions() == 3
        assert sorted(int(r["id"]) for r in df.collect()) == [
            i for p in range(3) for i in range(p * 10, p * 10 + 4)
        ]
        assert sorted(int(r["id"]) for r in df.filter("id >= 20").collect()) == [20, 21, 22, 23]


def test_decimal_and_nested_columns_read_into_spark_with_their_types(
    spark: SparkSession, tmp_path: Path
) -> None:
    from decimal import Decimal

    schema = {
        "id": "long",
        "price": "decimal(10,2)",
        "items": "list<struct<sku:string,qty:int>>",
        "attrs": "map<string,long>",
    }
    with Catalog.open(home=tmp_path / "home") as cat:
        spec = cat.create_table(
            {"name": "nested", "schema": schema, "primary_key": ["id"], "mode": "upsert"}
        ).spec
        data = pa.Table.from_pylist(
            [
                {
                    "id": 1,
                    "price": Decimal("12.34"),
                    "items": [{"sku": "x", "qty": 2}],
                    "attrs": [("w", 3)],
                    PARTITION_COL: 0,
                    OFFSET_COL: 0,
                    TOMBSTONE_COL: False,
                },
                {"id": 2, PARTITION_COL: 0, OFFSET_COL: 1, TOMBSTONE_COL: False},
            ],
            schema=spec.arrow_schema(system_columns=True),
        )
        staged = stage_rows(cat.deep, spec, data, name_hint="test")
        commit_staged(cat.store, cat.deep, "nested", staged, {0: (0, 2)}, {})
        df = millstream.read_table(spark, "nested", catalog=cat)
        assert df.schema.simpleString() == (
            "struct<id:bigint,price:decimal(10,2),items:array<struct<sku:string,qty:int>>,"
            "attrs:map<string,bigint>>"
        )
        rows = sorted(df.collect(), key=lambda r: r["id"])
    assert rows[0]["price"] == Decimal("12.34")
    assert [(i["sku"], i["qty"]) for i in rows[0]["items"]] == [("x", 2)]
    assert rows[0]["attrs"] == {"w": 3}
    assert (rows[1]["price"], rows[1]["items"], rows[1]["attrs"]) == (None, None, None)
