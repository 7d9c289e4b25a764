"""Avro values: a writer schema (from the registry by id, or a fixed one) decoded with
fastavro, one C-level read per record, into one Arrow array per column.

Columns are matched by field name against the writer schema once per schema (not per
record): a column the schema lacks is null, fields the table lacks are ignored, and a field
whose Avro type cannot become the column's type makes every record of that schema bad, naming
the field. Each record must be read to its last byte: trailing bytes or a short read mean the
payload does not belong to that schema.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import fastavro
import numpy as np
import pyarrow as pa

from millstream.ingest.formats.fit import Parsed, assemble, drop_rows
from millstream.spec import TableSpec

#: Avro primitive / logical types -> the Arrow type their fastavro values are built as.
_PRIMITIVE: dict[str, pa.DataType] = {
    "string": pa.string(),
    "long": pa.int64(),
    "int": pa.int32(),
    "double": pa.float64(),
    "float": pa.float32(),
    "boolean": pa.bool_(),
    "bytes": pa.binary(),
    "enum": pa.string(),
    "fixed": pa.binary(),
    "timestamp-millis": pa.timestamp("us", tz="UTC"),
    "timestamp-micros": pa.timestamp("us", tz="UTC"),
    "date": pa.date32(),
    "uuid": pa.string(),
}

#: Which source types a column type accepts (besides its own): numbers widen, a string may
#: hold a timestamp or date (ISO-8601, checked per value), bytes and strings fill binary.
_ACCEPTS: dict[str, set[str]] = {
    "string": {"string", "enum", "uuid"},
    "long": {"long", "int"},
    "int": {"int", "long"},  # a long that fits (checked per value)
    "double": {"double", "float", "long", "int"},
    "boolean": {"boolean"},
    "timestamp": {"timestamp-millis", "timestamp-micros", "string"},
    "date": {"date", "string"},
    "binary": {"bytes", "fixed", "string"},
}


def _avro_kind(t: Any) -> tuple[str | None, bool]:
    """The kind of an Avro field type (a primitive, logical type, enum, fixed; None for
    anything else) and whether it may be null."""
    nullable = False
    if isinstance(t, list):
        rest = [b for b in t if b != "null"]
        nullable = len(rest) < len(t)
        if len(rest) != 1:
            return None, nullable
        t = rest[0]
    if isinstance(t, dict):
        logical = t.get("logicalType")
        if logical in _PRIMITIVE:
            return str(logical), nullable
        inner = t.get("type")
        if inner in ("enum", "fixed"):
            return str(inner), nullable
        if isinstance(inner, str) and inner in _PRIMITIVE and not logical:
            return inner, nullable
        return None, nullable
    if isinstance(t, str) and t in _PRIMITIVE:
        return t, nullable
    return None, nullable


def _type_name(t: Any) -> str:
    return json.dumps(t, separators=(",", ":")) if not isinstance(t, str) else t


@dataclass
class AvroSchemaPlan:
    """How one writer schema fills the table's columns."""

    parsed: Any
    fields: list[str]  # the schema's fields that are table columns, in column order
    types: list[pa.DataType]
    mismatch: str | None  # every record of this schema is bad for this reason

    @classmethod
    def of(cls, spec: TableSpec, schema: Any) -> AvroSchemaPlan:
        if isinstance(schema, str):
            schema = json.loads(schema)
        parsed = fastavro.parse_schema(schema)
        if not isinstance(schema, dict) or schema.get("type") != "record":
            return cls(parsed, [], [], "the Avro schema is not a record")
        by_name = {f["name"]: f["type"] for f in schema.get("fields", [])}
        fields: list[str] = []
        types: list[pa.DataType] = []
        for c, t in spec.columns.items():
            if c not in by_name:
                continue
            kind, _ = _avro_kind(by_name[c])
            if kind is None or kind not in _ACCEPTS[t]:
                return cls(
                    parsed,
                    [],
                    [],
                    f"field {c!r}: Avro type {_type_name(by_name[c])} does not fit column "
                    f"{c!r} ({t})",
                )
            fields.append(c)
            types.append(_PRIMITIVE[kind])
        return cls(parsed, fields, types, None)


def decode_avro(
    spec: TableSpec, plan: AvroSchemaPlan, payloads: list[bytes], positions: np.ndarray
) -> Parsed:
    """Decode ``payloads`` (value ``positions[i]`` of the batch) with one writer schema."""
    if plan.mismatch is not None:
        return Parsed(
            spec.arrow_schema().empty_table(),
            np.zeros(0, dtype=np.int64),
            {int(p): plan.mismatch for p in positions},
        )
    reader = fastavro.schemaless_reader
    schema = plan.parsed
    records: list[Any] = []
    ok: list[int] = []
    bad: dict[int, str] = {}
    for i, payload in enumerate(payloads):
        buf = io.BytesIO(payload)
        try:
            rec = reader(buf, schema, None)
        except EOFError:
            bad[int(positions[i])] = "truncated: the Avro payload ends inside the record"
            continue
        except IndexError:  # a varint cut short, or a union/enum index out of range
            bad[int(positions[i])] = (
                "truncated or corrupt: the Avro payload ends inside a number or holds an "
                "index out of range"
            )
            continue
        except Exception as exc:  # fastavro raises ValueError, IndexError ... on corrupt data
            bad[int(positions[i])] = f"not valid Avro for its schema: {type(exc).__name__}: {exc}"
            continue
        if buf.tell() != len(payload):
            bad[int(positions[i])] = (
                f"not valid Avro for its schema: {len(payload) - buf.tell()} bytes left over "
                "after the record"
            )
            continue
        records.append(rec)
        ok.append(i)
    n = len(records)
    columns: dict[str, pa.Array] = {}
    if plan.fields and n:
        get = itemgetter(*plan.fields)
        rows = [get(r) for r in records]
        cols = zip(*rows, strict=True) if len(plan.fields) > 1 else [tuple(rows)]
        for name, t, values in zip(plan.fields, plan.types, cols, strict=True):
            columns[name] = pa.array(values, t)
    table, errors = assemble(spec, n, columns)
    kept = positions[np.asarray(ok, dtype=np.int64)] if ok else np.zeros(0, dtype=np.int64)
    return drop_rows(Parsed(table, kept, bad), errors)
