"""Record formats: how a source's values become table rows (``source.format``).

* ``json`` (every source): :mod:`millstream.ingest.decode`'s vectorized ``pyarrow.json``.
* ``avro`` and ``protobuf`` (kafka): with ``schema_registry``, values use the Confluent wire
  format (magic byte 0, a 4-byte big-endian schema id, for Protobuf the message-index array,
  then the payload) and each schema is fetched by id once per process; with ``schema_file``
  the schema is fixed and values are the plain payload (``framing: confluent`` says they
  carry the wire header anyway; its id is then not looked up).
* ``csv`` (files): a header row per file, columns by name.

A source's format travels in its reader config (``config["format"]``, a :class:`FormatConfig`
as a dict), so the sink, which gets the reader config, builds the same decoder on an executor
with :func:`decoder_for`. A schema file is read when the spec is turned into a config (on the
driver) and its text travels in the config: executors never need the file.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import threading
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import fastavro
import numpy as np
import pyarrow as pa
from google.protobuf import descriptor_pb2

from millstream.datastream import DEBEZIUM_METADATA
from millstream.errors import IncompatibleChangeError, InvalidSpecError
from millstream.ingest.formats.absorb import WriterField, absorbing_spec
from millstream.ingest.formats.avro import AvroSchemaPlan, decode_avro, read_each
from millstream.ingest.formats.avro import writer_fields as avro_writer_fields
from millstream.ingest.formats.csv import CsvDecoder
from millstream.ingest.formats.envelope import (
    DebeziumAvroPlan,
    EnvelopeDecoder,
    debezium_row_record,
    decode_debezium_avro,
)
from millstream.ingest.formats.fit import Parsed, concat
from millstream.ingest.formats.protobuf import (
    ProtoSchemaPlan,
    add_file,
    decode_protobuf,
    message_at,
    pool_with_well_known_types,
    registry_file,
)
from millstream.ingest.formats.protobuf import writer_fields as proto_writer_fields
from millstream.ingest.formats.registry import RegistryClient, SchemaNotFound
from millstream.ingest.formats.wire import HEADER, message_indexes, split_frames
from millstream.spec import TableSpec

log = logging.getLogger(__name__)

__all__ = [
    "EnvelopeDecoder",
    "FormatConfig",
    "Parsed",
    "RecordDecoder",
    "SchemaDecoder",
    "absorber",
    "decoder_for",
    "format_config",
]


@dataclass(frozen=True, slots=True)
class FormatConfig:
    """A source's record format, JSON-able (it travels in the reader config)."""

    format: str = "json"
    registry_url: str | None = None
    registry_user_info: str | None = None
    #: seconds a batch waits for a registry that does not answer before it fails
    registry_max_wait: float = 300.0
    #: a fixed schema: Avro schema JSON, or a base64 FileDescriptorSet (Protobuf)
    schema: str | None = None
    message_type: str | None = None
    #: "confluent": values carry the wire header; "none": plain payloads (fixed schema only)
    framing: str = "confluent"
    #: "debezium": values are Debezium change events (:mod:`.envelope`); None: plain rows
    envelope: str | None = None
    #: ``source.metadata_columns``: record (and envelope) field -> column
    metadata: dict[str, str] = field(default_factory=dict)
    #: the source's topic (the ``topic`` metadata column)
    topic: str | None = None
    #: ``source.schema_evolution``: "auto" grows the table to hold a registry's writer
    #: schemas (:meth:`SchemaDecoder.absorbing`); "none" ignores fields the table lacks
    schema_evolution: str = "none"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def format_config(fields: Mapping[str, Any]) -> dict[str, Any]:
    """The format config (as a dict) of a datastream's ``source`` section fields; reads the
    schema file."""
    fmt = str(fields.get("format") or "json")
    around: dict[str, Any] = {
        "envelope": fields.get("envelope"),
        "metadata": dict(fields.get("metadata_columns") or {}),
        "topic": fields.get("topic"),
    }
    if fmt in ("json", "csv"):
        return FormatConfig(fmt, **around).to_dict()
    registry = fields.get("schema_registry") or None
    schema_file = fields.get("schema_file")
    schema: str | None = None
    if schema_file:
        path = Path(schema_file)
        if not path.is_file():
            raise InvalidSpecError("source.schema_file", f"{str(path)!r} does not exist")
        if fmt == "avro":
            schema = path.read_text()
            try:
                AvroSchemaPlan.of(TableSpec.parse({"name": "x", "schema": {"x": "string"}}), schema)
            except Exception as exc:
                raise InvalidSpecError(
                    "source.schema_file", f"{str(path)!r} is not an Avro schema: {exc}"
                ) from None
        else:
            schema = base64.b64encode(path.read_bytes()).decode()
            try:
                _fixed_message(schema, str(fields.get("message_type") or ""))
            except (KeyError, ValueError, TypeError) as exc:
                raise InvalidSpecError(
                    "source.schema_file",
                    f"{str(path)!r} is not a FileDescriptorSet holding message "
                    f"{fields.get('message_type')!r}: {exc}",
                ) from None
    framing = fields.get("framing") or ("confluent" if registry else "none")
    return FormatConfig(
        fmt,
        registry_url=registry["url"] if registry else None,
        registry_user_info=registry.get("basic_auth_user_info") if registry else None,
        registry_max_wait=float(registry.get("max_wait_seconds", 300.0)) if registry else 300.0,
        schema=schema,
        message_type=fields.get("message_type"),
        framing=str(framing),
        schema_evolution=str(fields.get("schema_evolution") or "none"),
        **around,
    ).to_dict()


