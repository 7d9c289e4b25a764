"""JSON values, vectorized: a whole batch in one ``pyarrow.json`` call.

When that fails (a malformed record somewhere), the batch is bisected until each bad record is
isolated, so the cost stays close to vectorized even with a few bad records per batch. The
plain ``json`` format (:func:`parse_json`) and the Debezium envelope
(:mod:`millstream.ingest.formats.debezium`) both parse this way.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, date, datetime
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from math import isfinite
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from millstream.ingest.formats.fit import Parsed, assemble, drop_rows, fit_values
from millstream.spec import TableSpec
from millstream.types import (
    DecimalType,
    ListType,
    MapType,
    Scalar,
    StructType,
    Type,
    arrow_type,
    parse_type,
)

#: Columns parsed as JSON strings first, then cast (pyarrow.json cannot parse these directly).
VIA_STRING = {"timestamp", "date", "binary"}


def _read_as(t: pa.DataType) -> pa.DataType:
    """The type ``pyarrow.json`` reads a nested column as: dates and binaries inside it as
    strings (cast afterwards), the rest as they are (decimals from numbers or strings)."""
    if t in (pa.date32(), pa.binary()):
        return pa.string()
    if pa.types.is_list(t):
        return pa.list_(_read_as(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _read_as(f.type)) for f in t])
    return t


@lru_cache(maxsize=4096)
def _has_map(t: pa.DataType) -> bool:
    """``pyarrow.json`` cannot read a map: columns holding one are read per record."""
    if pa.types.is_map(t):
        return True
    return any(_has_map(t.field(i).type) for i in range(t.num_fields))


def json_schema(spec: TableSpec, columns: list[str] | None = None) -> pa.Schema:
    """The schema ``pyarrow.json`` reads ``columns`` (default: every column of ``spec``) with."""
    names = list(spec.columns) if columns is None else columns
    return _json_schema(tuple((c, spec.columns[c]) for c in names))


@lru_cache(maxsize=4096)
def _json_schema(columns: tuple[tuple[str, str], ...]) -> pa.Schema:
    """:func:`json_schema` of ``(name, column type)`` pairs, made once per process for each
    (an Arrow schema is immutable), not at every table's decode in every write task."""
    return pa.schema(
        [
            pa.field(c, pa.string() if t in VIA_STRING else _read_as(arrow_type(t)))
            for c, t in columns
        ]
    )


def _conform(v: Any, t: Type, path: str) -> Any:
    """A JSON value (from ``json.loads`` with decimal floats) as the Python value of type
    ``t``; a ValueError naming ``path`` if its shape is not ``t``'s (a string where a list
    belongs is refused, never split into characters)."""
    if v is None:
        return None
    if isinstance(t, ListType):
        if not isinstance(v, list):
            raise ValueError(f"{path}: expected a list, got {type(v).__name__}")
        return [_conform(x, t.element, f"{path}[{i}]") for i, x in enumerate(v)]
    if isinstance(t, MapType):
        if not isinstance(v, dict):
            raise ValueError(f"{path}: expected an object (map), got {type(v).__name__}")
        return [(k, _conform(x, t.value, f"{path}.{k}")) for k, x in v.items()]
    if isinstance(t, StructType):
        if not isinstance(v, dict):
            raise ValueError(f"{path}: expected an object (struct), got {type(v).__name__}")
        return {n: _conform(v.get(n), ft, f"{path}.{n}") for n, ft in t.fields}
    if isinstance(t, DecimalType):
        if isinstance(v, bool) or not isinstance(v, int | float | Decimal | str):
            raise ValueError(f"{path}: expected a number, got {type(v).__name__}")
        try:
            return Decimal(str(v).strip())
        except InvalidOperation:
            raise ValueError(f"{path}: {v!r} is not a number") from None
    return _scalar(v, t, path)


