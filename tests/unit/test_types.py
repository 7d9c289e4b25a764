"""Column types: the parser's canonical text, Arrow types, its errors (naming the column),
and what a spec refuses where (key, comparison, partial strategies, csv)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from millstream.datastream import DatastreamSpec
from millstream.errors import InvalidSpecError
from millstream.spec import TableSpec
from millstream.types import arrow_type, decimal_overflow, normalize, parse_type


@pytest.mark.parametrize(
    ("text", "canonical", "arrow"),
    [
        ("string", "string", pa.string()),
        ("LONG", "long", pa.int64()),
        (" timestamp ", "timestamp", pa.timestamp("us", tz="UTC")),
        ("decimal(10, 2)", "decimal(10,2)", pa.decimal128(10, 2)),
        ("Decimal( 38 )", "decimal(38,0)", pa.decimal128(38, 0)),
        ("list<int>", "list<int>", pa.list_(pa.int32())),
        ("array< double >", "list<double>", pa.list_(pa.float64())),
        (
            "list<struct<a:long, b : string>>",
            "list<struct<a:long,b:string>>",
            pa.list_(pa.struct([("a", pa.int64()), ("b", pa.string())])),
        ),
        (
            "MAP<STRING, decimal(5,2)>",
            "map<string,decimal(5,2)>",
            pa.map_(pa.string(), pa.decimal128(5, 2)),
        ),
        (
            "struct<Tags:map<string,list<date>>,n:int>",
            "struct<Tags:map<string,list<date>>,n:int>",
            pa.struct([("Tags", pa.map_(pa.string(), pa.list_(pa.date32()))), ("n", pa.int32())]),
        ),
    ],
)
def test_types_parse_to_canonical_text_and_arrow(
    text: str, canonical: str, arrow: pa.DataType
) -> None:
    assert normalize(text) == canonical
    assert normalize(canonical) == canonical  # canonical text is a fixed point
    assert arrow_type(canonical) == arrow
    assert parse_type(text) == parse_type(canonical)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("decimal(40,2)", "decimal precision 40 is above 38"),
        ("decimal(0,0)", "decimal precision 0 is below 1"),
        ("decimal(5,6)", "decimal scale 6 is above its precision 5"),
        ("decimal", "decimal needs a precision"),
        ("decimal(a,2)", "expected a precision"),
        ("varchar", "'varchar' is not a type"),
        ("list<foo>", "'foo' is not a type"),
        ("list<int", "expected '>' but the type ends"),
        ("list<int>>", "unexpected '>'"),
        ("map<long,int>", "map keys must be string, not long"),
        ("map<string>", "expected ','"),
        ("struct<>", "expected a field name"),
        ("struct<a:int,a:long>", "struct field 'a' appears twice"),
        ("struct<a int>", "expected ':'"),
        ("", "the type is empty"),
        ("str$ing", "unexpected '$'"),
    ],
)
def test_bad_types_are_refused_naming_the_column(text: str, message: str) -> None:
    with pytest.raises(InvalidSpecError, match=r"invalid schema\.price: ") as info:
        TableSpec.parse({"name": "t", "schema": {"id": "long", "price": text}})
    assert info.value.field == "schema.price"
    assert message in str(info.value)


def test_a_spec_stores_canonical_types_and_existing_specs_are_unchanged() -> None:
    old = {"name": "t", "schema": {"id": "long", "at": "timestamp", "b": "binary"}}
    spec = TableSpec.parse(old)
    assert spec.to_json_dict()["schema"] == old["schema"]
    new = TableSpec.parse(
        {"name": "t", "schema": {"id": "long", "p": "Decimal(10, 2)", "l": "array<struct<a: int>>"}}
    )
    assert new.to_json_dict()["schema"] == {
        "id": "long",
        "p": "decimal(10,2)",
        "l": "list<struct<a:int>>",
    }
    assert TableSpec.parse(new.to_json_dict()).same_table(new)
    assert new.arrow_schema().field("p").type == pa.decimal128(10, 2)


def _keyed(**extra: Any) -> dict[str, Any]:
    return {
        "name": "t",
        "mode": "partial",
        "primary_key": ["id"],
        "schema": {
            "id": "long",
            "price": "decimal(10,2)",
            "tags": "list<string>",
            "attrs": "map<string,long>",
            "addr": "struct<city:string,zip:string>",
            "note": "string",
        },
        **extra,
    }


@pytest.mark.parametrize(
    ("extra", "field", "message"),
    [
        ({"primary_key": ["price"]}, "table.primary_key", "column 'price' is decimal(10,2)"),
        ({"primary_key": ["tags"]}, "table.primary_key", "column 'tags' is list<string>"),
        ({"comparison_column": "addr"}, "table.comparison_column", "must not be a nested type"),
        ({"partial": {"tags": "max"}}, "table.partial.tags", "max needs an ordered column"),
        ({"partial": {"addr": "min"}}, "table.partial.addr", "min needs an ordered column"),
        ({"partial": {"attrs": "sum"}}, "table.partial.attrs", "sum needs a numeric column"),
        ({"partial": {"price": "sum"}}, "table.partial.price", "sum is not supported for decimal"),
        ({"partial": {"tags": "append"}}, "table.partial.tags", "append needs a string column"),
    ],
)
def test_nested_and_decimal_columns_are_refused_where_they_cannot_work(
    extra: dict[str, Any], field: str, message: str
) -> None:
    with pytest.raises(InvalidSpecError) as info:
        TableSpec.parse(_keyed(**extra))
    assert info.value.field == field
    assert message in str(info.value)


def test_decimal_may_order_a_key_and_every_type_may_overwrite_or_keep_non_null() -> None:
    spec = TableSpec.parse(
        _keyed(
            comparison_column="price",
            partial={"tags": "overwrite", "attrs": "ignore_null", "addr": "overwrite"},
        )
    )
    assert spec.comparison_column == "price"
    TableSpec.parse(_keyed(partial={"price": "max"}))


def test_csv_refuses_nested_columns_naming_them() -> None:
    spec = {
        "name": "orders",
        "source": {"kind": "files", "path": "/tmp/x", "format": "csv"},
        "schema": {"id": "long", "price": "decimal(10,2)", "tags": "list<string>"},
    }
    with pytest.raises(InvalidSpecError) as info:
        DatastreamSpec.parse(spec)
    assert info.value.field == "schema.tags"
    assert "cannot be read from csv" in str(info.value)
    spec["schema"] = {"id": "long", "price": "decimal(10,2)"}
    assert DatastreamSpec.parse(spec).table_spec().columns["price"] == "decimal(10,2)"


def test_decimal_overflow_finds_values_with_too_many_integer_digits_at_any_depth() -> None:
    d = pa.decimal128(5, 2)
    flat = pa.array([Decimal("999.99"), Decimal("-999.99"), None], d)
    assert decimal_overflow(flat).tolist() == [False, False, False]
    # Arrow's JSON reader builds such values without complaint; so can a raw buffer view.
    wide = pa.array([Decimal("1000.00"), Decimal("1.00"), Decimal("-1000.00")], pa.decimal128(6, 2))
    over = wide.view(d)
    assert decimal_overflow(over).tolist() == [True, False, True]
    lists = pa.ListArray.from_arrays(pa.array([0, 1, 1, 3]), over)
    assert decimal_overflow(lists).tolist() == [True, False, True]
    assert decimal_overflow(lists.slice(1)).tolist() == [False, True]
    structs = pa.StructArray.from_arrays([over], names=["p"])
    assert decimal_overflow(structs).tolist() == [True, False, True]