def _fixed_message(schema_b64: str, message_type: str) -> Any:
    fds = descriptor_pb2.FileDescriptorSet()
    fds.ParseFromString(base64.b64decode(schema_b64))
    pool = pool_with_well_known_types()
    for fdp in fds.file:
        add_file(pool, fdp)
    return pool.FindMessageTypeByName(message_type)


class RecordDecoder(Protocol):
    #: whether record keys are the records' keys (CSV puts the header line there instead)
    record_keys: bool

    def parse(self, spec: TableSpec, values: pa.Array, keys: pa.Array) -> Parsed: ...


def _spec_key(spec: TableSpec) -> str:
    return json.dumps(spec.columns, sort_keys=False)


class SchemaDecoder:
    """Avro or Protobuf values, grouped by schema id (and message index), one decode per
    group."""

    record_keys = True

    def __init__(self, cfg: FormatConfig) -> None:
        self.cfg = cfg
        self.registry = (
            RegistryClient(
                cfg.registry_url,
                user_info=cfg.registry_user_info,
                fmt="serialized" if cfg.format == "protobuf" else None,
                max_wait=cfg.registry_max_wait,
            )
            if cfg.registry_url
            else None
        )
        self._lock = threading.Lock()
        self._plans: dict[tuple[str, int, tuple[int, ...]], Any] = {}
        self._files: dict[int, Any] = {}
        #: (table spec, schema id, message indexes) -> the spec absorbing it (None: refused)
        self._absorbed: dict[tuple[str, int, tuple[int, ...]], TableSpec | None] = {}
        self._key_schemas: dict[int, Any] = {}
        #: (table spec, schema id, message indexes) -> why ``auto`` refused that writer
        #: schema for that table (added to its records' dead-letter errors)
        self._refusals: dict[tuple[str, int, tuple[int, ...]], str] = {}
        self.debezium = cfg.envelope == "debezium"
        if self.debezium and cfg.format != "avro":
            raise ValueError(f"the debezium envelope is not supported with {cfg.format} values")
        #: ``op`` / ``ts_ms`` / ``source_ts_ms`` -> column (debezium only)
        self.envelope_columns = {f: c for f, c in cfg.metadata.items() if f in DEBEZIUM_METADATA}

    # -- schemas ------------------------------------------------------------------------

    def _proto_file(self, schema_id: int) -> Any:
        file = self._files.get(schema_id)
        if file is None:
            assert self.registry is not None
            found = self.registry.schema(schema_id)
            if found.schema_type != "PROTOBUF":
                raise SchemaNotFound(f"schema id {schema_id} is {found.schema_type}, not PROTOBUF")
            file = self._files[schema_id] = registry_file(self.registry, found)
        return file

    def _plan(self, spec: TableSpec, schema_id: int, indexes: tuple[int, ...]) -> Any:
        key = (_spec_key(spec), schema_id, indexes)
        with self._lock:
            plan = self._plans.get(key)
        if plan is not None:
            return plan
        if self.cfg.format == "avro":
            if self.cfg.schema is not None:
                text = self.cfg.schema
            else:
                assert self.registry is not None
                found = self.registry.schema(schema_id)
                if found.schema_type != "AVRO":
                    raise SchemaNotFound(f"schema id {schema_id} is {found.schema_type}, not AVRO")
                text = found.schema
            if self.debezium:
                skip = set(self.cfg.metadata.values())
                plan = DebeziumAvroPlan.of(spec, text, [c for c in spec.columns if c not in skip])
            else:
                plan = AvroSchemaPlan.of(spec, text)
        elif self.cfg.schema is not None:
            plan = ProtoSchemaPlan.of(
                spec, _fixed_message(self.cfg.schema, self.cfg.message_type or "")
            )
        else:
            plan = ProtoSchemaPlan.of(spec, message_at(self._proto_file(schema_id), indexes))
        with self._lock:
            self._plans[key] = plan
        return plan

    # -- record keys --------------------------------------------------------------------

    def record_key(self, spec: TableSpec, key: bytes) -> dict[str, Any] | None:
        """The primary key of a record key in the Confluent wire format, read by the key's own
        writer schema (its id in the key's frame, looked up like a value's): an Avro record of
        the key columns (what Debezium's Avro converter writes; read with the Debezium
        envelope only) or a Protobuf message holding them (confluent-kafka's Protobuf
        serializer's keys, any Protobuf source with a registry). None when ``key`` is not
        such a key (no registry, not framed): the JSON rules apply then. Raises
        :class:`SchemaNotFound` (an unknown id) or ValueError (a key its schema does not
        read) for a bad key; a registry that does not answer raises
        :class:`~millstream.errors.SourceReadError` (the batch fails)."""
        if self.registry is None or len(key) < HEADER or key[0] != 0:
            return None
        if self.cfg.format == "protobuf":
            return self._protobuf_key(spec, key)
        if self.cfg.format != "avro" or not self.debezium:
            return None
        schema_id = int.from_bytes(key[1:HEADER], "big")
        with self._lock:
            parsed = self._key_schemas.get(schema_id)
        if parsed is None:
            found = self.registry.schema(schema_id)
            if found.schema_type != "AVRO":
                raise SchemaNotFound(f"key schema id {schema_id} is {found.schema_type}, not AVRO")
            parsed = fastavro.parse_schema(json.loads(found.schema))
            with self._lock:
                self._key_schemas[schema_id] = parsed
        records, _, bad = read_each(parsed, [key[HEADER:]], np.zeros(1, dtype=np.int64))
        if bad:
            raise ValueError(f"the Avro key (schema id {schema_id}) is bad: {bad[0]}")
        obj = records[0]
        if isinstance(obj, dict):
            return {k: obj.get(k) for k in spec.primary_key}
        if len(spec.primary_key) == 1:
            return {spec.primary_key[0]: obj}
        raise ValueError(f"the Avro key (schema id {schema_id}) is no record of the key columns")

    def _protobuf_key(self, spec: TableSpec, key: bytes) -> dict[str, Any]:
        """A Protobuf record key (wire format, message-index array and all) as the key
        columns, decoded as a value of a table of the key columns is: a field the key's
        message lacks, or one that is not set, is None (the tombstone is then dead-lettered,
        never applied to a default key)."""
        schema_id = int.from_bytes(key[1:HEADER], "big")
        try:
            indexes, pos = message_indexes(key, HEADER)
        except ValueError as exc:
            raise ValueError(
                f"the Protobuf key (schema id {schema_id}): bad message-index array: {exc}"
            ) from None
        keys = TableSpec.parse(
            {"name": spec.name, "schema": {k: spec.columns[k] for k in spec.primary_key}}
        )
        try:
            plan = self._plan(keys, schema_id, indexes)
        except SchemaNotFound as exc:
            raise SchemaNotFound(
                str(exc) or f"key schema id {schema_id} is unknown to the schema registry"
            ) from None
        except IndexError as exc:
            raise ValueError(f"the Protobuf key (schema id {schema_id}): {exc}") from None
        parsed = decode_protobuf(keys, plan, [key[pos:]], np.zeros(1, dtype=np.int64))
        if parsed.bad or parsed.table.num_rows != 1:
            why = next(iter(parsed.bad.values()), "not read")
            raise ValueError(f"the Protobuf key (schema id {schema_id}) is bad: {why}")
        row = parsed.table.to_pylist()[0]
        return {k: row.get(k) for k in spec.primary_key}

    # -- values -------------------------------------------------------------------------

    def _groups(
        self, values: pa.Array
    ) -> tuple[dict[tuple[int, tuple[int, ...]], tuple[list[int], list[bytes]]], dict[int, str]]:
        """The values by writer schema: (schema id, message indexes) -> (positions, payloads),
        and the values without a valid frame (position -> why)."""
        n = len(values)
        raw: list[bytes] = values.to_pylist()
        bad: dict[int, str] = {}
        if self.cfg.framing == "confluent":
            frames = split_frames(values)
            bad.update(frames.errors)
            ids = frames.schema_ids
            start = HEADER
        else:
            ids = np.zeros(n, dtype=np.int64)
            start = 0
        if self.cfg.schema is not None:
            ids = np.where(ids >= 0, 0, ids)  # a fixed schema: the header's id is not used
        # group key -> (positions, payloads)
        groups: dict[tuple[int, tuple[int, ...]], tuple[list[int], list[bytes]]] = {}
        proto = self.cfg.format == "protobuf"
        for sid in np.unique(ids[ids >= 0]).tolist():
            if not proto:  # Avro: no per-record header beyond the frame, so one slice each
                members = np.flatnonzero(ids == sid).tolist()
                groups[(int(sid), ())] = (
                    members,
                    [raw[i][start:] for i in members] if start else [raw[i] for i in members],
                )
                continue
            for i in np.flatnonzero(ids == sid).tolist():
                payload = raw[i]
                pos = start
                indexes: tuple[int, ...] = ()
                if proto and self.cfg.framing == "confluent":
                    if len(payload) > pos and payload[pos] == 0:
                        indexes, pos = (0,), pos + 1
                    else:
                        try:
                            indexes, pos = message_indexes(payload, pos)
                        except ValueError as exc:
                            bad[i] = f"bad Protobuf message-index array: {exc}"
                            continue
                elif proto:
                    indexes = (0,)
                g = groups.setdefault((int(sid), indexes), ([], []))
                g[0].append(i)
                g[1].append(payload[pos:] if pos else payload)
        return groups, bad

    # -- schema_evolution: auto ---------------------------------------------------------

    def _writer_fields(self, schema_id: int, indexes: tuple[int, ...]) -> list[WriterField]:
        assert self.registry is not None
        if self.cfg.format == "avro":
            found = self.registry.schema(schema_id)
            if found.schema_type != "AVRO":
                return []
            if self.debezium:  # the envelope's row record holds the table's fields
                return avro_writer_fields(debezium_row_record(found.schema) or {})
            return avro_writer_fields(found.schema)
        return proto_writer_fields(message_at(self._proto_file(schema_id), indexes))

    def absorbing(self, spec: TableSpec, values: pa.Array) -> TableSpec:
        """``spec`` grown to hold the fields of every writer schema among ``values``
        (:func:`~millstream.ingest.formats.absorb.absorbing_spec`, schema by schema in id
        order); ``spec`` itself when they need nothing. A writer schema the table cannot
        absorb changes nothing: a WARNING names its id, the field and the rule (once per
        process and table spec), and its records decode as without ``auto``."""
        if self.registry is None or self.cfg.schema is not None:
            return spec
        if self.cfg.format == "avro":  # the frame's id is the writer schema: no per-record step
            ids = split_frames(values).schema_ids
            keys: list[tuple[int, tuple[int, ...]]] = [
                (int(sid), ()) for sid in np.unique(ids[ids >= 0]).tolist()
            ]
        else:
            keys = list(self._groups(values)[0])
        for sid, indexes in sorted(keys):
            key = (json.dumps(spec.to_json_dict(), sort_keys=True), sid, indexes)
            with self._lock:
                done = key in self._absorbed
                grown = self._absorbed.get(key)
            if not done:
                try:
                    # a metadata column is filled from the record, not from a field
                    filled = set(self.cfg.metadata.values())
                    fields = [f for f in self._writer_fields(sid, indexes) if f.name not in filled]
                    grown = absorbing_spec(spec, fields)
                except (SchemaNotFound, IndexError, KeyError):
                    grown = None  # its records are dead-lettered by parse, naming why
                except IncompatibleChangeError as exc:
                    refusal = (
                        f"schema_evolution auto refused writer schema id {sid} of topic "
                        f"{self.cfg.topic!r} ({exc.field}): {exc.rule}"
                    )
                    log.warning(
                        "table %r: %s; the table is left as it is, and records whose values "
                        "do not fit are dead-lettered",
                        spec.name,
                        refusal,
                    )
                    with self._lock:
                        self._refusals[key] = refusal
                    grown = None
                with self._lock:
                    self._absorbed[key] = grown
            if grown is not None:
                spec = grown
        return spec

    # -- values -------------------------------------------------------------------------

    def parse(self, spec: TableSpec, values: pa.Array, keys: pa.Array) -> Parsed:
        groups, bad = self._groups(values)
        whole = json.dumps(spec.to_json_dict(), sort_keys=True) if self._refusals else ""
        parts: list[Parsed] = [
            Parsed(spec.arrow_schema().empty_table(), np.zeros(0, dtype=np.int64), bad)
        ]
        for (sid, indexes), (members, payloads) in groups.items():
            where = np.asarray(members, dtype=np.int64)
            try:
                plan = self._plan(spec, sid, indexes)
            except SchemaNotFound as exc:
                reason = str(exc) or f"unknown schema id {sid}: the schema registry has none"
                parts.append(
                    Parsed(
                        spec.arrow_schema().empty_table(),
                        np.zeros(0, dtype=np.int64),
                        dict.fromkeys(where.tolist(), reason),
                    )
                )
                continue
            except IndexError as exc:
                parts.append(
                    Parsed(
                        spec.arrow_schema().empty_table(),
                        np.zeros(0, dtype=np.int64),
                        dict.fromkeys(where.tolist(), f"schema id {sid}: {exc}"),
                    )
                )
                continue
            with self._lock:
                refusal = self._refusals.get((whole, sid, indexes)) if self._refusals else None
            if refusal is not None and plan.mismatch is not None:
                # its records do not fit because auto refused their writer schema: say so
                plan = dataclasses.replace(plan, mismatch=f"{plan.mismatch}; {refusal}")
            if self.debezium:
                parts.append(
                    decode_debezium_avro(spec, plan, payloads, where, self.envelope_columns)
                )
            elif self.cfg.format == "avro":
                parts.append(decode_avro(spec, plan, payloads, where))
            else:
                parts.append(decode_protobuf(spec, plan, payloads, where))
        return concat(spec, parts)