def _scalar(v: Any, t: Scalar, path: str) -> Any:
    name = t.name
    ok = {
        "string": isinstance(v, str),
        "long": isinstance(v, int) and not isinstance(v, bool),
        "int": isinstance(v, int) and not isinstance(v, bool),
        "double": isinstance(v, int | float | Decimal) and not isinstance(v, bool),
        "boolean": isinstance(v, bool),
    }.get(name, isinstance(v, str))
    if not ok:
        raise ValueError(f"{path}: expected {name}, got {type(v).__name__} {v!r}")
    try:
        if name == "double":
            return float(v)
        if name == "timestamp":
            ts = datetime.fromisoformat(v.replace("Z", "+00:00"))
            return ts if ts.tzinfo else ts.replace(tzinfo=UTC)
        if name == "date":
            return date.fromisoformat(v)
    except ValueError:
        raise ValueError(f"{path}: {v!r} is not a valid {name}") from None
    if name == "binary":
        return v.encode()
    return v


def _per_record(
    spec: TableSpec, values: pa.Array, positions: np.ndarray, names: list[str]
) -> tuple[dict[str, pa.Array], dict[int, str]]:
    """Columns ``names`` of the values at ``positions`` (already parsed fine as JSON
    objects), read with ``json.loads`` one record at a time; errors by table position."""
    errors: dict[int, str] = {}
    raw: dict[str, list[Any]] = {c: [] for c in names}
    types = {c: parse_type(spec.columns[c]) for c in names}
    for j, p in enumerate(positions.tolist()):
        obj = json.loads(values[p].as_py(), parse_float=Decimal)
        for c in names:
            try:
                raw[c].append(_conform(obj.get(c), types[c], c))
            except ValueError as exc:
                errors.setdefault(j, f"column {c!r}: {exc}")
                raw[c].append(None)
    out: dict[str, pa.Array] = {}
    for c in names:
        arr, errs = fit_values(raw[c], arrow_type(spec.columns[c]), c)
        for j, e in errs.items():
            errors.setdefault(j, e)
        out[c] = arr
    return out, errors


