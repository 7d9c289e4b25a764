"""``source.schema_evolution: auto`` through the production write path (no Spark): records
produced by confluent-kafka's own AvroSerializer / ProtobufSerializer against the test schema
registry, to a topic of the session's broker, go through ``SegmentSink.write`` (which reads
each task's ranges from the broker) and ``commit`` as a running writer's would.

* a writer schema with an added field (and a widened type) grows the table at the batch that
  first carries it, through the same transaction as a manual update (schema version + 1, the
  dead-letter table and the datastream row with it); its records keep the new values, older
  rows read null; two tasks racing evolve it once;
* a writer schema the rules refuse changes nothing: its records whose values do not fit are
  dead-lettered naming the field, a WARNING names the schema id and the rule, the frontier
  advances;
* without ``auto`` nothing evolves: the new field is dropped, and nothing else is lost;
* an unknown COMMIT outcome of the evolution is reconciled by re-reading the table.
"""

from __future__ import annotations

import importlib
import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from harness.fault_points import at_commit
from harness.ingest_support import produce_exact
from harness.schema_registry import TestSchemaRegistry
from millstream.catalog import Catalog
from millstream.control.registry import Registry
from millstream.datastream import DatastreamSpec, dead_letter_spec
from millstream.errors import CommitStateUnknownError, IncompatibleChangeError
from millstream.ingest.sources import config_for
from millstream.local.tansu import TansuBroker
from millstream.metastore.store import StoreRegistry
from millstream.spark.options import SinkOptions
from millstream.spark.sink import DECODE_ROWS, SegmentSink
from millstream.spark.sources import markers_batch

SCHEMA = {"id": "long", "customer": "string", "qty": "int"}

V1_AVRO: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "millstream.evo",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "customer", "type": "string"},
        {"name": "qty", "type": "int"},
    ],
}


def avro_with(*fields: dict[str, Any], replace: dict[str, Any] | None = None) -> dict[str, Any]:
    kept = [{**f, "type": (replace or {}).get(f["name"], f["type"])} for f in V1_AVRO["fields"]]
    return {**V1_AVRO, "fields": kept + list(fields)}


#: v2: qty widened int -> long, an optional `note` and a nested `tags` added
V2_AVRO = avro_with(
    {"name": "note", "type": ["null", "string"], "default": None},
    {"name": "tags", "type": ["null", {"type": "array", "items": "string"}], "default": None},
    replace={"qty": "long"},
)


@pytest.fixture(scope="module")
def registry() -> Iterator[TestSchemaRegistry]:
    with TestSchemaRegistry() as reg:
        yield reg


#: The broker the datastreams' topics are on (the session's, set by :func:`broker`).
BROKER: dict[str, TansuBroker] = {}


@pytest.fixture(autouse=True)
def broker(kafka_broker: TansuBroker) -> None:
    BROKER["broker"] = kafka_broker


@pytest.fixture
def cat(tmp_path: Path) -> Iterator[Catalog]:
    with Catalog.open(home=tmp_path / "home") as catalog:
        yield catalog


class Avro:
    """Values as confluent-kafka's AvroSerializer makes them (it registers its schema)."""

    def __init__(self, registry: TestSchemaRegistry, topic: str, schema: dict[str, Any]) -> None:
        sr = importlib.import_module("confluent_kafka.schema_registry")
        ser = importlib.import_module("confluent_kafka.serialization")
        avro = importlib.import_module("confluent_kafka.schema_registry.avro")
        self.ctx = ser.SerializationContext(topic, ser.MessageField.VALUE)
        client = sr.SchemaRegistryClient({"url": registry.url})
        self.ser = avro.AvroSerializer(client, json.dumps(schema))

    def __call__(self, record: dict[str, Any]) -> bytes:
        return bytes(self.ser(record, self.ctx))


def _message_class(package: str, fields: list[tuple[str, int]]) -> Any:
    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(
        name=f"{package.replace('.', '_')}.proto", package=package, syntax="proto3"
    )
    msg = fdp.message_type.add(name="Order")
    for number, (name, ftype) in enumerate(fields, 1):
        msg.field.add(name=name, number=number, type=ftype, label=F.LABEL_OPTIONAL)
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(fdp.name)
    except KeyError:
        pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.Order"))


