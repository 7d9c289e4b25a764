"""Sealing compacts a run of one partition's consecutive segments; the table must not change.

For every engine and random rows (duplicates, out-of-order comparison values, nulls,
tombstones, delete-column rows), replacing any contiguous run of any partition by
``compact(run)`` gives the same merged table as the original rows and as the sequential model.
With a comparison column, ``compact`` gets the floor the sealer passes: per key, the highest
comparison value of the partition's rows already sealed before the run.
"""

from __future__ import annotations

import itertools
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from millstream.core.engines import engine_for
from millstream.reference.model import canonical, model_rows
from millstream.spec import TableSpec

BASE = datetime(2026, 1, 1, tzinfo=UTC)
MODES = ["append", "dedup", "upsert", "partial"]


def _spec(rnd: random.Random, mode: str) -> TableSpec:
    kw: dict[str, Any] = {
        "name": "t",
        "schema": {"k": "long", "v": "long", "s": "string", "ts": "timestamp", "d": "boolean"},
        "mode": mode,
    }
    if mode != "append":
        kw["primary_key"] = ["k"]
        if rnd.random() < 0.5:
            kw["comparison_column"] = "ts"
        if rnd.random() < 0.5:
            kw["delete_column"] = "d"
    if mode == "dedup" and rnd.random() < 0.3:
        kw.update(dedup_ttl="10s", time_column="ts")
    if mode == "partial":
        kw["partial"] = {
            "v": rnd.choice(["overwrite", "ignore_null", "max", "min", "sum"]),
            "s": rnd.choice(["append", "overwrite", "ignore_null"]),
        }
    return TableSpec.parse(kw)


def _rows(rnd: random.Random, partitions: int) -> list[dict[str, Any]]:
    """Random rows; only deletes may lack the comparison value (a Kafka tombstone has none),
    and comparison values arrive out of order, so tombstones meet re-inserts and late older
    records."""
    rows = []
    for p in range(partitions):
        for o in range(rnd.randint(0, 25)):
            tombstone = rnd.random() < 0.15
            d = rnd.choice([None, False, False, True])
            ts = BASE + timedelta(seconds=rnd.randint(0, 30))
            rows.append(
                {
                    "k": rnd.choice([None, 0, 1, 2, 3]),
                    "v": None if tombstone else rnd.choice([None, rnd.randint(0, 9)]),
                    "s": None if tombstone else rnd.choice([None, "a", "b"]),
                    "ts": None if tombstone or (d and rnd.random() < 0.5) else ts,
                    "d": None if tombstone else d,
                    "_ms_partition": p,
                    "_ms_offset": o * 3,
                    "_ms_tombstone": tombstone,
                }
            )
    return rows


def _floor(spec: TableSpec, sealed: list[dict[str, Any]]) -> pa.Table | None:
    """Per key, the highest comparison value of ``sealed`` (the partition's earlier rows)."""
    column = spec.comparison_column
    if column is None:
        return None
    highest: dict[Any, Any] = {}
    for r in sealed:
        v = r[column]
        if v is not None and (r["k"] not in highest or v > highest[r["k"]]):
            highest[r["k"]] = v
    schema = spec.arrow_schema()
    return pa.table(
        {"k": list(highest), column: list(highest.values())},
        schema=pa.schema([schema.field("k"), schema.field(column)]),
    )


@settings(max_examples=300, deadline=None)
@given(mode=st.sampled_from(MODES), rnd=st.randoms(use_true_random=False))
def test_sealing_any_run_of_a_partition_does_not_change_the_table(
    mode: str, rnd: random.Random
) -> None:
    spec = _spec(rnd, mode)
    partitions = rnd.randint(1, 3)
    rows = _rows(rnd, partitions)
    schema = spec.arrow_schema(system_columns=True)
    expected = canonical(model_rows(spec, rows))
    table = pa.Table.from_pylist(rows, schema=schema)
    assert (
        canonical(engine_for(spec).resolve(table).select(list(spec.columns)).to_pylist())
        == expected
    )

    # Seal several consecutive runs, one after the other, in each partition (as the sealer does).
    pieces: list[pa.Table] = []
    for p in range(partitions):
        mine = sorted((r for r in rows if r["_ms_partition"] == p), key=lambda r: r["_ms_offset"])
        cuts = sorted(rnd.sample(range(len(mine) + 1), k=min(len(mine) + 1, rnd.randint(1, 4))))
        bounds = [0, *cuts, len(mine)]
        stored: list[dict[str, Any]] = []  # the partition's rows as sealed so far
        for lo, hi in itertools.pairwise(bounds):
            run = pa.Table.from_pylist(mine[lo:hi], schema=schema)
            if rnd.random() < 0.8:
                sealed = engine_for(spec).compact(run, floor=_floor(spec, stored)).cast(schema)
            else:
                sealed = run
            pieces.append(sealed.select(schema.names).cast(schema))
            stored += sealed.to_pylist()
    merged = engine_for(spec).resolve(pa.concat_tables(pieces))
    assert canonical(merged.select(list(spec.columns)).to_pylist()) == expected
