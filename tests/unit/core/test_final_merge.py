"""``resolve_one_per_partition`` is ``resolve`` for rows holding one row per (key, partition):
the same rows in the same order, over random keys (two key columns, nulls among them),
partitions, deletes and row orders; the same rows, in the order read, for a single integer key
whose keys may or may not all be distinct; and it refuses (None) rows where a key repeats
within a partition, since only offsets can order those."""

from __future__ import annotations

import os
import random
from typing import Any

import pyarrow as pa
import pytest

from millstream.core.engines import engine_for
from millstream.core.final import keys_distinct, resolve_one_per_partition
from millstream.spec import TableSpec

SPEC = TableSpec.parse(
    {
        "name": "t",
        "schema": {"a": "long", "b": "string", "v": "long", "d": "boolean"},
        "primary_key": ["a", "b"],
        "mode": "upsert",
        "delete_column": "d",
    }
)


def _rows(rnd: random.Random, n_keys: int, repeat_in_partition: bool) -> pa.Table:
    keys = [
        (rnd.choice([None, *range(4)]), rnd.choice([None, "x", "y", "z"])) for _ in range(n_keys)
    ]
    rows = []
    for a, b in dict.fromkeys(keys):
        for p in rnd.sample(range(4), rnd.randint(1, 4)):
            rows.append((a, b, p))
    if repeat_in_partition and rows:
        rows.append(rnd.choice(rows))
    return _table(rnd, SPEC, [({"a": a, "b": b}, p) for a, b, p in rows])


def _table(rnd: random.Random, spec: TableSpec, rows: list[tuple[dict[str, Any], int]]) -> pa.Table:
    """``rows`` (key columns, partition) in a random order, each with a random value, delete
    flag and tombstone, at the next offset of its partition."""
    rnd.shuffle(rows)
    offsets = {p: 0 for p in range(4)}
    out = []
    for key, p in rows:
        out.append(
            {
                **key,
                "v": rnd.randrange(100),
                "d": rnd.choice([None, False, False, True]),
                "_ms_partition": p,
                "_ms_offset": offsets[p],
                "_ms_tombstone": rnd.random() < 0.15,
            }
        )
        offsets[p] += 1
    return pa.Table.from_pylist(out, schema=spec.arrow_schema(system_columns=True))


