"""Protobuf values: a message descriptor (from the registry's serialized FileDescriptorProto
by id, or a fixed FileDescriptorSet) and the message class protobuf's message factory makes
for it; each record is parsed by the C implementation, then each column is read off the
messages in one pass.

A field with presence (``optional``, proto2, a message) that is not set is null; a proto3
scalar without presence reads as its default, as protobuf defines. Enums are read as their
names, ``google.protobuf.Timestamp`` as a timestamp. A field whose type cannot become the
column's type makes every record of that schema bad, naming the field. Protobuf cannot tell a
message cut at a field boundary from one that lacks the later fields: only a cut inside a
field is an error.
"""

from __future__ import annotations

import base64
import dataclasses
from dataclasses import dataclass
from datetime import UTC
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
from google.protobuf import (
    any_pb2,
    descriptor_pb2,
    descriptor_pool,
    duration_pb2,
    empty_pb2,
    message_factory,
    struct_pb2,
    timestamp_pb2,
    wrappers_pb2,
)
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError

from millstream.datastream import DerivedTable
from millstream.errors import InvalidSpecError
from millstream.ingest.formats.absorb import WriterField
from millstream.ingest.formats.avro import writer_fields as avro_writer_fields
from millstream.ingest.formats.fit import Parsed, all_rejected, assemble, drop_rows, fit_values
from millstream.ingest.formats.registry import RegisteredSchema, RegistryClient
from millstream.spec import TableSpec
from millstream.types import ListType, MapType, Scalar, StructType, Type, arrow_type, parse_type

_T = FieldDescriptor
_INTS32 = {_T.TYPE_INT32, _T.TYPE_SINT32, _T.TYPE_SFIXED32}
_INTS64 = {_T.TYPE_INT64, _T.TYPE_SINT64, _T.TYPE_SFIXED64, _T.TYPE_UINT32, _T.TYPE_FIXED32}
_UINT64 = {_T.TYPE_UINT64, _T.TYPE_FIXED64}
TIMESTAMP = "google.protobuf.Timestamp"


def _repeated(f: FieldDescriptor) -> bool:
    """protobuf 6+ has ``is_repeated``; older ones only ``label``."""
    if hasattr(f, "is_repeated"):
        return bool(f.is_repeated)
    return bool(f.label == _T.LABEL_REPEATED)


def _kind(f: FieldDescriptor, *, element: bool = False) -> tuple[str | None, pa.DataType | None]:
    """A field's kind and the Arrow type its values are built as (None: not supported);
    ``element``: of one element of a repeated field."""
    if _repeated(f) and not element:
        return None, None
    t = f.type
    if t in _INTS32:
        return "int", pa.int32()
    if t in _INTS64:
        return "long", pa.int64()
    if t in _UINT64:
        return "ulong", pa.uint64()
    if t == _T.TYPE_DOUBLE:
        return "double", pa.float64()
    if t == _T.TYPE_FLOAT:
        return "float", pa.float32()
    if t == _T.TYPE_BOOL:
        return "boolean", pa.bool_()
    if t == _T.TYPE_STRING:
        return "string", pa.string()
    if t == _T.TYPE_BYTES:
        return "bytes", pa.binary()
    if t == _T.TYPE_ENUM:
        return "enum", pa.string()
    if t == _T.TYPE_MESSAGE and f.message_type.full_name == TIMESTAMP:
        return "timestamp", pa.timestamp("us", tz="UTC")
    return None, None


_ACCEPTS: dict[str, set[str]] = {
    "string": {"string", "enum"},
    "long": {"long", "int", "ulong"},
    "int": {"int", "long", "ulong"},
    "double": {"double", "float", "long", "int"},
    "boolean": {"boolean"},
    "timestamp": {"timestamp", "string"},
    "date": {"string"},
    "binary": {"bytes", "string"},
}


def _is_map(f: FieldDescriptor) -> bool:
    return bool(
        _repeated(f) and f.type == _T.TYPE_MESSAGE and f.message_type.GetOptions().map_entry
    )


