"""The generator's orders in Avro and Protobuf, for tests and the ingest benchmark.

:class:`OrdersEncoder` turns a generator value (JSON bytes) into the same order produced with
confluent-kafka's own ``AvroSerializer`` / ``ProtobufSerializer`` against a schema registry
(:class:`harness.schema_registry.TestSchemaRegistry`). A value that is not a
well-formed order (the generator's malformed records) becomes a bad wire value instead, one of
a wrong magic byte, a truncated payload or an unknown schema id, so the JSON value stays the
oracle's twin: bad in both forms, good rows equal.

The Protobuf message class is built at run time from a FileDescriptorProto written in Python
(no protoc). confluent-kafka's schema-registry extras are test dependencies: they are imported
when an encoder is made.
"""

from __future__ import annotations

import importlib
import json
from datetime import UTC, datetime
from typing import Any

from google.protobuf import (
    descriptor_pb2,
    descriptor_pool,
    empty_pb2,  # noqa: F401  (registers google.protobuf.Empty in the default pool)
    message_factory,
    timestamp_pb2,
)

ORDERS_AVRO: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "millstream.test",
    "fields": [
        {"name": "order_id", "type": "long"},
        {"name": "customer", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "status", "type": "string"},
        {"name": "updated_at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "is_deleted", "type": "boolean"},
        {"name": "channel", "type": ["null", "string"], "default": None},
    ],
}

_FIELDS = {
    "order_id": int,
    "customer": str,
    "amount": float,
    "status": str,
    "updated_at": str,
    "is_deleted": bool,
}


def orders_file_descriptor(name: str = "millstream_test_orders.proto") -> Any:
    """A FileDescriptorProto of ``millstream.test.Order`` (and a nested ``Order.Note`` so a
    message-index array other than [0] can be tested)."""
    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name=name, package="millstream.test", syntax="proto3")
    fdp.dependency.append("google/protobuf/timestamp.proto")
    msg = fdp.message_type.add(name="Order")
    for number, (fname, ftype, type_name) in enumerate(
        [
            ("order_id", F.TYPE_INT64, None),
            ("customer", F.TYPE_STRING, None),
            ("amount", F.TYPE_DOUBLE, None),
            ("status", F.TYPE_STRING, None),
            ("updated_at", F.TYPE_MESSAGE, ".google.protobuf.Timestamp"),
            ("is_deleted", F.TYPE_BOOL, None),
            ("channel", F.TYPE_STRING, None),
        ],
        1,
    ):
        f = msg.field.add(name=fname, number=number, type=ftype, label=F.LABEL_OPTIONAL)
        if type_name:
            f.type_name = type_name
    note = msg.nested_type.add(name="Note")
    note.field.add(name="text", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    return fdp


def orders_message_class(name: str = "millstream_test_orders.proto") -> Any:
    """The ``millstream.test.Order`` class, in the default pool (what serializers need)."""
    pool = descriptor_pool.Default()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    try:
        pool.FindFileByName(name)
    except KeyError:
        pool.Add(orders_file_descriptor(name))
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("millstream.test.Order"))


def order_of(value: bytes | None) -> dict[str, Any] | None:
    """The generator value as an order, or None when it is not a well-formed one."""
    if value is None:
        return None
    try:
        obj = json.loads(value)
    except ValueError:
        return None
    if not isinstance(obj, dict) or set(obj) != set(_FIELDS):
        return None
    for k, t in _FIELDS.items():
        v = obj[k]
        if t is float and isinstance(v, int) and not isinstance(v, bool):
            continue
        if not isinstance(v, t) or (t is int and isinstance(v, bool)):
            return None
    obj["updated_at"] = datetime.fromisoformat(obj["updated_at"]).astimezone(UTC)
    obj["amount"] = float(obj["amount"])
    return obj


