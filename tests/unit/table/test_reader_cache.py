"""A reader with a cache (``Catalog.open(read_cache_mb=...)``) reads what a new reader without
one reads: the same table, partitions and filters, through seals, compactions and micro-batch
files that hold several partitions. The cache keys name everything a cached table is computed
from: the partition (a merged partition is kept under a key of its sealed files, and with no
sealed file yet those name nothing) and the read's filter (a filtered read keeps no sealed rows,
else an unfiltered read would be served them)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from millstream.catalog import Catalog
from millstream.reference.model import canonical, model_rows
from millstream.sealing.compaction import CompactionPolicy
from millstream.sealing.keyindex import IndexCache
from millstream.sealing.sealer import Sealer
from millstream.spec import TableSpec
from millstream.table.read import Condition
from millstream.table.writer import commit_staged, stage_rows

SCHEMA = {"k": "long", "v": "long", "s": "string", "d": "boolean"}
ENGINES: dict[str, dict[str, Any]] = {
    "append": {"mode": "append"},
    "dedup": {"mode": "dedup", "primary_key": ["k"], "delete_column": "d"},
    "upsert": {"mode": "upsert", "primary_key": ["k"], "delete_column": "d"},
    "upsert-cmp": {
        "mode": "upsert",
        "primary_key": ["k"],
        "delete_column": "d",
        "comparison_column": "v",
    },
    "partial": {
        "mode": "partial",
        "primary_key": ["k"],
        "delete_column": "d",
        "partial": {"v": "sum", "s": "append"},
    },
}
PARTITIONS = 3


class Table:
    """Table ``t`` under ``home``, written the way a writer writes it: each commit one staged
    file holding the rows of one or more partitions."""

    def __init__(self, home: Path, engine: str, partitioned_by_key: bool) -> None:
        self.cat = Catalog.open(home=home)
        extra = {"partitioned_by_key": True} if partitioned_by_key else {}
        self.spec = TableSpec.parse({"name": "t", "schema": SCHEMA, **ENGINES[engine], **extra})
        self.cat.create_table(self.spec)
        self.pos: dict[int, int] = {}
        self.rows: list[dict[str, Any]] = []
        self.sealer = Sealer(
            self.cat, "t", index_cache=IndexCache(), compaction=CompactionPolicy(min_segments=2)
        )

    def commit(self, batch: dict[int, list[tuple[int, int | None, str | None, bool]]]) -> None:
        rows: list[dict[str, Any]] = []
        ranges: dict[int, tuple[int, int]] = {}
        for p, values in sorted(batch.items()):
            lo = self.pos.get(p, 0)
            for o, (k, v, s, d) in enumerate(values, start=lo):
                if v is None and not d and self.spec.comparison_column:
                    v = 0  # a record that is not a delete carries its comparison value
                rows.append(
                    {
                        "k": k,
                        "v": v,
                        "s": s,
                        "d": d,
                        "_ms_partition": p,
                        "_ms_offset": o,
                        "_ms_tombstone": False,
                    }
                )
            ranges[p] = (lo, lo + len(values))
            self.pos[p] = lo + len(values)
        schema = self.spec.arrow_schema(system_columns=True)
        staged = stage_rows(self.cat.deep, self.spec, pa.Table.from_pylist(rows, schema=schema))
        commit_staged(self.cat.store, self.cat.deep, "t", staged, ranges, dict.fromkeys(ranges, 0))
        self.rows += rows

    def expected(self) -> list[Any]:
        return canonical(model_rows(self.spec, self.rows))

    def close(self) -> None:
        self.cat.close()


@pytest.fixture
def home() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="millstream-cache-") as d:
        yield Path(d)


def test_a_cached_reader_keeps_partitions_of_one_shared_file_apart(home: Path) -> None:
    """Issue 35, point 4: one staged file holding partitions 0 and 1 with equal ranges and no
    sealed segment: a cached reader's later reads returned one partition's rows twice and the
    other's none."""
    t = Table(home, "upsert", partitioned_by_key=True)
    try:
        t.commit({0: [(0, 1, "a", False), (2, 2, "b", False)], 1: [(1, 3, "c", False)] * 2})
        with Catalog.open(home=home, read_cache_mb=64) as cached:
            for _ in range(3):
                assert canonical(cached.read_table("t").to_pylist()) == t.expected()
            t.commit({0: [(4, 5, "d", False)], 1: [(3, 6, "e", False)]})
            for _ in range(3):
                assert canonical(cached.read_table("t").to_pylist()) == t.expected()
                for p in (0, 1):
                    got = cached.read_table("t", partitions=[p]).to_pylist()
                    assert {r["k"] % 2 for r in got} == {p}, (p, got)
    finally:
        t.close()


def test_a_filtered_cached_read_is_not_served_to_an_unfiltered_read(home: Path) -> None:
    """A cached reader keeps a partition's sealed rows for its next reads; rows read under a
    filter are not the partition's sealed rows, and an unfiltered read after a filtered one
    (or a filtered read under another filter) must see every row."""
    t = Table(home, "upsert", partitioned_by_key=True)
    try:
        t.commit({0: [(k * 2, k, None, False) for k in range(6)]})
        assert t.sealer.seal_partition(0, force=True) is not None
        t.commit({0: [(2, 20, "x", False)]})  # newer rows over final sealed ones
        with Catalog.open(home=home, read_cache_mb=64) as cached:
            few = cached.read_table("t", conditions=[("k", "<", 4)]).to_pylist()
            assert sorted(r["k"] for r in few) == [0, 2]
            other = cached.read_table("t", conditions=[("k", ">=", 4)]).to_pylist()
            assert sorted(r["k"] for r in other) == [4, 6, 8, 10]
            assert canonical(cached.read_table("t").to_pylist()) == t.expected()
            assert len(t.expected()) == 6
    finally:
        t.close()


