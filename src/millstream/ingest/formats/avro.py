"""Avro values: a writer schema (from the registry by id, or a fixed one) decoded into one
Arrow array per column.

Columns are matched by field name against the writer schema once per schema (not per
record): a column the schema lacks is null, fields the table lacks are ignored, and a field
whose Avro type cannot become the column's type makes every record of that schema bad, naming
the field. Each record must be read to its last byte: trailing bytes or a short read mean the
payload does not belong to that schema.

Two paths, one behaviour:

* the fast path (:func:`_fast_columns`): a batch's payloads of one schema are wrapped as one
  block of an in-memory Avro object container file and read by polars' native (Rust) Avro
  reader in one call. The block is trusted only when it proves it was read record by record
  as fastavro would: after every record sits a random 62-bit guard (a ``long`` field appended
  to the schema, a fresh value per block) that must read back unchanged, every record's
  canonical encoded size recomputed from its decoded values must equal its payload length,
  every nullable union's branch byte must be the canonical 0 or 1, and every value must be
  one fastavro accepts (enum index in range, dates and timestamps within Python's range).
  Only schemas whose fields are all flat primitives, enums, fixed, the date and timestamp
  logical types, or a union of null and one of those take this path;
* the reference path (:func:`_decode_per_record`): one fastavro ``schemaless_reader`` call per
  record. A block that fails any check is bisected (as JSON is in
  :mod:`millstream.ingest.decode`) down to small pieces, which take the reference path, so
  exactly the bad records are dead-lettered, each with fastavro's reason.
"""

from __future__ import annotations

import io
import json
import secrets
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from functools import partial
from typing import Any

import fastavro
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from millstream.ingest.formats.absorb import WriterField
from millstream.ingest.formats.fit import (
    Parsed,
    all_rejected,
    assemble,
    concat,
    drop_rows,
    fit_values,
)
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


def _fits(t: Any, col: Type) -> bool:
    """Whether Avro type ``t`` (a union with null allowed) can fill a column of type ``col``:
    a decimal from the decimal logical type (bytes or fixed), a list from an array, a struct
    from a record (fields matched by name; a field the record lacks is null), a map from a
    map, and the scalars as :data:`_ACCEPTS` says (without strings inside nested values)."""
    if isinstance(t, list):
        rest = [b for b in t if b != "null"]
        if len(rest) != 1:
            return False
        t = rest[0]
    if isinstance(col, Scalar):
        kind, _ = _avro_kind(t)
        return kind is not None and kind in _ACCEPTS[col.name] - {"string"} | (
            {"string"} if col.name in ("string", "binary") else set()
        )
    if not isinstance(t, dict):
        return False
    base = t.get("type")
    if isinstance(col, DecimalType):
        return t.get("logicalType") == "decimal" and base in ("bytes", "fixed")
    if isinstance(col, ListType):
        return base == "array" and _fits(t.get("items"), col.element)
    if isinstance(col, MapType):
        return base == "map" and _fits(t.get("values"), col.value)
    by_name = {f["name"]: f["type"] for f in t.get("fields", [])} if base == "record" else {}
    return (
        base == "record"
        and any(n in by_name for n, _ in col.fields)
        and all(n not in by_name or _fits(by_name[n], ft) for n, ft in col.fields)
    )


def _type_name(t: Any) -> str:
    return json.dumps(t, separators=(",", ":")) if not isinstance(t, str) else t


@dataclass
class AvroSchemaPlan:
    """How one writer schema fills the table's columns."""

    parsed: Any
    fields: list[str]  # the schema's fields that are table columns, in column order
    types: list[pa.DataType]
    mismatch: str | None  # every record of this schema is bad for this reason
    #: how polars reads this schema (None: only fastavro, per record, does)
    fast: FastPlan | None = None
    #: ``fields[k]`` is the writer's field ``field_index[k]``
    field_index: tuple[int, ...] = ()

    @classmethod
    def of(cls, spec: TableSpec, schema: Any) -> AvroSchemaPlan:
        if isinstance(schema, str):
            schema = json.loads(schema)
        parsed = fastavro.parse_schema(schema)
        if not isinstance(schema, dict) or schema.get("type") != "record":
            return cls(parsed, [], [], "the Avro schema is not a record")
        by_name = {f["name"]: f["type"] for f in schema.get("fields", [])}
        index = {f["name"]: j for j, f in enumerate(schema.get("fields", []))}
        fields: list[str] = []
        types: list[pa.DataType] = []
        for c, t in spec.columns.items():
            if c not in by_name:
                continue
            col = parse_type(t)
            if not isinstance(col, Scalar):
                if not _fits(by_name[c], col):
                    return cls(
                        parsed,
                        [],
                        [],
                        f"field {c!r}: Avro type {_type_name(by_name[c])} does not fit column "
                        f"{c!r} ({t})",
                    )
                fields.append(c)
                types.append(arrow_type(t))
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
        fast = FastPlan.of(schema)
        return cls(parsed, fields, types, None, fast, tuple(index[c] for c in fields))