class OrdersEncoder:
    """Generator values -> Confluent wire values (``avro`` or ``protobuf``) for ``topic``."""

    def __init__(self, fmt: str, registry_url: str, topic: str) -> None:
        sr = importlib.import_module("confluent_kafka.schema_registry")
        ser_mod = importlib.import_module("confluent_kafka.serialization")
        self.fmt = fmt
        client = sr.SchemaRegistryClient({"url": registry_url})
        self.ctx = ser_mod.SerializationContext(topic, ser_mod.MessageField.VALUE)
        if fmt == "avro":
            avro = importlib.import_module("confluent_kafka.schema_registry.avro")
            self._ser = avro.AvroSerializer(client, json.dumps(ORDERS_AVRO))
        else:
            pb = importlib.import_module("confluent_kafka.schema_registry.protobuf")
            self.cls = orders_message_class()
            self._ser = pb.ProtobufSerializer(self.cls, client, {"use.deprecated.format": False})
        self._n = 0

    def good(self, order: dict[str, Any]) -> bytes:
        if self.fmt == "avro":
            return bytes(self._ser(order, self.ctx))
        msg = self.cls(
            order_id=order["order_id"],
            customer=order["customer"],
            amount=order["amount"],
            status=order["status"],
            is_deleted=order["is_deleted"],
        )
        msg.updated_at.FromDatetime(order["updated_at"])
        return bytes(self._ser(msg, self.ctx))

    def encode(self, value: bytes | None) -> bytes | None:
        """The wire value of a generator value (a tombstone stays None)."""
        if value is None:
            return None
        order = order_of(value)
        if order is not None:
            return self.good(order)
        # A malformed generator record: a bad wire value of one of three kinds, in turn.
        self._n += 1
        sample = self.good(
            {
                "order_id": 1,
                "customer": "c1",
                "amount": 1.5,
                "status": "new",
                "updated_at": datetime(2026, 1, 1, tzinfo=UTC),
                "is_deleted": True,
            }
        )
        kind = self._n % 3
        if kind == 0:
            return b"\x01" + sample[1:]  # wrong magic byte
        if kind == 1:
            return sample[:-3]  # truncated inside the last field
        return b"\x00\x00\x00\x7f\xff" + sample[5:]  # an id the registry does not know


def debezium_envelope(
    value_fields: list[dict[str, Any]],
    namespace: str = "shop.public.items",
    *,
    op_optional: bool = False,
) -> dict[str, Any]:
    """The Avro schema Debezium's Avro converter writes for a table whose row record has
    ``value_fields``: ``Envelope {before, after: union{null, Value}, source: Source{...,
    ts_ms}, op, ts_ms, transaction}`` (``after`` refers to ``Value`` by name, as Debezium's
    does). ``op_optional``: ``op`` as a union with null (to send an event without one)."""
    return {
        "type": "record",
        "name": "Envelope",
        "namespace": namespace,
        "fields": [
            {
                "name": "before",
                "type": ["null", {"type": "record", "name": "Value", "fields": value_fields}],
                "default": None,
            },
            {"name": "after", "type": ["null", "Value"], "default": None},
            {
                "name": "source",
                "type": {
                    "type": "record",
                    "name": "Source",
                    "namespace": "io.debezium.connector.postgresql",
                    "fields": [
                        {"name": "version", "type": "string"},
                        {"name": "connector", "type": "string"},
                        {"name": "name", "type": "string"},
                        {"name": "ts_ms", "type": "long"},
                        {"name": "db", "type": "string"},
                        {"name": "table", "type": "string"},
                        {"name": "lsn", "type": ["null", "long"], "default": None},
                    ],
                },
            },
            {"name": "op", "type": ["null", "string"] if op_optional else "string"},
            {"name": "ts_ms", "type": ["null", "long"], "default": None},
            {
                "name": "transaction",
                "type": [
                    "null",
                    {
                        "type": "record",
                        "name": "block",
                        "namespace": "event",
                        "fields": [
                            {"name": "id", "type": "string"},
                            {"name": "total_order", "type": "long"},
                            {"name": "data_collection_order", "type": "long"},
                        ],
                    },
                ],
                "default": None,
            },
        ],
    }


#: The row record of the ``items`` table the Debezium tests use.
ITEMS_VALUE_FIELDS: list[dict[str, Any]] = [
    {"name": "id", "type": "long"},
    {"name": "name", "type": ["null", "string"], "default": None},
    {"name": "qty", "type": ["null", "int"], "default": None},
]
ITEMS_KEY_AVRO: dict[str, Any] = {
    "type": "record",
    "name": "Key",
    "namespace": "shop.public.items",
    "fields": [{"name": "id", "type": "long"}],
}


class DebeziumAvroEncoder:
    """Debezium change events (the JSON converter's dicts: ``before``, ``after``, ``op``,
    ``ts_ms``, ``source.ts_ms``) and keys as Debezium's Avro converter writes them, with
    confluent-kafka's ``AvroSerializer`` against a schema registry (subjects
    ``<topic>-value`` and ``<topic>-key``)."""

    def __init__(
        self,
        registry_url: str,
        topic: str,
        envelope: dict[str, Any] | None = None,
        key_schema: dict[str, Any] | None = None,
    ) -> None:
        sr = importlib.import_module("confluent_kafka.schema_registry")
        ser_mod = importlib.import_module("confluent_kafka.serialization")
        avro = importlib.import_module("confluent_kafka.schema_registry.avro")
        client = sr.SchemaRegistryClient({"url": registry_url})
        self.value_ctx = ser_mod.SerializationContext(topic, ser_mod.MessageField.VALUE)
        self.key_ctx = ser_mod.SerializationContext(topic, ser_mod.MessageField.KEY)
        self._value = avro.AvroSerializer(
            client, json.dumps(envelope or debezium_envelope(ITEMS_VALUE_FIELDS))
        )
        self._key = avro.AvroSerializer(client, json.dumps(key_schema or ITEMS_KEY_AVRO))

    def key(self, key: dict[str, Any]) -> bytes:
        return bytes(self._key(key, self.key_ctx))

    def value(self, event: dict[str, Any] | None) -> bytes | None:
        """The wire value of a change event (None: the tombstone stays None)."""
        if event is None:
            return None
        src = event.get("source") or {}
        record = {
            "before": event.get("before"),
            "after": event.get("after"),
            "op": event.get("op"),
            "ts_ms": event.get("ts_ms"),
            "source": {
                "version": "2.5.0.Final",
                "connector": str(src.get("connector", "postgresql")),
                "name": "shop",
                "ts_ms": int(src["ts_ms"]),
                "db": str(src.get("db", "shop")),
                "table": str(src.get("table", "items")),
                "lsn": None,
            },
            "transaction": None,
        }
        return bytes(self._value(record, self.value_ctx))


