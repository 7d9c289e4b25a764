"""Decimal and nested columns at the decode level (no Spark), per format: JSON (numbers and
strings for decimals; a value that overflows, would need rounding, or has the wrong shape is
dead-lettered naming its column while the rest of the batch decodes), Avro (decimal logical
type, arrays, records, maps), Protobuf (repeated, nested messages, map fields) and CSV
(decimals from text)."""

from __future__ import annotations

import io
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from millstream.ingest.decode import decode_records
from millstream.ingest.formats import decoder_for, format_config
from millstream.spec import TableSpec

SCHEMA = {
    "id": "long",
    "price": "decimal(5,2)",
    "tags": "list<string>",
    "items": "list<struct<sku:string,qty:int>>",
    "attrs": "map<string,long>",
    "addr": "struct<city:string,zip:string>",
}
SPEC = TableSpec.parse({"name": "t", "mode": "upsert", "primary_key": ["id"], "schema": SCHEMA})


def raw_table(values: list[bytes], *, keys: list[bytes] | None = None) -> pa.Table:
    n = len(values)
    return pa.table(
        {
            "partition": pa.array([0] * n, pa.int32()),
            "offset": pa.array(range(n), pa.int64()),
            "key": pa.array(keys or [None] * n, pa.binary()),
            "value": pa.array(values, pa.binary()),
        }
    )


def rows_and_dead(d: Any) -> tuple[dict[int, dict[str, Any]], dict[int, str]]:
    rows = {r["_ms_offset"]: {c: r[c] for c in SCHEMA} for r in d.rows.to_pylist()}
    return rows, {o: e for _, o, _, _, e in d.dead}


def test_json_nested_and_decimal_values_decode_and_bad_ones_are_dead_lettered_naming_the_column() -> (
    None
):
    values = [
        {
            "id": 1,
            "price": 12.34,
            "tags": ["a", "b"],
            "items": [{"sku": "x", "qty": 2}, {"sku": "y"}],
            "attrs": {"w": 3},
            "addr": {"city": "Oslo", "zip": "0150"},
        },
        {"id": 2, "price": "999.99", "tags": [], "attrs": {}, "addr": None},
        {"id": 3, "price": "1234.5"},  # one integer digit too many
        {"id": 4, "price": 12.345},  # would need rounding
        {"id": 5, "tags": "ab"},  # a string where a list belongs
        {"id": 6, "attrs": ["w"]},  # a list where a map belongs
        {"id": 7, "attrs": {"w": "x"}},  # a map value of the wrong type
        {"id": 8, "addr": {"city": 5}},
        {"id": 9, "items": [{"sku": "z", "qty": "many"}]},
        {"id": 10, "price": -0.5},
    ]
    d = decode_records(SPEC, raw_table([json.dumps(v).encode() for v in values]))
    rows, dead = rows_and_dead(d)
    assert rows[0] == {
        "id": 1,
        "price": Decimal("12.34"),
        "tags": ["a", "b"],
        "items": [{"sku": "x", "qty": 2}, {"sku": "y", "qty": None}],
        "attrs": [("w", 3)],
        "addr": {"city": "Oslo", "zip": "0150"},
    }
    assert rows[1]["price"] == Decimal("999.99") and rows[1]["tags"] == []
    assert rows[9]["price"] == Decimal("-0.50")
    assert sorted(rows) == [0, 1, 9]
    # every other record is dead-lettered (none dropped silently), naming its column
    assert sorted(dead) == [2, 3, 4, 5, 6, 7, 8]
    assert dead[2] == "column 'price': decimal overflow: 1234.50 does not fit decimal(5,2)"
    assert dead[3].startswith("column 'price': 12.345 does not fit decimal(5,2)")
    assert dead[4].startswith("column 'tags': ")
    assert dead[5] == "column 'attrs': attrs: expected an object (map), got list"
    assert dead[6].startswith("column 'attrs': attrs.w: expected long")
    assert dead[7].startswith("column 'addr': ")
    assert dead[8].startswith("column 'items': ")