def _fits(f: FieldDescriptor, col: Type, *, element: bool = False) -> bool:
    """Whether field ``f`` (``element``: one element of it) can fill a column of type ``col``:
    a list from a repeated field, a map from a map field with string keys, a struct from a
    message (fields matched by name; one the message lacks is null). Decimals have no
    Protobuf type: a decimal column takes no Protobuf field."""
    repeated = _repeated(f) and not element
    if isinstance(col, ListType):
        return repeated and not _is_map(f) and _fits(f, col.element, element=True)
    if isinstance(col, MapType):
        if not (repeated and _is_map(f)):
            return False
        key, value = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
        return key.type == _T.TYPE_STRING and _fits(value, col.value, element=True)
    if repeated:
        return False
    if isinstance(col, StructType):
        if f.type != _T.TYPE_MESSAGE or f.message_type.full_name == TIMESTAMP:
            return False
        by_name = f.message_type.fields_by_name
        return any(n in by_name for n, _ in col.fields) and all(
            n not in by_name or _fits(by_name[n], ft) for n, ft in col.fields
        )
    if isinstance(col, Scalar):
        kind, _ = _kind(f, element=True)
        return kind is not None and kind in _ACCEPTS[col.name] - {"string"} | (
            {"string"} if col.name in ("string", "binary") else set()
        )
    return False


def _py(f: FieldDescriptor, value: Any, col: Type, *, element: bool = False) -> Any:
    """A field's value as the Python value of column type ``col`` (see :func:`_fits`)."""
    if isinstance(col, ListType) and not element:
        return [_py(f, x, col.element, element=True) for x in value]
    if isinstance(col, MapType):
        vf = f.message_type.fields_by_name["value"]
        return [(k, _py(vf, v, col.value, element=True)) for k, v in value.items()]
    if isinstance(col, StructType):
        by_name = f.message_type.fields_by_name
        out: dict[str, Any] = {}
        for n, ft in col.fields:
            sub = by_name.get(n)
            if sub is None or (sub.has_presence and not value.HasField(n)):
                out[n] = None
            else:
                out[n] = _py(sub, getattr(value, n), ft)
        return out
    if f.type == _T.TYPE_MESSAGE:  # a Timestamp
        return value.ToDatetime(tzinfo=UTC)
    if f.type == _T.TYPE_ENUM:
        return (
            f.enum_type.values_by_number[value].name
            if value in f.enum_type.values_by_number
            else str(value)
        )
    return value


def _type_name(f: FieldDescriptor) -> str:
    if f.type == _T.TYPE_MESSAGE:
        name = f.message_type.full_name
    elif f.type == _T.TYPE_ENUM:
        name = f.enum_type.full_name
    else:
        name = {v: k for k, v in vars(_T).items() if k.startswith("TYPE_")}[f.type][5:].lower()
    return f"repeated {name}" if _repeated(f) else name


@dataclass
class ProtoSchemaPlan:
    """How one message type fills the table's columns."""

    cls: Any
    fields: list[tuple[str, str, pa.DataType, bool, Any]]  # column, kind, type, presence, enum
    mismatch: str | None
    #: decimal-free nested columns: column -> (field, column type), read with :func:`_py`
    nested: dict[str, tuple[FieldDescriptor, Type]] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, spec: TableSpec, desc: Descriptor) -> ProtoSchemaPlan:
        by_name = {f.name: f for f in desc.fields}
        fields: list[tuple[str, str, pa.DataType, bool, Any]] = []
        nested: dict[str, tuple[FieldDescriptor, Type]] = {}
        msg_cls = message_factory.GetMessageClass(desc)
        for c, t in spec.columns.items():
            f = by_name.get(c)
            if f is None:
                continue
            col = parse_type(t)
            if not isinstance(col, Scalar):
                if not _fits(f, col):
                    return cls(
                        msg_cls,
                        [],
                        f"field {c!r}: Protobuf type {_type_name(f)} does not fit column "
                        f"{c!r} ({t})",
                    )
                nested[c] = (f, col)
                continue
            kind, arrow = _kind(f)
            if kind is None or arrow is None or kind not in _ACCEPTS[t]:
                return cls(
                    msg_cls,
                    [],
                    f"field {c!r}: Protobuf type {_type_name(f)} does not fit column {c!r} ({t})",
                )
            names = {v.number: v.name for v in f.enum_type.values} if kind == "enum" else None
            fields.append((c, kind, arrow, bool(f.has_presence), names))
        return cls(msg_cls, fields, None, nested)


def pool_with_well_known_types() -> descriptor_pool.DescriptorPool:
    pool = descriptor_pool.DescriptorPool()
    for mod in (any_pb2, duration_pb2, empty_pb2, struct_pb2, timestamp_pb2, wrappers_pb2):
        pool.AddSerializedFile(mod.DESCRIPTOR.serialized_pb)
    return pool