#: Protobuf field types a :class:`ProtobufRowEncoder` message may hold, by name.
_PROTO_TYPES = {
    "int64": descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
    "int32": descriptor_pb2.FieldDescriptorProto.TYPE_INT32,
    "string": descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
    "double": descriptor_pb2.FieldDescriptorProto.TYPE_DOUBLE,
    "bool": descriptor_pb2.FieldDescriptorProto.TYPE_BOOL,
}


def proto_message_class(package: str, name: str, fields: list[tuple[str, str]]) -> Any:
    """A proto3 message class ``<package>.<name>`` of ``fields`` ((name, type) pairs, numbered
    in order; plain proto3 fields: an unset one reads its default; type ``empty`` is a
    ``google.protobuf.Empty``, which no column type holds), in the default pool (what
    confluent-kafka's serializer needs); its file is named after the package and the
    message, so each (package, name) is made once."""
    F = descriptor_pb2.FieldDescriptorProto
    file_name = f"{package.replace('.', '/')}/{name.lower()}.proto"
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(file_name)
    except KeyError:
        fdp = descriptor_pb2.FileDescriptorProto(name=file_name, package=package, syntax="proto3")
        msg = fdp.message_type.add(name=name)
        for number, (fname, ftype) in enumerate(fields, 1):
            if ftype == "empty":
                fdp.dependency.append("google/protobuf/empty.proto")
                msg.field.add(
                    name=fname,
                    number=number,
                    type=F.TYPE_MESSAGE,
                    type_name=".google.protobuf.Empty",
                    label=F.LABEL_OPTIONAL,
                )
                continue
            msg.field.add(
                name=fname, number=number, type=_PROTO_TYPES[ftype], label=F.LABEL_OPTIONAL
            )
        pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{name}"))


class ProtobufRowEncoder:
    """Rows (dicts) and keys as confluent-kafka's ``ProtobufSerializer`` writes them for
    ``topic`` against a schema registry (subjects ``<topic>-value`` and ``<topic>-key``): a
    value message ``<package>.Row`` of ``fields``, a key message ``<package>.Key`` of
    ``key_fields`` (None: keys are not serialized, :meth:`key` is not to be called). Both
    schemas are registered when the encoder is made."""

    def __init__(
        self,
        registry_url: str,
        topic: str,
        package: str,
        fields: list[tuple[str, str]],
        key_fields: list[tuple[str, str]] | None = None,
    ) -> None:
        sr = importlib.import_module("confluent_kafka.schema_registry")
        ser_mod = importlib.import_module("confluent_kafka.serialization")
        pb = importlib.import_module("confluent_kafka.schema_registry.protobuf")
        client = sr.SchemaRegistryClient({"url": registry_url})
        self.value_ctx = ser_mod.SerializationContext(topic, ser_mod.MessageField.VALUE)
        self.key_ctx = ser_mod.SerializationContext(topic, ser_mod.MessageField.KEY)
        conf = {"use.deprecated.format": False}
        self.row_cls = proto_message_class(package, "Row", fields)
        self._value = pb.ProtobufSerializer(self.row_cls, client, conf)
        self.key_cls = proto_message_class(package, "Key", key_fields) if key_fields else None
        self._key = pb.ProtobufSerializer(self.key_cls, client, conf) if self.key_cls else None
        # the writer schemas are registered now, as a producer's first record would
        self._value(self.row_cls(), self.value_ctx)
        if self._key is not None:
            self._key(self.key_cls(), self.key_ctx)

    def value(self, row: dict[str, Any] | None) -> bytes | None:
        """The wire value of ``row`` (None, a tombstone, stays None)."""
        if row is None:
            return None
        return bytes(self._value(self.row_cls(**row), self.value_ctx))

    def key(self, key: dict[str, Any]) -> bytes:
        assert self._key is not None and self.key_cls is not None
        return bytes(self._key(self.key_cls(**key), self.key_ctx))