_DECODERS: dict[str, RecordDecoder] = {}
_DECODERS_LOCK = threading.Lock()


def decoder_for(source_config: Mapping[str, Any] | None) -> RecordDecoder | None:
    """The decoder of a reader config's format (None: JSON, the default decoder). One per
    format config and process, so a schema is fetched once per process."""
    fmt = dict((source_config or {}).get("format") or {})
    cfg = FormatConfig(**fmt)
    if cfg.format == "json" and not cfg.envelope and not cfg.metadata:
        return None
    key = json.dumps(fmt, sort_keys=True)
    with _DECODERS_LOCK:
        found = _DECODERS.get(key)
        if found is None:
            inner: RecordDecoder | None = None
            if cfg.format == "csv":
                inner = CsvDecoder()
            elif cfg.format != "json":
                inner = SchemaDecoder(cfg)
            found = inner
            if cfg.envelope or cfg.metadata or inner is None:
                found = EnvelopeDecoder(inner, cfg.envelope, cfg.metadata, cfg.topic)
            assert found is not None
            _DECODERS[key] = found
        return found


def absorber(source_config: Mapping[str, Any] | None) -> SchemaDecoder | None:
    """The decoder whose :meth:`SchemaDecoder.absorbing` a write task asks before decoding,
    when the source says ``schema_evolution: auto`` (None otherwise)."""
    found = decoder_for(source_config)
    if isinstance(found, EnvelopeDecoder):
        found = found.inner
    if not isinstance(found, SchemaDecoder) or found.cfg.schema_evolution != "auto":
        return None
    return found
