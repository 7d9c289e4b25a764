"""``source.envelope: debezium`` and ``source.metadata_columns`` at the decode level (no Spark):
change events become upserts of ``after`` and deletes of ``before``'s key, with or without the
schema/payload wrapper; a Kafka tombstone after a delete is one more delete; bad events go to
the dead-letter rows naming the field; record and envelope fields fill their columns, typed.
Table contents are checked against the sequential model (:mod:`millstream.reference.model`)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pytest

from millstream.datastream import DatastreamSpec
from millstream.errors import InvalidSpecError
from millstream.ingest.decode import Decoded, decode_records
from millstream.ingest.formats import decoder_for
from millstream.ingest.sources import config_for
from millstream.ingest.sources.base import PartitionReader, records_batch
from millstream.ingest.sources.kafka import KafkaConfig, KafkaReader, headers_json
from millstream.reference.model import canonical, model_rows

SCHEMA = {"id": "long", "name": "string", "qty": "int", "changed_ms": "long", "op": "string"}


def datastream(
    table: dict[str, Any] | None = None,
    metadata: dict[str, str] | None = None,
    schema: dict[str, str] | None = None,
    **source: Any,
) -> DatastreamSpec:
    return DatastreamSpec.parse(
        {
            "name": "cdc",
            "source": {
                "kind": "kafka",
                "bootstrap_servers": "localhost:9092",
                "topic": "db.public.items",
                "envelope": "debezium",
                "metadata_columns": {"source_ts_ms": "changed_ms", "op": "op"}
                if metadata is None
                else metadata,
                **source,
            },
            "table": table or {"mode": "upsert", "primary_key": ["id"]},
            "schema": schema or SCHEMA,
        }
    )


def event(
    op: str,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
    ts: int,
    *,
    wrapped: bool = False,
) -> bytes:
    payload = {
        "before": before,
        "after": after,
        "op": op,
        "ts_ms": ts + 1000,
        "source": {"version": "2.5", "connector": "postgresql", "ts_ms": ts, "db": "shop"},
    }
    if wrapped:
        return json.dumps({"schema": {"type": "struct", "fields": []}, "payload": payload}).encode()
    return json.dumps(payload).encode()


def key(i: int, *, wrapped: bool = False) -> bytes:
    if wrapped:
        return json.dumps({"schema": {"type": "struct"}, "payload": {"id": i}}).encode()
    return json.dumps({"id": i}).encode()


def decode(
    ds: DatastreamSpec, records: list[tuple[bytes | None, bytes | None]], **raw: list[Any]
) -> Decoded:
    n = len(records)
    columns = {
        "partition": pa.array([0] * n, pa.int32()),
        "offset": pa.array(range(n), pa.int64()),
        "key": pa.array([k for k, _ in records], pa.binary()),
        "value": pa.array([v for _, v in records], pa.binary()),
    }
    types = {"timestamp": pa.int64(), "headers": pa.string()}
    columns.update({name: pa.array(values, types[name]) for name, values in raw.items()})
    return decode_records(ds.table_spec(), pa.table(columns), decoder_for(config_for(ds.source)[1]))


def by_offset(d: Decoded) -> list[dict[str, Any]]:
    return sorted(d.rows.to_pylist(), key=lambda r: r["_ms_offset"])


def table(ds: DatastreamSpec, d: Decoded) -> list[dict[str, Any]]:
    return sorted(model_rows(ds.table_spec(), d.rows.to_pylist()), key=lambda r: r["id"])


ITEM1 = {"id": 1, "name": "apple", "qty": 3}
ITEM1B = {"id": 1, "name": "apple", "qty": 5}
ITEM2 = {"id": 2, "name": "pear", "qty": 1}


@pytest.mark.parametrize("wrapped", [False, True], ids=["plain", "schema-payload"])
def test_create_read_update_delete_and_the_tombstone_after_it(wrapped: bool) -> None:
    """c and r insert, u replaces, d deletes before's key, the tombstone that follows is a
    delete too and dead-letters nothing; with and without the schema/payload wrapper."""
    ds = datastream()
    records = [
        (key(2, wrapped=wrapped), event("r", None, ITEM2, 90, wrapped=wrapped)),
        (key(1, wrapped=wrapped), event("c", None, ITEM1, 100, wrapped=wrapped)),
        (key(1, wrapped=wrapped), event("u", ITEM1, ITEM1B, 101, wrapped=wrapped)),
        (key(2, wrapped=wrapped), event("d", ITEM2, None, 102, wrapped=wrapped)),
        (key(2, wrapped=wrapped), None),
    ]
    d = decode(ds, records)
    assert d.dead == []
    rows = by_offset(d)
    assert [(r["id"], r["op"], r["_ms_tombstone"]) for r in rows] == [
        (2, "r", False),
        (1, "c", False),
        (1, "u", False),
        (2, "d", True),
        (2, None, True),
    ]
    assert rows[3]["changed_ms"] == 102 and rows[3]["name"] is None  # a delete: key + envelope
    assert table(ds, d) == [{**ITEM1B, "changed_ms": 101, "op": "u"}]


def test_a_delete_takes_befores_key_never_afters_nor_the_record_key() -> None:
    """A d event's key is before's: an event that (wrongly) carries an after, or a record key
    of another row, must not delete that row instead; a before without the key is bad."""
    ds = datastream()
    records = [
        (key(1), event("c", None, ITEM1, 1)),
        (key(2), event("c", None, ITEM2, 2)),
        (key(2), event("d", {"id": 1}, {"id": 2, "name": "x", "qty": 0}, 3)),
        (None, event("d", {"id": 2}, None, 4)),  # no record key: before's key still works
        (key(2), event("d", {"name": "pear"}, None, 5)),  # before without the key
    ]
    d = decode(ds, records)
    deletes = [(r["id"], r["_ms_offset"]) for r in by_offset(d) if r["_ms_tombstone"]]
    assert deletes == [(1, 2), (2, 3)]
    assert [(o, e) for _, o, _, _, e in d.dead] == [
        (4, "field 'before' lacks primary key column 'id' for op 'd'")
    ]
    assert table(ds, d) == []


def test_bad_events_go_to_the_dead_letter_rows_naming_the_field() -> None:
    ds = datastream()
    records = [
        (key(1), event("x", None, ITEM1, 1)),
        (key(1), event("c", None, None, 2)),
        (key(1), event("u", ITEM1, None, 3)),
        (key(1), event("d", None, None, 4)),
        (key(1), json.dumps(ITEM1).encode()),  # a plain row, no envelope
        (key(1), b"{not json"),
        (key(1), event("c", None, {"id": 1, "name": "a", "qty": "many"}, 5)),
        (key(1), event("c", None, ITEM1, 6)),
    ]
    d = decode(ds, records)
    errors = {o: e for _, o, _, _, e in d.dead}
    assert errors[0] == "field 'op': 'x' is not a Debezium operation (c, r, u, d)"
    assert errors[1] == "field 'after' is null for op 'c'"
    assert errors[2] == "field 'after' is null for op 'u'"
    assert errors[3] == "field 'before' is null for op 'd': no key"
    assert errors[4] == "field 'op' is missing: not a Debezium change event"
    assert errors[5].startswith("not valid JSON")
    assert "qty" in errors[6] or "int" in errors[6]
    assert sorted(errors) == [0, 1, 2, 3, 4, 5, 6]
    assert [r["_ms_offset"] for r in by_offset(d)] == [7]


def test_a_recreated_key_is_present_again() -> None:
    """insert, delete, tombstone, insert again: the key is back (with and without the
    source timestamp as comparison column); a late insert older than the delete is not."""
    for comparison in (None, "changed_ms"):
        tbl: dict[str, Any] = {"mode": "upsert", "primary_key": ["id"]}
        if comparison:
            tbl["comparison_column"] = comparison
        ds = datastream(tbl)
        records = [
            (key(1), event("c", None, ITEM1, 10)),
            (key(1), event("d", ITEM1, None, 20)),
            (key(1), None),
            (key(1), event("c", None, ITEM1B, 30)),
        ]
        d = decode(ds, records)
        assert d.dead == []
        assert table(ds, d) == [{**ITEM1B, "changed_ms": 30, "op": "c"}]
    # with the source timestamp deciding, an insert from before the delete stays deleted
    ds = datastream({"mode": "upsert", "primary_key": ["id"], "comparison_column": "changed_ms"})
    late = [
        (key(1), event("c", None, ITEM1, 10)),
        (key(1), event("d", ITEM1, None, 20)),
        (key(1), None),
        (key(1), event("u", ITEM1, ITEM1B, 15)),
    ]
    assert table(ds, decode(ds, late)) == []


@pytest.mark.parametrize("mode", ["dedup", "partial"])
def test_other_keyed_modes_apply_deletes(mode: str) -> None:
    ds = datastream({"mode": mode, "primary_key": ["id"]})
    records = [
        (key(1), event("c", None, ITEM1, 10)),
        (key(1), event("d", ITEM1, None, 20)),
        (key(1), None),
        (key(1), event("c", None, ITEM1B, 30)),
    ]
    d = decode(ds, records)
    assert d.dead == []
    assert [r["qty"] for r in table(ds, d)] == [5]


def test_kafka_metadata_columns_are_typed_and_tombstones_carry_them() -> None:
    schema = {
        **SCHEMA,
        "k_ts": "timestamp",
        "k_ts_ms": "long",
        "k_part": "int",
        "k_off": "long",
        "k_key": "string",
        "k_topic": "string",
        "k_headers": "string",
    }
    metadata = {
        "timestamp": "k_ts",
        "partition": "k_part",
        "offset": "k_off",
        "key": "k_key",
        "topic": "k_topic",
        "headers": "k_headers",
        "ts_ms": "k_ts_ms",
        "op": "op",
    }
    ds = datastream(metadata=metadata, schema=schema)
    stamp = 1_700_000_000_123
    hdrs = headers_json([("trace", b"abc"), ("bin", b"\xff"), ("none", None)])
    d = decode(
        ds,
        [(key(1), event("c", None, ITEM1, 10)), (key(1), None), (b"\xfe", None)],
        timestamp=[stamp, stamp + 1, stamp + 2],
        headers=[hdrs, None, None],
    )
    rows = by_offset(d)
    assert d.rows.schema.field("k_ts").type == pa.timestamp("us", tz="UTC")
    assert d.rows.schema.field("k_part").type == pa.int32()
    first = rows[0]
    assert first["k_ts"] == datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=UTC)
    assert (first["k_part"], first["k_off"], first["k_key"]) == (0, 0, '{"id": 1}')
    assert first["k_topic"] == "db.public.items" and first["k_ts_ms"] == 1010
    assert json.loads(first["k_headers"]) == {"trace": "abc", "bin": "\ufffd", "none": None}
    stone = rows[1]
    assert stone["_ms_tombstone"] and stone["k_off"] == 1 and stone["k_topic"] == "db.public.items"
    # a key that is not UTF-8 does not fit a string column: its record is bad, naming it
    assert [(o, e) for _, o, _, _, e in d.dead] == [
        (2, "metadata column 'k_key': the key is not UTF-8")
    ]


def test_metadata_columns_with_plain_json_ignore_a_value_field_of_that_name() -> None:
    ds = DatastreamSpec.parse(
        {
            "name": "events",
            "source": {
                "kind": "kafka",
                "bootstrap_servers": "localhost:9092",
                "topic": "events",
                "metadata_columns": {"offset": "kafka_offset", "timestamp": "kafka_ms"},
            },
            "schema": {"id": "long", "kafka_offset": "long", "kafka_ms": "long"},
        }
    )
    d = decode(
        ds,
        [(None, b'{"id": 1, "kafka_offset": "not a number"}'), (None, b'{"id": 2}')],
        timestamp=[5, None],
    )
    assert d.dead == []
    assert [(r["id"], r["kafka_offset"], r["kafka_ms"]) for r in by_offset(d)] == [
        (1, 0, 5),
        (2, 1, None),
    ]


def test_a_metadata_column_the_records_do_not_carry_fails_the_batch() -> None:
    """Records without the timestamp column (read through a path that drops it) must not
    fill the column with nulls silently."""
    ds = datastream(metadata={"timestamp": "changed_ms"})
    with pytest.raises(ValueError, match="timestamp"):
        decode(ds, [(key(1), event("c", None, ITEM1, 1))])


def test_without_envelope_or_metadata_json_keeps_its_plain_decoder() -> None:
    ds = DatastreamSpec.parse(
        {
            "name": "plain",
            "source": {"kind": "kafka", "bootstrap_servers": "b:1", "topic": "t"},
            "schema": {"id": "long"},
        }
    )
    assert decoder_for(config_for(ds.source)[1]) is None


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"table": {"mode": "append"}}, "source.envelope", "keyed table"),
        (
            {"source": {"format": "protobuf", "schema_registry": {"url": "http://r:1"}}},
            "source.envelope",
            "json or avro",
        ),
        ({"metadata": {"timestamp": "missing"}}, "source.metadata_columns.timestamp", "not in"),
        ({"metadata": {"timestamp": "name"}}, "source.metadata_columns.timestamp", "is string"),
        ({"metadata": {"headers": "qty"}}, "source.metadata_columns.headers", "string"),
        ({"metadata": {"wat": "name"}}, "source.metadata_columns.wat", "not a record field"),
        ({"metadata": {"offset": "id"}}, "source.metadata_columns.offset", "primary key"),
        ({"metadata": {"op": "name", "key": "name"}}, "source.metadata_columns.key", "also"),
    ],
)
def test_the_spec_refuses_what_it_cannot_honour(
    change: dict[str, Any], field: str, words: str
) -> None:
    kwargs: dict[str, Any] = {**change.get("source", {})}
    with pytest.raises(InvalidSpecError) as err:
        datastream(change.get("table"), change.get("metadata"), **kwargs)
    assert err.value.field == field
    assert words in str(err.value)


def test_envelope_fields_need_the_envelope() -> None:
    with pytest.raises(InvalidSpecError) as err:
        DatastreamSpec.parse(
            {
                "name": "plain",
                "source": {
                    "kind": "kafka",
                    "bootstrap_servers": "b:1",
                    "topic": "t",
                    "metadata_columns": {"op": "op"},
                },
                "schema": {"id": "long", "op": "string"},
            }
        )
    assert err.value.field == "source.metadata_columns.op"
    assert "source.envelope: debezium" in str(err.value)


class _Headered(PartitionReader):
    kind = "test-headered"
    Config = dict

    def read_range(self, partition: int, lo: int, hi: int) -> Any:
        offs = list(range(lo, hi))
        yield records_batch(
            partition,
            offs,
            [None] * len(offs),
            [b"{}"] * len(offs),
            offs,
            ['{"h":"v"}'] * len(offs),
        )


def test_the_sink_read_path_passes_timestamps_and_headers_on() -> None:
    batch = next(_Headered({}).read_records([(0, 3, 5)]))
    assert batch.schema.names == ["partition", "offset", "key", "value", "timestamp", "headers"]
    assert batch.column("headers").to_pylist() == ['{"h":"v"}', '{"h":"v"}']


def test_the_kafka_reader_reads_headers_only_when_a_column_holds_them() -> None:
    ds = datastream(metadata={"headers": "name"})
    config = KafkaConfig(**config_for(ds.source)[1])
    assert KafkaReader(config).headers
    assert not KafkaReader(KafkaConfig(**config_for(datastream().source)[1])).headers
    assert headers_json(None) == "{}"


def test_model_agrees_with_decode_order_for_canonical_compare() -> None:
    """A sanity check of the helpers: canonical() of the model's rows is order-free."""
    ds = datastream()
    d = decode(ds, [(key(1), event("c", None, ITEM1, 1)), (key(2), event("c", None, ITEM2, 2))])
    assert canonical(model_rows(ds.table_spec(), d.rows.to_pylist())) == canonical(
        model_rows(ds.table_spec(), list(reversed(d.rows.to_pylist())))
    )


def test_reingestion_keeps_the_timestamps_and_headers_its_reader_passes_on() -> None:
    """A lost segment of a table with metadata columns is rebuilt with them: re-ingestion
    passes the reader's optional columns to the decoder as the sink does (without them the
    rebuild fails the batch, and the segment stays lost)."""
    from millstream.sealing.reingest import _raw_table

    ds = datastream(metadata={"timestamp": "changed_ms", "headers": "name"})
    batch = records_batch(
        0, [7], [key(1)], [event("c", None, ITEM1, 10)], [1_700_000_000_000], ['{"h":"v"}']
    )
    d = decode_records(ds.table_spec(), _raw_table([batch]), decoder_for(config_for(ds.source)[1]))
    assert d.dead == []
    (row,) = d.rows.to_pylist()
    assert (row["id"], row["changed_ms"], row["name"]) == (1, 1_700_000_000_000, '{"h":"v"}')
