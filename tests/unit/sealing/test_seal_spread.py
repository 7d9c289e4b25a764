"""Age seals of many tables that started together spread over ``flush_seconds`` instead of
all falling in one pass every ``flush_seconds`` (issue 38: 100 tables' seals in one minute
tripled a worker's CPU a batch), and no run is ever sealed later than ``flush_seconds``."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.datastream import SegmentsSection
from millstream.metastore.models import SegmentState
from millstream.sealing.sealer import Sealer
from millstream.sealing.thresholds import Thresholds
from millstream.spec import TableSpec
from millstream.table.writer import commit_staged, stage_rows

TABLES = 12
FLUSH_SECONDS = 60.0
TICK = 5.0  # a commit to every table, then a sealing pass over them all


def _run(tmp_path: Path, thresholds: Thresholds, ticks: int) -> list[list[str]]:
    """Commit a row to each of :data:`TABLES` busy tables every tick, all from the same
    start, and run a worker's sealing pass over them after each; returns the tables each pass
    sealed. After every pass, no table's pending run is older than ``flush_seconds``."""
    cat = Catalog.open(home=tmp_path)
    clock = ManualClock(start=1_700_000_000.0)
    cat.store.clock = clock  # the entries' created_at
    specs = [
        TableSpec.parse({"name": f"orders_{i:02d}", "schema": {"k": "long"}, "mode": "append"})
        for i in range(TABLES)
    ]
    sealers = []
    for spec in specs:
        cat.create_table(spec)
        sealers.append(Sealer(cat, spec.name, thresholds=thresholds, clock=clock))
    passes: list[list[str]] = []
    for tick in range(ticks):
        for spec in specs:
            rows = pa.Table.from_pylist(
                [{"k": tick, "_ms_partition": 0, "_ms_offset": tick, "_ms_tombstone": False}],
                schema=spec.arrow_schema(system_columns=True),
            )
            staged = stage_rows(cat.deep, spec, rows)
            commit_staged(cat.store, cat.deep, spec.name, staged, {0: (tick, tick + 1)}, {0: 0})
        passes.append([s.table for s in sealers for _ in s.seal_due()])
        for spec in specs:
            pending = [
                e.created_at
                for e in cat.manifest(spec.name).entries
                if e.state is not SegmentState.ONLINE
            ]
            assert clock.now() - min(pending, default=clock.now()) < FLUSH_SECONDS, (
                spec.name,
                tick,
            )
        clock.advance(TICK)
    return passes


def test_tables_started_together_seal_spread_over_flush_seconds_never_later(
    tmp_path: Path,
) -> None:
    thresholds = Thresholds.of(SegmentsSection(flush_seconds=FLUSH_SECONDS))
    assert thresholds.spread  # a datastream's sealing spreads
    passes = _run(tmp_path, thresholds, ticks=int(3 * FLUSH_SECONDS / TICK))
    sealed = [t for p in passes for t in p]
    # Every table sealed at least once a period after its first, none more than twice a
    # period: the seals are as many as without spreading, within one early seal a table.
    for i in range(TABLES):
        assert 2 <= sealed.count(f"orders_{i:02d}") <= 3
    # ... and spread: no pass seals more than a third of the tables.
    assert max(len(p) for p in passes) <= TABLES // 3, passes
    assert sum(1 for p in passes if p) >= TABLES // 2, passes


def test_without_spreading_tables_started_together_seal_in_one_pass(tmp_path: Path) -> None:
    """What the spreading avoids: the same tables, with age seals at ``flush_seconds``
    exactly, all seal in the same pass."""
    thresholds = Thresholds(flush_seconds=FLUSH_SECONDS)
    passes = _run(tmp_path, thresholds, ticks=int(FLUSH_SECONDS / TICK) + 2)
    assert [len(p) for p in passes if p] == [TABLES]
