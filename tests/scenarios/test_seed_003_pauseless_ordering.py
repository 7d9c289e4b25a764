"""Seed 003 (Pinot pauseless consumption): with consumption continuing while segment N is
still being built and committed, segment N+1 must not be sealed before N. Pinot needs
``enforceConsumptionInOrder`` and, for dedup tables, even stops consumption during a commit,
because the dedup state must reflect N before N+1 is resolved against it.

Millstream keeps consuming (pauseless) and keeps key state out of the hot path, but its sealer
resolves keys against the partition's key index and writes delete vectors, so the same race
exists there: if N+1 were sealed first, N's older rows would be resolved *after* N+1's newer
ones and would delete them. The guard: a seal always takes the whole unsealed suffix of the
partition, and a run with a segment still COMMITTING is left alone.

The scenario, deterministic: N = [k1 = a, k1 deleted, k2 = a] is being built (its build is held
at a fault point); N+1 = [k1 = Y, k2 = b] is committed meanwhile, and a second sealer tries to
seal. Expected table: upsert {k1: Y, k2: b}, dedup {k1: Y, k2: a}. The control test runs a
sealer without the guard (it seals the newest unclaimed segments) and shows the lost rows.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from harness.fault_points import at_sealer
from millstream.catalog import Catalog
from millstream.metastore.models import Entry, Manifest, SegmentState
from millstream.reference.model import canonical, model_rows
from millstream.sealing.keyindex import CACHE
from millstream.sealing.sealer import Sealer
from millstream.spec import TableSpec
from millstream.table.writer import commit_staged, stage_rows

N = [("k1", "a", False), ("k1", None, True), ("k2", "a", False)]
N_PLUS_1 = [("k1", "Y", False), ("k2", "b", False)]
EXPECTED = {"upsert": {"k1": "Y", "k2": "b"}, "dedup": {"k1": "Y", "k2": "a"}}


class UnorderedSealer(Sealer):
    """The buggy logic: seal whatever consuming segments nobody has claimed, even while an
    older segment of the partition is still being committed."""

    def pending_run(self, partition: int, manifest: Manifest | None = None) -> list[Entry]:
        run = super().pending_run(partition, manifest)
        while run and any(e.state is SegmentState.COMMITTING for e in run):
            run = run[1:]
        return run


def _commit(cat: Catalog, spec: TableSpec, lo: int, rows: list[tuple[str, Any, bool]]) -> None:
    table = pa.Table.from_pylist(
        [
            {
                "k": k,
                "v": v,
                "d": d,
                "_ms_partition": 0,
                "_ms_offset": lo + i,
                "_ms_tombstone": False,
            }
            for i, (k, v, d) in enumerate(rows)
        ],
        schema=spec.arrow_schema(system_columns=True),
    )
    commit_staged(
        cat.store,
        cat.deep,
        "t",
        stage_rows(cat.deep, spec, table),
        {0: (lo, lo + len(rows))},
        {0: 0},
    )


def _race(tmp_path: Path, mode: str, second_sealer: type[Sealer]) -> tuple[dict[str, Any], Any]:
    CACHE.clear()
    cat = Catalog.open(home=tmp_path)
    spec = TableSpec.parse(
        {
            "name": "t",
            "schema": {"k": "string", "v": "string", "d": "boolean"},
            "mode": mode,
            "primary_key": ["k"],
            "delete_column": "d",
        }
    )
    cat.create_table(spec)
    _commit(cat, spec, 0, N)
    in_build, release = threading.Event(), threading.Event()

    def hold_n(point: str, partition: int) -> None:
        if point == "before_upload" and not in_build.is_set():
            in_build.set()
            assert release.wait(30)

    slow = Sealer(cat, "t", max_failures=10)

    at_sealer(slow, hook=hold_n)
    errors: list[BaseException] = []

    def seal_n() -> None:
        try:
            slow.seal_partition(0, force=True)
        except Exception as exc:  # a discarded seal is retried below
            errors.append(exc)

    t = threading.Thread(target=seal_n)
    t.start()
    assert in_build.wait(30)
    # Pauseless: N+1 is consumed and committed while N is COMMITTING...
    _commit(cat, spec, len(N), N_PLUS_1)
    # ...and a second sealer tries to seal it.
    second_sealer(cat, "t").seal_partition(0, force=True)
    release.set()
    t.join(30)
    for _ in range(3):  # retries, as the background loop would do them
        if not slow.pending_run(0):
            break
        try:
            slow.seal_partition(0, force=True)
        except Exception as exc:
            errors.append(exc)
    assert not slow.pending_run(0), "everything is sealed in the end"
    rows = cat.read_table("t").to_pylist()
    all_rows = [
        {"k": k, "v": v, "d": d, "_ms_partition": 0, "_ms_offset": i, "_ms_tombstone": False}
        for i, (k, v, d) in enumerate(N + N_PLUS_1)
    ]
    assert canonical(model_rows(spec, all_rows)) == canonical(
        [{"k": k, "v": v, "d": False} for k, v in EXPECTED[mode].items()]
    ), "the expected table is the sequential model's"
    return {r["k"]: r["v"] for r in rows}, errors


@pytest.mark.parametrize("mode", ["upsert", "dedup"])
def test_segment_n_plus_1_waits_for_n_and_the_table_equals_the_model(
    tmp_path: Path, mode: str
) -> None:
    table, errors = _race(tmp_path, mode, Sealer)
    assert table == EXPECTED[mode]
    assert errors == [], "N sealed at the first attempt: nothing raced it"


@pytest.mark.parametrize("mode", ["upsert", "dedup"])
def test_control_sealing_n_plus_1_before_n_loses_the_newer_rows(tmp_path: Path, mode: str) -> None:
    table, _ = _race(tmp_path, mode, UnorderedSealer)
    assert table != EXPECTED[mode], "without the ordering guard N's rows delete N+1's"
    assert table.get("k1") is None, "k1 = Y was deleted by N's older delete"
