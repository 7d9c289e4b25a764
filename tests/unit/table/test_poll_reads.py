"""A cached reader's poll of an upsert table (:mod:`millstream.table.poll`) returns what a new
reader without a cache returns, at every version: through commits of updates, deletes (with and
without a comparison value) and keys made again after their delete, seals, compactions,
rollbacks with different rows committed in their place, and schema changes, whether it polls
after every change or after several.

The randomized test draws a seed (Hypothesis) and plays a random history from it; a failure
names the seed, and ``POLL_SEED=<seed> pytest tests/unit/table/test_poll_reads.py`` plays that
history alone."""

from __future__ import annotations

import os
import random
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from millstream.catalog import Catalog
from millstream.reference.model import canonical
from millstream.sealing.compaction import CompactionPolicy
from millstream.sealing.keyindex import IndexCache
from millstream.sealing.sealer import Sealer
from millstream.spec import TableSpec
from millstream.table.writer import commit_staged, stage_rows

PARTITIONS = 3
SPECS: dict[str, dict[str, Any]] = {
    "upsert": {"primary_key": ["k"]},
    "upsert-cmp": {"primary_key": ["k"], "comparison_column": "v"},
    "upsert-cmp-two-keys": {"primary_key": ["k", "j"], "comparison_column": "v"},
}


class Table:
    """Table ``t``: an upsert table written as a writer writes it (one staged file a commit,
    one or more partitions in it), sealed, compacted and rolled back by the production code."""

    def __init__(self, home: Path, kind: str) -> None:
        self.cat = Catalog.open(home=home)
        self.spec = TableSpec.parse(
            {
                "name": "t",
                "schema": {"k": "long", "j": "string", "v": "long", "s": "string", "d": "boolean"},
                "mode": "upsert",
                "delete_column": "d",
                **SPECS[kind],
            }
        )
        self.cat.create_table(self.spec)
        self.pos: dict[int, int] = {}
        self.epochs: dict[int, int] = {}
        self.sealer = Sealer(
            self.cat, "t", index_cache=IndexCache(), compaction=CompactionPolicy(min_segments=2)
        )

    def commit(self, rnd: random.Random) -> None:
        rows: list[dict[str, Any]] = []
        ranges: dict[int, tuple[int, int]] = {}
        for p in rnd.sample(range(PARTITIONS), rnd.randint(1, PARTITIONS)):
            lo = self.pos.get(p, 0)
            n = rnd.randint(1, 5)
            for o in range(lo, lo + n):
                delete = rnd.random() < 0.25
                v = rnd.choice([None, 1, 2, 3, 5, 8]) if delete else rnd.randint(0, 9)
                row = {
                    "k": rnd.randint(0, 6),
                    "j": rnd.choice(["a", "b"]),
                    "v": v,
                    "s": rnd.choice([None, "x", "y"]),
                    "d": delete,
                    "_ms_partition": p,
                    "_ms_offset": o,
                    "_ms_tombstone": False,
                }
                if "extra" in self.spec.columns:
                    row["extra"] = rnd.choice([None, 1, 2])
                rows.append(row)
            ranges[p] = (lo, lo + n)
            self.pos[p] = lo + n
        schema = self.spec.arrow_schema(system_columns=True)
        staged = stage_rows(self.cat.deep, self.spec, pa.Table.from_pylist(rows, schema=schema))
        epochs = {p: self.epochs.get(p, 0) for p in ranges}
        commit_staged(self.cat.store, self.cat.deep, "t", staged, ranges, epochs)

    def rollback(self, rnd: random.Random) -> None:
        p = rnd.randrange(PARTITIONS)
        seqs = [e.seq for e in self.cat.manifest("t").entries if e.partition == p]
        if not seqs:
            return
        plan = self.cat.store.rollback_partition("t", p, rnd.choice(seqs), dry_run=False)
        self.pos[p], self.epochs[p] = plan.new_upper, plan.new_epoch

    def evolve(self) -> None:
        if "extra" in self.spec.columns:
            return
        data = self.spec.model_dump(by_alias=True)
        data["schema"] = {**data["schema"], "extra": "long"}
        info, _ = self.cat.store.evolve_table(TableSpec.parse(data))
        self.spec = info.spec

    def close(self) -> None:
        self.cat.close()