# ---------------------------------------------------------------- randomized: cached == uncached


@st.composite
def _row(draw: st.DrawFn) -> tuple[int, int | None, str | None, bool]:
    k = draw(st.integers(0, 5))
    v = draw(st.one_of(st.none(), st.integers(0, 9)))
    s = draw(st.sampled_from([None, "a", "b"]))
    d = draw(st.integers(0, 9)) == 0
    return k, v, s, d


COMMIT = st.dictionaries(
    st.integers(0, PARTITIONS - 1), st.lists(_row(), min_size=1, max_size=4), min_size=1
)
OP = st.one_of(
    st.tuples(st.just("commit"), COMMIT),
    st.tuples(st.just("commit-equal"), st.lists(_row(), min_size=1, max_size=4)),
    st.tuples(st.just("seal"), st.integers(0, PARTITIONS - 1)),
    st.tuples(st.just("compact"), st.integers(0, PARTITIONS - 1)),
)


def _conditions(engine: str) -> st.SearchStrategy[list[Condition]]:
    on_key: st.SearchStrategy[Condition] = st.one_of(
        st.tuples(st.just("k"), st.sampled_from(["==", "<", ">="]), st.integers(0, 15)),
        st.tuples(
            st.just("k"),
            st.just("in"),
            st.lists(st.integers(0, 15), max_size=4).map(tuple),
        ),
    )
    if engine != "append":
        return st.lists(on_key, max_size=2)
    on_any: st.SearchStrategy[Condition] = st.one_of(
        on_key,
        st.tuples(
            st.just("v"), st.sampled_from(["<", ">=", "is_null", "not_null"]), st.integers(0, 9)
        ),
        st.tuples(st.just("s"), st.sampled_from(["==", "is_null"]), st.sampled_from(["a", "b"])),
    )
    return st.lists(on_any, max_size=2)


@st.composite
def _scenario(draw: st.DrawFn) -> dict[str, Any]:
    engine = draw(st.sampled_from(sorted(ENGINES)))
    by_key = engine != "append" and draw(st.booleans())
    narrowable = engine == "append" or by_key
    steps = []
    for _ in range(draw(st.integers(1, 12))):
        op = draw(OP)
        reads = []
        for _ in range(draw(st.integers(1, 3))):
            parts = (
                draw(st.one_of(st.none(), st.sets(st.integers(0, PARTITIONS - 1), max_size=2)))
                if narrowable
                else None
            )
            reads.append((parts, draw(_conditions(engine))))
        steps.append((op, reads))
    cache_mb = draw(st.sampled_from([0.002, 0.05, 64.0]))
    return {"engine": engine, "by_key": by_key, "steps": steps, "cache_mb": cache_mb}


@settings(
    max_examples=40,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(_scenario())
def test_a_cached_reader_reads_what_an_uncached_reader_reads(scenario: dict[str, Any]) -> None:
    """Random tables (every mode, partitioned by key or not), commits of one file holding one
    or several partitions (equal ranges too), seals, compactions, and reads of random
    partitions and filters: a long-lived cached reader (small caches evict) returns exactly
    what a new reader without a cache returns. A failure prints its example and a
    ``@reproduce_failure`` blob to re-run it."""
    engine, by_key = scenario["engine"], scenario["by_key"]
    with tempfile.TemporaryDirectory(prefix="millstream-cache-") as d:
        home = Path(d)
        t = Table(home, engine, by_key)

        # The key of a partitioned_by_key table lives in one partition: k = n * P + p.
        def key(n: int, p: int) -> int:
            return n * PARTITIONS + p if by_key else n

        cached = Catalog.open(home=home, read_cache_mb=scenario["cache_mb"])
        plain = Catalog.open(home=home)
        try:
            for (kind, arg), reads in scenario["steps"]:
                if kind == "commit":
                    t.commit(
                        {
                            p: [(key(n, p), v, s, dl) for n, v, s, dl in rows]
                            for p, rows in arg.items()
                        }
                    )
                elif kind == "commit-equal":  # partitions 0 and 1 in one file, same ranges
                    equal = t.pos.get(0, 0) == t.pos.get(1, 0)
                    parts_of = (0, 1) if equal else (0,)
                    t.commit({p: [(key(n, p), v, s, dl) for n, v, s, dl in arg] for p in parts_of})
                elif kind == "seal":
                    t.sealer.seal_partition(arg, force=True)
                else:
                    t.sealer.compact_partition(arg)
                for parts, conditions in reads:
                    want = plain.read_table("t", partitions=parts, conditions=conditions)
                    got = cached.read_table("t", partitions=parts, conditions=conditions)
                    assert canonical(got.to_pylist()) == canonical(want.to_pylist()), (
                        parts,
                        conditions,
                    )
                assert canonical(cached.read_table("t").to_pylist()) == t.expected()
        finally:
            cached.close()
            plain.close()
            t.close()
