"""Acceptance (issue 38): a whole Debezium database in one datastream, over the real broker
with the test schema registry.

20 topics, one per database table, Avro values and keys as Debezium's converter writes them.
The spec names a ``topic_pattern`` and no schema: each topic's table is made from its writer
schemas (the key from the record key's schema, the comparison column from ``source.ts_ms``,
the columns from the envelope's row record). Each topic carries inserts, updates, deletes
with their tombstones and re-created keys; 3 topics then change their schema (a field added)
and their tables grow by ``schema_evolution: auto``; one topic is created while the
datastream runs and gets its table without a restart. Every table equals the sequential
model of its own topic's events, built here from the events' JSON twins.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.formats import DebeziumAvroEncoder, debezium_envelope
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
from millstream.datastream import SOURCE_TS_COLUMN, DatastreamSpec
from millstream.local.tansu import TansuBroker
from millstream.reference.model import Row, model_rows

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

TOPICS = 20
KEYS = 12
#: topics whose schema gains a field mid-stream
EVOLVED = (0, 1, 2)
#: (op, source ts) steps; key k gets the first ``k % 6``; None is the tombstone after a delete
STEPS: list[tuple[str, int] | None] = [("c", 1), ("u", 2), ("d", 3), None, ("c", 4)]
V1 = [
    {"name": "id", "type": "long"},
    {"name": "name", "type": ["null", "string"], "default": None},
    {"name": "qty", "type": ["null", "int"], "default": None},
]
V2 = [*V1, {"name": "note", "type": ["null", "string"], "default": None}]


def _row(t: int, k: int, ts: int, *, note: bool = False) -> dict[str, Any]:
    row: dict[str, Any] = {"id": k, "name": f"t{t}k{k}@{ts}", "qty": ts * 10 + t}
    if note:
        row["note"] = f"n{t}.{k}.{ts}"
    return row


def _event(t: int, k: int, op: str, ts: int, *, note: bool = False) -> dict[str, Any]:
    return {
        "before": _row(t, k, ts - 1, note=note) if op in ("u", "d") else None,
        "after": None if op == "d" else _row(t, k, ts, note=note),
        "op": op,
        "ts_ms": 10_000 + ts,
        "source": {"ts_ms": 1_000 * ts + k},
    }


def _changes(t: int) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    """(key, event or None for a tombstone) of topic ``t``, keys interleaved step by step."""
    out: list[tuple[dict[str, Any], dict[str, Any] | None]] = []
    for step, what in enumerate(STEPS):
        for k in range(KEYS):
            if step < k % 6:
                out.append(({"id": k}, None if what is None else _event(t, k, *what)))
    return out


def _evolved_changes(t: int) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    """The later changes of an evolved topic: every key updated (or re-created) with the new
    field, at source ts 5."""
    return [
        ({"id": k}, _event(t, k, "u" if k % 6 in (2, 5) else "c", 5, note=True))
        for k in range(KEYS)
    ]


class Topic:
    """One database table's topic: its encoders per schema version and what was produced."""

    def __init__(self, registry: str, name: str, t: int) -> None:
        self.name, self.t = name, t
        ns = f"db.inventory.t{t}"
        key = {"type": "record", "name": "Key", "namespace": ns, "fields": [V1[0]]}
        self.v1 = DebeziumAvroEncoder(registry, name, debezium_envelope(V1, ns), key)
        self.v2 = DebeziumAvroEncoder(registry, name, debezium_envelope(V2, ns), key)
        #: (partition, offset, key event, value event) of every acknowledged record
        self.acked: list[tuple[int, int, dict[str, Any], dict[str, Any] | None]] = []

    def produce(
        self,
        bootstrap: str,
        changes: list[tuple[dict[str, Any], dict[str, Any] | None]],
        enc: DebeziumAvroEncoder,
    ) -> None:
        wire = [(enc.key(k), enc.value(v)) for k, v in changes]
        twin = {w: c for w, c in zip(wire, changes, strict=True)}
        for p, o, key, value in produce_exact(bootstrap, self.name, {0: wire}):
            k, v = twin[(key, value)]
            self.acked.append((p, o, k, v))

    def end(self) -> dict[int, int]:
        return {0: 1 + max(o for _, o, _, _ in self.acked)}

    def model_input(self) -> list[Row]:
        rows: list[Row] = []
        for p, o, key, ev in self.acked:
            sys = {"_ms_partition": p, "_ms_offset": o}
            if ev is None:
                rows.append({"id": key["id"], **sys, "_ms_tombstone": True})
            elif ev["op"] == "d":
                ts = {SOURCE_TS_COLUMN: ev["source"]["ts_ms"]}
                rows.append({"id": ev["before"]["id"], **ts, **sys, "_ms_tombstone": True})
            else:
                ts = {SOURCE_TS_COLUMN: ev["source"]["ts_ms"]}
                rows.append({**ev["after"], **ts, **sys, "_ms_tombstone": False})
        return rows


