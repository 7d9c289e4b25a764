"""The schema evolution rules (``millstream.core.evolution``): what an update of a table's spec
may change, and that a refusal names the field, the column and the rule."""

from __future__ import annotations

from typing import Any

import pytest

from millstream.core.evolution import Change, check_evolution, parse_decimal, widening_refusal
from millstream.errors import IncompatibleChangeError, exit_code, http_status
from millstream.spec import TableSpec

BASE: dict[str, Any] = {
    "name": "orders",
    "mode": "upsert",
    "primary_key": ["id"],
    "comparison_column": "ts",
    "schema": {"id": "long", "ts": "long", "qty": "int", "price": "double", "note": "string"},
}


def spec(**changes: Any) -> TableSpec:
    return TableSpec.parse({**BASE, **changes})


def schema(**changes: str) -> dict[str, str]:
    return {**BASE["schema"], **changes}


def refused(new: TableSpec, old: TableSpec | None = None) -> IncompatibleChangeError:
    with pytest.raises(IncompatibleChangeError) as info:
        check_evolution(old or spec(), new)
    assert "nothing was changed" in info.value.message
    return info.value


def test_the_same_spec_is_no_change() -> None:
    assert check_evolution(spec(), spec()) == []


def test_a_column_added_at_the_end_is_a_compatible_change() -> None:
    changes = check_evolution(spec(), spec(schema=schema(discount="double", tag="string")))
    assert changes == [
        Change("add", "discount", None, "double"),
        Change("add", "tag", None, "string"),
    ]
    assert [c.describe() for c in changes] == [
        "+ column discount double",
        "+ column tag string",
    ]


@pytest.mark.parametrize(("old", "new"), [("int", "long"), ("int", "double")])
def test_lossless_widenings_are_allowed(old: str, new: str) -> None:
    changes = check_evolution(spec(), spec(schema=schema(qty=new)))
    assert changes == [Change("widen", "qty", old, new)]
    assert changes[0].describe() == f"~ column qty int -> {new}"


def test_widening_and_adding_at_once_lists_both_in_column_order() -> None:
    changes = check_evolution(spec(), spec(schema=schema(qty="long", discount="double")))
    assert [c.describe() for c in changes] == [
        "~ column qty int -> long",
        "+ column discount double",
    ]


def test_retention_may_change_as_before() -> None:
    changes = check_evolution(spec(), spec(retention={"time": "7d", "min_versions": 3}))
    assert changes == [Change("retention", None, "24h/10 versions", "7d/3 versions")]


def test_removing_a_column_is_refused_naming_it() -> None:
    cols = schema()
    del cols["note"]
    err = refused(spec(schema=cols))
    assert (err.field, err.column) == ("schema.note", "note")
    assert "cannot be removed or renamed" in err.rule
    assert "column 'note'" in err.message


def test_renaming_a_column_is_refused_as_a_removal() -> None:
    cols = {("remark" if c == "note" else c): t for c, t in schema().items()}
    err = refused(spec(schema=cols))
    assert err.column == "note"
    assert "removed or renamed" in err.rule


def test_reordering_columns_is_refused() -> None:
    cols = dict(schema())
    reordered = {"id": cols["id"], "ts": cols["ts"], "price": cols["price"]}
    reordered |= {"qty": cols["qty"], "note": cols["note"]}
    err = refused(spec(schema=reordered))
    assert err.column == "price"
    assert err.rule == "existing columns cannot be reordered"


def test_a_new_column_before_an_existing_one_is_refused() -> None:
    cols = {"id": "long", "ts": "long", "discount": "double", "qty": "int"}
    cols |= {"price": "double", "note": "string"}
    err = refused(spec(schema=cols))
    assert err.column == "discount"
    assert err.rule == "a new column must be added after every existing column"


def test_narrowing_is_refused() -> None:
    old = spec(schema=schema(qty="long"))
    err = refused(spec(schema=schema(qty="int")), old)
    assert (err.field, err.column) == ("schema.qty", "qty")
    assert err.rule == "narrowing long -> int could lose values"


def test_long_to_double_is_refused_as_lossy() -> None:
    old = spec(schema=schema(qty="long"))
    err = refused(spec(schema=schema(qty="double")), old)
    assert err.column == "qty"
    assert "lossy" in err.rule


@pytest.mark.parametrize("new", ["string", "boolean", "timestamp", "binary"])
def test_changing_the_type_family_is_refused(new: str) -> None:
    err = refused(spec(schema=schema(qty=new)))
    assert err.column == "qty"
    assert err.rule == f"changing the type int -> {new} is not a lossless widening"


def test_double_to_int_is_refused_as_narrowing() -> None:
    err = refused(spec(schema=schema(price="int")))
    assert err.column == "price"
    assert err.rule == "narrowing double -> int could lose values"