def play(seed: int, home: Path) -> None:
    """A random history of ``seed``; after some of its steps a long-lived cached reader polls
    and its read (with and without system columns) must equal a new uncached reader's."""
    rnd = random.Random(seed)
    kind = rnd.choice(sorted(SPECS))
    t = Table(home, kind)
    cached = Catalog.open(home=home, read_cache_mb=64)
    try:
        for step in range(rnd.randint(4, 24)):
            op = rnd.choices(["commit", "seal", "compact", "rollback", "evolve"], [10, 4, 2, 1, 1])[
                0
            ]
            if op == "commit":
                t.commit(rnd)
            elif op == "seal":
                t.sealer.seal_partition(rnd.randrange(PARTITIONS), force=True)
            elif op == "compact":
                t.sealer.compact_partition(rnd.randrange(PARTITIONS))
            elif op == "rollback":
                t.rollback(rnd)
            else:
                t.evolve()
            if rnd.random() < 0.6:
                system = rnd.random() < 0.3
                with Catalog.open(home=home) as fresh:
                    want = fresh.read_table("t", include_system_columns=system)
                got = cached.read_table("t", include_system_columns=system)
                assert got.schema.names == want.schema.names, (seed, kind, step, op)
                assert canonical(got.to_pylist()) == canonical(want.to_pylist()), (
                    f"seed {seed} ({kind}): the cached poll after step {step} ({op}) differs "
                    f"from an uncached read; re-run with POLL_SEED={seed}"
                )
    finally:
        cached.close()
        t.close()


@pytest.fixture
def home() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="millstream-poll-") as d:
        yield Path(d)


SEEDS = (
    st.just(int(os.environ["POLL_SEED"]))
    if os.environ.get("POLL_SEED")
    else st.integers(0, 2**32 - 1)
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(seed=SEEDS)
def test_a_cached_poll_reads_what_a_new_uncached_reader_reads(seed: int) -> None:
    """Random histories of upsert tables (with and without a comparison column, one and two
    key columns): every cached poll equals a new uncached read of the same version."""
    with tempfile.TemporaryDirectory(prefix="millstream-poll-") as d:
        play(seed, Path(d))


def _history(home: Path, kind: str) -> tuple[Table, Catalog]:
    t = Table(home, kind)
    cached = Catalog.open(home=home, read_cache_mb=64)
    return t, cached


def _same(cached: Catalog, home: Path) -> None:
    with Catalog.open(home=home) as fresh:
        want = fresh.read_table("t", include_system_columns=True)
    got = cached.read_table("t", include_system_columns=True)
    assert canonical(got.to_pylist()) == canonical(want.to_pylist())


def _commit(t: Table, rows: dict[int, list[tuple[int, int | None, bool]]]) -> None:
    out, ranges = [], {}
    for p, values in rows.items():
        lo = t.pos.get(p, 0)
        for o, (k, v, d) in enumerate(values, start=lo):
            out.append(
                {"k": k, "j": "a", "v": v, "s": None, "d": d}
                | {"_ms_partition": p, "_ms_offset": o, "_ms_tombstone": False}
            )
        ranges[p] = (lo, lo + len(values))
        t.pos[p] = lo + len(values)
    schema = t.spec.arrow_schema(system_columns=True)
    staged = stage_rows(t.cat.deep, t.spec, pa.Table.from_pylist(out, schema=schema))
    epochs = {p: t.epochs.get(p, 0) for p in ranges}
    commit_staged(t.cat.store, t.cat.deep, "t", staged, ranges, epochs)


def test_a_delete_without_a_comparison_value_takes_its_partitions_earlier_value(
    home: Path,
) -> None:
    """Key 1 has v=5 in partition 0, polled; then a delete of key 1 without a value lands in
    partition 0: it takes 5 from the earlier row and wins the tie by offset, so key 1 is gone.
    The previous winners alone do not hold that value (a poll must merge in full)."""
    t, cached = _history(home, "upsert-cmp")
    try:
        _commit(t, {0: [(1, 5, False)], 1: [(2, 1, False)]})
        _same(cached, home)
        _commit(t, {0: [(1, None, True)]})
        _same(cached, home)
        assert cached.read_table("t").column("k").to_pylist() == [2]
    finally:
        cached.close()
        t.close()


def test_a_rollback_between_polls_brings_the_rows_it_removed_back_out(home: Path) -> None:
    """Partition 0 rolled back to before key 1's update, another row committed in its place
    and the run sealed, all between two polls: the poll shows the row now there, not the one
    rolled back (its previous winners are not the table's any more)."""
    t, cached = _history(home, "upsert")
    try:
        _commit(t, {0: [(1, 1, False)]})
        _commit(t, {0: [(1, 2, False)]})
        _same(cached, home)
        second = max(e.seq for e in t.cat.manifest("t").entries)
        plan = t.cat.store.rollback_partition("t", 0, second, dry_run=False)
        t.pos[0], t.epochs[0] = plan.new_upper, plan.new_epoch
        _commit(t, {0: [(1, 3, False)]})
        t.sealer.seal_partition(0, force=True)
        _same(cached, home)
        assert cached.read_table("t").column("v").to_pylist() == [3]
    finally:
        cached.close()
        t.close()


def test_a_schema_change_between_polls_shows_the_new_column(home: Path) -> None:
    t, cached = _history(home, "upsert")
    try:
        _commit(t, {0: [(1, 1, False)]})
        _same(cached, home)
        t.evolve()
        _same(cached, home)
        assert "extra" in cached.read_table("t").column_names
    finally:
        cached.close()
        t.close()
