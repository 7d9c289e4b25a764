"""Two real ``millstream controller`` processes on one metadata store (SQLite file or
PostgreSQL), with a short lease TTL: one leads; when it dies, or is frozen past its lease,
the other takes over with a larger fencing token, and every assignment in the store is then
the new leader's.

No Spark here: a worker is a heartbeat row written by the test through
:func:`millstream.control.workers.heartbeat`, which is all the controller needs to assign.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from harness.cluster import Api, Cluster, Service, wait_until
from millstream.clock import SYSTEM_CLOCK
from millstream.control.leases import Lease, read_lease
from millstream.control.workers import CONTROLLER_LEASE, heartbeat
from millstream.ingest.sources.generator import ORDERS_SCHEMA
from millstream.metastore import schema as s
from millstream.metastore.store import MetadataStore

pytestmark = [pytest.mark.e2e]

LEASE_TTL = 2.0
TICK = 0.5  # ControlSettings.tick_seconds
#: Between the kill and our poll noticing the new leader: process scheduling and HTTP polls.
SLACK = 1.0
_databases = itertools.count()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def metadata_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'home' / 'metadata.db'}"
    server = request.getfixturevalue("postgres_server")
    return str(server.create_database(f"e2e_controllers_{next(_databases)}"))


@pytest.fixture
def store(metadata_url: str, cluster: Cluster) -> Iterator[MetadataStore]:
    st = MetadataStore(metadata_url)
    try:
        yield st
    finally:
        st.dispose()


class FakeWorkers:
    """Workers that only heartbeat (every 0.3 s, from a thread), so the leader assigns them."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        self.ids: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fake-workers", daemon=True)

    def join(self, worker_id: str) -> None:
        self.ids.append(worker_id)
        self._beat(worker_id)

    def _beat(self, worker_id: str) -> None:
        heartbeat(self.store, worker_id, status="RUNNING", info={"writers": []}, clock=SYSTEM_CLOCK)

    def _run(self) -> None:
        while not self._stop.wait(0.3):
            for w in list(self.ids):
                self._beat(w)

    def __enter__(self) -> FakeWorkers:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def lease(store: MetadataStore) -> Lease:
    with store.read() as conn:
        cur = read_lease(conn, CONTROLLER_LEASE)
    assert cur is not None, "nobody ever took the controller lease"
    return cur


def assignment_rows(store: MetadataStore) -> list[tuple[str, str, str, int]]:
    a = s.assignments
    with store.read() as conn:
        rows = conn.execute(
            select(a.c.datastream, a.c.worker_id, a.c.role, a.c.token).order_by(
                a.c.datastream, a.c.worker_id
            )
        ).all()
    return [(str(d), str(w), str(r), int(t)) for d, w, r, t in rows]


def generator_spec(name: str) -> dict[str, object]:
    return {
        "name": name,
        "source": {"kind": "generator", "partitions": 2, "rate": 10},
        "table": {"primary_key": ["order_id"], "mode": "upsert"},
        "schema": dict(ORDERS_SCHEMA),
    }


def create_and_wait_assigned(api: Api, store: MetadataStore, name: str, diag: object) -> None:
    r = api.post("/datastreams", generator_spec(name))
    assert r.status_code == 201, r.text
    wait_until(
        f"{name} is READY and assigned",
        lambda: (
            api.state(name) == "READY" and any(row[0] == name for row in assignment_rows(store))
        ),
        timeout=30,
        diagnostics=diag,  # type: ignore[arg-type]
    )


def start_two(cluster: Cluster) -> tuple[dict[str, Service], dict[str, Api]]:
    ctls = {n: cluster.controller(n, lease_ttl=LEASE_TTL) for n in ("c1", "c2")}
    apis = {n: Api(c.url) for n, c in ctls.items()}
    return ctls, apis


def the_leader(apis: dict[str, Api]) -> str | None:
    """The one controller that says it leads (None if none or both do)."""
    leading = [n for n, api in apis.items() if api.get("/health")["leader"]]
    return leading[0] if len(leading) == 1 else None


