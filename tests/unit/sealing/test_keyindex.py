"""The key index against a brute-force model: after any sequence of seals, its live rows are
exactly the rows not superseded, and ``superseded`` names exactly the rows a newer run
supersedes, across several sorted runs (big runs first, as in a long-lived partition)."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest

from millstream.sealing.keyindex import KeyIndex, Reflects
from millstream.spec import OFFSET_COL, TableSpec

SPECS = {
    "upsert": {"mode": "upsert", "primary_key": ["k"]},
    "upsert_cmp": {"mode": "upsert", "primary_key": ["k"], "comparison_column": "c"},
    "dedup": {"mode": "dedup", "primary_key": ["k"], "delete_column": "d"},
}
NO_REFLECTS = Reflects((), ())


def _rows(spec: TableSpec, rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=spec.arrow_schema(system_columns=True))


def _later(new: dict[str, Any], old: dict[str, Any]) -> bool:
    """(c nulls first, offset) order of the upsert_cmp model: a sealed row without a value is a
    delete whose key had none before it."""
    if new["c"] is None or old["c"] is None:
        if new["c"] is None and old["c"] is None:
            return bool(new["_ms_offset"] > old["_ms_offset"])
        return old["c"] is None
    if new["c"] != old["c"]:
        return bool(new["c"] > old["c"])
    return bool(new["_ms_offset"] > old["_ms_offset"])


def _superseded(mode: str, live: list[dict[str, Any]], run: list[dict[str, Any]]) -> set[int]:
    out = set()
    for old in live:
        for new in run:
            if new["k"] != old["k"]:
                continue
            if (
                mode == "upsert"
                or (mode == "upsert_cmp" and _later(new, old))
                or (mode == "dedup" and new["d"])
            ):
                out.add(old["_ms_offset"])
    return out


def _highest(live: list[dict[str, Any]], run: list[dict[str, Any]]) -> dict[Any, Any]:
    """Per key of ``run``, the highest comparison value of the live rows of that key."""
    keys = {r["k"] for r in run}
    out: dict[Any, Any] = {}
    for r in live:
        if r["k"] in keys and r["c"] is not None:
            out[r["k"]] = max(out.get(r["k"], r["c"]), r["c"])
    return out


def _floor(index: KeyIndex, run: pa.Table) -> dict[Any, Any]:
    floor = index.comparison_floor(run)
    assert floor is not None
    pairs = zip(floor.column("k").to_pylist(), floor.column("c").to_pylist(), strict=True)
    out = dict(pairs)
    assert len(out) == floor.num_rows, "one floor row per key"
    return out


@pytest.mark.parametrize("mode", sorted(SPECS))
@pytest.mark.parametrize("seed", range(6))
def test_superseded_rows_and_live_rows_match_a_brute_force_model(mode: str, seed: int) -> None:
    rnd = random.Random(seed)
    spec = TableSpec.parse(
        {
            "name": "t",
            "schema": {"k": "string", "c": "long", "d": "boolean"},
            **SPECS[mode],
        }
    )
    index = KeyIndex.from_rows(spec, 0, _rows(spec, []), NO_REFLECTS)
    live: list[dict[str, Any]] = []
    offset = 0
    max_runs = 0
    merged = 0
    for size in [800, 250, 80, 30, 10, 400, 5, 120, 60, 3, 900, 40]:
        run = []
        for _ in range(size):
            c = rnd.choice([None, rnd.randrange(20)])
            run.append(
                {
                    "k": rnd.choice([None, *(f"k{i}" for i in range(300))]),
                    "c": c,
                    "d": rnd.random() < 0.2,
                    "_ms_partition": 0,
                    "_ms_offset": offset,
                    # only a delete may lack the comparison value
                    "_ms_tombstone": mode == "upsert_cmp" and c is None,
                }
            )
            offset += 1
        table = _rows(spec, run)
        dropped = index.superseded(table)
        got = set(index.offsets(dropped).to_pylist())
        expected = _superseded(mode, live, run)
        assert got == expected, f"seed={seed} mode={mode} run of {size}"
        if mode == "upsert_cmp":
            assert _floor(index, table) == _highest(live, run), f"seed={seed} run of {size}"
        index = index.updated(dropped, table, NO_REFLECTS)
        max_runs = max(max_runs, len(index.runs))
        if rnd.random() < 0.5:  # the sealer merges runs after a seal; sometimes later
            index = index.compacted()
            merged += 1
        live = [r for r in live if r["_ms_offset"] not in expected] + run
        assert sorted(index.data.column(OFFSET_COL).to_pylist()) == sorted(
            r["_ms_offset"] for r in live
        ), f"seed={seed} mode={mode}"
        assert index.num_rows == len(live)
    assert max_runs >= 3, "the sequence must exercise several sorted runs"
    assert merged, "and merges of runs"
