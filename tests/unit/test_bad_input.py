"""Bad specs and bad reads fail loudly, name the offending field, and write nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import millstream
from millstream.catalog import Catalog
from millstream.errors import InvalidSpecError, TableNotFoundError
from millstream.table.writer import stage_rows

GOOD = {
    "name": "orders",
    "schema": {"id": "string", "amount": "long", "deleted": "boolean", "note": "string"},
    "primary_key": ["id"],
    "mode": "upsert",
}


def spec_with(**changes: Any) -> dict[str, Any]:
    return {**GOOD, **changes}


@pytest.fixture
def cat(tmp_path: Path) -> Iterator[Catalog]:
    with Catalog.open(home=tmp_path / "home") as catalog:
        yield catalog


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        pytest.param(spec_with(name="a/b"), "table.name", id="name_with_slash"),
        pytest.param(spec_with(name="a\\b"), "table.name", id="name_with_backslash"),
        pytest.param(spec_with(name=".."), "table.name", id="name_dot_dot"),
        pytest.param(spec_with(name="a..b"), "table.name", id="name_containing_dot_dot"),
        pytest.param(spec_with(name=""), "table.name", id="empty_name"),
        pytest.param(spec_with(name="a" * 129), "table.name", id="name_of_129_chars"),
        pytest.param(spec_with(mode="merge"), "table.mode", id="unknown_merge_engine"),
        pytest.param(spec_with(primary_key=["nope"]), "table.primary_key", id="key_not_in_schema"),
        pytest.param(spec_with(primary_key=[]), "table.primary_key", id="upsert_without_key"),
        pytest.param(
            spec_with(delete_column="note"), "table.delete_column", id="delete_column_not_boolean"
        ),
        pytest.param(
            spec_with(mode="partial", partial={"nope": "sum"}),
            "table.partial.nope",
            id="partial_strategy_on_missing_column",
        ),
    ],
)
def test_invalid_table_spec_names_the_field_and_writes_nothing(
    cat: Catalog, spec: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidSpecError) as info:
        cat.create_table(spec)
    assert info.value.field == field
    assert field in str(info.value)
    assert cat.store.list_tables() == []
    assert cat.deep.list_files("") == []


def test_a_name_of_128_chars_is_accepted(cat: Catalog) -> None:
    cat.create_table(spec_with(name="a" * 128))
    assert [t.name for t in cat.store.list_tables()] == ["a" * 128]


def test_reading_an_unknown_table_names_it(cat: Catalog) -> None:
    with pytest.raises(TableNotFoundError) as info:
        cat.read_table("no_such_table")
    assert info.value.name == "no_such_table"
    assert "no_such_table" in str(info.value)


def test_top_level_read_of_an_unknown_table_names_it(tmp_path: Path) -> None:
    with pytest.raises(TableNotFoundError, match="no_such_table"):
        millstream.read_table("no_such_table", home=tmp_path / "home")


def test_reading_a_path_like_table_name_is_refused_as_invalid(cat: Catalog) -> None:
    with pytest.raises(InvalidSpecError) as info:
        cat.read_table("../orders")
    assert info.value.field == "table"


def test_as_of_beyond_the_latest_version_is_invalid(cat: Catalog) -> None:
    cat.create_table(GOOD)
    assert cat.read_table("orders", as_of=0).num_rows == 0
    with pytest.raises(InvalidSpecError) as info:
        cat.read_table("orders", as_of=1)
    assert info.value.field == "as_of"
    assert "0..0" in str(info.value)


def test_staging_a_row_that_is_not_a_delete_without_the_comparison_value_is_refused(
    cat: Catalog,
) -> None:
    """Decode dead-letters such records, so only a writer bypassing it could stage one; the
    error names the column and where the row is, and no file is written."""
    spec = cat.create_table(spec_with(comparison_column="amount", delete_column="deleted")).spec
    system = {"_ms_partition": 3, "_ms_tombstone": False}
    rows = pa.Table.from_pylist(
        [
            {"id": "a", "amount": None, "deleted": True, "_ms_offset": 7, **system},  # a delete
            {"id": "b", "amount": None, "deleted": False, "_ms_offset": 8, **system},
        ],
        schema=spec.arrow_schema(system_columns=True),
    )

    with pytest.raises(InvalidSpecError) as info:
        stage_rows(cat.deep, spec, rows)

    assert info.value.field == "rows.amount"
    assert "partition 3 offset 8" in str(info.value)
    assert "comparison column 'amount' is null" in str(info.value)
    assert cat.deep.list_files("tables/orders") == []


@pytest.mark.parametrize(
    ("value", "column"),
    [
        pytest.param(b'{"id": 1, "qty": 2147483648}', "qty", id="int_overflow"),
        pytest.param(b'{"id": 1, "qty": 1.5}', "qty", id="fraction_for_int"),
        pytest.param(b'{"id": 1, "total": 1e400}', "total", id="double_out_of_range"),
        pytest.param(b'{"id": 1, "qty": 2, "ok": 3}', "ok", id="number_for_boolean"),
        pytest.param(b'{"id": 99999999999999999999}', "id", id="long_overflow"),
    ],
)
def test_a_json_value_that_does_not_fit_its_column_dead_letters_naming_the_column(
    value: bytes, column: str
) -> None:
    """Arrow's JSON reader names the value only (``Failed to convert JSON to int32,
    couldn't parse:2147483648``); the dead-letter reason names the column first."""
    from millstream.ingest.decode import decode_records
    from millstream.spec import TableSpec

    spec = TableSpec.parse(
        {"name": "t", "schema": {"id": "long", "qty": "int", "total": "double", "ok": "boolean"}}
    )
    good = b'{"id": 2, "qty": 3, "total": 1.5, "ok": true}'
    raw = pa.table(
        {
            "partition": pa.array([0, 0], pa.int32()),
            "offset": pa.array([0, 1], pa.int64()),
            "key": pa.array([None, None], pa.binary()),
            "value": pa.array([value, good], pa.binary()),
        }
    )
    decoded = decode_records(spec, raw)
    assert decoded.rows.column("id").to_pylist() == [2], "the good record is kept"
    [(partition, offset, _, _, error)] = decoded.dead
    assert (partition, offset) == (0, 0)
    assert error.startswith(f"column {column!r}: "), error
