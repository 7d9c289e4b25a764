"""Decimal, list, struct and map columns through every merge engine, on the production
commit path (stage + commit, as a writer does), read fresh, after a seal and after a second
seal, and compared with the sequential model."""

from __future__ import annotations

import random
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import millstream
from millstream.catalog import Catalog
from millstream.errors import InvalidSpecError
from millstream.metastore.models import SegmentState
from millstream.reference.model import canonical, model_rows
from millstream.sealing.sealer import Sealer
from millstream.spec import TableSpec
from millstream.table.writer import commit_staged, stage_rows

SCHEMA = {
    "k": "long",
    "d": "boolean",
    "price": "decimal(10,2)",
    "tags": "list<string>",
    "attrs": "map<string,long>",
    "addr": "struct<city:string,zip:int>",
    "items": "list<struct<sku:string,qty:int,unit:decimal(6,3)>>",
}
ENGINES: dict[str, dict[str, Any]] = {
    "append": {"mode": "append"},
    "dedup": {"mode": "dedup", "primary_key": ["k"], "delete_column": "d"},
    # a decimal orders the rows of a key
    "upsert": {
        "mode": "upsert",
        "primary_key": ["k"],
        "delete_column": "d",
        "comparison_column": "price",
    },
    "partial": {
        "mode": "partial",
        "primary_key": ["k"],
        "delete_column": "d",
        "partial": {
            "price": "max",
            "tags": "overwrite",
            "attrs": "ignore_null",
            "addr": "overwrite",
            "items": "ignore_null",
        },
    },
}


def _value(rnd: random.Random) -> dict[str, Any]:
    def maybe(v: Any) -> Any:
        return None if rnd.random() < 0.3 else v

    return {
        "price": Decimal(rnd.randrange(-(10**6), 10**6)) / 100,
        "tags": maybe([rnd.choice("abc") for _ in range(rnd.randrange(3))]),
        "attrs": maybe([(f"a{j}", rnd.choice([None, rnd.randrange(99)])) for j in range(2)]),
        "addr": maybe({"city": rnd.choice(["Oslo", None]), "zip": rnd.randrange(9999)}),
        "items": maybe(
            [
                {"sku": f"s{j}", "qty": j, "unit": Decimal(rnd.randrange(10**6)) / 1000}
                for j in range(rnd.randrange(1, 3))
            ]
        ),
    }


class Feed:
    def __init__(self, cat: Catalog, spec: TableSpec) -> None:
        self.cat, self.spec, self.rnd = cat, spec, random.Random(7)
        self.rows: list[dict[str, Any]] = []
        self.pos: dict[int, int] = {}

    def batch(self, partition: int, n: int) -> None:
        lo = self.pos.get(partition, 0)
        rows = [
            {
                "k": self.rnd.randrange(4) * 2 + partition,
                "d": self.rnd.random() < 0.1,
                **_value(self.rnd),
                "_ms_partition": partition,
                "_ms_offset": o,
                "_ms_tombstone": False,
            }
            for o in range(lo, lo + n)
        ]
        table = pa.Table.from_pylist(rows, schema=self.spec.arrow_schema(system_columns=True))
        staged = stage_rows(self.cat.deep, self.spec, table)
        commit_staged(
            self.cat.store, self.cat.deep, "t", staged, {partition: (lo, lo + n)}, {partition: 0}
        )
        self.rows += rows
        self.pos[partition] = lo + n

    def check(self) -> list[dict[str, Any]]:
        got = self.cat.read_table("t")
        assert got.schema.field("price").type == pa.decimal128(10, 2)
        assert got.schema.field("attrs").type == pa.map_(pa.string(), pa.int64())
        rows = got.to_pylist()
        assert canonical(rows) == canonical(model_rows(self.spec, self.rows))
        return rows


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_nested_and_decimal_columns_round_trip_through_every_engine_and_sealing(
    tmp_path: Path, engine: str
) -> None:
    spec = TableSpec.parse({"name": "t", "schema": SCHEMA, **ENGINES[engine]})
    with Catalog.open(home=tmp_path) as cat:
        cat.create_table(spec)
        feed = Feed(cat, spec)
        for _ in range(3):
            feed.batch(0, 25)
            feed.batch(1, 20)
        fresh = feed.check()
        assert any(r["items"] for r in fresh) and any(r["attrs"] for r in fresh)
        sealer = Sealer(cat, "t")
        assert sealer.seal_partition(0, force=True) is not None
        feed.check()
        feed.batch(0, 30)
        assert sealer.seal_partition(0, force=True) is not None
        states = [e.state for e in cat.manifest("t").entries if e.partition == 0]
        assert states and all(s is SegmentState.ONLINE for s in states)
        rows = feed.check()
    # the top-level read (no Spark) gives the same rows
    top = millstream.read_table("t", home=tmp_path)
    assert canonical(top.to_pylist()) == canonical(rows)


def test_partial_keeps_the_last_non_null_nested_value_and_the_largest_decimal(
    tmp_path: Path,
) -> None:
    spec = TableSpec.parse({"name": "t", "schema": SCHEMA, **ENGINES["partial"]})
    rows = [
        {"k": 1, "price": Decimal("5.00"), "tags": ["a"], "attrs": [("x", 1)], "items": None},
        {
            "k": 1,
            "price": Decimal("2.50"),
            "tags": None,
            "attrs": None,
            "addr": {"city": "Oslo", "zip": 1},
        },
    ]
    table = pa.Table.from_pylist(
        [
            {**r, "_ms_partition": 0, "_ms_offset": i, "_ms_tombstone": False}
            for i, r in enumerate(rows)
        ],
        schema=spec.arrow_schema(system_columns=True),
    )
    with Catalog.open(home=tmp_path) as cat:
        cat.create_table(spec)
        commit_staged(
            cat.store, cat.deep, "t", stage_rows(cat.deep, spec, table), {0: (0, 2)}, {0: 0}
        )
        (row,) = cat.read_table("t").to_pylist()
    assert row["price"] == Decimal("5.00")  # max
    assert row["tags"] is None  # overwrite takes the newest, even null
    assert row["attrs"] == [("x", 1)]  # ignore_null keeps the last non-null
    assert row["addr"] == {"city": "Oslo", "zip": 1}


def test_staging_a_decimal_that_overflows_its_precision_is_refused(tmp_path: Path) -> None:
    spec = TableSpec.parse({"name": "t", "schema": {"k": "long", "price": "decimal(5,2)"}})
    wide = pa.array([Decimal("1.00"), Decimal("1000.00")], pa.decimal128(6, 2))
    table = pa.table(
        {
            "k": pa.array([1, 2], pa.int64()),
            "price": wide.view(pa.decimal128(5, 2)),  # as Arrow's JSON reader can build it
            "_ms_partition": pa.array([0, 0], pa.int32()),
            "_ms_offset": pa.array([0, 1], pa.int64()),
            "_ms_tombstone": pa.array([False, False]),
        }
    )
    with Catalog.open(home=tmp_path) as cat:
        cat.create_table(spec)
        with pytest.raises(InvalidSpecError) as info:
            stage_rows(cat.deep, spec, table)
        assert info.value.field == "rows.price"
        assert "1000.00 does not fit decimal(5,2)" in str(info.value)
        assert cat.read_table("t").num_rows == 0
