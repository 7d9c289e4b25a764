"""``source.envelope: debezium`` with ``format: avro`` at the decode level (no Spark): events and
keys produced with confluent-kafka's ``AvroSerializer`` against the test schema registry, in
Debezium's Avro shape (``Envelope {before, after: union{null, Value}, source, op, ts_ms,
transaction}``, ``Key {id}``), decoded by the production path (``decoder_for`` +
``decode_records``) must give the rows and dead letters the same events give as JSON through
the JSON envelope, and the table the sequential model gives."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pyarrow as pa
import pytest

from harness.formats import (
    ITEMS_VALUE_FIELDS,
    DebeziumAvroEncoder,
    debezium_envelope,
)
from harness.schema_registry import TestSchemaRegistry
from millstream.datastream import DatastreamSpec
from millstream.errors import InvalidSpecError, SourceReadError
from millstream.ingest.decode import Decoded, decode_records
from millstream.ingest.formats import absorber, decoder_for
from millstream.ingest.sources import config_for
from millstream.reference.model import model_rows

SCHEMA = {
    "id": "long",
    "name": "string",
    "qty": "int",
    "changed_ms": "long",
    "op": "string",
    "event_ms": "long",
}
METADATA = {"source_ts_ms": "changed_ms", "op": "op", "ts_ms": "event_ms"}


@pytest.fixture(scope="module")
def registry():
    with TestSchemaRegistry() as reg:
        yield reg


def datastream(
    registry_url: str | None,
    table: dict[str, Any] | None = None,
    max_wait: float = 300,
    **source: Any,
) -> DatastreamSpec:
    fmt: dict[str, Any] = (
        {"format": "avro", "schema_registry": {"url": registry_url, "max_wait_seconds": max_wait}}
        if registry_url
        else {}
    )
    return DatastreamSpec.parse(
        {
            "name": "cdc",
            "source": {
                "kind": "kafka",
                "bootstrap_servers": "localhost:9092",
                "topic": "shop.public.items",
                "envelope": "debezium",
                "metadata_columns": METADATA,
                **fmt,
                **source,
            },
            "table": table or {"mode": "upsert", "primary_key": ["id"]},
            "schema": SCHEMA,
        }
    )


def event(
    op: str | None, before: dict[str, Any] | None, after: dict[str, Any] | None, ts: int
) -> dict[str, Any]:
    return {
        "before": before,
        "after": after,
        "op": op,
        "ts_ms": ts + 1000,
        "source": {"connector": "postgresql", "db": "shop", "table": "items", "ts_ms": ts},
    }


def decode(
    ds: DatastreamSpec, records: list[tuple[bytes | None, bytes | None]], decoder: Any = None
) -> Decoded:
    n = len(records)
    raw = pa.table(
        {
            "partition": pa.array([0] * n, pa.int32()),
            "offset": pa.array(range(n), pa.int64()),
            "key": pa.array([k for k, _ in records], pa.binary()),
            "value": pa.array([v for _, v in records], pa.binary()),
        }
    )
    dec = decoder if decoder is not None else decoder_for(config_for(ds.source)[1])
    return decode_records(ds.table_spec(), raw, dec)


def by_offset(d: Decoded) -> list[dict[str, Any]]:
    return sorted(d.rows.to_pylist(), key=lambda r: r["_ms_offset"])


def dead(d: Decoded) -> dict[int, str]:
    return {o: e for _, o, _, _, e in d.dead}


def table(ds: DatastreamSpec, d: Decoded) -> list[dict[str, Any]]:
    return sorted(model_rows(ds.table_spec(), d.rows.to_pylist()), key=lambda r: r["id"])


def as_json(events: list[tuple[dict[str, Any] | None, dict[str, Any] | None]]) -> list[Any]:
    return [
        (
            None if k is None else json.dumps(k).encode(),
            None if e is None else json.dumps(e).encode(),
        )
        for k, e in events
    ]


def as_avro(
    enc: DebeziumAvroEncoder, events: list[tuple[dict[str, Any] | None, dict[str, Any] | None]]
) -> list[Any]:
    return [(None if k is None else enc.key(k), enc.value(e)) for k, e in events]


def item(i: int, ts: int) -> dict[str, Any]:
    return {"id": i, "name": f"item{i}@{ts}", "qty": ts}


def k(i: int) -> dict[str, Any]:
    return {"id": i}


#: inserts, snapshot reads, updates, deletes + tombstones, re-created keys, bad events
EVENTS: list[tuple[dict[str, Any] | None, dict[str, Any] | None]] = [
    (k(1), event("r", None, item(1, 1), 1)),
    (k(2), event("c", None, item(2, 2), 2)),
    (k(3), event("c", None, item(3, 3), 3)),
    (k(1), event("u", item(1, 1), item(1, 4), 4)),
    (k(2), event("d", item(2, 2), None, 5)),
    (k(2), None),  # the tombstone after the delete
    (k(3), event("d", item(3, 3), None, 6)),
    (k(3), None),
    (k(3), event("c", None, item(3, 7), 7)),  # re-created
    (k(4), event("x", None, item(4, 8), 8)),  # unknown op
    (k(4), event("c", None, None, 9)),  # c without after
    (k(4), event("u", item(4, 8), None, 10)),  # u without after
    (k(4), event("d", None, None, 11)),  # d without before
    (k(5), event("c", None, item(5, 12), 12)),
    (k(1), event("d", item(1, 4), None, 13)),
    (k(1), None),
    (k(1), event("c", None, item(1, 14), 14)),  # re-created
]


@pytest.mark.parametrize("comparison", [None, "changed_ms"])
def test_avro_events_decode_like_their_json_twins_and_the_model(registry, comparison) -> None:
    """Every row (deletes and tombstones included) and every dead letter's offset equal the
    JSON envelope's for the same events; the table is the sequential rule's."""
    tbl: dict[str, Any] = {"mode": "upsert", "primary_key": ["id"]}
    if comparison:
        tbl["comparison_column"] = comparison
    enc = DebeziumAvroEncoder(registry.url, "twins")
    ds_avro = datastream(registry.url, tbl)
    ds_json = datastream(None, tbl)
    got = decode(ds_avro, as_avro(enc, EVENTS))
    want = decode(ds_json, as_json(EVENTS))
    assert by_offset(got) == by_offset(want)
    assert dead(got) == dead(want)
    assert sorted(dead(got)) == [9, 10, 11, 12]
    assert dead(got)[9] == "field 'op': 'x' is not a Debezium operation (c, r, u, d)"
    assert dead(got)[10] == "field 'after' is null for op 'c'"
    assert dead(got)[12] == "field 'before' is null for op 'd': no key"
    stones = [r for r in by_offset(got) if r["_ms_tombstone"]]
    assert [(r["id"], r["_ms_offset"], r["op"]) for r in stones] == [
        (2, 4, "d"),
        (2, 5, None),
        (3, 6, "d"),
        (3, 7, None),
        (1, 14, "d"),
        (1, 15, None),
    ]
    assert table(ds_avro, got) == [
        {**item(1, 14), "changed_ms": 14, "op": "c", "event_ms": 1014},
        {**item(3, 7), "changed_ms": 7, "op": "c", "event_ms": 1007},
        {**item(5, 12), "changed_ms": 12, "op": "c", "event_ms": 1012},
    ]


def test_a_delete_takes_befores_key_never_afters_nor_the_record_key(registry) -> None:
    """An Avro d event that (wrongly) carries an after of another row, under the record key
    of that other row, deletes before's key only."""
    enc = DebeziumAvroEncoder(registry.url, "before-key")
    ds = datastream(registry.url)
    events = [
        (k(1), event("c", None, item(1, 1), 1)),
        (k(2), event("c", None, item(2, 2), 2)),
        (k(2), event("d", item(1, 1), item(2, 3), 3)),
    ]
    d = decode(ds, as_avro(enc, events))
    assert d.dead == []
    assert [(r["id"], r["_ms_tombstone"]) for r in by_offset(d)][-1] == (1, True)
    assert [r["id"] for r in table(ds, d)] == [2]


