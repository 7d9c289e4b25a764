"""source.format avro / protobuf / csv at the decode level (no Spark): values produced with
confluent-kafka's own serializers against the test schema registry decode to the rows their
JSON twins decode to; every kind of bad value goes to the dead-letter rows with its reason;
a registry that is down makes the batch wait (nothing dead-lettered, nothing lost)."""

from __future__ import annotations

import base64
import json
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from harness.formats import ORDERS_AVRO, OrdersEncoder, orders_file_descriptor
from harness.schema_registry import TestSchemaRegistry
from millstream.datastream import DatastreamSpec
from millstream.errors import InvalidSpecError, SourceReadError
from millstream.ingest.decode import decode_records
from millstream.ingest.formats import decoder_for, format_config
from millstream.ingest.sources import spec_reader
from millstream.ingest.sources.generator import ORDERS_SCHEMA, GeneratorConfig, generate
from millstream.spec import TableSpec

SPEC = TableSpec.parse(
    {
        "name": "orders",
        "schema": dict(ORDERS_SCHEMA),
        "mode": "upsert",
        "primary_key": ["order_id"],
        "comparison_column": "updated_at",
        "delete_column": "is_deleted",
    }
)


@pytest.fixture(scope="module")
def registry():
    with TestSchemaRegistry() as reg:
        yield reg


def raw_table(values: list[bytes | None], keys: list[bytes | None] | None = None) -> pa.Table:
    n = len(values)
    return pa.table(
        {
            "partition": pa.array([0] * n, pa.int32()),
            "offset": pa.array(range(n), pa.int64()),
            "key": pa.array(keys or [None] * n, pa.binary()),
            "value": pa.array(values, pa.binary()),
        }
    )


def decoder(fields: dict[str, Any]) -> Any:
    return decoder_for({"format": format_config(fields)})


def generator_values(n: int, seed: int = 11) -> tuple[list[bytes | None], list[bytes]]:
    cfg = GeneratorConfig(seed=seed, partitions=1, malformed_fraction=0.05, delete_fraction=0.05)
    recs = list(generate(cfg, 0, 0, n))
    return [r[2] for r in recs], [r[1] for r in recs]


def rows(d: Any) -> list[dict[str, Any]]:
    return sorted(d.rows.to_pylist(), key=lambda r: r["_ms_offset"])


@pytest.mark.parametrize("fmt", ["avro", "protobuf"])
def test_wire_values_decode_like_their_json_twins(registry, fmt: str) -> None:
    """Every good order equals its JSON twin's row (tombstones too); every malformed one is
    dead-lettered with a reason, at its offset; the schema is fetched once per id."""
    print("seed 11")
    values, keys = generator_values(3000)
    enc = OrdersEncoder(fmt, registry.url, f"twins-{fmt}")
    wire = [enc.encode(v) for v in values]
    dec = decoder({"format": fmt, "schema_registry": {"url": registry.url}})
    got = decode_records(SPEC, raw_table(wire, keys), dec)
    want = decode_records(SPEC, raw_table(values, keys))
    assert rows(got) == rows(want)
    assert len(want.dead) > 50
    assert sorted(d[1] for d in got.dead) == sorted(d[1] for d in want.dead)
    reasons = {d[4].split(" ")[0].rstrip(":") for d in got.dead}
    assert reasons >= {"wrong", "unknown", "truncated" if fmt == "avro" else "not"}, reasons
    assert [d[2] for d in sorted(got.dead, key=lambda d: d[1])] == [
        wire[d[1]] for d in sorted(got.dead, key=lambda d: d[1])
    ]
    # A second batch is served from the cache: no new lookup of the good schema.
    fetched = dec.registry.fetches
    decode_records(SPEC, raw_table(wire[:100], keys[:100]), dec)
    assert (
        dec.registry.fetches == fetched - (0 if fmt else 1) or dec.registry.fetches <= fetched + 1
    )


def test_avro_bad_values_each_name_their_reason(registry) -> None:
    enc = OrdersEncoder("avro", registry.url, "bad-avro")
    good = enc.good(
        {
            "order_id": 7,
            "customer": "c7",
            "amount": 2.0,
            "status": "new",
            "updated_at": datetime(2026, 1, 1, tzinfo=UTC),
            "is_deleted": False,
        }
    )
    # A schema whose `amount` is a string: its records do not fit the double column.
    other = dict(ORDERS_AVRO, fields=[dict(f) for f in ORDERS_AVRO["fields"]])
    other["fields"][2] = {"name": "amount", "type": "string"}
    sid = registry.register("bad-avro-other", json.dumps(other))
    import fastavro

    buf = __import__("io").BytesIO()
    rec = {
        "order_id": 8,
        "customer": "c",
        "amount": "lots",
        "status": "new",
        "updated_at": datetime(2026, 1, 1, tzinfo=UTC),
        "is_deleted": False,
        "channel": None,
    }
    fastavro.schemaless_writer(buf, fastavro.parse_schema(other), rec)
    mismatched = b"\x00" + sid.to_bytes(4, "big") + buf.getvalue()
    values = [good, b"\x02" + good[1:], good[:3], good[:-2], good + b"\x00\x00", mismatched, b""]
    dec = decoder({"format": "avro", "schema_registry": {"url": registry.url}})
    d = decode_records(SPEC, raw_table(values, [b"7"] * len(values)), dec)
    assert [r["order_id"] for r in d.rows.to_pylist()] == [7]
    why = {o: e for _, o, _, _, e in d.dead}
    assert why[1].startswith("wrong magic byte 2")
    assert why[2].startswith("truncated: 3 bytes")
    assert why[3].startswith("truncated")
    assert "2 bytes left over" in why[4]
    assert why[5] == ("field 'amount': Avro type string does not fit column 'amount' (double)")
    assert why[6].startswith("truncated: 0 bytes")


