"""Issue 38 for Protobuf values: many topics into many tables, each made and evolved from its
writer schemas, over the real broker with the test schema registry.

Five topics, Protobuf values and keys as confluent-kafka's ``ProtobufSerializer`` writes them
(subjects ``<topic>-value`` and ``<topic>-key``). The spec names a ``topic_pattern`` and no
schema: each topic's table is made from its writer schemas (the columns from the value
message, the key from the key message; a plain message has no ``source.ts_ms``, so a key's
versions are ordered by offset). Each topic carries inserts, updates, tombstones and
re-created keys; one topic then adds a field (its table grows by ``schema_evolution: auto``),
another changes a field's type (refused for that table alone: those records are
dead-lettered naming the topic, the field and the schema id, its later records and every
other table go on); one topic is created while the datastream runs and gets its table
without a restart. Every table equals the sequential model of its own topic's records.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.formats import ProtobufRowEncoder
from harness.ingest_support import (
    InProcessCluster,
    assert_same_rows,
    produce_exact,
    uppers_or_empty,
)
from harness.schema_registry import TestSchemaRegistry
from millstream.catalog import Catalog
from millstream.control.registry import Registry
from millstream.core.lifecycle import State
from millstream.datastream import DatastreamSpec
from millstream.local.tansu import TansuBroker
from millstream.reference.model import Row, model_rows

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

TOPICS = 5
KEYS = 10
#: the topic whose schema gains a field mid-stream, and the one whose field changes type
EVOLVED, REFUSED = 1, 2
#: steps; key k gets the first ``k % 5``; ts is in the row, None is a tombstone
STEPS: list[int | None] = [1, 2, None, 4]
V1 = [("id", "int64"), ("name", "string"), ("qty", "int32")]
V2 = [*V1, ("note", "string")]
#: ``qty`` a string: no lossless widening of the int column
V_REFUSED = [("id", "int64"), ("name", "string"), ("qty", "string")]
KEY = [("id", "int64")]

Change = tuple[dict[str, Any], dict[str, Any] | None]


def _row(t: int, k: int, ts: int) -> dict[str, Any]:
    return {"id": k, "name": f"t{t}k{k}@{ts}", "qty": ts * 10 + t}


def _changes(t: int) -> list[Change]:
    """(key, row or None for a tombstone) of topic ``t``, keys interleaved step by step."""
    return [
        ({"id": k}, None if ts is None else _row(t, k, ts))
        for step, ts in enumerate(STEPS)
        for k in range(KEYS)
        if step < k % 5
    ]


class Topic:
    """One topic: its encoders per schema version and what was produced with them."""

    def __init__(self, registry: str, prefix: str, t: int) -> None:
        self.name, self.t = f"{prefix}.shop.t{t}", t
        self.registry, self.package = registry, f"{prefix}.t{t}"
        self.v1 = self.encoder("v1", V1)
        #: (partition, offset, key, row or None) of every acknowledged record, and the
        #: offsets of those dead-lettered by design (the refused writer schema's)
        self.acked: list[tuple[int, int, dict[str, Any], dict[str, Any] | None]] = []
        self.refused_offsets: list[int] = []

    def encoder(self, version: str, fields: list[tuple[str, str]]) -> ProtobufRowEncoder:
        """An encoder of a writer schema, registered now (the topic's latest)."""
        return ProtobufRowEncoder(
            self.registry, self.name, f"{self.package}.{version}", fields, KEY
        )

    def produce(self, bootstrap: str, changes: list[Change], enc: ProtobufRowEncoder) -> list[int]:
        wire = [(enc.key(k), enc.value(v)) for k, v in changes]
        twin = {w: c for w, c in zip(wire, changes, strict=True)}
        offsets = []
        for p, o, key, value in produce_exact(bootstrap, self.name, {0: wire}):
            k, v = twin[(key, value)]
            self.acked.append((p, o, k, v))
            offsets.append(o)
        return offsets

    def end(self) -> dict[int, int]:
        return {0: 1 + max(o for _, o, _, _ in self.acked)}

    def model_input(self) -> list[Row]:
        rows: list[Row] = []
        for p, o, key, row in self.acked:
            if o in self.refused_offsets:
                continue
            sys = {"_ms_partition": p, "_ms_offset": o}
            if row is None:
                rows.append({"id": key["id"], **sys, "_ms_tombstone": True})
            else:
                rows.append({**row, **sys, "_ms_tombstone": False})
        return rows


def test_protobuf_topics_in_one_datastream_equal_the_model_table_by_table(
    kafka_broker: TansuBroker, spark: Any, tmp_path: Path
) -> None:
    prefix = f"pb{uuid.uuid4().hex[:8]}"
    boot = kafka_broker.bootstrap
    with TestSchemaRegistry() as registry_server:
        topics = {t: Topic(registry_server.url, prefix, t) for t in range(TOPICS)}
        late = topics[TOPICS - 1]  # created while the datastream runs
        for t, topic in topics.items():
            if topic is not late:
                kafka_broker.create_topic(topic.name, 1)
                topic.produce(boot, _changes(t), topic.v1)

        cat = Catalog.open(home=tmp_path / "home")
        registry = Registry(cat.store)
        spec = DatastreamSpec.parse(
            {
                "name": "shop",
                "source": {
                    "kind": "kafka",
                    "bootstrap_servers": boot,
                    "topic_pattern": rf"{prefix}\.shop\..*",
                    "topic_poll_interval": "1s",
                    "format": "protobuf",
                    "schema_registry": {"url": registry_server.url},
                },
                "table": {"mode": "upsert"},
            }
        )
        assert spec.schema_from_registry
        registry.create(spec)
        cluster = InProcessCluster.start(cat, spark, tmp_path / "st")

        def run_until(done: Callable[[], bool], what: str) -> None:
            cluster.tick_until(done, what, timeout=600.0, interval=0.5)

        def caught_up(which: list[Topic]) -> bool:
            return all(uppers_or_empty(cat, f"t{x.t}") == x.end() for x in which)

        try:
            early = [x for x in topics.values() if x is not late]
            run_until(lambda: caught_up(early), f"the first {TOPICS - 1} tables")
            first = cat.table("t0").spec
            assert (first.mode, first.primary_key, first.comparison_column) == (
                "upsert",
                ("id",),
                None,
            )
            assert first.columns == {"id": "long", "name": "string", "qty": "int"}
            run_id = cluster.worker_info()["shared_query"]["run_id"]

            # a new topic, a field added on one topic, a refused change on another, while
            # the datastream runs; the refused topic then goes on with its old schema
            kafka_broker.create_topic(late.name, 1)
            late.produce(boot, _changes(late.t), late.v1)
            evolved = topics[EVOLVED]
            evolved.produce(
                boot,
                [({"id": k}, {**_row(EVOLVED, k, 5), "note": f"n{k}"}) for k in range(KEYS)],
                evolved.encoder("v2", V2),
            )
            refused = topics[REFUSED]
            refused.refused_offsets = refused.produce(
                boot,
                [({"id": k}, {**_row(REFUSED, k, 5), "qty": "many"}) for k in range(0, KEYS, 2)],
                refused.encoder("refused", V_REFUSED),
            )
            refused.produce(boot, [({"id": k}, _row(REFUSED, k, 6)) for k in (1, 2)], refused.v1)
            run_until(lambda: caught_up(list(topics.values())), f"all {TOPICS} tables")

            refused_id = registry_server.subjects[f"{refused.name}-value"][1]
            for topic in topics.values():
                name = f"t{topic.t}"
                table = cat.table(name).spec
                assert ("note" in table.columns) is (topic is evolved), name
                model = model_rows(table, topic.model_input())
                assert model, f"{name}: the model holds no row"
                assert_same_rows(cat.read_table(name).to_pylist(), model, what=name)
                dead = cat.read_table(f"{name}__dead_letter").to_pylist()
                if topic is not refused:
                    assert dead == [], name
                    continue
                assert table.columns == first.columns, "the refused change changed nothing"
                assert sorted(d["offset"] for d in dead) == refused.refused_offsets
                for d in dead:
                    assert d["error"].startswith("field 'qty': Protobuf type string"), d
                    assert (
                        f"writer schema id {refused_id} of topic {refused.name!r} (schema.qty)"
                        in d["error"]
                    ), d
            assert registry.get("shop").state is State.READY
            info = cluster.worker_info()
            assert info["shared_query"]["run_id"] == run_id, "the new topic restarted the query"
            assert len(info["shared_query"]["members"]) == TOPICS
        finally:
            cluster.worker._stop_shared()
    assert not spark.streams.active