def _parse_block(values: pa.Array, schema: pa.Schema) -> pa.Table | str:
    """Parse non-null values as one newline-delimited block; an error text on failure."""
    if len(values) == 0:
        return schema.empty_table()
    # Pretty-printed JSON is still one record: newlines are whitespace between tokens.
    flat = pc.replace_substring(values, "\n", " ") if _has_newline(values) else values
    joined = pc.binary_join_element_wise(flat, pa.scalar(b"", pa.binary()), b"\n")
    size = int(np.frombuffer(joined.buffers()[1], dtype=np.int32)[len(joined)])
    try:
        table = pj.read_json(
            pa.BufferReader(joined.buffers()[2].slice(0, size)),
            read_options=pj.ReadOptions(block_size=max(1 << 20, size + 1)),
            parse_options=pj.ParseOptions(
                explicit_schema=schema, unexpected_field_behavior="ignore"
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        return str(exc).removeprefix("JSON parse error: ")
    if table.num_rows != len(values):
        return f"value holds {table.num_rows} JSON objects, expected exactly one"
    return table


def _has_newline(values: pa.Array) -> bool:
    """Whether any value of a binary array holds a newline (one scan of its data buffer)."""
    n = len(values)
    data = values.buffers()[2]
    if n == 0 or data is None:
        return False
    wide = pa.types.is_large_binary(values.type) or pa.types.is_large_string(values.type)
    offsets = np.frombuffer(values.buffers()[1], dtype=np.int64 if wide else np.int32)
    lo, hi = int(offsets[values.offset]), int(offsets[values.offset + n])
    # Bytes under null slots are looked at too: at worst that costs a needless copy.
    body = np.frombuffer(data, dtype=np.uint8, count=hi - lo, offset=lo)
    return bool((body == 10).any())


def parse_robust(
    values: pa.Array, schema: pa.Schema
) -> tuple[pa.Table, np.ndarray, dict[int, str]]:
    """Parse, bisecting around failures: (good rows, their positions, {bad position: error})."""
    good: list[pa.Table] = []
    pieces: list[np.ndarray] = []
    bad: dict[int, str] = {}
    stack = [(0, len(values))]
    while stack:
        lo, hi = stack.pop()
        result = _parse_block(values.slice(lo, hi - lo), schema)
        if isinstance(result, pa.Table):
            good.append(result)
            pieces.append(np.arange(lo, hi, dtype=np.int64))
        elif hi - lo == 1:
            bad[lo] = _explain(values[lo].as_py(), result, schema)
        else:
            mid = (lo + hi) // 2
            stack.append((mid, hi))
            stack.append((lo, mid))
    table = pa.concat_tables(good) if good else schema.empty_table()
    positions = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
    return table, positions, bad


def _explain(raw: bytes | None, arrow_error: str, schema: pa.Schema | None = None) -> str:
    if not raw or not raw.strip():
        return "empty value"
    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        return f"not valid JSON: {exc}"
    if not isinstance(obj, dict):
        return f"expected a JSON object, got {type(obj).__name__}"
    m = _DECIMAL_ERROR.search(arrow_error)
    if m:  # Arrow names the value, not the column: find the column holding it
        wanted = m.group(3)
        column = next((c for c, v in obj.items() if _holds(v, wanted)), "?")
        return (
            f"column {column!r}: {wanted} does not fit decimal({m.group(1)},{m.group(2)}) "
            f"(more fractional digits than its scale; decimals are never rounded)"
        )
    m = _SHAPE_ERROR.search(arrow_error)
    if m:  # a value of the wrong type or shape: name its column first
        top = m.group(1).split("/")[1]
        return f"column {top!r}: {arrow_error}"
    column = _culprit(raw, obj, schema) if schema is not None else None
    if column is not None:  # Arrow names the value only ("Failed to convert JSON to int32")
        return f"column {column!r}: {arrow_error}"
    return arrow_error


def _culprit(raw: bytes, obj: dict[str, Any], schema: pa.Schema) -> str | None:
    """The first column of ``schema`` whose value does not parse as its type: the record is
    read again (as it is, flattened to one line) with one column at a time. A number too big
    for a double fails every such read: its column is the one ``json`` reads as infinite.
    None when no column is to blame."""
    line = raw.replace(b"\n", b" ")

    def fails(fields: list[pa.Field]) -> bool:
        try:
            pj.read_json(
                pa.BufferReader(line),
                parse_options=pj.ParseOptions(
                    explicit_schema=pa.schema(fields), unexpected_field_behavior="ignore"
                ),
            )
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return True
        return False

    present = [f for f in schema if f.name in obj]
    if fails([]):  # the record itself does not parse
        return next(
            (
                f.name
                for f in present
                if isinstance(obj[f.name], float) and not isfinite(obj[f.name])
            ),
            None,
        )
    return next((f.name for f in present if fails([f])), None)


_SHAPE_ERROR = re.compile(r"Column\((/[^)]*)\) changed from")
_DECIMAL_ERROR = re.compile(r"to decimal128\((\d+), (\d+)\): (\S+) requires scale")


def _holds(value: Any, text: str) -> bool:
    """Whether a JSON value is or contains (at any depth) the number ``text``."""
    if isinstance(value, dict):
        return any(_holds(v, text) for v in value.values())
    if isinstance(value, list):
        return any(_holds(v, text) for v in value)
    return not isinstance(value, bool) and str(value) == text


def parse_json(spec: TableSpec, values: pa.Array, columns: list[str] | None = None) -> Parsed:
    """The JSON format: parse with :func:`parse_robust`, then cast the columns read as
    strings (a value that does not cast makes its record bad, naming the column). Only
    ``columns`` (default: all) are read from the values; the others are null."""
    names = list(spec.columns) if columns is None else columns
    slow = [c for c in names if _has_map(arrow_type(spec.columns[c]))]
    fast = [c for c in names if c not in slow]
    parsed, positions, bad = parse_robust(values, json_schema(spec, fast))
    arrays = {c: parsed.column(c) for c in fast}
    slow_errors: dict[int, str] = {}
    if slow:
        more, slow_errors = _per_record(spec, values, positions, slow)
        arrays.update(more)
    table, errors = assemble(spec, len(positions), arrays)
    for j, e in slow_errors.items():
        errors.setdefault(j, e)
    return drop_rows(Parsed(table, positions, bad), errors)