def test_an_event_without_op_and_a_schema_that_is_no_envelope_are_bad(registry) -> None:
    no_op = DebeziumAvroEncoder(
        registry.url, "no-op", envelope=debezium_envelope(ITEMS_VALUE_FIELDS, op_optional=True)
    )
    plain = DebeziumAvroEncoder(
        registry.url,
        "plain-row",
        envelope={"type": "record", "name": "Row", "fields": ITEMS_VALUE_FIELDS},
    )
    ds = datastream(registry.url)
    records = [
        (no_op.key(k(1)), no_op.value(event(None, None, item(1, 1), 1))),
        (no_op.key(k(1)), no_op.value(event("c", None, item(1, 2), 2))),
        (plain.key(k(1)), bytes(plain._value(item(1, 3), plain.value_ctx))),
        (b"\x00\x00\x00\x7f\x7f\x02", None),  # a tombstone whose key schema id is unknown
        (no_op.key(k(1)), b"\x00" + no_op.value(event("c", None, item(1, 2), 2))[1:-1]),
    ]
    d = decode(ds, records)
    why = dead(d)
    assert why[0] == "field 'op' is missing: not a Debezium change event"
    assert why[2] == "fields 'before' and 'after' hold no record: not a Debezium envelope"
    assert why[3].startswith("tombstone without a usable record key")
    assert why[4].startswith(("truncated", "not valid Avro"))
    assert sorted(why) == [0, 2, 3, 4]
    assert [r["name"] for r in table(ds, d)] == ["item1@2"]


