"""``resolve`` of an upsert (or delete-free dedup) table without a comparison column, keyed by
one dense integer column, keeps each key's winner in an array over the keys' span instead of
a hash aggregation: the same rows in the same order (by key) as the hash path, over random
keys near the ends of their type, partitions, offsets, deletes and arrival orders."""

from __future__ import annotations

import os
import random

import pyarrow as pa
import pytest

from millstream.core import merge
from millstream.core.engines import engine_for
from millstream.spec import TableSpec


def _spec(mode: str, key_type: str) -> TableSpec:
    return TableSpec.parse(
        {
            "name": "t",
            "schema": {"k": key_type, "v": "long", "d": "boolean"},
            "primary_key": ["k"],
            "mode": mode,
            "delete_column": "d",
        }
    )


#: (the spec's type, the Arrow type the rows carry, the lowest key a case may start at)
TYPES = [
    ("long", pa.int64(), [-(2**63), -7, 2**63 - 200]),
    ("int", pa.int32(), [-(2**31), 0, 2**31 - 200]),
]


def _rows(rnd: random.Random, spec: TableSpec, arrow_type: pa.DataType, low: int) -> pa.Table:
    """Up to 120 rows of keys in [low, low + rows) over 3 partitions (dense: they span no more
    than the rows), each partition's offsets growing by 1-3 from a random start, in a random
    arrival order; deletes only for upsert."""
    offsets = {p: rnd.randrange(0, 10**9) for p in range(3)}
    out = []
    n = rnd.randint(1, 120)
    for _ in range(n):
        p = rnd.randrange(3)
        deleting = spec.mode == "upsert" and rnd.random() < 0.2
        out.append(
            {
                "k": low + rnd.randrange(n),
                "v": rnd.randrange(1000),
                "d": deleting and rnd.random() < 0.5,
                "_ms_partition": p,
                "_ms_offset": offsets[p],
                "_ms_tombstone": deleting and rnd.random() < 0.5,
            }
        )
        offsets[p] += rnd.randint(1, 3)
    rnd.shuffle(out)
    schema = spec.arrow_schema(system_columns=True)
    return pa.Table.from_pylist(out, schema=schema).cast(schema.set(0, pa.field("k", arrow_type)))


@pytest.mark.parametrize("mode", ["upsert", "dedup"])
@pytest.mark.parametrize(("key_type", "arrow_type", "lows"), TYPES, ids=[t[0] for t in TYPES])
@pytest.mark.parametrize("round_", range(20))
def test_dense_integer_keys_resolve_like_the_hash_aggregation(
    round_: int, mode: str, key_type: str, arrow_type: pa.DataType, lows: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    seed = int(os.environ.get("MILLSTREAM_TEST_SEED", random.randrange(1 << 30))) + round_
    try:
        rnd = random.Random(seed)
        spec = _spec(mode, key_type)
        rows = _rows(rnd, spec, arrow_type, rnd.choice(lows))
        # the array path is taken
        assert merge.dense_places(rows.column("k"), merge.MERGE_DENSE_SPAN) is not None
        got = engine_for(spec).resolve(rows)
        monkeypatch.setattr(merge, "MERGE_DENSE_SPAN", 0)  # no key is dense: the hash path
        expected = engine_for(spec).resolve(rows)
        monkeypatch.undo()
        assert got.to_pylist() == expected.to_pylist()
        assert got.column("k").to_pylist() == sorted(got.column("k").to_pylist())
    except BaseException:
        print(f"re-run with MILLSTREAM_TEST_SEED={seed - round_}")
        raise


def test_a_uint64_key_near_the_top_of_its_type_is_placed_without_overflow() -> None:
    column = pa.array([2**64 - 1, 2**64 - 3, 2**64 - 2, 2**64 - 3], pa.uint64())
    found = merge.dense_places(column)
    assert found is not None
    places, span = found
    assert span == 3 and places.tolist() == [2, 0, 1, 0]


def test_keys_spread_wider_than_the_rows_are_not_dense() -> None:
    assert merge.dense_places(pa.array([0, 10**6])) is None
    assert merge.dense_places(pa.array([1, None, 2])) is None
    assert merge.dense_places(pa.array(["a", "b"])) is None


def test_the_merge_takes_the_array_only_for_keys_spanning_at_most_twice_the_rows() -> None:
    """The merge's array holds an int64 per value of the span: keys spread wider than twice
    the rows (still dense enough for the bitmap that proves keys distinct) are hashed, so a
    large read never allocates more than 16 bytes a row for it."""
    keys = pa.array([0, 5, 10, 15])  # a span of 16 values for 4 rows
    assert merge.dense_places(keys) is not None
    assert merge.dense_places(keys, merge.MERGE_DENSE_SPAN) is None
    assert merge.dense_places(pa.array([0, 3, 5, 7]), merge.MERGE_DENSE_SPAN) is not None
