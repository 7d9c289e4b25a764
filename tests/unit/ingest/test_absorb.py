"""The spec that absorbs a writer schema (``schema_evolution: auto``), as pure functions: the
Avro and Protobuf type -> column type mapping, and what a writer schema adds, widens or is
refused for."""

from __future__ import annotations

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool

from millstream.errors import IncompatibleChangeError
from millstream.ingest.formats import avro, protobuf
from millstream.ingest.formats.absorb import absorbing_spec
from millstream.spec import TableSpec

SPEC = TableSpec.parse(
    {
        "name": "t",
        "schema": {"id": "long", "qty": "int", "name": "string"},
        "primary_key": ["id"],
        "mode": "upsert",
    }
)


def test_every_kind_maps_to_a_column_type_that_accepts_it() -> None:
    for kind, column in avro.COLUMN_OF_KIND.items():
        assert kind in avro._ACCEPTS[column], kind
    for kind, column in protobuf.COLUMN_OF_KIND.items():
        assert kind in protobuf._ACCEPTS[column], kind


@pytest.mark.parametrize(
    ("avro_type", "column"),
    [
        ("float", "double"),
        ({"type": "enum", "name": "E", "symbols": ["A"]}, "string"),
        (["null", {"type": "long", "logicalType": "timestamp-millis"}], "timestamp"),
        ({"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}, "decimal(10,2)"),
        ({"type": "array", "items": "long"}, "list<long>"),
        ({"type": "map", "values": ["null", "double"]}, "map<string,double>"),
        (
            {
                "type": "record",
                "name": "R",
                "fields": [{"name": "a", "type": "int"}, {"name": "b", "type": "string"}],
            },
            "struct<a:int,b:string>",
        ),
        (["null", "long", "string"], None),
    ],
)
def test_avro_types_map_to_column_types(avro_type: object, column: str | None) -> None:
    assert avro.column_type_of(avro_type) == column


def _schema(*fields: tuple[str, object]) -> dict[str, object]:
    return {"type": "record", "name": "R", "fields": [{"name": n, "type": t} for n, t in fields]}


def test_absorbing_adds_new_fields_at_the_end_in_writer_order_and_widens() -> None:
    writer = _schema(
        ("zeta", ["null", "string"]), ("id", "int"), ("qty", "long"), ("alpha", "double")
    )
    grown = absorbing_spec(SPEC, avro.writer_fields(writer))
    assert grown.columns == {
        "id": "long",
        "qty": "long",
        "name": "string",
        "zeta": "string",
        "alpha": "double",
    }
    assert absorbing_spec(grown, avro.writer_fields(writer)) is grown, "nothing more to do"


@pytest.mark.parametrize(
    ("fields", "field", "rule"),
    [
        ((("name", "long"),), "schema.name", "changing the type string -> long"),
        ((("id", "double"),), "schema.id", "the type of a key column cannot change"),
        ((("odd", ["long", "string"]),), "schema.odd", "no column type holds Avro type"),
        ((("_ms_x", "long"),), "schema._ms_x", "_ms_"),
    ],
)
def test_absorbing_refuses_what_the_rules_refuse(
    fields: tuple[tuple[str, object], ...], field: str, rule: str
) -> None:
    with pytest.raises(IncompatibleChangeError) as exc:
        absorbing_spec(SPEC, avro.writer_fields(_schema(("note", "string"), *fields)))
    assert exc.value.field == field and rule in str(exc.value), str(exc.value)


def test_protobuf_fields_map_to_column_types() -> None:
    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(
        name="absorb_test.proto", package="absorb.test", syntax="proto3"
    )
    inner = fdp.message_type.add(name="Inner")
    inner.field.add(name="a", number=1, type=F.TYPE_UINT32, label=F.LABEL_OPTIONAL)
    msg = fdp.message_type.add(name="M")
    msg.field.add(name="id", number=1, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    msg.field.add(name="xs", number=2, type=F.TYPE_FLOAT, label=F.LABEL_REPEATED)
    msg.field.add(
        name="inner",
        number=3,
        type=F.TYPE_MESSAGE,
        label=F.LABEL_OPTIONAL,
        type_name=".absorb.test.Inner",
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    desc = pool.FindMessageTypeByName("absorb.test.M")
    fields = protobuf.writer_fields(desc)
    assert [(f.name, f.column_type) for f in fields] == [
        ("id", "long"),
        ("xs", "list<double>"),
        ("inner", "struct<a:long>"),
    ]
    grown = absorbing_spec(SPEC, fields)
    assert list(grown.columns)[3:] == ["xs", "inner"]