def add_file(pool: descriptor_pool.DescriptorPool, fdp: descriptor_pb2.FileDescriptorProto) -> Any:
    try:
        return pool.FindFileByName(fdp.name)
    except KeyError:
        return pool.Add(fdp)


def file_from_b64(pool: descriptor_pool.DescriptorPool, text: str) -> Any:
    """A registry's serialized schema (base64 FileDescriptorProto) added to ``pool``."""
    fdp = descriptor_pb2.FileDescriptorProto()
    fdp.ParseFromString(base64.b64decode(text))
    add_file(pool, fdp)
    return pool.FindFileByName(fdp.name)


def registry_file(registry: RegistryClient, found: RegisteredSchema) -> Any:
    """The file of a registry's PROTOBUF schema (``registry`` asks with
    ``format=serialized``), the files it imports (its references, by subject and version)
    added to its pool first."""
    pool = pool_with_well_known_types()

    def add_references(refs: tuple[dict[str, Any], ...]) -> None:
        for ref in refs:
            dep = registry.version(str(ref["subject"]), int(ref["version"]))
            add_references(dep.references)
            file_from_b64(pool, dep.schema)

    add_references(found.references)
    return file_from_b64(pool, found.schema)


def message_at(file: Any, indexes: tuple[int, ...]) -> Descriptor:
    """The message a Confluent message-index array names in ``file``."""
    types = list(file.message_types_by_name.values())
    desc: Descriptor | None = None
    for i in indexes:
        if i < 0 or i >= len(types):
            raise IndexError(f"message index {i} is out of range")
        desc = types[i]
        types = list(desc.nested_types)
    if desc is None:
        raise IndexError("empty message-index array")
    return desc


def _read(msgs: list[Any], name: str, kind: str, presence: bool, enum: Any) -> list[Any]:
    if kind == "timestamp":
        return [
            m.__getattribute__(name).ToDatetime(tzinfo=UTC) if m.HasField(name) else None
            for m in msgs
        ]
    if presence:
        values = [getattr(m, name) if m.HasField(name) else None for m in msgs]
    else:
        values = [getattr(m, name) for m in msgs]
    if enum is not None:
        return [None if v is None else enum.get(v, str(v)) for v in values]
    return values


def decode_protobuf(
    spec: TableSpec, plan: ProtoSchemaPlan, payloads: list[bytes], positions: np.ndarray
) -> Parsed:
    """Decode ``payloads`` (value ``positions[i]`` of the batch) as one message type."""
    if plan.mismatch is not None:
        return all_rejected(spec, positions, plan.mismatch)
    parse = plan.cls.FromString
    msgs: list[Any] = []
    ok: list[int] = []
    bad: dict[int, str] = {}
    for i, payload in enumerate(payloads):
        try:
            msgs.append(parse(payload))
        except (DecodeError, ValueError, RuntimeError) as exc:
            bad[int(positions[i])] = f"not valid Protobuf for its message type: {exc}"
            continue
        ok.append(i)
    columns = {
        name: pa.array(_read(msgs, name, kind, presence, enum), arrow)
        for name, kind, arrow, presence, enum in plan.fields
    }
    nested_errors: dict[int, str] = {}
    for name, (f, col) in plan.nested.items():
        values = [
            None
            if f.has_presence and not _repeated(f) and not m.HasField(name)
            else _py(f, getattr(m, name), col)
            for m in msgs
        ]
        columns[name], errs = fit_values(values, arrow_type(spec.columns[name]), name)
        for j, e in errs.items():
            nested_errors.setdefault(j, e)
    table, errors = assemble(spec, len(msgs), columns)
    for j, e in nested_errors.items():
        errors.setdefault(j, e)
    kept = positions[np.asarray(ok, dtype=np.int64)] if ok else np.zeros(0, dtype=np.int64)
    return drop_rows(Parsed(table, kept, bad), errors)


# -- schema_evolution: auto -----------------------------------------------------------------

#: The column type that holds each Protobuf kind (:func:`_kind`); every kind is one its
#: column type accepts (:data:`_ACCEPTS`). A ``uint64`` is a ``long``: a value above 2**63-1
#: does not fit and dead-letters its record, naming the column, as without ``auto``.
COLUMN_OF_KIND: dict[str, str] = {
    "int": "int",
    "long": "long",
    "ulong": "long",
    "double": "double",
    "float": "double",
    "boolean": "boolean",
    "string": "string",
    "bytes": "binary",
    "enum": "string",
    "timestamp": "timestamp",
}