def test_a_key_columns_type_cannot_change_even_widened() -> None:
    old = spec(schema={"id": "int", "ts": "long", "qty": "int"})
    err = refused(spec(schema={"id": "long", "ts": "long", "qty": "int"}), old)
    assert (err.column, err.field) == ("id", "schema.id")
    assert "key column cannot change" in err.rule


def test_the_comparison_columns_type_cannot_change() -> None:
    old = spec(schema={"id": "long", "ts": "int", "qty": "int"})
    err = refused(spec(schema={"id": "long", "ts": "long", "qty": "int"}), old)
    assert err.column == "ts"
    assert "comparison column cannot change" in err.rule


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"primary_key": ["id", "ts"]}, "table.primary_key"),
        ({"mode": "dedup"}, "table.mode"),
        ({"comparison_column": None}, "table.comparison_column"),
        ({"delete_column": "gone", "schema": schema(gone="boolean")}, "table.delete_column"),
        ({"partitioned_by_key": True}, "table.partitioned_by_key"),
        ({"name": "orders2"}, "table.name"),
    ],
)
def test_key_and_merge_settings_cannot_change(changes: dict[str, Any], field: str) -> None:
    err = refused(spec(**changes))
    assert err.field == field
    assert err.column is None
    assert "cannot" in err.rule
    assert field in err.message


def test_time_column_and_dedup_ttl_cannot_change() -> None:
    base = {"mode": "dedup", "comparison_column": None, "schema": schema(at="timestamp")}
    old = spec(**base, time_column="at", dedup_ttl="1h")
    assert refused(spec(**base, time_column="at", dedup_ttl="2h"), old).field == "table.dedup_ttl"
    moved = spec(**{**base, "schema": schema(at="timestamp", at2="timestamp")})
    old2 = spec(**{**base, "schema": schema(at="timestamp", at2="timestamp")}, time_column="at")
    assert refused(moved, old2).field == "table.time_column"


def test_a_partial_strategy_may_come_with_a_new_column_but_not_change() -> None:
    base = {"mode": "partial", "comparison_column": None}
    old = spec(**base, partial={"qty": "sum"})
    new = spec(**base, partial={"qty": "sum", "extra": "max"}, schema=schema(extra="long"))
    assert check_evolution(old, new) == [Change("add", "extra", None, "long")]
    err = refused(spec(**base, partial={"qty": "max"}), old)
    assert (err.field, err.column) == ("table.partial.qty", "qty")


@pytest.mark.parametrize(
    ("old", "new", "refusal"),
    [
        ("decimal(10,2)", "decimal(12,2)", None),
        ("decimal(10,2)", "decimal(10,2)", None),
        ("decimal(10, 2)", "DECIMAL(38,2)", None),
        ("decimal(12,2)", "decimal(10,2)", "narrowing decimal(12,2) -> decimal(10,2)"),
        ("decimal(10,2)", "decimal(12,3)", "a decimal's scale cannot change"),
        ("decimal(10,2)", "double", "is not a lossless widening"),
        ("int", "decimal(10,0)", "is not a lossless widening"),
        ("list<int>", "list<long>", "is not a lossless widening"),
        ("struct<a:int>", "struct<a:int,b:int>", "is not a lossless widening"),
    ],
)
def test_widening_rule_on_type_strings(old: str, new: str, refusal: str | None) -> None:
    why = widening_refusal(old, new)
    if refusal is None:
        assert why is None
    else:
        assert why is not None and refusal in why


def test_decimal_types_are_parsed_with_precision_and_scale() -> None:
    assert parse_decimal("decimal(10,2)") == (10, 2)
    assert parse_decimal(" Decimal( 38 , 0 ) ") == (38, 0)
    assert parse_decimal("decimal") is None
    assert parse_decimal("long") is None


def test_the_refusal_is_a_409_and_a_conflict_exit_code() -> None:
    err = refused(spec(schema=schema(qty="string")))
    assert http_status(err) == 409
    assert exit_code(err) == 4
    body = err.to_dict()
    assert body["error"] == "IncompatibleChangeError"
    assert body["column"] == "qty"
    assert body["rule"] == err.rule
    assert body["field"] == "schema.qty"


def test_a_decimal_column_widens_its_precision_and_a_nested_column_may_be_added() -> None:
    old = spec(schema=schema(price="decimal(10,2)"))
    new = spec(schema={**schema(price="decimal(12,2)"), "tags": "list<string>"})
    assert check_evolution(old, new) == [
        Change("widen", "price", "decimal(10,2)", "decimal(12,2)"),
        Change("add", "tags", None, "list<string>"),
    ]
    err = refused(spec(schema=schema(price="decimal(12,3)")), old)
    assert err.column == "price" and "scale" in err.rule