def test_a_tombstone_key_is_never_dead_lettered_while_the_registry_is_down(registry) -> None:
    """A tombstone's Avro key whose schema is not cached yet: while the registry answers 503
    the batch waits (then fails after max_wait); once back, the key is a delete, nothing is
    dead-lettered."""
    enc = DebeziumAvroEncoder(registry.url, "key-down")
    ds = datastream(registry.url, max_wait=0.5)
    records = as_avro(enc, [(k(1), event("c", None, item(1, 1), 1)), (k(1), None)])
    warm = decode_for(ds)
    decode(ds, records[:1], warm)  # the value schema is cached, the key schema is not
    registry.available = False
    try:
        with pytest.raises(SourceReadError, match="schema registry"):
            decode(ds, records, warm)
    finally:
        registry.available = True
    d = decode(ds, records, warm)
    assert d.dead == []
    assert table(ds, d) == []


def decode_for(ds: DatastreamSpec) -> Any:
    """A fresh decoder (its own schema cache), not the process-wide one."""
    from millstream.ingest.formats import EnvelopeDecoder, FormatConfig, SchemaDecoder

    cfg = FormatConfig(**config_for(ds.source)[1]["format"])
    return EnvelopeDecoder(SchemaDecoder(cfg), cfg.envelope, cfg.metadata, cfg.topic)


def test_a_new_value_schema_waits_for_a_registry_that_is_down(registry) -> None:
    """Events of a schema id the cache does not have: the decode retries while the registry
    answers 503 and, once it is back, every event decodes (none dead-lettered, none lost)."""
    enc = DebeziumAvroEncoder(registry.url, "value-down")
    ds = datastream(registry.url, max_wait=120)
    records = as_avro(enc, EVENTS[:9])
    dec = decode_for(ds)
    registry.available = False
    out: dict[str, Decoded] = {}
    worker = threading.Thread(target=lambda: out.setdefault("d", decode(ds, records, dec)))
    try:
        worker.start()
        time.sleep(1.0)
        assert worker.is_alive(), "the batch did not wait for the registry"
    finally:
        registry.available = True
    worker.join(60)
    assert out["d"].dead == []
    assert by_offset(out["d"]) == by_offset(decode(datastream(None), as_json(EVENTS[:9])))


def test_schema_file_reads_plain_envelopes(tmp_path) -> None:
    """A fixed envelope schema (``schema_file``, plain payloads): the same rows as JSON; a
    tombstone's key is then read by the JSON rules (a JSON key works)."""
    import io

    import fastavro

    schema = debezium_envelope(ITEMS_VALUE_FIELDS)
    path = tmp_path / "envelope.avsc"
    path.write_text(json.dumps(schema))
    parsed = fastavro.parse_schema(schema)

    def plain(e: dict[str, Any] | None) -> bytes | None:
        if e is None:
            return None
        buf = io.BytesIO()
        src = {"version": "2", "name": "shop", "lsn": None, **e["source"]}
        fastavro.schemaless_writer(buf, parsed, {**e, "source": src, "transaction": None})
        return buf.getvalue()

    events = [e for e in EVENTS if e[1] is None or e[1]["op"] in ("c", "r", "u", "d")]
    ds = datastream(None, schema_file=str(path), format="avro")
    got = decode(ds, [(json.dumps(key).encode(), plain(e)) for key, e in events])
    want = decode(datastream(None), as_json(events))
    assert by_offset(got) == by_offset(want)
    assert dead(got) == dead(want)


