"""A write the server aborts (a deadlock, a serialization failure) committed nothing and is run
again, even where a lost compare-and-set is an answer rather than a reason to retry: the
Iceberg pointer's swap, a pin's release, a re-ingest job's lease and outcome. The commit-path
fault campaign found a publisher's pointer swap chosen as a PostgreSQL deadlock victim (seed
739558309): the swap raised, and the publish failed, where running it again moves the pointer.
Here the deadlock is a real one, made on purpose on a real PostgreSQL server."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest
from sqlalchemy import text

from millstream.metastore.store import MetadataStore
from millstream.spec import TableSpec

TABLE = "kv"


@pytest.mark.postgres
def test_a_pointer_swap_chosen_as_a_deadlock_victim_is_run_again_and_moves_the_pointer(
    postgres_server: Any,
) -> None:
    url = postgres_server.create_database(f"ms_deadlock_{uuid.uuid4().hex[:12]}")
    store = MetadataStore(url)
    try:
        store.create_table(
            TableSpec.parse({"name": TABLE, "schema": {"k": "long"}, "mode": "append"})
        )
        first = store.swap_pointer(
            TABLE, None, metadata_location="m/v1.json", manifest_version=0, now=1.0
        )
        assert first is not None

        # The swap's transaction locks the table row, then updates the pointer row. Another
        # transaction holds the pointer row first; once the swap waits for it, that one asks
        # for the table row: a cycle. The swap waited first, so its deadlock check runs first
        # and PostgreSQL aborts it.
        swap_pid: list[int] = []
        result: list[Any] = []

        def swap() -> None:
            try:
                result.append(
                    store.swap_pointer(
                        TABLE, first, metadata_location="m/v2.json", manifest_version=0, now=2.0
                    )
                )
            except Exception as exc:  # reported below
                result.append(exc)

        with store.engine.connect() as other:
            other.execute(text("BEGIN"))
            other.execute(
                text(
                    "UPDATE ms_iceberg_pointers SET published_at = published_at "
                    "WHERE table_name = :t"
                ),
                {"t": TABLE},
            )
            before = store.conflicts
            mine = int(other.execute(text("SELECT pg_backend_pid()")).scalar_one())
            thread = threading.Thread(target=swap)
            thread.start()
            deadline = time.monotonic() + 60  # a bound on a loaded machine, not a measurement
            while not swap_pid and time.monotonic() < deadline:
                with store.engine.connect() as probe:
                    rows = probe.execute(
                        text(
                            "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                            "AND query LIKE '%ms_iceberg_pointers%'"
                        )
                    ).fetchall()
                swap_pid.extend(int(r[0]) for r in rows if int(r[0]) != mine)
                time.sleep(0.05)
            assert swap_pid, "the swap never waited for the pointer row"
            other.execute(
                text("SELECT name FROM ms_tables WHERE name = :t FOR UPDATE"), {"t": TABLE}
            )
            other.execute(text("COMMIT"))
        thread.join(120)
        assert not thread.is_alive()
        [out] = result
        assert not isinstance(out, Exception), f"the swap failed: {out!r}"
        assert out is not None and out.metadata_location == "m/v2.json"
        assert store.read_pointer(TABLE).metadata_location == "m/v2.json"  # type: ignore[union-attr]
        assert store.conflicts > before, "no deadlock happened: the test proved nothing"
    finally:
        store.dispose()
