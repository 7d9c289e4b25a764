"""One datastream, many topics, a table each, over the real broker.

A worker runs a ``topic_pattern`` datastream's tables as members of its one shared query: each
table equals the model of its own topic, one topic's bad records land in its own dead-letter
table, and a table that cannot be written (its name belongs to another datastream) waits out
its own backoff while the others commit, the datastream staying READY. A topic created while
the datastream runs gets its table at the next listing of the broker's topics, without a
restart of the query. Tables with nothing new cost nothing: no task of the batch carries them
(the planner skips them) and the commit's one metadata transaction does not touch them.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.ingest_support import (
    InProcessCluster,
    assert_table_matches_source,
    ends_of,
    produce_exact,
    uppers_or_empty,
)
from millstream.catalog import Catalog
from millstream.control.controller import Controller
from millstream.control.registry import Registry
from millstream.core.lifecycle import State
from millstream.datastream import DatastreamSpec, dead_letter_spec
from millstream.ingest.sources import config_for
from millstream.local.tansu import TansuBroker
from millstream.metastore.store import MetadataStore
from millstream.reference.oracle import RawRecord
from millstream.spark.options import (
    GroupSinkOptions,
    GroupSourceOptions,
    SinkOptions,
    SourceOptions,
)
from millstream.spark.runner import bootstrap
from millstream.spark.sink import GroupSink
from millstream.spark.sources import GroupStreamReader

pytestmark = [pytest.mark.kafka]


def _value(k: int, v: str) -> bytes:
    return json.dumps({"id": k, "v": v}).encode()


def _rows(n: int, tag: str, *, bad_every: int = 0) -> list[tuple[bytes | None, bytes | None]]:
    """``n`` records of 40 keys (updates after the first 40); every ``bad_every``-th is not
    JSON."""
    out: list[tuple[bytes | None, bytes | None]] = []
    for i in range(n):
        value = b"not json" if bad_every and i % bad_every == 3 else _value(i % 40, f"{tag}{i}")
        out.append((str(i % 40).encode(), value))
    return out


def _spec(name: str, bootstrap_servers: str, prefix: str) -> DatastreamSpec:
    return DatastreamSpec.parse(
        {
            "name": name,
            "source": {
                "kind": "kafka",
                "bootstrap_servers": bootstrap_servers,
                "topic_pattern": rf"{prefix}\.shop\..*",
                "topic_poll_interval": "1s",
            },
            "table": {"mode": "upsert", "primary_key": ["id"]},
            "schema": {"id": "long", "v": "string"},
        }
    )


@pytest.mark.spark
def test_a_worker_runs_every_table_of_a_topic_pattern_and_isolates_them(
    spark: Any, kafka_broker: TansuBroker, tmp_path: Path
) -> None:
    prefix = f"mt{uuid.uuid4().hex[:8]}"
    boot = kafka_broker.bootstrap
    topics = {n: f"{prefix}.shop.{n}" for n in ("alpha", "beta", "gamma", "delta")}
    for n, t in topics.items():
        kafka_broker.create_topic(t, partitions=2 if n == "alpha" else 1)
    records: dict[str, list[RawRecord]] = {
        "alpha": produce_exact(boot, topics["alpha"], {0: _rows(60, "a"), 1: _rows(40, "A")}),
        "beta": produce_exact(boot, topics["beta"], {0: _rows(80, "b", bad_every=10)}),
        "gamma": produce_exact(boot, topics["gamma"], {0: _rows(50, "g")}),
        "delta": produce_exact(boot, topics["delta"], {0: _rows(30, "d")}),
    }
    cat = Catalog.open(home=tmp_path / "home")
    registry = Registry(cat.store)
    # Another datastream owns the name "delta": the topic's table cannot be written.
    squat = tmp_path / "squat" / "0"
    squat.mkdir(parents=True)
    (squat / "0.jsonl").write_text('{"id": 1}\n')
    registry.create(
        DatastreamSpec.parse(
            {
                "name": "squatter",
                "source": {"kind": "files", "path": str(squat.parent)},
                "table": {"name": "delta"},
                "schema": {"id": "long"},
            }
        )
    )
    spec = _spec("shop", boot, prefix)
    registry.create(spec)
    cluster = InProcessCluster.start(cat, spark, tmp_path / "state")
    worker = cluster.worker

    def run_until(done: Callable[[], bool], what: str) -> None:
        cluster.tick_until(done, what, timeout=300.0, interval=0.3)

    def members() -> dict[str, DatastreamSpec]:
        found = spec.tables(topics.values())
        assert list(found.members) == sorted(topics)
        return found.members

    def caught_up(*names: str) -> bool:
        return all(
            uppers_or_empty(cat, n) == ends_of(records[n]) and bool(records[n]) for n in names
        )

    def writer(name: str) -> dict[str, Any]:
        info = cluster.worker_info()
        found = [wr for wr in info["writers"] if wr.get("member") == f"shop.{name}"]
        assert found, f"the worker reports no writer of shop.{name}: {info['writers']}"
        return found[0]

    try:
        run_until(lambda: caught_up("alpha", "beta", "gamma"), "alpha, beta and gamma")
        for name in ("alpha", "beta", "gamma"):
            assert_table_matches_source(cat, members()[name], records[name])
        assert cat.read_table("beta__dead_letter").num_rows == 8
        assert cat.read_table("alpha__dead_letter").num_rows == 0
        # delta's table is another datastream's: it alone fails, and waits out its backoff
        assert registry.get("shop").state is State.READY
        run_until(lambda: writer("delta")["health"]["status"] == "retrying", "delta to retry")
        assert "belongs to datastream 'squatter'" in (writer("delta")["error"] or "")
        assert cat.read_table("delta").num_rows <= 1  # the squatter's row, never delta's
        assert writer("alpha")["datastream"] == "shop" and writer("alpha")["table"] == "alpha"
        status = cluster.worker_info()["shared_query"]
        run_id = status["run_id"]
        assert {"shop.alpha", "shop.beta", "shop.gamma"} <= set(status["members"])

        # Idle tables cost no commit: only alpha gets records, only alpha's versions move.
        versions = {n: cat.table(n).manifest_version for n in ("beta", "gamma")}
        dl_versions = {n: cat.table(f"{n}__dead_letter").manifest_version for n in versions}
        more = produce_exact(boot, topics["alpha"], {0: _rows(30, "a2")})
        records["alpha"] += more
        run_until(lambda: caught_up("alpha"), "alpha's new records")
        assert {n: cat.table(n).manifest_version for n in versions} == versions
        assert {n: cat.table(f"{n}__dead_letter").manifest_version for n in versions} == dl_versions

        # A topic created now gets its table at the next listing, without a restart.
        topics["epsilon"] = f"{prefix}.shop.epsilon"
        kafka_broker.create_topic(topics["epsilon"], partitions=1)
        records["epsilon"] = produce_exact(boot, topics["epsilon"], {0: _rows(45, "e")})
        run_until(lambda: caught_up("epsilon"), "the new topic's table")
        del topics["delta"]
        for name in ("alpha", "beta", "gamma", "epsilon"):
            assert_table_matches_source(
                cat, spec.tables(topics.values()).members[name], records[name]
            )
        status = cluster.worker_info()["shared_query"]
        assert status["run_id"] == run_id, "a new topic restarted the shared query"
        assert "shop.epsilon" in status["members"]
        assert registry.get("shop").state is State.READY
    finally:
        worker._stop_shared()
    assert not spark.streams.active


def test_tables_with_nothing_new_get_no_task_and_no_commit(
    kafka_broker: TansuBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shared query's planner and sink (as a worker's query runs them, without Spark)
    over 6 tables of one datastream, 2 of which have new records: the batch's tasks carry
    only those 2, and only those 2 commit (in one metadata transaction)."""
    prefix = f"mi{uuid.uuid4().hex[:8]}"
    boot = kafka_broker.bootstrap
    names = [f"t{i}" for i in range(6)]
    for n in names:
        kafka_broker.create_topic(f"{prefix}.shop.{n}", partitions=1)
    for n in ("t1", "t4"):
        produce_exact(boot, f"{prefix}.shop.{n}", {0: _rows(20, n)})
    spec = _spec("shop", boot, prefix)
    catalog = Catalog.open(home=tmp_path / "home")
    members = spec.tables(f"{prefix}.shop.{n}" for n in names).members
    source: dict[str, SourceOptions] = {}
    sink: dict[str, SinkOptions] = {}
    for table, member in members.items():
        t = member.table_spec()
        catalog.create_table(t)
        catalog.create_table(dead_letter_spec(t))
        b = bootstrap(member, catalog.store)
        kind, config = config_for(member.source, member.name)
        key = f"shop.{table}"
        source[key] = SourceOptions(kind, config, start_offsets=b.uppers, tasks=2)
        sink[key] = SinkOptions(
            settings=catalog.settings,
            table_spec=t,
            writer_id="w1",
            epochs=b.epochs,
            dead_letter_epochs=b.dead_letter_epochs,
            source_kind=kind,
            source_config=config,
        )
    reader = GroupStreamReader(
        GroupSourceOptions.from_options(GroupSourceOptions(source).to_options())
    )
    start = reader.initialOffset()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    tasks = reader.partitions(start, end)
    planned = sorted({name for t in tasks for name, _ in t.parts})  # type: ignore[attr-defined]
    assert planned == ["shop.t1", "shop.t4"]
    assert len(tasks) <= 2

    commits: list[list[str]] = []
    real = MetadataStore.commit_batches

    def counted(self: MetadataStore, batches: Any) -> Any:
        commits.append(sorted(batches))
        return real(self, batches)

    monkeypatch.setattr(MetadataStore, "commit_batches", counted)
    writer = GroupSink(GroupSinkOptions.from_options(GroupSinkOptions(sink).to_options()))
    writer.commit([writer.write(reader.read(t)) for t in tasks], 0)
    assert commits == [["shop.t1", "shop.t4"]], "one transaction, for the tables with records"
    versions = {n: catalog.table(n).manifest_version for n in names}
    assert versions["t1"] > versions["t0"] and versions["t4"] > versions["t0"]
    assert len({versions[n] for n in names if n not in ("t1", "t4")}) == 1


