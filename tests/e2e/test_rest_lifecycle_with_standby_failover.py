"""A datastream's whole life through the REST API, on real processes: one ``millstream
controller`` and two ``millstream worker`` processes (each its own JVM) on one metadata store
(SQLite file or PostgreSQL), ingesting a 4-partition topic of the test broker while a
producer keeps writing to it.

create (replicas: 2, an active and a warm standby) -> rows appear -> pause (nothing commits
while records keep arriving) -> resume (rows advance again) -> SIGKILL the active worker's
whole process group -> the standby is promoted and keeps committing -> the producer stops ->
the shards reach the topic's end offsets -> the table equals the oracle's model of every
acknowledged record (nothing lost, nothing twice) and the dead-letter table holds exactly the
bad records -> stop (STOPPING, then STOPPED) -> delete (404 afterwards).
"""

from __future__ import annotations

import contextlib
import itertools
import time
from pathlib import Path

import pytest

from millstream.catalog import Catalog
from millstream.datastream import DatastreamSpec
from millstream.local.tansu import TansuBroker
from millstream.testing.cluster import (
    PARTITIONS,
    Api,
    Cluster,
    SteadyProducer,
    advanced,
    all_reached,
    commits_by,
    orders_config,
    orders_spec,
    table_vs_source,
    wait_until,
)

pytestmark = [pytest.mark.e2e, pytest.mark.kafka]

SEED = 20260214
RATE = 300  # records/s over all partitions
#: Workers heartbeat every 0.5 s; a worker silent this long is dead and its standby takes over.
WORKER_TTL = 5.0
SPARK_START_S = 240  # two JVMs and their first queries start at once on a small machine
_topics = itertools.count()


@pytest.fixture(
    params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)],
)
def metadata_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'home' / 'metadata.db'}"
    server = request.getfixturevalue("postgres_server")
    return str(server.create_database("e2e_lifecycle"))