#: Message nesting deeper than this (a recursive message) has no column type.
_MAX_DEPTH = 16


def column_type_of(f: FieldDescriptor) -> str | None:
    """The column type that holds field ``f``: a repeated field is a ``list``, a map field
    with string keys a ``map<string,...>``, a message a ``struct``. None: no column type does
    (a map with other keys, a recursive message)."""
    found = _column_type(f)
    return None if found is None else str(found)


def _column_type(f: FieldDescriptor, *, element: bool = False, depth: int = 0) -> Type | None:
    """:func:`column_type_of` as a :mod:`millstream.types` type (its text is the canonical
    one); ``element``: the type of one element of ``f``."""
    if depth > _MAX_DEPTH:
        return None
    if _repeated(f) and not element:
        if _is_map(f):
            key = f.message_type.fields_by_name["key"]
            value = f.message_type.fields_by_name["value"]
            inner = _column_type(value, element=True, depth=depth + 1)
            if key.type != _T.TYPE_STRING or inner is None:
                return None
            return MapType(inner)
        inner = _column_type(f, element=True, depth=depth + 1)
        return None if inner is None else ListType(inner)
    kind, _ = _kind(f, element=True)
    if kind is not None:
        return Scalar(COLUMN_OF_KIND[kind])
    if f.type == _T.TYPE_MESSAGE and f.message_type.fields:
        parts = [(g.name, _column_type(g, depth=depth + 1)) for g in f.message_type.fields]
        fields = tuple((n, t) for n, t in parts if t is not None)
        return StructType(fields) if len(fields) == len(parts) else None
    return None


def _takes(f: FieldDescriptor, column: str) -> bool:
    """Whether a column of type ``column`` takes field ``f`` (what
    :meth:`ProtoSchemaPlan.of` checks: no mismatch for this field)."""
    try:
        col = parse_type(column)
    except ValueError:
        return False
    if not isinstance(col, Scalar):
        return _fits(f, col)
    kind, _ = _kind(f)
    return kind is not None and kind in _ACCEPTS[col.name]


def writer_fields(desc: Descriptor) -> list[WriterField]:
    """The top-level fields of a message type, for :func:`absorbing_spec`."""
    out: list[WriterField] = []
    for f in desc.fields:
        column = column_type_of(f)
        why = "" if column else f"no column type holds Protobuf type {_type_name(f)}"
        out.append(WriterField(f.name, column, partial(_takes, f), why))
    return out


# -- tables made from the registry (a multi-table datastream without a schema) ---------------


def protobuf_table(
    registry: RegistryClient, topic: str, keys: RegistryClient | None = None
) -> DerivedTable | None:
    """``topic``'s table as its latest Protobuf writer schemas make it: the fields of the
    first message of subject ``<topic>-value`` (the message Confluent's serializer names a
    schema by) as columns, in field order, and the fields of the record key's schema
    (subject ``<topic>-key``, Protobuf or Avro) as the key; no key (``()``) when the registry
    holds no key schema (the spec's ``primary_key`` then, or an append table). None while
    the registry has no value schema for the topic. ``registry`` asks with
    ``format=serialized``; ``keys`` (default ``registry``) asks without it, as an Avro key's
    subject is read. A schema that makes no table raises :class:`InvalidSpecError` naming
    the topic, the schema id and the field."""
    value = registry.latest(f"{topic}-value")
    if value is None:
        return None
    if value.schema_type != "PROTOBUF":
        raise InvalidSpecError(
            "source.format",
            f"topic {topic!r}: writer schema id {value.schema_id} is {value.schema_type}, "
            "not PROTOBUF",
        )
    desc = message_at(registry_file(registry, value), (0,))
    columns: dict[str, str] = {}
    for f in writer_fields(desc):
        if f.column_type is None:
            raise InvalidSpecError(
                f"schema.{f.name}",
                f"topic {topic!r}: writer schema id {value.schema_id}: field {f.name!r}: {f.why}",
            )
        columns[f.name] = f.column_type
    key = (keys or registry).latest(f"{topic}-key")
    key_fields: list[str] = []
    if key is not None and key.schema_type == "PROTOBUF":
        found = registry.schema(key.schema_id) if keys is not None else key
        key_desc = message_at(registry_file(registry, found), (0,))
        key_fields = [f.name for f in key_desc.fields]
    elif key is not None and key.schema_type == "AVRO":
        key_fields = [f.name for f in avro_writer_fields(key.schema)]
    return DerivedTable(columns, tuple(key_fields))