@pytest.mark.parametrize(
    ("source", "ok"),
    [({"format": "avro"}, True), ({"format": "protobuf", "message_type": "x.Y"}, False)],
)
def test_the_spec_takes_avro_and_refuses_protobuf(source: dict[str, Any], ok: bool) -> None:
    fields = {**source, "schema_registry": {"url": "http://127.0.0.1:1"}}
    if ok:
        datastream(None, **fields)
        return
    with pytest.raises(InvalidSpecError) as err:
        datastream(None, **fields)
    assert err.value.field == "source.envelope" and "json or avro" in str(err.value)


def test_schema_evolution_auto_with_the_envelope_grows_the_table_by_its_row_record(
    registry,
) -> None:
    """The writer schema of a Debezium topic is the envelope's: auto grows the table by the
    fields of its row record (``before``/``after``'s ``Value``), never by the envelope's own
    top-level fields (before, after, source, op...)."""
    spec = datastream(registry.url, schema_evolution="auto")
    enc = DebeziumAvroEncoder(
        registry.url,
        "auto-envelope",
        envelope=debezium_envelope(
            [*ITEMS_VALUE_FIELDS, {"name": "note", "type": ["null", "string"], "default": None}]
        ),
    )
    value = enc.value(event("c", None, {"id": 1, "name": "a", "qty": 1, "note": "n"}, 1))
    auto = absorber(config_for(spec.source)[1])
    assert auto is not None
    table = spec.table_spec()
    grown = auto.absorbing(table, pa.array([value], pa.binary()))
    assert list(grown.columns) == [*table.columns, "note"]


def test_decimal_and_nested_after_columns_and_their_bad_values(registry) -> None:
    """``after``'s decimal and list fields fill their columns; a decimal that overflows its
    column dead-letters its event naming the column; a delete's row needs none of them."""
    from decimal import Decimal

    fields = [
        {"name": "id", "type": "long"},
        {
            "name": "price",
            "type": [
                "null",
                {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2},
            ],
            "default": None,
        },
        {"name": "tags", "type": ["null", {"type": "array", "items": "string"}], "default": None},
    ]
    enc = DebeziumAvroEncoder(registry.url, "nested", envelope=debezium_envelope(fields))
    ds = DatastreamSpec.parse(
        {
            "name": "nested",
            "source": {
                "kind": "kafka",
                "bootstrap_servers": "localhost:9092",
                "topic": "nested",
                "format": "avro",
                "schema_registry": {"url": registry.url},
                "envelope": "debezium",
            },
            "table": {"mode": "upsert", "primary_key": ["id"]},
            "schema": {"id": "long", "price": "decimal(5,2)", "tags": "list<string>"},
        }
    )
    good = {"id": 1, "price": Decimal("12.50"), "tags": ["a", "b"]}
    events = [
        (k(1), event("c", None, good, 1)),
        (k(2), event("c", None, {"id": 2, "price": Decimal("1234.50"), "tags": []}, 2)),
        (k(3), event("c", None, {"id": 3, "price": None, "tags": None}, 3)),
        (k(3), event("d", {"id": 3, "price": Decimal("1234.50"), "tags": None}, None, 4)),
    ]
    d = decode(ds, as_avro(enc, events))
    assert sorted(dead(d)) == [1]
    assert dead(d)[1].startswith("column 'price': ") and "does not fit decimal(5,2)" in dead(d)[1]
    assert [(r["id"], r["price"], r["tags"], r["_ms_tombstone"]) for r in by_offset(d)] == [
        (1, Decimal("12.50"), ["a", "b"], False),
        (3, None, None, False),
        (3, None, None, True),
    ]