def test_a_registry_that_is_down_makes_the_batch_wait_and_loses_nothing(registry) -> None:
    """While the registry answers 503 the decode retries with backoff; once it is back every
    record decodes: none is dead-lettered, none is missing."""
    values, keys = generator_values(400, seed=5)
    values = [v for v in values if v is None or b'"customer"' in v]  # good orders only
    keys = keys[: len(values)]
    enc = OrdersEncoder("avro", registry.url, "down")
    wire = [enc.encode(v) for v in values]
    # A fresh decoder (its own cache): the schema must be fetched.
    dec = decoder(
        {"format": "avro", "schema_registry": {"url": registry.url, "max_wait_seconds": 120}}
    )
    registry.available = False
    out: dict[str, Any] = {}
    worker = threading.Thread(
        target=lambda: out.setdefault("d", decode_records(SPEC, raw_table(wire, keys), dec))
    )
    try:
        worker.start()
        time.sleep(1.5)
        assert worker.is_alive(), "the batch did not wait for the registry"
        assert "d" not in out
    finally:
        registry.available = True
    worker.join(60)
    d = out["d"]
    assert d.dead == []
    assert rows(d) == rows(decode_records(SPEC, raw_table(values, keys)))


def test_a_registry_down_for_longer_than_max_wait_fails_the_batch(registry) -> None:
    """Failing (the writer resumes at the shard uppers) rather than dead-lettering."""
    dec = decoder(
        {"format": "avro", "schema_registry": {"url": registry.url, "max_wait_seconds": 0.5}}
    )
    enc = OrdersEncoder("avro", registry.url, "down-long")
    good = enc.encode(generator_values(1)[0][0])
    registry.available = False
    try:
        with pytest.raises(SourceReadError, match="schema registry"):
            decode_records(SPEC, raw_table([good]), dec)
    finally:
        registry.available = True


def test_fixed_schema_files_read_plain_payloads(tmp_path: Path) -> None:
    import fastavro
    from google.protobuf import descriptor_pb2, timestamp_pb2

    from harness.formats import orders_message_class

    order = {
        "order_id": 3,
        "customer": "c3",
        "amount": 9.25,
        "status": "paid",
        "updated_at": datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
        "is_deleted": False,
        "channel": "web",
    }
    avsc = tmp_path / "orders.avsc"
    avsc.write_text(json.dumps(ORDERS_AVRO))
    buf = __import__("io").BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(ORDERS_AVRO), order)
    d = decode_records(
        SPEC,
        raw_table([buf.getvalue()]),
        decoder({"format": "avro", "schema_file": str(avsc)}),
    )
    expected = {k: v for k, v in order.items() if k != "channel"}
    assert [{k: r[k] for k in expected} for r in d.rows.to_pylist()] == [expected]

    fds = descriptor_pb2.FileDescriptorSet()
    fds.file.append(
        descriptor_pb2.FileDescriptorProto.FromString(timestamp_pb2.DESCRIPTOR.serialized_pb)
    )
    fds.file.append(orders_file_descriptor())
    desc = tmp_path / "orders.desc"
    desc.write_bytes(fds.SerializeToString())
    cls = orders_message_class()
    msg = cls(order_id=3, customer="c3", amount=9.25, status="paid")
    msg.updated_at.FromDatetime(order["updated_at"])
    d = decode_records(
        SPEC,
        raw_table([msg.SerializeToString()]),
        decoder(
            {
                "format": "protobuf",
                "schema_file": str(desc),
                "message_type": "millstream.test.Order",
            }
        ),
    )
    assert [{k: r[k] for k in expected} for r in d.rows.to_pylist()] == [expected]


