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

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from millstream.datastream import DEBEZIUM_METADATA, KAFKA_METADATA
from millstream.ingest.formats.fit import Parsed, assemble, drop_rows
from millstream.ingest.formats.jsonblock import json_schema, parse_json, parse_robust
from millstream.spec import TableSpec

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

    def parse(self, spec: TableSpec, values: pa.Array, keys: pa.Array) -> Parsed:
        skip = set(self.metadata.values())
        if self.envelope == "debezium":
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
    """Debezium change events (see the module doc): rows, and which of them are deletes.
    ``envelope_columns`` maps ``op`` / ``ts_ms`` / ``source_ts_ms`` to columns; ``skip``
    (metadata columns) are not read from ``after``."""
    row_columns = [c for c in spec.columns if c not in skip]
    parsed, positions, bad = parse_robust(values, debezium_schema(spec, row_columns))
    n = parsed.num_rows
    payload = parsed.column("payload").combine_chunks()
    wrapped = pc.is_valid(payload)

    def pick(name: str) -> pa.Array:
        top = parsed.column(name).combine_chunks()
        return pc.if_else(wrapped, pc.struct_field(payload, name), top)

    op, after, before = pick("op"), pick("after"), pick("before")
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
    fail(pc.and_(is_upsert, pc.is_null(after)), "field 'after' is null for op {op!r}")
    fail(pc.and_(is_delete, pc.is_null(before)), "field 'before' is null for op 'd': no key")
    columns: dict[str, pa.Array] = {}
    for c in row_columns:
        value = pc.struct_field(after, c)
        if c in spec.primary_key:
            # A delete's key is before's, never after's (null in a delete) nor the record's.
            key = pc.struct_field(before, c)
            fail(
                pc.and_(is_delete, pc.and_(pc.is_valid(before), pc.is_null(key))),
                f"field 'before' lacks primary key column {c!r} for op 'd'",
            )
            value = pc.if_else(is_delete, key, value)
        else:
            value = pc.if_else(is_delete, pa.nulls(n, value.type), value)
        columns[c] = value
    envelope = {
        "op": op,
        "ts_ms": pick("ts_ms"),
        "source_ts_ms": pc.struct_field(pick("source"), "ts_ms"),
    }
    for field, column in envelope_columns.items():
        arr = envelope[field]
        columns[column] = arr if field == "op" else _epoch_ms(arr, spec.columns[column])
    table, fit_errors = assemble(spec, n, columns)
    for j, e in fit_errors.items():
        errors.setdefault(j, e)
    deletes = np.asarray(is_delete.to_numpy(zero_copy_only=False), dtype=bool)
    return drop_rows(Parsed(table, positions, bad, deletes), errors)