# -- the fast path: one polars read per block ---------------------------------------------

#: Field kinds the fast path reads, and the Avro type polars is told to read each as: every
#: varint kind as ``long`` (checked and converted here, so no value is accepted that fastavro
#: would refuse) and ``boolean`` as one raw byte (fastavro takes any non-zero byte as true).
_FAST_VARINT = {"long", "int", "enum", "date", "timestamp-millis", "timestamp-micros"}
_FAST_WIDTH = {"double": 8, "float": 4, "boolean": 1}
_FAST_LENGTH = {"string", "bytes"}
_FAST_LOGICAL = {"timestamp-millis": "long", "timestamp-micros": "long", "date": "int"}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: the microseconds (since the epoch) of Python's first and last datetime: fastavro refuses
#: a timestamp outside them, and a date outside Python's range
_MIN_US = (datetime.min.replace(tzinfo=UTC) - _EPOCH) // timedelta(microseconds=1)
_MAX_US = (datetime.max.replace(tzinfo=UTC) - _EPOCH) // timedelta(microseconds=1)
_MIN_DAY = date.min.toordinal() - date(1970, 1, 1).toordinal()
_MAX_DAY = date.max.toordinal() - date(1970, 1, 1).toordinal()
_INT32 = (-(2**31), 2**31 - 1)
#: a block that fails its checks is split until its pieces are this small, then read per record
FAST_LEAF = 16
#: zero bytes after the last guard: a misaligned read runs into them, not off the block
_PAD = bytes(64)


def zigzag(n: int) -> bytes:
    """The Avro encoding of a ``long``."""
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


@dataclass(frozen=True, slots=True)
class _FastField:
    kind: str
    nullable: bool
    null_first: bool
    fixed_size: int = 0
    symbols: tuple[str, ...] = ()


def _fast_field(t: Any) -> _FastField | None:
    """How the fast path reads an Avro field type (None: it does not)."""
    nullable = null_first = False
    if isinstance(t, list):
        if len(t) != 2 or "null" not in t or t[0] == t[1]:
            return None
        nullable, null_first = True, t[0] == "null"
        t = t[1] if null_first else t[0]
    if isinstance(t, str):
        if t in _FAST_VARINT or t in _FAST_WIDTH or t in _FAST_LENGTH:
            return _FastField(t, nullable, null_first)
        return None  # null, or a named type defined elsewhere
    if not isinstance(t, dict):
        return None
    base, logical = t.get("type"), t.get("logicalType")
    if logical is not None:
        if _FAST_LOGICAL.get(str(logical)) != base:
            return None
        return _FastField(str(logical), nullable, null_first)
    if base == "enum":
        return _FastField("enum", nullable, null_first, symbols=tuple(t["symbols"]))
    if base == "fixed":
        return _FastField("fixed", nullable, null_first, fixed_size=int(t["size"]))
    if isinstance(base, str) and base in _FAST_VARINT | set(_FAST_WIDTH) | _FAST_LENGTH:
        return _FastField(base, nullable, null_first)
    return None