def test_standby_controller_takes_over_within_the_lease_ttl_after_the_leader_is_killed(
    cluster: Cluster, store: MetadataStore
) -> None:
    diag = cluster.diagnostics
    ctls, apis = start_two(cluster)
    try:
        leader = wait_until(
            "exactly one controller leads", lambda: the_leader(apis), timeout=60, diagnostics=diag
        )
        other = next(n for n in apis if n != leader)
        with FakeWorkers(store) as workers:
            workers.join("fake-w1")
            create_and_wait_assigned(apis[leader], store, "before", diag)
            before = lease(store)
            assert before.holder == leader
            assert {row[3] for row in assignment_rows(store)} == {before.token}

            killed_at = time.monotonic()
            ctls[leader].kill()
            wait_until(
                f"{other} leads",
                lambda: apis[other].get("/health")["leader"],
                timeout=LEASE_TTL + 30,
                interval=0.05,
                diagnostics=diag,
            )
            takeover = time.monotonic() - killed_at
            print(f"takeover after SIGKILL of the leader: {takeover:.2f}s (lease TTL {LEASE_TTL}s)")
            assert takeover <= LEASE_TTL + TICK + SLACK, f"took over after {takeover:.2f}s"

            after = lease(store)
            assert after.holder == other
            assert after.token > before.token

            # Assignments made from now on carry the new token; the store holds no other.
            workers.join("fake-w2")
            create_and_wait_assigned(apis[other], store, "after", diag)
            rows = assignment_rows(store)
            assert {row[0] for row in rows} == {"before", "after"}
            current = lease(store)
            assert current.holder == other and current.token == after.token
            assert {row[3] for row in rows} == {current.token}, rows
    finally:
        for api in apis.values():
            api.close()


def test_a_frozen_leader_that_wakes_after_the_takeover_assigns_nothing(
    cluster: Cluster, store: MetadataStore
) -> None:
    """SIGSTOP the leader past its lease (a long GC pause, a partition), let the other take
    over and make assignments, then SIGCONT it: it must step down, and every assignment in
    the store carries the new leader's token, also after the sleeper ran a few ticks."""
    diag = cluster.diagnostics
    ctls, apis = start_two(cluster)
    frozen: Service | None = None
    try:
        leader = wait_until(
            "exactly one controller leads", lambda: the_leader(apis), timeout=60, diagnostics=diag
        )
        other = next(n for n in apis if n != leader)
        with FakeWorkers(store) as workers:
            workers.join("fake-w1")
            create_and_wait_assigned(apis[leader], store, "before", diag)
            before = lease(store)

            frozen = ctls[leader]
            os.killpg(frozen.pid, signal.SIGSTOP)
            wait_until(
                f"{other} leads",
                lambda: apis[other].get("/health")["leader"],
                timeout=LEASE_TTL + 30,
                diagnostics=diag,
            )
            # While the old leader sleeps, the cluster changes: a worker joins, a datastream
            # is created; the new leader assigns both.
            workers.join("fake-w2")
            create_and_wait_assigned(apis[other], store, "during", diag)
            taken = lease(store)
            assert taken.holder == other and taken.token > before.token

            os.killpg(frozen.pid, signal.SIGCONT)
            frozen = None
            # More changes after it woke: it sees them too, but it may not act on them.
            workers.join("fake-w3")
            create_and_wait_assigned(apis[other], store, "woken", diag)
            time.sleep(4 * TICK)  # a few of the woken controller's ticks
            assert apis[leader].get("/health")["leader"] is False
            assert apis[other].get("/health")["leader"] is True
            current = lease(store)
            assert current.holder == other and current.token == taken.token
            rows = assignment_rows(store)
            assert {row[0] for row in rows} == {"before", "during", "woken"}
            assert {row[3] for row in rows} == {current.token}, rows
    finally:
        if frozen is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(frozen.pid, signal.SIGCONT)
        for api in apis.values():
            api.close()