def _in_two_chunks(rows: pa.Table) -> pa.Table:
    """The same rows as a table of two chunks, as a read of two files gives them."""
    return pa.concat_tables([rows.slice(0, rows.num_rows // 2), rows.slice(rows.num_rows // 2)])


@pytest.mark.parametrize("round_", range(40))
def test_one_row_per_key_and_partition_resolves_like_the_merge(round_: int) -> None:
    seed = int(os.environ.get("MILLSTREAM_TEST_SEED", random.randrange(1 << 30))) + round_
    try:
        rnd = random.Random(seed)
        rows = _rows(rnd, rnd.randint(0, 30), False)
        chunked = _in_two_chunks(rows)
        got = resolve_one_per_partition(SPEC, chunked)
        assert got is not None
        assert got.to_pylist() == engine_for(SPEC).resolve(rows).to_pylist()
        lean = resolve_one_per_partition(SPEC, chunked.drop_columns(["_ms_offset"]))
        assert lean is not None
        assert (
            lean.to_pylist()
            == engine_for(SPEC).resolve(rows).drop_columns(["_ms_offset"]).to_pylist()
        )
    except BaseException:
        print(f"re-run with MILLSTREAM_TEST_SEED={seed - round_}")
        raise


ONE_KEY = TableSpec.parse(
    {
        "name": "t",
        "schema": {"k": "long", "v": "long", "d": "boolean"},
        "primary_key": ["k"],
        "mode": "upsert",
        "delete_column": "d",
    }
)


def _one_key_rows(rnd: random.Random, n_keys: int, spread: bool, dense: bool) -> pa.Table:
    """One row per (key, partition); each key in one partition unless ``spread``. ``dense``
    keys lie close together (proven distinct by a bitmap), others far apart (by a sort);
    either near the ends of a long."""
    rows: list[tuple[dict[str, Any], int]] = []
    step = 1 if dense else 10**15
    low = rnd.choice([-(2**63), -50, 2**63 - 2 * n_keys * step])
    for k in rnd.sample(range(low, low + 2 * n_keys * step, step), n_keys):
        for p in rnd.sample(range(4), rnd.randint(1, 4) if spread else 1):
            rows.append(({"k": k}, p))
    return _table(rnd, ONE_KEY, rows)


@pytest.mark.parametrize("dense", [True, False], ids=["dense_keys", "sparse_keys"])
@pytest.mark.parametrize("spread", [False, True], ids=["one_partition_a_key", "spread"])
@pytest.mark.parametrize("round_", range(15))
def test_a_single_integer_key_resolves_to_the_merges_rows(
    round_: int, spread: bool, dense: bool
) -> None:
    """Keys that each occur once come back as read (nothing to merge, nothing reordered); a key
    in several partitions still resolves to its row in the highest one."""
    seed = int(os.environ.get("MILLSTREAM_TEST_SEED", random.randrange(1 << 30))) + round_
    try:
        rnd = random.Random(seed)
        rows = _one_key_rows(rnd, rnd.randint(0, 40), spread, dense)
        chunked = _in_two_chunks(rows)
        got = resolve_one_per_partition(ONE_KEY, chunked.drop_columns(["_ms_offset"]))
        assert got is not None
        expected = engine_for(ONE_KEY).resolve(rows).drop_columns(["_ms_offset"])
        assert got.sort_by("k").to_pylist() == expected.to_pylist()
        if not spread:  # every row its key's winner: the deletes dropped, the order kept
            read = rows.drop_columns(["_ms_offset"]).to_pylist()
            kept = [r for r in read if not r["_ms_tombstone"] and not r["d"]]
            assert got.to_pylist() == kept
    except BaseException:
        print(f"re-run with MILLSTREAM_TEST_SEED={seed - round_}")
        raise


@pytest.mark.parametrize("round_", range(10))
def test_a_key_twice_in_one_partition_is_left_to_the_merge(round_: int) -> None:
    seed = int(os.environ.get("MILLSTREAM_TEST_SEED", random.randrange(1 << 30))) + round_
    try:
        rnd = random.Random(seed)
        rows = _rows(rnd, rnd.randint(1, 30), True)
        assert resolve_one_per_partition(SPEC, rows) is None
    except BaseException:
        print(f"re-run with MILLSTREAM_TEST_SEED={seed - round_}")
        raise


@pytest.mark.parametrize(
    ("arrow_type", "values", "distinct"),
    [
        (pa.int8(), list(range(-128, 128)), True),  # the whole type: span = count
        (pa.int8(), [*range(-128, 127), -128], False),
        (pa.int64(), [-(2**63), -(2**63) + 1, 2**63 - 1], True),  # sorted, not a bitmap
        (pa.int64(), [2**63 - 3, 2**63 - 1, 2**63 - 2, 2**63 - 1], False),
        (pa.uint64(), [2**64 - 1, 2**64 - 2, 2**64 - 3], True),
        (pa.uint64(), [2**64 - 1, 2**64 - 2, 2**64 - 1], False),
        (pa.int32(), [5, 7, 9, 11, 5 + 8 * 4 - 1], True),  # a span of 8 per key: the bitmap
        (pa.int32(), [5, 7, 9, 11, 7], False),
        (pa.int64(), [3, None, 4], False),  # a null key: cannot tell
        (pa.int64(), [], True),
        (pa.int64(), [42], True),
    ],
)
def test_keys_distinct_at_the_ends_of_each_integer_type(
    arrow_type: pa.DataType, values: list[int | None], distinct: bool
) -> None:
    spec = ONE_KEY
    rows = pa.table({"k": pa.array(values, arrow_type)})
    assert keys_distinct(spec, rows) is distinct


STRING_KEY = TableSpec.parse(
    {
        "name": "t",
        "schema": {"k": "string", "v": "long", "d": "boolean"},
        "primary_key": ["k"],
        "mode": "upsert",
        "delete_column": "d",
    }
)
TWO_COLUMNS = TableSpec.parse(
    {
        "name": "t",
        "schema": {"a": "long", "b": "string", "v": "long", "d": "boolean"},
        "primary_key": ["a", "b"],
        "mode": "upsert",
        "delete_column": "d",
    }
)


@pytest.mark.parametrize("shape", ["string", "two_columns"])
@pytest.mark.parametrize("spread", [False, True], ids=["one_partition_a_key", "spread"])
@pytest.mark.parametrize("round_", range(15))
def test_a_string_or_composite_key_resolves_to_the_merges_rows(
    round_: int, spread: bool, shape: str
) -> None:
    """The same for keys that are hashed to be counted: a string key, a key of two columns
    (without nulls; two keys may share a column's value, and differ only in the other)."""
    seed = int(os.environ.get("MILLSTREAM_TEST_SEED", random.randrange(1 << 30))) + round_
    try:
        rnd = random.Random(seed)
        spec = STRING_KEY if shape == "string" else TWO_COLUMNS
        pairs = rnd.sample([(a, b) for a in range(6) for b in "uvwxyz"], rnd.randint(0, 30))
        rows: list[tuple[dict[str, Any], int]] = []
        for a, b in pairs:
            key: dict[str, Any] = {"k": f"{b}-{a}"} if shape == "string" else {"a": a, "b": b}
            for p in rnd.sample(range(4), rnd.randint(1, 4) if spread else 1):
                rows.append((key, p))
        table = _table(rnd, spec, rows)
        chunked = _in_two_chunks(table).drop_columns(["_ms_offset"])
        got = resolve_one_per_partition(spec, chunked)
        assert got is not None
        expected = engine_for(spec).resolve(table).drop_columns(["_ms_offset"])
        order = [(k, "ascending") for k in spec.primary_key]
        assert got.sort_by(order).to_pylist() == expected.to_pylist()
        if not spread:
            read = table.drop_columns(["_ms_offset"]).to_pylist()
            assert got.to_pylist() == [r for r in read if not r["_ms_tombstone"] and not r["d"]]
    except BaseException:
        print(f"re-run with MILLSTREAM_TEST_SEED={seed - round_}")
        raise


def test_keys_of_several_columns_with_a_null_are_left_to_the_sort() -> None:
    rows = pa.table({"a": [1, 1], "b": pa.array([None, "x"], pa.string())})
    assert keys_distinct(TWO_COLUMNS, rows) is False
    assert keys_distinct(TWO_COLUMNS, rows.slice(1)) is True
