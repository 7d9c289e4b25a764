"""Races between manifest operations on PostgreSQL, with real concurrent transactions (SQLite
serializes every writer with BEGIN IMMEDIATE, which hides them).

A re-ingestion reads a segment's entry, then a sealer claims that entry and commits, then the
re-ingestion swaps. The swap's compare-and-set must see that the entry moved (rowcount 0) and
re-read; without the rowcount check it inserted a second live entry for the same offsets:
append tables returned those rows twice.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event
from test_contract_manifest_guards import TABLE, Pipeline

from millstream.catalog import Catalog
from millstream.metastore.models import SegmentState
from millstream.sealing.reingest import reingest_segment
from millstream.sealing.sealer import Sealer

pytestmark = pytest.mark.postgres


@pytest.fixture
def pg_catalog(postgres_server: Any, tmp_path: Path) -> Iterator[Catalog]:
    url = postgres_server.create_database(f"ms_race_{uuid.uuid4().hex[:12]}")
    with Catalog.open(metadata_url=url, deep_store=str(tmp_path / "deep")) as cat:
        yield cat


def test_a_reingestion_racing_a_seal_claim_leaves_one_live_entry_per_segment_on_postgres(
    pg_catalog: Catalog, tmp_path: Path
) -> None:
    pipe = Pipeline(pg_catalog, tmp_path)
    for _ in range(3):
        pipe.batch(0)
    target = next(e for e in pg_catalog.manifest(TABLE).entries if e.seq == 1)
    # The sealer is another process: its own engine and connections.
    sealer_side = Catalog.open(metadata_url=pg_catalog.store.url, deep_store=str(tmp_path / "deep"))
    me = threading.get_ident()
    claimed: list[Any] = []

    def claim_first(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        """Right before the re-ingestion's UPDATE of the entry (after its read), the sealer's
        claim commits."""
        if claimed or threading.get_ident() != me:
            return
        if not statement.lstrip().upper().startswith("UPDATE MS_ENTRIES"):
            return
        t = threading.Thread(
            target=lambda: claimed.append(
                sealer_side.store.claim_run([target], owner="sealer-elsewhere")
            )
        )
        t.start()
        t.join(timeout=60)

    event.listen(pg_catalog.store.engine, "before_cursor_execute", claim_first)
    try:
        reingest_segment(pg_catalog, pipe.ds, target.name)
    finally:
        event.remove(pg_catalog.store.engine, "before_cursor_execute", claim_first)
        sealer_side.close()
    assert claimed and claimed[0] is not None, "the claim committed in between"

    live = [e for e in pg_catalog.manifest(TABLE).entries if e.partition == 0]
    assert sorted(e.seq for e in live) == [0, 1, 2], "one live entry per segment"
    replaced = next(e for e in live if e.seq == 1)
    assert replaced.state is SegmentState.CONSUMING and replaced.claimed_by is None
    pipe.assert_reads_every_row_once()
    assert Sealer(pg_catalog, TABLE).seal_partition(0, force=True) is not None
    assert [e.state for e in pg_catalog.manifest(TABLE).entries if e.partition == 0] == [
        SegmentState.ONLINE
    ]
    pipe.assert_reads_every_row_once()


def test_two_sealers_claiming_the_same_run_at_once_get_it_once_on_postgres(
    pg_catalog: Catalog, tmp_path: Path
) -> None:
    pipe = Pipeline(pg_catalog, tmp_path)
    for _ in range(2):
        pipe.batch(0)
    run = Sealer(pg_catalog, TABLE).pending_run(0)
    other = Catalog.open(metadata_url=pg_catalog.store.url, deep_store=str(tmp_path / "deep"))
    me = threading.get_ident()
    theirs: list[Any] = []

    seen: list[str] = []

    def peer_claims_first(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        """Right after this sealer checked every entry of the run (one read of them all) and
        before its next statement on them, a peer sealer's claim of the same run commits."""
        if theirs or threading.get_ident() != me or "ms_entries" not in statement:
            return
        seen.append(statement)
        if len(seen) == 1:
            return
        t = threading.Thread(
            target=lambda: theirs.append(other.store.claim_run(run, owner="sealer-b"))
        )
        t.start()
        t.join(timeout=60)

    event.listen(pg_catalog.store.engine, "before_cursor_execute", peer_claims_first)
    try:
        mine = pg_catalog.store.claim_run(run, owner="sealer-a")
    finally:
        event.remove(pg_catalog.store.engine, "before_cursor_execute", peer_claims_first)
        other.close()
    assert theirs and theirs[0] is not None, "the peer's claim committed in between"
    assert mine is None, "the run is claimed once"
    owners = {e.claimed_by for e in pg_catalog.manifest(TABLE).entries if e.partition == 0}
    assert owners == {"sealer-b"}