@dataclass(frozen=True)
class FastPlan:
    """A writer schema as polars reads it: ``fields[j]`` is the writer's field ``j``; the
    container file's header (schema with the guard field appended, codec null, sync marker)
    is made once."""

    fields: tuple[_FastField, ...]
    header: bytes
    sync: bytes

    @classmethod
    def of(cls, schema: Any) -> FastPlan | None:
        if not isinstance(schema, dict) or schema.get("type") != "record":
            return None
        fields: list[_FastField] = []
        declared: list[dict[str, Any]] = []
        for j, f in enumerate(schema.get("fields", [])):
            fast = _fast_field(f["type"])
            if fast is None:
                return None
            if fast.kind in _FAST_VARINT:
                t: Any = "long"
            elif fast.kind in ("fixed", "boolean"):
                size = fast.fixed_size if fast.kind == "fixed" else 1
                t = {"type": "fixed", "name": f"millstream_fixed_{j}", "size": size}
            else:
                t = fast.kind
            if fast.nullable:
                t = ["null", t] if fast.null_first else [t, "null"]
            fields.append(fast)
            declared.append({"name": f"f{j}", "type": t})
        declared.append({"name": "guard", "type": "long"})
        text = json.dumps({"type": "record", "name": "millstream_block", "fields": declared})
        sync = secrets.token_bytes(16)
        meta = {"avro.schema": text.encode(), "avro.codec": b"null"}
        head = bytearray(b"Obj\x01") + zigzag(len(meta))
        for k, v in meta.items():
            head += zigzag(len(k)) + k.encode() + zigzag(len(v)) + v
        head += b"\x00" + sync
        return cls(tuple(fields), bytes(head), sync)


def _varint_sizes(values: np.ndarray) -> np.ndarray:
    """The bytes of each int64's zig-zag varint."""
    z = ((values << 1) ^ (values >> 63)).view(np.uint64)
    sizes = np.ones(len(values), dtype=np.int64)
    for k in range(1, 10):
        sizes += z >= np.uint64(1 << (7 * k))
    return sizes


def _ints(col: pa.Array) -> np.ndarray:
    return np.asarray(pc.fill_null(col, 0).to_numpy(zero_copy_only=False), dtype=np.int64)


def _in_range(values: np.ndarray, valid: np.ndarray, lo: int, hi: int) -> bool:
    v = values[valid]
    return not len(v) or (int(v.min()) >= lo and int(v.max()) <= hi)


def _fast_columns(plan: FastPlan, payloads: list[bytes]) -> list[pa.Array] | None:
    """The writer's fields of ``payloads`` as Arrow arrays (fastavro's types, see
    ``_PRIMITIVE``), or None when the block does not prove it was read right."""
    n = len(payloads)
    nonce = secrets.randbits(62)
    guard = zigzag(nonce)
    body = guard.join(payloads) + guard + _PAD
    blob = plan.header + zigzag(n) + zigzag(len(body)) + body + plan.sync
    # lazy: polars takes 0.3-1 s to import; every Python process that decodes records loads
    # this module, and only those of an Avro source need it.
    import polars

    try:
        table = polars.read_avro(io.BytesIO(blob)).to_arrow()
    except BaseException as exc:  # polars' Rust panics surface as pyo3's PanicException
        if not isinstance(exc, Exception) and type(exc).__name__ != "PanicException":
            raise
        return None
    if table.num_rows != n or table.num_columns != len(plan.fields) + 1:
        return None
    # 1. every record was followed by its guard: no record was read short or long
    if not pc.all(pc.equal(table.column(len(plan.fields)), nonce)).as_py():
        return None
    lengths = np.fromiter(map(len, payloads), dtype=np.int64, count=n)
    starts = np.zeros(n, dtype=np.int64)
    np.cumsum(lengths[:-1] + len(guard), out=starts[1:])
    raw = np.frombuffer(body, dtype=np.uint8)
    offset = np.zeros(n, dtype=np.int64)  # where the field being checked starts, per record
    out: list[pa.Array] = []
    for j, f in enumerate(plan.fields):
        col = table.column(j).combine_chunks()
        valid = np.ones(n, dtype=bool)
        if f.nullable:
            valid = ~np.asarray(col.is_null().to_numpy(zero_copy_only=False), dtype=bool)
            # 2. a union's branch is one byte, 0 or 1 (fastavro refuses others)
            branch = raw[starts + offset]
            want = np.where(valid, 2, 0) if f.null_first else np.where(valid, 0, 2)
            if not np.array_equal(branch, want):
                return None
            offset += 1
        if f.kind in _FAST_VARINT:
            ints = _ints(col)
            size = _varint_sizes(ints)
            arr = _fast_varint(f, col, ints, valid)
            if arr is None:
                return None
        elif f.kind in _FAST_LENGTH:
            lens = _ints(pc.binary_length(col))
            size = _varint_sizes(lens) + lens
            arr = col.cast(pa.string() if f.kind == "string" else pa.binary())
        elif f.kind == "fixed":
            size = np.full(n, f.fixed_size, dtype=np.int64)
            arr = col.cast(pa.binary())
        else:
            size = np.full(n, _FAST_WIDTH[f.kind], dtype=np.int64)
            arr = pc.not_equal(col, pa.scalar(b"\x00", col.type)) if f.kind == "boolean" else col
        offset += np.where(valid, size, 0)
        out.append(arr)
    # 3. the canonical encoding of what was read fills each payload exactly
    if not np.array_equal(offset, lengths):
        return None
    return out