def test_the_api_lists_every_table_and_its_own_topics_lag(
    kafka_broker: TansuBroker, tmp_path: Path
) -> None:
    """GET /datastreams/{name} lists the tables a pattern's topics got; /metrics and a table's
    consumingSegmentsInfo show each table's lag against its own topic."""
    from harness.api_support import TestClient
    from millstream.api import create_app

    prefix = f"ma{uuid.uuid4().hex[:8]}"
    boot = kafka_broker.bootstrap
    sizes = {"orders": 7, "items": 3}
    for n, size in sizes.items():
        kafka_broker.create_topic(f"{prefix}.shop.{n}", partitions=1)
        produce_exact(boot, f"{prefix}.shop.{n}", {0: _rows(size, n)})
    catalog = Catalog.open(home=tmp_path / "home")
    controller = Controller(catalog, controller_id="c1")
    body = _spec("shop", boot, prefix).model_dump(mode="json", by_alias=True, exclude_none=True)
    body["source"].pop("topic_pattern")
    body["source"]["topics"] = [f"{prefix}.shop.{n}" for n in sizes]
    with TestClient(create_app(catalog, controller=controller, upstream_timeout=10)) as api:
        created = api.post("/datastreams", json=body)
        assert created.status_code == 201, created.text
        assert created.json()["table"] is None
        controller.tick()
        rec = api.get("/datastreams/shop").json()
        assert (rec["state"], rec["table"], rec["tables"]) == ("READY", None, ["items", "orders"])
        # each table's shards, as its writer makes them when it joins a worker's query
        spec = DatastreamSpec.parse(rec["spec"])
        for member in spec.declared_tables().values():
            bootstrap(member, catalog.store)
        assert [d["tables"] for d in api.get("/datastreams").json()] == [["items", "orders"]]
        info = api.get("/tables/orders/consumingSegmentsInfo").json()
        assert [p["records_lag"] for p in info["partitions"]] == [sizes["orders"]]
        metrics = api.get("/metrics").text
        for n, size in sizes.items():
            assert f'millstream_offset_lag{{partition="0",table="{n}"}} {size}.0' in metrics