class Proto:
    """Values as confluent-kafka's ProtobufSerializer makes them."""

    def __init__(self, registry: TestSchemaRegistry, topic: str, cls: Any) -> None:
        sr = importlib.import_module("confluent_kafka.schema_registry")
        ser = importlib.import_module("confluent_kafka.serialization")
        pb = importlib.import_module("confluent_kafka.schema_registry.protobuf")
        self.ctx = ser.SerializationContext(topic, ser.MessageField.VALUE)
        client = sr.SchemaRegistryClient({"url": registry.url})
        self.cls = cls
        self.ser = pb.ProtobufSerializer(cls, client, {"use.deprecated.format": False})

    def __call__(self, record: dict[str, Any]) -> bytes:
        return bytes(self.ser(self.cls(**record), self.ctx))


def records(
    options: SinkOptions, partition: int, lo: int, values: list[bytes]
) -> list[pa.RecordBatch]:
    """``values`` produced to the datastream's topic at offsets ``[lo, hi)`` of ``partition``,
    and what the stream source hands the write task for them: the range's marker (the sink
    reads the records from the broker)."""
    config = options.source_config or {}
    acked = produce_exact(
        config["bootstrap_servers"], config["topic"], {partition: [(None, v) for v in values]}
    )
    assert [o for _, o, _, _ in acked] == list(range(lo, lo + len(values))), "offsets as planned"
    return [markers_batch([(partition, lo, lo + len(values))])]


def datastream(
    registry: TestSchemaRegistry,
    topic: str,
    *,
    fmt: str = "avro",
    auto: bool = True,
    metadata: dict[str, str] | None = None,
) -> DatastreamSpec:
    extra = {"src_offset": "long"} if metadata else {}
    return DatastreamSpec.parse(
        {
            "name": "orders",
            "source": {
                "kind": "kafka",
                "bootstrap_servers": BROKER["broker"].bootstrap,
                "topic": f"evo-{topic}",
                "format": fmt,
                "schema_registry": {"url": registry.url},
                **({"schema_evolution": "auto"} if auto else {}),
                **({"metadata_columns": metadata} if metadata else {}),
            },
            "schema": {**SCHEMA, **extra},
        }
    )


def start(cat: Catalog, spec: DatastreamSpec, stores: StoreRegistry | None = None) -> SinkOptions:
    """The datastream's topic (4 partitions), its row and tables as the leader makes them,
    and its sink's options."""
    BROKER["broker"].create_topic(config_for(spec.source)[1]["topic"], 4)
    Registry(cat.store).create(spec)
    table = spec.table_spec()
    cat.create_table(table)
    cat.create_table(dead_letter_spec(table))
    return SinkOptions.from_options(
        {
            **cat.settings.as_options(),
            "table": table.name,
            "tableSpec": json.dumps(table.to_json_dict()),
            "sourceKind": "kafka",
            "sourceConfig": json.dumps(config_for(spec.source)[1]),
        }
    )


def rows(cat: Catalog) -> list[dict[str, Any]]:
    return sorted(cat.read_table("orders").to_pylist(), key=lambda r: r["id"])


def dead(cat: Catalog) -> list[tuple[int, str]]:
    return sorted(
        (r["offset"], r["error"]) for r in cat.read_table("orders__dead_letter").to_pylist()
    )


def test_auto_grows_the_table_at_the_batch_that_first_carries_a_new_writer_schema(
    cat: Catalog, registry: TestSchemaRegistry
) -> None:
    spec = datastream(registry, "auto-avro")
    options = start(cat, spec)
    v1, v2 = Avro(registry, "auto-avro", V1_AVRO), Avro(registry, "auto-avro", V2_AVRO)
    sink = SegmentSink(options)  # Spark reuses one writer object for every batch

    staged0 = sink.write(
        iter(records(options, 0, 0, [v1({"id": i, "customer": "a", "qty": i}) for i in range(3)]))
    )
    assert cat.store.get_table("orders").schema_version == 1, "v1 needs nothing"
    batch1 = [v1({"id": 3, "customer": "b", "qty": 3})] + [
        v2({"id": i, "customer": "c", "qty": 2**31 + i, "note": f"n{i}", "tags": ["x", str(i)]})
        for i in range(4, 7)
    ]
    staged1 = sink.write(iter(records(options, 0, 3, batch1)))
    SegmentSink(options).commit([staged0], 0)
    SegmentSink(options).commit([staged1], 1)

    table = cat.store.get_table("orders")
    assert table.spec.columns == {
        **SCHEMA,
        "qty": "long",  # widened int -> long
        "note": "string",  # added at the end, in the writer schema's field order
        "tags": "list<string>",
    }
    assert table.schema_version == 2
    assert [v for v, _, _ in cat.store.schema_history("orders")] == [1, 2]
    # the datastream's spec follows its table, in the same transaction
    assert Registry(cat.store).get("orders").spec.table_spec().columns == table.spec.columns
    assert dead(cat) == []
    assert rows(cat) == [
        *({"id": i, "customer": "a", "qty": i, "note": None, "tags": None} for i in range(3)),
        {"id": 3, "customer": "b", "qty": 3, "note": None, "tags": None},
        *(
            {"id": i, "customer": "c", "qty": 2**31 + i, "note": f"n{i}", "tags": ["x", str(i)]}
            for i in range(4, 7)
        ),
    ], "v2 records keep the new values and the widened qty; v1 rows read null"
    assert cat.store.get_shard("orders", 0).upper == 7  # type: ignore[union-attr]

    # later batches of either schema change nothing more
    SegmentSink(options).commit(
        [
            sink.write(
                iter(
                    records(
                        options,
                        0,
                        7,
                        [
                            v2({"id": 7, "customer": "d", "qty": 1}),
                            v1({"id": 8, "customer": "e", "qty": 2}),
                        ],
                    )
                )
            )
        ],
        2,
    )
    assert cat.store.get_table("orders").schema_version == 2
    assert len(rows(cat)) == 9