def test_datastream_survives_pause_resume_and_the_loss_of_its_active_worker(
    cluster: Cluster, kafka_broker: TansuBroker, metadata_url: str
) -> None:
    diag = cluster.diagnostics
    t0 = time.monotonic()

    def phase(what: str) -> None:  # the captured output of a failure shows how far it got
        print(f"{time.monotonic() - t0:6.1f}s  {what}", flush=True)

    topic = f"e2e-orders-{next(_topics)}-{int(time.time())}"
    kafka_broker.create_topic(topic, PARTITIONS)
    ctl = cluster.controller(worker_ttl=WORKER_TTL)
    api = Api(ctl.url)
    producer: SteadyProducer | None = None
    try:
        wait_until(
            "the controller leads",
            lambda: api.get("/health")["leader"],
            timeout=60,
            diagnostics=diag,
        )
        cluster.worker("w1", ctl.url)
        cluster.worker("w2", ctl.url)
        wait_until(
            "both workers heartbeat",
            lambda: all(api.workers().get(w, {}).get("alive") for w in ("w1", "w2")),
            timeout=SPARK_START_S,
            diagnostics=diag,
        )
        phase("controller and both workers up")

        # -- create: INITIALIZING -> READY, an active and a standby on different workers --
        producer = SteadyProducer(
            kafka_broker.bootstrap, topic, orders_config(SEED), rate=RATE, rounds_s=0.25
        ).start()
        body = orders_spec("orders", kafka_broker.bootstrap, topic, replicas=2)
        spec = DatastreamSpec.parse(body)
        table = spec.table_name
        created = api.post("/datastreams", body)
        assert created.status_code == 201, created.text
        assert created.json()["state"] == "INITIALIZING"
        wait_until(
            "the datastream is READY",
            lambda: api.state("orders") == "READY",
            timeout=60,
            diagnostics=diag,
        )
        pair = wait_until(
            "an active and a standby are assigned, each on its own worker",
            lambda: api.active_and_standby("orders"),
            timeout=60,
            diagnostics=diag,
        )
        assert sorted(pair) == ["w1", "w2"]
        wait_until(
            "rows appear in the table",
            lambda: sum(api.uppers(table).values()) > 0,
            timeout=SPARK_START_S,
            diagnostics=diag,
        )
        phase("READY, rows appear")

        # -- pause: the writers stop; nothing commits although records keep arriving -----
        paused = api.post("/datastreams/orders/pause")
        assert paused.status_code == 200, paused.text
        assert paused.json()["state"] == "PAUSED"
        wait_until(
            "no worker runs a writer while PAUSED",
            lambda: not api.running_writers("orders", alive_only=False),
            timeout=90,
            diagnostics=diag,
        )
        version_paused = api.manifest_version(table)
        uppers_paused = api.uppers(table)
        produced_paused = producer.count()
        time.sleep(3)
        assert producer.count() > produced_paused, "the producer stalled: the check is void"
        assert api.state("orders") == "PAUSED"
        assert api.manifest_version(table) == version_paused, diag()
        assert api.uppers(table) == uppers_paused, diag()
        phase("PAUSED, nothing committed")

        # -- resume: rows advance again --------------------------------------------------
        resumed = api.post("/datastreams/orders/resume")
        assert resumed.status_code == 200, resumed.text
        assert resumed.json()["state"] == "READY"
        wait_until(
            "rows advance after resume",
            lambda: advanced(api.uppers(table), uppers_paused, range(PARTITIONS)),
            timeout=SPARK_START_S,
            diagnostics=diag,
        )
        wait_until(
            "both workers run their writer again",
            lambda: api.running_writers("orders") == {"w1", "w2"},
            timeout=SPARK_START_S,
            diagnostics=diag,
        )
        phase("READY again, rows advance")

        # -- SIGKILL the active worker: the standby takes over -----------------------------
        active, standby = wait_until(
            "an active and a standby are assigned",
            lambda: api.active_and_standby("orders"),
            timeout=60,
            diagnostics=diag,
        )
        uppers_at_kill = api.uppers(table)
        killed_at = cluster.services[active].kill()
        phase(f"killed the active worker {active}")
        wait_until(
            f"the standby {standby} is promoted once {active} stops heartbeating",
            lambda: (
                api.placement("orders") == {standby: "active"}
                and not api.workers()[active]["alive"]
            ),
            timeout=WORKER_TTL + 30,
            diagnostics=diag,
        )
        deep_store = str(cluster.home / "deepstore")
        with Catalog.open(
            home=cluster.home, metadata_url=metadata_url, deep_store=deep_store
        ) as cat:
            wait_until(
                f"{standby} commits and the uppers advance past {uppers_at_kill}",
                lambda: (
                    commits_by(cat.store, table, standby, after=killed_at)
                    and advanced(api.uppers(table), uppers_at_kill, range(PARTITIONS))
                ),
                timeout=120,
                diagnostics=diag,
            )
            phase(f"{standby} promoted and committing")

            # -- drain: stop producing, wait for the topic's end offsets ------------------
            producer.stop()
            ends, records = producer.ends(), list(producer.records)
            producer = None
            wait_until(
                f"the shard uppers reach the topic's end offsets {ends}",
                lambda: all_reached(api.uppers(table), ends),
                timeout=180,
                diagnostics=diag,
            )
            assert api.uppers(table) == ends, "a shard upper is past the end of the topic"
            problem = table_vs_source(cat, spec, records)
            assert not problem, f"{problem} ({len(records)} records)\n{diag()}"
            assert commits_by(cat.store, table, active, after=killed_at) == []
            phase(f"caught up; the table equals the model of {len(records)} records")

        # -- stop, then delete ---------------------------------------------------------
        stopped = api.post("/datastreams/orders/stop")
        assert stopped.status_code == 200, stopped.text
        assert stopped.json()["state"] == "STOPPING"
        wait_until(
            "the datastream is STOPPED",
            lambda: api.state("orders") == "STOPPED",
            timeout=90,
            diagnostics=diag,
        )
        assert not api.running_writers("orders")
        deleted = api.delete("/datastreams/orders")
        assert deleted.status_code == 202, deleted.text
        assert deleted.json()["state"] == "DELETING"
        wait_until(
            "the datastream is gone",
            lambda: api.http.get("/datastreams/orders").status_code == 404,
            timeout=60,
            diagnostics=diag,
        )
        assert api.http.get("/datastreams/orders").json()["error"] == "NotFoundError"
        assert api.placement("orders") == {}
        phase("STOPPED, deleted")
    finally:
        if producer is not None:
            with contextlib.suppress(AssertionError):
                producer.stop()
        api.close()