def test_protobuf_nested_message_index_and_type_mismatch(registry) -> None:
    """The message-index array picks the nested message; its fields lacking every column
    but text, the keyed table dead-letters it for its null key, and a message whose field
    does not fit is dead-lettered naming the field."""
    from google.protobuf import descriptor_pb2

    fdp = orders_file_descriptor("mismatch.proto")
    fdp.message_type[0].field[0].type = descriptor_pb2.FieldDescriptorProto.TYPE_STRING
    sid = registry.register(
        "mismatch", base64.b64encode(fdp.SerializeToString()).decode(), "PROTOBUF"
    )
    frame = b"\x00" + sid.to_bytes(4, "big")
    values = [frame + b"\x00" + b"\x0a\x01x", frame + b"\x04\x00\x00" + b"\x0a\x01y"]
    d = decode_records(
        SPEC,
        raw_table(values),
        decoder({"format": "protobuf", "schema_registry": {"url": registry.url}}),
    )
    why = {o: e for _, o, _, _, e in d.dead}
    assert why[0] == "field 'order_id': Protobuf type string does not fit column 'order_id' (long)"
    assert why[1] == "primary key column 'order_id' is null"


def test_csv_files_match_columns_by_name_skip_headers_and_dead_letter_bad_rows(
    tmp_path: Path,
) -> None:
    part = tmp_path / "0"
    part.mkdir()
    (part / "a.csv").write_text(
        "order_id,customer,amount,status,updated_at,is_deleted,extra\n"
        "1,c1,2.5,new,2026-01-01T00:00:00Z,false,x\n"
        "2,c2,not-a-number,new,2026-01-01T00:00:01Z,false,x\n"
        "3,c3,1.0,new\n"
        '4,"c, four",4.0,paid,2026-01-01T00:00:03Z,false,x\n'
    )
    (part / "b.csv").write_text(  # other order, no `status`, a bad timestamp
        "updated_at,order_id,amount,customer,is_deleted\n"
        "2026-01-01T00:00:04Z,5,5.0,,true\n"
        "yesterday,6,6.0,c6,false\n"
    )
    spec = DatastreamSpec.parse(
        {
            "name": "csv",
            "source": {"kind": "files", "path": str(tmp_path), "format": "csv"},
            "table": {
                "mode": "upsert",
                "primary_key": ["order_id"],
                "comparison_column": "updated_at",
            },
            "schema": dict(ORDERS_SCHEMA),
        }
    )
    reader = spec_reader(spec.source)
    assert reader.latest_offsets() == {0: 6}  # data lines only
    batch = pa.Table.from_batches(list(reader.read_range(0, 0, 6)))
    assert batch.column("offset").to_pylist() == list(range(6))
    from millstream.ingest.sources import config_for

    d = decode_records(spec.table_spec(), batch, decoder_for(config_for(spec.source)[1]))
    got = {r["order_id"]: r for r in d.rows.to_pylist()}
    assert sorted(got) == [1, 4, 5]
    assert got[4]["customer"] == "c, four"
    assert got[5]["status"] is None and got[5]["customer"] is None and got[5]["is_deleted"]
    why = {o: e for _, o, _, _, e in d.dead}
    assert sorted(why) == [1, 2, 5]
    assert "column 'amount'" in why[1] and "not-a-number" in why[1]
    assert "columns" in why[2]
    assert why[5] == "column 'updated_at': 'yesterday' is not a valid timestamp[us, tz=UTC]"
    assert [d[3] for d in d.dead][:1] == [
        b"order_id,customer,amount,status,updated_at,is_deleted,extra"
    ]


@pytest.mark.parametrize(
    ("source", "field"),
    [
        ({"kind": "kafka", "format": "avro"}, "source.schema_registry"),
        (
            {"kind": "kafka", "format": "protobuf", "schema_file": "x.desc"},
            "source.message_type",
        ),
        (
            {"kind": "kafka", "format": "json", "schema_registry": {"url": "http://r:1"}},
            "source.schema_registry",
        ),
        (
            {
                "kind": "kafka",
                "format": "avro",
                "schema_registry": {"url": "http://r:1"},
                "framing": "none",
            },
            "source.framing",
        ),
        ({"kind": "kafka", "format": "csv"}, "source.format"),
        ({"kind": "files", "path": "/tmp", "format": "avro"}, "source.format"),
        ({"kind": "kafka", "schema_evolution": "auto"}, "source.schema_evolution"),
        (
            {
                "kind": "kafka",
                "format": "avro",
                "schema_file": __file__,
                "schema_evolution": "auto",
            },
            "source.schema_evolution",
        ),
        ({"kind": "files", "path": "/tmp", "schema_evolution": "auto"}, "source.schema_evolution"),
        (
            {
                "kind": "kafka",
                "format": "avro",
                "schema_registry": {"url": "http://r:1"},
                "schema_evolution": "yes",
            },
            "source.schema_evolution",
        ),
    ],
)
def test_format_spec_mistakes_name_the_field(source: dict[str, Any], field: str) -> None:
    if source["kind"] == "kafka":
        source = {"bootstrap_servers": "b:9092", "topic": "t", **source}
    with pytest.raises(InvalidSpecError) as exc:
        DatastreamSpec.parse({"name": "x", "source": source, "schema": {"a": "string"}})
    assert exc.value.field == field