def test_rows_decoded_earlier_in_the_task_are_conformed_to_the_grown_spec(
    cat: Catalog, registry: TestSchemaRegistry
) -> None:
    """A task decodes its records in pieces of DECODE_ROWS; when only a later piece carries
    the new writer schema, the rows of the earlier pieces gain the new column (null) and the
    widened type, and the task stages one file in the grown spec."""
    options = start(cat, datastream(registry, "pieces"))
    v1, v2 = Avro(registry, "pieces", V1_AVRO), Avro(registry, "pieces", V2_AVRO)
    first = [v1({"id": 0, "customer": "a", "qty": 7})] * DECODE_ROWS  # one whole piece
    later = [v2({"id": 1, "customer": "b", "qty": 2**35, "note": "n", "tags": None})] * 2
    staged = SegmentSink(options).write(iter(records(options, 0, 0, first + later)))
    SegmentSink(options).commit([staged], 0)
    got = cat.read_table("orders")
    assert got.num_rows == DECODE_ROWS + 2
    assert got.schema.field("qty").type == pa.int64()
    counts = got.group_by(["id", "qty", "note"]).aggregate([("id", "count")]).to_pylist()
    assert sorted(counts, key=lambda r: r["id"]) == [
        {"id": 0, "qty": 7, "note": None, "id_count": DECODE_ROWS},
        {"id": 1, "qty": 2**35, "note": "n", "id_count": 2},
    ]
    assert dead(cat) == []


def test_auto_with_protobuf_adds_the_new_field(cat: Catalog, registry: TestSchemaRegistry) -> None:
    F = descriptor_pb2.FieldDescriptorProto
    base = [("id", F.TYPE_INT64), ("customer", F.TYPE_STRING), ("qty", F.TYPE_INT32)]
    v1 = Proto(registry, "auto-proto", _message_class("millstream.evo1", base))
    v2 = Proto(
        registry, "auto-proto", _message_class("millstream.evo2", [*base, ("note", F.TYPE_STRING)])
    )
    options = start(cat, datastream(registry, "auto-proto", fmt="protobuf"))
    sink = SegmentSink(options)
    batch = [
        v1({"id": 1, "customer": "a", "qty": 1}),
        v2({"id": 2, "customer": "b", "qty": 2, "note": "hi"}),
    ]
    SegmentSink(options).commit([sink.write(iter(records(options, 0, 0, batch)))], 0)
    assert cat.store.get_table("orders").spec.columns == {**SCHEMA, "note": "string"}
    assert rows(cat) == [
        {"id": 1, "customer": "a", "qty": 1, "note": None},
        {"id": 2, "customer": "b", "qty": 2, "note": "hi"},
    ]


def test_two_tasks_racing_to_absorb_the_same_writer_schema_evolve_the_table_once(
    cat: Catalog, registry: TestSchemaRegistry
) -> None:
    options = start(cat, datastream(registry, "race-avro"))
    v2 = Avro(registry, "race-avro", V2_AVRO)
    n = 4  # tasks (partitions) of one batch, each its own writer object, all at once
    barrier = threading.Barrier(n)
    staged: dict[int, Any] = {}
    errors: list[BaseException] = []

    def task(p: int) -> None:
        values = [
            v2({"id": p * 10 + i, "customer": "c", "qty": 2**40, "note": f"p{p}", "tags": []})
            for i in range(3)
        ]
        barrier.wait()
        try:
            staged[p] = SegmentSink(options).write(iter(records(options, p, 0, values)))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=task, args=(p,)) for p in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    SegmentSink(options).commit([staged[p] for p in range(n)], 0)

    assert cat.store.get_table("orders").schema_version == 2, "evolved once, not once per task"
    assert [v for v, _, _ in cat.store.schema_history("orders")] == [1, 2]
    got = rows(cat)
    assert len(got) == 3 * n and all(r["note"] == f"p{r['id'] // 10}" for r in got)
    assert all(r["qty"] == 2**40 for r in got)
    # a proposal made from the old spec and applied late changes nothing (the CAS loser)
    stale = cat.store.get_table("orders").spec
    _, changes = cat.store.absorb("orders", lambda current: stale)
    assert changes == []


