"""Two controllers starting the re-ingest job of the same segment at once, on PostgreSQL with
real concurrent transactions (READ COMMITTED: both read "no job running" before either
writes). Exactly one job runs; the other controller is told it exists. Without the unique
``active_key`` both inserted a RUNNING job and both re-ingested the segment."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from millstream.catalog import Catalog
from millstream.errors import AlreadyExistsError
from millstream.metastore.jobs import ABANDONED, RUNNING

pytestmark = pytest.mark.postgres

NOW = 1_700_000_000.0


@pytest.fixture
def pg_catalog(postgres_server: Any, tmp_path: Path) -> Iterator[Catalog]:
    url = postgres_server.create_database(f"ms_jobs_{uuid.uuid4().hex[:12]}")
    with Catalog.open(metadata_url=url, deep_store=str(tmp_path / "deep")) as cat:
        yield cat


def _race(catalog: Catalog, tmp_path: Path, now: float) -> list[Any]:
    """Two controllers (each its own engine) start the job of orders__0__0 at once: both
    read before either writes. Returns what each got (a job, or the error)."""
    stores = [
        Catalog.open(metadata_url=catalog.store.url, deep_store=str(tmp_path / "deep"))
        for _ in range(2)
    ]
    both_read = threading.Barrier(2, timeout=30)
    got: list[Any] = [None, None]

    def run(i: int) -> None:
        first = [True]

        def after_read() -> None:
            if first[0]:  # only the first attempt waits; a retry re-reads on its own
                first[0] = False
                both_read.wait()

        try:
            got[i] = stores[i].store.start_reingest(
                "orders",
                "orders__0__0",
                entry_id=1,
                owner=f"controller-{i}",
                now=now,
                lease=60.0,
                trigger="auto",
                after_read=after_read,
            )
        except Exception as exc:
            got[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for c in stores:
        c.close()
    return got


def test_two_controllers_starting_the_same_segments_job_at_once_run_it_once_on_postgres(
    pg_catalog: Catalog, tmp_path: Path
) -> None:
    got = _race(pg_catalog, tmp_path, NOW)
    errors = [g for g in got if isinstance(g, Exception)]
    assert len(errors) == 1 and isinstance(errors[0], AlreadyExistsError), got
    running = [j for j in pg_catalog.store.reingest_jobs() if j.status(NOW) == RUNNING]
    assert len(running) == 1, [j.payload for j in pg_catalog.store.reingest_jobs()]


def test_two_controllers_taking_over_an_abandoned_job_at_once_take_it_once_on_postgres(
    pg_catalog: Catalog, tmp_path: Path
) -> None:
    dead = pg_catalog.store.start_reingest(
        "orders",
        "orders__0__0",
        entry_id=1,
        owner="controller-dead",
        now=NOW,
        lease=60.0,
        trigger="api",
    )
    assert dead is not None
    later = NOW + 120
    assert [j.status(later) for j in pg_catalog.store.reingest_jobs()] == [ABANDONED]
    got = _race(pg_catalog, tmp_path, later)
    errors = [g for g in got if isinstance(g, Exception)]
    assert len(errors) == 1 and isinstance(errors[0], AlreadyExistsError), got
    [job] = pg_catalog.store.reingest_jobs()
    assert (job.id, job.status(later), job.attempts) == (dead.id, RUNNING, 2)