def test_a_debezium_database_in_one_datastream_equals_the_model_table_by_table(
    kafka_broker: TansuBroker, spark: Any, tmp_path: Path
) -> None:
    prefix = f"dbz{uuid.uuid4().hex[:8]}"
    boot = kafka_broker.bootstrap
    with TestSchemaRegistry() as registry_server:
        topics = {
            t: Topic(registry_server.url, f"{prefix}.inventory.t{t:02d}", t) for t in range(TOPICS)
        }
        late = topics[TOPICS - 1]  # created while the datastream runs
        for t, topic in topics.items():
            if topic is not late:
                kafka_broker.create_topic(topic.name, 1)
                topic.produce(boot, _changes(t), topic.v1)

        cat = Catalog.open(home=tmp_path / "home")
        registry = Registry(cat.store)
        spec = DatastreamSpec.parse(
            {
                "name": "inventory",
                "source": {
                    "kind": "kafka",
                    "bootstrap_servers": boot,
                    "topic_pattern": rf"{prefix}\.inventory\..*",
                    "topic_poll_interval": "1s",
                    "format": "avro",
                    "schema_registry": {"url": registry_server.url},
                    "envelope": "debezium",
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
            return all(uppers_or_empty(cat, f"t{x.t:02d}") == x.end() for x in which)

        try:
            early = [x for x in topics.values() if x is not late]
            run_until(lambda: caught_up(early), "the first 19 tables")
            first = cat.table("t00").spec
            assert (first.mode, first.primary_key, first.comparison_column) == (
                "upsert",
                ("id",),
                SOURCE_TS_COLUMN,
            )
            assert list(first.columns) == ["id", "name", "qty", SOURCE_TS_COLUMN]
            info = cluster.worker_info()
            run_id = info["shared_query"]["run_id"]

            # a new topic, and a schema change on 3 topics, while the datastream runs
            kafka_broker.create_topic(late.name, 1)
            late.produce(boot, _changes(late.t), late.v1)
            for t in EVOLVED:
                topics[t].produce(boot, _evolved_changes(t), topics[t].v2)
            run_until(lambda: caught_up(list(topics.values())), "all 20 tables")

            for topic in topics.values():
                name = f"t{topic.t:02d}"
                table = cat.table(name).spec
                expect_note = topic.t in EVOLVED
                assert ("note" in table.columns) is expect_note, name
                model = model_rows(table, topic.model_input())
                assert model, f"{name}: the model holds no row"
                got = cat.read_table(name).to_pylist()
                assert_same_rows(got, model, what=name)
                assert cat.read_table(f"{name}__dead_letter").num_rows == 0, name
            assert registry.get("inventory").state is State.READY
            info = cluster.worker_info()
            assert info["shared_query"]["run_id"] == run_id, "the new topic restarted the query"
            assert len(info["shared_query"]["members"]) == TOPICS
        finally:
            cluster.worker._stop_shared()
    assert not spark.streams.active