def schema_id(value: bytes) -> int:
    return int.from_bytes(value[1:5], "big")


NOTE = {"name": "note", "type": ["null", "string"], "default": None}


@pytest.mark.parametrize(
    ("column", "writer_type", "rule"),
    [
        pytest.param(
            "customer",
            "long",
            "changing the type string -> long is not a lossless widening",
            id="string_to_long",
        ),
        pytest.param("id", "double", "long -> double is lossy", id="long_to_double"),
    ],
)
def test_auto_does_not_evolve_on_a_writer_schema_the_rules_refuse(
    cat: Catalog,
    registry: TestSchemaRegistry,
    caplog: pytest.LogCaptureFixture,
    column: str,
    writer_type: str,
    rule: str,
) -> None:
    topic = f"refused-{column}"
    options = start(cat, datastream(registry, topic))
    v1 = Avro(registry, topic, V1_AVRO)
    bad = Avro(registry, topic, avro_with(NOTE, replace={column: writer_type}))
    changed = {"customer": 7, "id": 1.5}[column]
    values = [
        v1({"id": 0, "customer": "a", "qty": 0}),
        bad({"id": 1, "customer": "b", "qty": 1, "note": "x", column: changed}),
        bad({"id": 2, "customer": "c", "qty": 2, "note": "y", column: changed}),
        v1({"id": 3, "customer": "d", "qty": 3}),
    ]
    with caplog.at_level(logging.WARNING, logger="millstream.ingest.formats"):
        SegmentSink(options).commit(
            [SegmentSink(options).write(iter(records(options, 0, 0, values)))], 0
        )

    table = cat.store.get_table("orders")
    assert (table.schema_version, table.spec.columns) == (1, SCHEMA), "nothing evolved"
    assert Registry(cat.store).get("orders").spec.table_spec().columns == SCHEMA
    assert [r["id"] for r in rows(cat)] == [0, 3]
    assert [(o, e.split(":")[0]) for o, e in dead(cat)] == [
        (1, f"field {column!r}"),
        (2, f"field {column!r}"),
    ], "the records that do not fit are dead-lettered naming the field"
    assert cat.store.get_shard("orders", 0).upper == 4  # type: ignore[union-attr]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    sid = schema_id(values[1])
    assert any(f"schema id {sid} " in m and rule in m for m in warned), warned


def test_auto_keeps_the_column_when_the_writer_narrows_a_type(
    cat: Catalog, registry: TestSchemaRegistry
) -> None:
    """A writer schema with ``id`` as an Avro int (the table's column is a long) needs no
    change for it: its values fit; its added field is absorbed."""
    options = start(cat, datastream(registry, "narrower"))
    v2 = Avro(registry, "narrower", avro_with(NOTE, replace={"id": "int"}))
    batch = [v2({"id": 5, "customer": "a", "qty": 1, "note": "n"})]
    SegmentSink(options).commit(
        [SegmentSink(options).write(iter(records(options, 0, 0, batch)))], 0
    )
    assert cat.store.get_table("orders").spec.columns == {**SCHEMA, "note": "string"}
    assert rows(cat) == [{"id": 5, "customer": "a", "qty": 1, "note": "n"}]


def test_without_auto_nothing_evolves_and_the_new_field_is_dropped(
    cat: Catalog, registry: TestSchemaRegistry
) -> None:
    options = start(cat, datastream(registry, "no-auto", auto=False))
    v1, v2 = Avro(registry, "no-auto", V1_AVRO), Avro(registry, "no-auto", V2_AVRO)
    values = [
        v1({"id": 0, "customer": "a", "qty": 0}),
        v2({"id": 1, "customer": "b", "qty": 1, "note": "dropped", "tags": ["t"]}),
        v2({"id": 2, "customer": "c", "qty": 2**31, "note": "dropped", "tags": None}),
    ]
    SegmentSink(options).commit(
        [SegmentSink(options).write(iter(records(options, 0, 0, values)))], 0
    )
    table = cat.store.get_table("orders")
    assert (table.schema_version, table.spec.columns) == (1, SCHEMA)
    assert rows(cat) == [
        {"id": 0, "customer": "a", "qty": 0},
        {"id": 1, "customer": "b", "qty": 1},
    ], "the new fields are ignored; the values that fit are kept"
    [(offset, error)] = dead(cat)
    assert offset == 2 and error.startswith("column 'qty': "), error
    assert cat.store.get_shard("orders", 0).upper == 3  # type: ignore[union-attr]