def test_avro_decimal_arrays_records_and_maps_decode(tmp_path: Path) -> None:
    schema = {
        "type": "record",
        "name": "Order",
        "fields": [
            {"name": "id", "type": "long"},
            {
                "name": "price",
                "type": [
                    "null",
                    {"type": "bytes", "logicalType": "decimal", "precision": 6, "scale": 2},
                ],
            },
            {"name": "tags", "type": {"type": "array", "items": "string"}},
            {
                "name": "items",
                "type": {
                    "type": "array",
                    "items": {
                        "type": "record",
                        "name": "Item",
                        "fields": [
                            {"name": "sku", "type": "string"},
                            {"name": "qty", "type": "int"},
                            {"name": "note", "type": "string"},  # not in the struct: ignored
                        ],
                    },
                },
            },
            {"name": "attrs", "type": {"type": "map", "values": "long"}},
            {
                "name": "addr",
                "type": [
                    "null",
                    {
                        "type": "record",
                        "name": "Addr",
                        "fields": [{"name": "city", "type": "string"}],  # zip: null
                    },
                ],
            },
        ],
    }
    avsc = tmp_path / "orders.avsc"
    avsc.write_text(json.dumps(schema))
    records = [
        {
            "id": 1,
            "price": Decimal("12.34"),
            "tags": ["a"],
            "items": [{"sku": "x", "qty": 2, "note": "n"}],
            "attrs": {"w": 3},
            "addr": {"city": "Oslo"},
        },
        {"id": 2, "price": None, "tags": [], "items": [], "attrs": {}, "addr": None},
        {"id": 3, "price": Decimal("1234.56"), "tags": [], "items": [], "attrs": {}, "addr": None},
    ]
    values = []
    for r in records:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), r)
        values.append(buf.getvalue())
    dec = decoder_for({"format": format_config({"format": "avro", "schema_file": str(avsc)})})
    rows, dead = rows_and_dead(decode_records(SPEC, raw_table(values), dec))
    assert rows[0] == {
        "id": 1,
        "price": Decimal("12.34"),
        "tags": ["a"],
        "items": [{"sku": "x", "qty": 2}],
        "attrs": [("w", 3)],
        "addr": {"city": "Oslo", "zip": None},
    }
    assert rows[1] == {"id": 2, "price": None, "tags": [], "items": [], "attrs": [], "addr": None}
    # decimal(6,2) in the writer schema: 1234.56 has a digit too many for decimal(5,2)
    assert list(dead) == [2] and dead[2].startswith("column 'price': ")
    assert "does not fit decimal(5,2)" in dead[2]

    # an Avro type that cannot become the column's type refuses every record of the schema
    wrong = dict(schema, fields=[schema["fields"][0], {"name": "tags", "type": "string"}])
    avsc.write_text(json.dumps(wrong))
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(wrong), {"id": 1, "tags": "a"})
    dec = decoder_for({"format": format_config({"format": "avro", "schema_file": str(avsc)})})
    _, dead = rows_and_dead(decode_records(SPEC, raw_table([buf.getvalue()]), dec))
    assert dead == {0: "field 'tags': Avro type string does not fit column 'tags' (list<string>)"}


def _proto_file(tmp_path: Path) -> tuple[Any, Path]:
    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(
        name="nested_test.proto", package="nt", syntax="proto3"
    )
    item = fdp.message_type.add(name="Item")
    item.field.add(name="sku", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    item.field.add(name="qty", number=2, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL)
    addr = fdp.message_type.add(name="Addr")
    addr.field.add(name="city", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    addr.field.add(name="zip", number=2, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    msg = fdp.message_type.add(name="Order")
    msg.field.add(name="id", number=1, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    msg.field.add(name="tags", number=2, type=F.TYPE_STRING, label=F.LABEL_REPEATED)
    msg.field.add(
        name="items", number=3, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED, type_name=".nt.Item"
    )
    entry = msg.nested_type.add(name="AttrsEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    msg.field.add(
        name="attrs",
        number=4,
        type=F.TYPE_MESSAGE,
        label=F.LABEL_REPEATED,
        type_name=".nt.Order.AttrsEntry",
    )
    msg.field.add(
        name="addr", number=5, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL, type_name=".nt.Addr"
    )
    fds = descriptor_pb2.FileDescriptorSet()
    fds.file.append(fdp)
    path = tmp_path / "nested.desc"
    path.write_bytes(fds.SerializeToString())
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("nt.Order")), path


def test_protobuf_repeated_nested_messages_and_maps_decode(tmp_path: Path) -> None:
    cls, desc = _proto_file(tmp_path)
    full = cls(id=1, tags=["a", "b"], attrs={"w": 3})
    full.items.add(sku="x", qty=2)
    full.addr.city = "Oslo"
    empty = cls(id=2)
    spec = TableSpec.parse(
        {
            "name": "t",
            "mode": "upsert",
            "primary_key": ["id"],
            "schema": {c: t for c, t in SCHEMA.items() if c != "price"},
        }
    )
    dec = decoder_for(
        {
            "format": format_config(
                {"format": "protobuf", "schema_file": str(desc), "message_type": "nt.Order"}
            )
        }
    )
    d = decode_records(spec, raw_table([full.SerializeToString(), empty.SerializeToString()]), dec)
    assert d.dead == []
    assert [{c: r[c] for c in spec.columns} for r in d.rows.to_pylist()] == [
        {
            "id": 1,
            "tags": ["a", "b"],
            "items": [{"sku": "x", "qty": 2}],
            "attrs": [("w", 3)],
            "addr": {"city": "Oslo", "zip": ""},
        },
        {"id": 2, "tags": [], "items": [], "attrs": [], "addr": None},
    ]
    # a repeated field for a struct column refuses every record of the message type, naming it
    bad = TableSpec.parse({"name": "t", "schema": {"id": "long", "tags": "struct<a:string>"}})
    d = decode_records(bad, raw_table([full.SerializeToString()]), dec)
    assert [e for *_, e in d.dead] == [
        "field 'tags': Protobuf type repeated string does not fit column 'tags' (struct<a:string>)"
    ]


def test_csv_decimals_parse_from_text_and_an_overflow_is_dead_lettered() -> None:
    spec = TableSpec.parse({"name": "t", "schema": {"id": "long", "price": "decimal(5,2)"}})
    dec = decoder_for({"format": format_config({"format": "csv"})})
    header = b"id,price"
    d = decode_records(
        spec, raw_table([b"1,12.34", b"2,1234.5", b"3,-0.5"], keys=[header] * 3), dec
    )
    assert [(r["id"], r["price"]) for r in d.rows.to_pylist()] == [
        (1, Decimal("12.34")),
        (3, Decimal("-0.50")),
    ]
    assert [(o, e) for _, o, _, _, e in d.dead] == [
        (1, "column 'price': decimal overflow: 1234.50 does not fit decimal(5,2)")
    ]
