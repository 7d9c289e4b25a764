"""JSON values, vectorized: a whole batch in one ``pyarrow.json`` call.

When that fails (a malformed record somewhere), the batch is bisected until each bad record is
isolated, so the cost stays close to vectorized even with a few bad records per batch. The
plain ``json`` format (:func:`parse_json`) and the Debezium envelope
(:mod:`millstream.ingest.formats.debezium`) both parse this way.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from millstream.ingest.formats.fit import Parsed, assemble, drop_rows
from millstream.spec import ARROW_TYPES, TableSpec

#: Columns parsed as JSON strings first, then cast (pyarrow.json cannot parse these directly).
VIA_STRING = {"timestamp", "date", "binary"}


def json_schema(spec: TableSpec, columns: list[str] | None = None) -> pa.Schema:
    """The schema ``pyarrow.json`` reads ``columns`` (default: every column of ``spec``) with."""
    names = list(spec.columns) if columns is None else columns
    return pa.schema(
        [
            pa.field(
                c, pa.string() if spec.columns[c] in VIA_STRING else ARROW_TYPES[spec.columns[c]]
            )
            for c in names
        ]
    )


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
            bad[lo] = _explain(values[lo].as_py(), result)
        else:
            mid = (lo + hi) // 2
            stack.append((mid, hi))
            stack.append((lo, mid))
    table = pa.concat_tables(good) if good else schema.empty_table()
    positions = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
    return table, positions, bad


def _explain(raw: bytes | None, arrow_error: str) -> str:
    if not raw or not raw.strip():
        return "empty value"
    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        return f"not valid JSON: {exc}"
    if not isinstance(obj, dict):
        return f"expected a JSON object, got {type(obj).__name__}"
    return arrow_error


def parse_json(spec: TableSpec, values: pa.Array, columns: list[str] | None = None) -> Parsed:
    """The JSON format: parse with :func:`parse_robust`, then cast the columns read as
    strings (a value that does not cast makes its record bad, naming the column). Only
    ``columns`` (default: all) are read from the values; the others are null."""
    names = list(spec.columns) if columns is None else columns
    parsed, positions, bad = parse_robust(values, json_schema(spec, names))
    table, errors = assemble(spec, parsed.num_rows, {c: parsed.column(c) for c in names})
    return drop_rows(Parsed(table, positions, bad), errors)