@pytest.mark.parametrize("landed", [True, False], ids=["landed", "not-landed"])
def test_an_unknown_outcome_of_the_evolution_is_reconciled_by_re_reading_the_table(
    cat: Catalog, registry: TestSchemaRegistry, landed: bool
) -> None:
    stores = StoreRegistry()
    options = start(cat, datastream(registry, f"unknown-{landed}"))
    v2 = Avro(registry, f"unknown-{landed}", V2_AVRO)
    batch = records(
        options, 0, 0, [v2({"id": 1, "customer": "a", "qty": 2**33, "note": "n", "tags": []})]
    )
    store = stores.get(cat.settings.metadata_url)
    fired: list[bool] = []

    def fail_once(after: bool) -> None:
        # the store's COMMIT fault seam: raising before COMMIT rolls back (not landed),
        # raising after it leaves it committed (landed); either way the outcome is unknown
        if after == landed and not fired:
            fired.append(after)
            raise OSError("connection lost during COMMIT")

    uninstall = at_commit(store, fail_once)
    sink = SegmentSink(options, stores)
    try:
        if landed:
            staged = sink.write(iter(batch))  # re-read: the change is there, go on
        else:
            with pytest.raises(CommitStateUnknownError):
                sink.write(iter(batch))  # re-read: not there, the task fails (nothing staged)
            assert cat.store.get_table("orders").schema_version == 1
            staged = sink.write(iter(batch))  # Spark's retry of the task
    finally:
        uninstall()
        stores.close()
    assert fired == [landed]
    SegmentSink(options).commit([staged], 0)
    assert cat.store.get_table("orders").schema_version == 2
    assert rows(cat) == [{"id": 1, "customer": "a", "qty": 2**33, "note": "n", "tags": []}]


def test_schema_evolution_is_not_changed_by_an_update(
    cat: Catalog, registry: TestSchemaRegistry
) -> None:
    """A running writer reads the setting from its source config when it starts: an update
    that changes it is refused naming the field (restart the datastream with a new one)."""
    spec = datastream(registry, "update", auto=False)
    start(cat, spec)
    with pytest.raises(IncompatibleChangeError) as exc:
        Registry(cat.store).update("orders", datastream(registry, "update", auto=True))
    assert exc.value.field == "source.schema_evolution"


def test_without_auto_a_protobuf_value_that_does_not_fit_names_the_column(
    cat: Catalog, registry: TestSchemaRegistry
) -> None:
    F = descriptor_pb2.FieldDescriptorProto
    wide = [("id", F.TYPE_INT64), ("customer", F.TYPE_STRING), ("qty", F.TYPE_INT64)]
    v2 = Proto(registry, "no-auto-proto", _message_class("millstream.evo3", wide))
    options = start(cat, datastream(registry, "no-auto-proto", fmt="protobuf", auto=False))
    batch = [
        v2({"id": 1, "customer": "a", "qty": 5}),
        v2({"id": 2, "customer": "b", "qty": 2**40}),
    ]
    SegmentSink(options).commit(
        [SegmentSink(options).write(iter(records(options, 0, 0, batch)))], 0
    )
    assert cat.store.get_table("orders").schema_version == 1
    assert rows(cat) == [{"id": 1, "customer": "a", "qty": 5}]
    [(offset, error)] = dead(cat)
    assert offset == 1 and error.startswith("column 'qty': "), error


def test_a_writer_field_named_like_a_metadata_column_is_not_absorbed(
    cat: Catalog, registry: TestSchemaRegistry
) -> None:
    """``src_offset`` is filled from the record's offset: a writer field of that name (a
    string here) neither changes its column nor stops the rest of the schema being absorbed."""
    options = start(cat, datastream(registry, "meta", metadata={"offset": "src_offset"}))
    v2 = Avro(registry, "meta", avro_with(NOTE, {"name": "src_offset", "type": "string"}))
    batch = [v2({"id": 1, "customer": "a", "qty": 1, "note": "n", "src_offset": "x"})]
    SegmentSink(options).commit(
        [SegmentSink(options).write(iter(records(options, 0, 0, batch)))], 0
    )
    assert cat.store.get_table("orders").spec.columns == {
        **SCHEMA,
        "src_offset": "long",
        "note": "string",
    }