def _fast_varint(
    f: _FastField, col: pa.Array, ints: np.ndarray, valid: np.ndarray
) -> pa.Array | None:
    """A varint field in fastavro's type, or None for a value fastavro refuses or cannot
    build (an enum index out of range, a date or timestamp outside Python's range, an int
    column value that is no int32)."""
    if f.kind == "long":
        return col
    if f.kind == "int":
        return col.cast(pa.int32()) if _in_range(ints, valid, *_INT32) else None
    if f.kind == "enum":
        if not _in_range(ints, valid, 0, len(f.symbols) - 1):
            return None
        return pc.take(pa.array(f.symbols, pa.string()), col)
    if f.kind == "date":
        if not _in_range(ints, valid, _MIN_DAY, _MAX_DAY):
            return None
        return col.cast(pa.int32()).cast(pa.date32())
    if f.kind == "timestamp-millis":
        if not _in_range(ints, valid, -(-_MIN_US // 1000), _MAX_US // 1000):
            return None
        col = pc.multiply(col, 1000)
    elif not _in_range(ints, valid, _MIN_US, _MAX_US):
        return None
    return col.cast(pa.timestamp("us", tz="UTC"))


def decode_avro(
    spec: TableSpec, plan: AvroSchemaPlan, payloads: list[bytes], positions: np.ndarray
) -> Parsed:
    """Decode ``payloads`` (value ``positions[i]`` of the batch) with one writer schema."""
    if plan.mismatch is not None:
        return all_rejected(spec, positions, plan.mismatch)
    if plan.fast is None or not payloads:
        return _decode_per_record(spec, plan, payloads, positions)
    parts: list[Parsed] = []
    stack = [(0, len(payloads))]
    while stack:
        lo, hi = stack.pop()
        columns = _fast_columns(plan.fast, payloads[lo:hi])
        if columns is not None:
            picked = {c: columns[j] for c, j in zip(plan.fields, plan.field_index, strict=True)}
            table, errors = assemble(spec, hi - lo, picked)
            parts.append(drop_rows(Parsed(table, positions[lo:hi]), errors))
        elif hi - lo <= FAST_LEAF:
            parts.append(_decode_per_record(spec, plan, payloads[lo:hi], positions[lo:hi]))
        else:
            mid = (lo + hi) // 2
            stack.append((mid, hi))
            stack.append((lo, mid))
    return concat(spec, parts)


def read_each(
    schema: Any, payloads: list[bytes], positions: np.ndarray
) -> tuple[list[Any], list[int], dict[int, str]]:
    """One fastavro read per payload (each must be read to its last byte): the records, the
    indexes (into ``payloads``) they came from, and the bad values by position with
    fastavro's reason."""
    reader = fastavro.schemaless_reader
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
    return records, ok, bad


def field_columns(
    plan: AvroSchemaPlan, records: list[Any]
) -> tuple[dict[str, pa.Array], dict[int, str]]:
    """The plan's fields of ``records`` (decoded by fastavro; None: no record, all its fields
    null) as Arrow arrays, and the errors of the records whose nested or decimal values do not
    fit their column."""
    columns: dict[str, pa.Array] = {}
    errors: dict[int, str] = {}
    if not plan.fields or not records:
        return columns, errors
    for name, t in zip(plan.fields, plan.types, strict=True):
        values = [None if r is None else r[name] for r in records]
        if pa.types.is_decimal(t) or pa.types.is_nested(t):
            columns[name], errs = fit_values(values, t, name)
            for j, e in errs.items():
                errors.setdefault(j, e)
        else:
            columns[name] = pa.array(values, t)
    return columns, errors


def _decode_per_record(
    spec: TableSpec, plan: AvroSchemaPlan, payloads: list[bytes], positions: np.ndarray
) -> Parsed:
    """The reference path: one fastavro read per record."""
    records, ok, bad = read_each(plan.parsed, payloads, positions)
    n = len(records)
    columns, fit_errors = field_columns(plan, records)
    table, errors = assemble(spec, n, columns)
    for j, e in fit_errors.items():
        errors.setdefault(j, e)
    kept = positions[np.asarray(ok, dtype=np.int64)] if ok else np.zeros(0, dtype=np.int64)
    return drop_rows(Parsed(table, kept, bad), errors)


# -- schema_evolution: auto -----------------------------------------------------------------

#: The column type that holds each Avro kind (:func:`_avro_kind`); every kind is one its
#: column type accepts (:data:`_ACCEPTS`), so a column made from it takes the field as is.
COLUMN_OF_KIND: dict[str, str] = {
    "string": "string",
    "enum": "string",
    "uuid": "string",
    "long": "long",
    "int": "int",
    "double": "double",
    "float": "double",
    "boolean": "boolean",
    "bytes": "binary",
    "fixed": "binary",
    "timestamp-millis": "timestamp",
    "timestamp-micros": "timestamp",
    "date": "date",
}


def column_type_of(t: Any) -> str | None:
    """The column type that holds Avro type ``t`` (a union with null allowed), nested types
    included: an array is a ``list``, a map a ``map<string,...>``, a record a ``struct``, the
    decimal logical type a ``decimal(p,s)``. None: no column type does (a union of several
    types, an empty record)."""
    found = _column_type(t)
    return None if found is None else str(found)


def _column_type(t: Any) -> Type | None:
    """:func:`column_type_of` as a :mod:`millstream.types` type (its text is the canonical
    one)."""
    if isinstance(t, list):
        rest = [b for b in t if b != "null"]
        if len(rest) != 1:
            return None
        t = rest[0]
    if isinstance(t, dict) and t.get("logicalType") == "decimal":
        if t.get("type") not in ("bytes", "fixed") or "precision" not in t:
            return None
        return DecimalType(int(t["precision"]), int(t.get("scale", 0)))
    kind, _ = _avro_kind(t)
    if kind is not None:
        return Scalar(COLUMN_OF_KIND[kind])
    if not isinstance(t, dict):
        return None
    base = t.get("type")
    if base in ("array", "map"):
        inner = _column_type(t.get("items" if base == "array" else "values"))
        if inner is None:
            return None
        return ListType(inner) if base == "array" else MapType(inner)
    if base == "record" and t.get("fields"):
        parts = [(f["name"], _column_type(f["type"])) for f in t["fields"]]
        fields = tuple((n, ft) for n, ft in parts if ft is not None)
        return StructType(fields) if len(fields) == len(parts) else None
    return None


def _takes(t: Any, column: str) -> bool:
    """Whether a column of type ``column`` takes Avro type ``t`` (what
    :meth:`AvroSchemaPlan.of` checks: no mismatch for this field)."""
    try:
        col = parse_type(column)
    except ValueError:
        return False
    if not isinstance(col, Scalar):
        return _fits(t, col)
    kind, _ = _avro_kind(t)
    return kind is not None and kind in _ACCEPTS[col.name]


def writer_fields(schema: Any) -> list[WriterField]:
    """The top-level fields of an Avro writer schema, for :func:`absorbing_spec` (none when
    the schema is no record)."""
    if isinstance(schema, str):
        schema = json.loads(schema)
    if not isinstance(schema, dict) or schema.get("type") != "record":
        return []
    out: list[WriterField] = []
    for f in schema.get("fields", []):
        t = f["type"]
        column = column_type_of(t)
        why = "" if column else f"no column type holds Avro type {_type_name(t)}"
        out.append(WriterField(f["name"], column, partial(_takes, t), why))
    return out
