"""Around a format: the Debezium envelope and record metadata columns.

``source.envelope: debezium`` (JSON values): each value is a Debezium change event
``{"before", "after", "op", "ts_ms", "source": {"ts_ms", ...}}``, or the same wrapped as
``{"schema": ..., "payload": {...}}`` (Kafka Connect's JSON converter with
``schemas.enable=true``); both are accepted, record by record. The whole batch is parsed with
one ``pyarrow.json`` call (``before`` and ``after`` as struct columns, bisected around bad
records like plain JSON), then:

* ``op`` ``c``, ``r``, ``u``: the row is ``after``;
* ``op`` ``d``: a delete of ``before``'s primary key, exactly as a tombstone is (the row holds
  only the key and the envelope's metadata columns). Never ``after``'s key (it is null in a
  delete) and never the record key: a ``before`` without the key is a bad record.
* anything else is a bad record naming the field: no ``op``, an unknown ``op``, no ``after``
  for c/r/u, no ``before`` for d.

A Kafka tombstone (null value) that follows a delete is decoded by
:func:`millstream.ingest.decode.decode_records` as any tombstone: one more delete of the key.

``source.metadata_columns`` maps envelope fields (``op``, ``ts_ms``, ``source_ts_ms``) and
Kafka record fields (``timestamp``, ``key``, ``headers``, ``topic``, ``partition``,
``offset``) to columns the schema declares (:mod:`millstream.datastream` validates them). This
decoder fills the envelope's; ``decode_records`` fills the record's from the raw columns
(:meth:`EnvelopeDecoder.kafka_metadata`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import fastavro
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from millstream.datastream import DEBEZIUM_METADATA, KAFKA_METADATA, DerivedTable
from millstream.errors import InvalidSpecError
from millstream.ingest.formats.avro import AvroSchemaPlan, field_columns, read_each
from millstream.ingest.formats.avro import writer_fields as avro_writer_fields
from millstream.ingest.formats.fit import Parsed, all_rejected, assemble, drop_rows
from millstream.ingest.formats.jsonblock import json_schema, parse_json, parse_robust
from millstream.ingest.formats.registry import RegistryClient
from millstream.spec import TableSpec
from millstream.types import arrow_type

if TYPE_CHECKING:
    from millstream.ingest.formats import RecordDecoder

#: Debezium operations that upsert ``after`` (create, read i.e. snapshot, update).
UPSERT_OPS = ("c", "r", "u")
DELETE_OP = "d"


class EnvelopeDecoder:
    """A format (``inner``; None: JSON) with an envelope and/or metadata columns."""

    def __init__(
        self,
        inner: RecordDecoder | None,
        envelope: str | None,
        metadata: dict[str, str],
        topic: str | None,
    ) -> None:
        self.inner = inner
        self.envelope = envelope
        self.metadata = dict(metadata)
        self.topic = topic
        self.record_keys = True if inner is None else inner.record_keys

    @property
    def kafka_metadata(self) -> dict[str, str]:
        """Record field -> column, for the fields that come from the record, not its value."""
        return {f: c for f, c in self.metadata.items() if f in KAFKA_METADATA}

    def record_key(self, spec: TableSpec, key: bytes) -> dict[str, Any] | None:
        """The primary key of a record key the format reads itself (a key in the wire format:
        Debezium's Avro converter's, a Protobuf serializer's); None: the JSON rules apply
        (:func:`millstream.ingest.decode.decode_records`)."""
        reader = getattr(self.inner, "record_key", None)
        if reader is None:
            return None
        found: dict[str, Any] | None = reader(spec, key)
        return found

    def parse(self, spec: TableSpec, values: pa.Array, keys: pa.Array) -> Parsed:
        """Rows of ``values``: the inner format (with the Debezium envelope, Avro reads the
        envelope itself), or JSON (with the envelope, :func:`parse_debezium`)."""
        skip = set(self.metadata.values())
        if self.envelope == "debezium" and self.inner is None:
            envelope = {f: c for f, c in self.metadata.items() if f in DEBEZIUM_METADATA}
            return parse_debezium(spec, values, envelope, skip)
        if self.inner is None:
            # metadata columns are not read from the value (a field of that name is ignored)
            return parse_json(spec, values, [c for c in spec.columns if c not in skip])
        return self.inner.parse(spec, values, keys)


def _struct(spec: TableSpec, columns: list[str]) -> pa.DataType:
    return pa.struct(list(json_schema(spec, columns)))


def debezium_schema(spec: TableSpec, row_columns: list[str]) -> pa.Schema:
    """What ``pyarrow.json`` reads a change event as: the envelope, and the envelope again
    under ``payload`` (the schema/payload wrapper). ``before`` needs only the key."""
    envelope = [
        ("before", _struct(spec, list(spec.primary_key))),
        ("after", _struct(spec, row_columns)),
        ("op", pa.string()),
        ("ts_ms", pa.int64()),
        ("source", pa.struct([("ts_ms", pa.int64())])),
    ]
    return pa.schema([*envelope, ("payload", pa.struct(envelope))])


def _epoch_ms(arr: pa.Array, column_type: str) -> pa.Array:
    """Epoch milliseconds for a ``long`` or ``timestamp`` column."""
    if column_type == "timestamp":
        return arr.cast(pa.timestamp("ms", tz="UTC"))
    return arr


def parse_debezium(
    spec: TableSpec, values: pa.Array, envelope_columns: dict[str, str], skip: set[str]
) -> Parsed:
    """Debezium change events as JSON (see the module doc): rows, and which of them are
    deletes. ``envelope_columns`` maps ``op`` / ``ts_ms`` / ``source_ts_ms`` to columns;
    ``skip`` (metadata columns) are not read from ``after``."""
    row_columns = [c for c in spec.columns if c not in skip]
    parsed, positions, bad = parse_robust(values, debezium_schema(spec, row_columns))
    n = parsed.num_rows
    payload = parsed.column("payload").combine_chunks()
    wrapped = pc.is_valid(payload)

    def pick(name: str) -> pa.Array:
        top = parsed.column(name).combine_chunks()
        return pc.if_else(wrapped, pc.struct_field(payload, name), top)

    after, before = pick("after"), pick("before")
    events = Events(
        op=pick("op"),
        after={c: pc.struct_field(after, c) for c in row_columns},
        has_after=pc.is_valid(after),
        before={c: pc.struct_field(before, c) for c in spec.primary_key},
        has_before=pc.is_valid(before),
        ts_ms=pick("ts_ms"),
        source_ts_ms=pc.struct_field(pick("source"), "ts_ms"),
    )
    return apply_debezium(spec, n, events, positions, bad, envelope_columns)


@dataclass(frozen=True, slots=True)
class Events:
    """A batch of decoded change events, whatever their format, one entry per event:
    ``op`` (null: missing), ``after``'s row columns (a column ``after`` lacks is absent)
    and whether ``after`` is there, ``before``'s primary key columns (likewise) and whether
    ``before`` is there, the event's ``ts_ms`` and ``source.ts_ms``."""

    op: pa.Array
    after: dict[str, pa.Array]
    has_after: pa.Array
    before: dict[str, pa.Array]
    has_before: pa.Array
    ts_ms: pa.Array
    source_ts_ms: pa.Array


def apply_debezium(
    spec: TableSpec,
    n: int,
    events: Events,
    positions: np.ndarray,
    bad: dict[int, str],
    envelope_columns: dict[str, str],
    row_errors: dict[int, str] | None = None,
) -> Parsed:
    """The op rules, the same for every format: c/r/u rows are ``after``, a d row is
    ``before``'s key (never ``after``'s, never the record key) marked as a delete, anything
    else is a bad event naming the field. Row ``j`` is value ``positions[j]``; ``bad`` holds
    the values the format could not read at all, ``row_errors`` the rows (by row) whose
    values the format could not fit."""
    op = events.op
    is_delete = pc.fill_null(pc.equal(op, DELETE_OP), False)
    is_upsert = pc.fill_null(pc.is_in(op, pa.array(UPSERT_OPS)), False)

    errors: dict[int, str] = {}

    def fail(mask: pa.Array, message: str) -> None:
        """``message`` for the rows in ``mask`` (``{op!r}``: the row's op) that have none yet."""
        for j in np.flatnonzero(np.asarray(mask.to_numpy(zero_copy_only=False))).tolist():
            text = (
                message.replace("{op!r}", repr(op[j].as_py())) if "{op!r}" in message else message
            )
            errors.setdefault(j, text)

    fail(pc.is_null(op), "field 'op' is missing: not a Debezium change event")
    fail(
        pc.and_not(pc.is_valid(op), pc.or_(is_delete, is_upsert)),
        "field 'op': {op!r} is not a Debezium operation (c, r, u, d)",
    )
    fail(pc.and_(is_upsert, pc.invert(events.has_after)), "field 'after' is null for op {op!r}")
    fail(
        pc.and_(is_delete, pc.invert(events.has_before)),
        "field 'before' is null for op 'd': no key",
    )
    columns: dict[str, pa.Array] = {}
    for c, value in events.after.items():
        if c not in spec.primary_key:
            columns[c] = pc.if_else(is_delete, pa.nulls(n, value.type), value)
    for c in spec.primary_key:
        # A delete's key is before's, never after's (null in a delete) nor the record's.
        key = events.before.get(c)
        if key is None:
            key = pa.nulls(n, arrow_type(spec.columns[c]))
        fail(
            pc.and_(is_delete, pc.and_(events.has_before, pc.is_null(key))),
            f"field 'before' lacks primary key column {c!r} for op 'd'",
        )
        value = events.after.get(c)
        if value is None:
            value = pa.nulls(n, key.type)
        elif value.type != key.type:
            value, key = _common(value, key, spec.columns[c])
        columns[c] = pc.if_else(is_delete, key, value)
    envelope = {"op": op, "ts_ms": events.ts_ms, "source_ts_ms": events.source_ts_ms}
    for field, column in envelope_columns.items():
        arr = envelope[field]
        columns[column] = arr if field == "op" else _epoch_ms(arr, spec.columns[column])
    table, fit_errors = assemble(spec, n, columns)
    for j, e in [*fit_errors.items(), *(row_errors or {}).items()]:
        errors.setdefault(j, e)
    deletes = np.asarray(is_delete.to_numpy(zero_copy_only=False), dtype=bool)
    return drop_rows(Parsed(table, positions, bad, deletes), errors)


def _common(a: pa.Array, b: pa.Array, column_type: str) -> tuple[pa.Array, pa.Array]:
    """``after``'s and ``before``'s key values in one type (the column's) for ``if_else``."""
    target = arrow_type(column_type)
    return a.cast(target), b.cast(target)


# -- Debezium over Avro -----------------------------------------------------------------


def _branches(t: Any) -> list[Any]:
    return list(t) if isinstance(t, list) else [t]


def _is_kind(t: Any, kinds: tuple[str, ...]) -> bool:
    """Whether Avro type ``t`` (or a union of null and it) is one of ``kinds``."""
    rest = [b for b in _branches(t) if b != "null"]
    if len(rest) != 1:
        return False
    b = rest[0]
    if isinstance(b, dict) and b.get("logicalType") is None:
        b = b.get("type")
    return isinstance(b, str) and b in kinds


def debezium_row_record(schema: Any) -> dict[str, Any] | None:
    """The row record of a Debezium ``Envelope`` Avro schema (None when it has none): it is
    defined in ``before``'s union (``after`` refers to it by name), or in ``after``'s."""
    if isinstance(schema, str):
        schema = json.loads(schema)
    if not isinstance(schema, dict) or schema.get("type") != "record":
        return None
    fields = {f["name"]: f["type"] for f in schema.get("fields", [])}
    return next(
        (
            b
            for name in ("before", "after")
            for b in _branches(fields.get(name))
            if isinstance(b, dict) and b.get("type") == "record"
        ),
        None,
    )


def debezium_table(registry: RegistryClient, topic: str) -> DerivedTable | None:
    """``topic``'s table as its latest Debezium writer schemas make it (subjects
    ``<topic>-value`` and ``<topic>-key``, Debezium's default naming): the row record's
    fields as columns, the key record's fields as the key. None while the registry has no
    value schema for the topic; a schema that makes no table raises
    :class:`InvalidSpecError` naming the topic and why."""
    value = registry.latest(f"{topic}-value")
    if value is None:
        return None
    row = debezium_row_record(value.schema) if value.schema_type == "AVRO" else None
    if row is None:
        raise InvalidSpecError(
            "source.envelope",
            f"topic {topic!r}: writer schema id {value.schema_id} is not a Debezium envelope "
            "(no record in before/after)",
        )
    columns: dict[str, str] = {}
    for f in avro_writer_fields(row):
        if f.column_type is None:
            raise InvalidSpecError(f"schema.{f.name}", f"topic {topic!r}: {f.why}")
        columns[f.name] = f.column_type
    key = registry.latest(f"{topic}-key")
    key_fields = [f.name for f in avro_writer_fields(key.schema)] if key is not None else []
    if not key_fields:
        raise InvalidSpecError(
            "table.primary_key",
            f"topic {topic!r}: the registry holds no record key schema ({topic}-key) to take "
            "the key from; give the table's primary_key in overrides",
        )
    return DerivedTable(columns, tuple(key_fields))


@dataclass
class DebeziumAvroPlan:
    """How one Debezium ``Envelope`` writer schema fills the table: the envelope is read with
    fastavro per record (its ``before``/``after`` are unions of null and a record, which the
    block reader does not take), ``value`` says which fields of the row record (``before``'s
    and ``after``'s) fill which columns."""

    parsed: Any
    value: AvroSchemaPlan | None
    mismatch: str | None  # every event of this schema is bad for this reason

    @classmethod
    def of(cls, spec: TableSpec, schema: Any, row_columns: list[str]) -> DebeziumAvroPlan:
        if isinstance(schema, str):
            schema = json.loads(schema)
        parsed = fastavro.parse_schema(schema)
        if not isinstance(schema, dict) or schema.get("type") != "record":
            return cls(parsed, None, "the Avro schema is not a record: not a Debezium envelope")
        fields = {f["name"]: f["type"] for f in schema.get("fields", [])}
        value = debezium_row_record(schema)
        if value is None:
            return cls(
                parsed,
                None,
                "fields 'before' and 'after' hold no record: not a Debezium envelope",
            )
        for name, kinds in (("op", ("string", "enum")), ("ts_ms", ("long", "int"))):
            if name in fields and not _is_kind(fields[name], kinds):
                return cls(parsed, None, f"field {name!r}: Avro type is not {kinds[0]}")
        source = [b for b in _branches(fields.get("source")) if isinstance(b, dict)]
        source_ts = {f["name"]: f["type"] for f in source[0].get("fields", [])} if source else {}
        if "ts_ms" in source_ts and not _is_kind(source_ts["ts_ms"], ("long", "int")):
            return cls(parsed, None, "field 'source.ts_ms': Avro type is not long")
        rows = TableSpec.parse(
            {"name": spec.name, "schema": {c: spec.columns[c] for c in row_columns}}
        )
        try:
            plan = AvroSchemaPlan.of(rows, value)
        except Exception as exc:  # a row record that refers to types defined outside it
            return cls(parsed, None, f"field 'after': its record cannot be read alone: {exc}")
        if plan.mismatch is not None:
            return cls(parsed, None, f"field 'after': {plan.mismatch}")
        return cls(parsed, plan, None)


def decode_debezium_avro(
    spec: TableSpec,
    plan: DebeziumAvroPlan,
    payloads: list[bytes],
    positions: np.ndarray,
    envelope_columns: dict[str, str],
) -> Parsed:
    """Debezium change events as Avro (one writer schema): fastavro reads each envelope,
    the op rules are :func:`apply_debezium`'s, as for JSON."""
    if plan.mismatch is not None or plan.value is None:
        return all_rejected(spec, positions, plan.mismatch or "not a Debezium envelope")
    records, ok, bad = read_each(plan.parsed, payloads, positions)
    n = len(records)
    kept = positions[np.asarray(ok, dtype=np.int64)] if ok else np.zeros(0, dtype=np.int64)
    afters = [r.get("after") for r in records]
    befores = [r.get("before") for r in records]
    after, row_errors = field_columns(plan.value, afters)
    key_fields = [c for c in spec.primary_key if c in plan.value.fields]
    before = {
        c: pa.array(
            [None if b is None else b.get(c) for b in befores],
            plan.value.types[plan.value.fields.index(c)],
        )
        for c in key_fields
    }
    sources = [r.get("source") for r in records]
    events = Events(
        op=pa.array([r.get("op") for r in records], pa.string()),
        after=after if n else {},
        has_after=pa.array([a is not None for a in afters], pa.bool_()),
        before=before,
        has_before=pa.array([b is not None for b in befores], pa.bool_()),
        ts_ms=pa.array([r.get("ts_ms") for r in records], pa.int64()),
        source_ts_ms=pa.array(
            [s.get("ts_ms") if isinstance(s, dict) else None for s in sources], pa.int64()
        ),
    )
    return apply_debezium(spec, n, events, kept, bad, envelope_columns, row_errors)
