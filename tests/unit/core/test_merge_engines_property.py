"""The vectorized merge engines agree with the sequential model, row for row.

Each engine's ``resolve`` (:mod:`millstream.core.engines`: Arrow group-bys and joins) and
``testing.model.model_rows`` (plain Python, one row at a time) must give the same current rows
for any input. The input can have duplicate keys, comparison values that arrive out of order, nulls, tombstones and
delete-column rows (so deletes followed by re-inserts and by late older records), and can span
several partitions in any file order. With a comparison column only deletes lack its value, as
decode guarantees. The examples at the
top show what each engine does; the properties at the bottom check the engines against the
model on random inputs, first in memory and then through a real catalog (stage, commit,
read).
"""

from __future__ import annotations

import random
import tempfile
from collections.abc import Iterable, Sequence
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from millstream.catalog import Catalog
from millstream.core.engines import engine_for
from millstream.core.frontier import Outcome
from millstream.reference.model import canonical, model_rows
from millstream.spec import OFFSET_COL, PARTITION_COL, SYSTEM_COLUMNS, TOMBSTONE_COL, TableSpec
from millstream.table.writer import commit_staged, stage_rows

Row = dict[str, Any]

SCHEMA = {
    "k": "string",
    "k2": "long",
    "seq": "long",
    "qty": "long",
    "price": "double",
    "note": "string",
    "gone": "boolean",
    "ts": "timestamp",
    "evt_ms": "long",
}
VALUE_COLUMNS = [c for c in SCHEMA if c not in ("k", "k2")]
T0 = datetime(2024, 1, 1, tzinfo=UTC)


def spec_of(**fields: Any) -> TableSpec:
    return TableSpec.parse({"name": "t", "schema": SCHEMA, **fields})


def row(partition: int, offset: int, *, tombstone: bool = False, **values: Any) -> Row:
    r: Row = {c: values.get(c) for c in SCHEMA}
    r.update({PARTITION_COL: partition, OFFSET_COL: offset, TOMBSTONE_COL: tombstone})
    return r


def plain(value: Any) -> Any:
    """Timestamps as epoch microseconds, so Arrow's and Python's tzinfo objects compare equal."""
    if isinstance(value, datetime):
        return ("ts", round(value.timestamp() * 1_000_000))
    return value


def canon(rows: Iterable[Row]) -> list[tuple[tuple[str, Any], ...]]:
    return canonical({c: plain(v) for c, v in r.items()} for r in rows)


def to_arrow(spec: TableSpec, rows: Sequence[Row]) -> pa.Table:
    return pa.Table.from_pylist(list(rows), schema=spec.arrow_schema(system_columns=True))


def resolved(spec: TableSpec, rows: Sequence[Row]) -> pa.Table:
    return engine_for(spec).resolve(to_arrow(spec, rows))


def current(spec: TableSpec, rows: Sequence[Row]) -> list[Row]:
    """The engine's current rows (user columns), after checking that the model agrees."""
    out = resolved(spec, rows).drop_columns(list(SYSTEM_COLUMNS)).to_pylist()
    assert canon(out) == canon(model_rows(spec, rows)), "resolve() disagrees with the model"
    return out


def pick(rows: Iterable[Row], *cols: str) -> list[tuple[Any, ...]]:
    """The named columns of ``rows``, sorted (nulls first)."""
    return sorted(
        (tuple(r[c] for c in cols) for r in rows), key=lambda t: [(v is not None, v) for v in t]
    )


# -- examples: what each engine does ------------------------------------------------------


def test_append_keeps_every_row_including_duplicates() -> None:
    spec = spec_of(mode="append")
    rows = [row(0, 0, k="a", qty=1), row(0, 1, k="a", qty=1), row(1, 0, k="a", qty=None)]
    assert pick(current(spec, rows), "k", "qty") == [("a", None), ("a", 1), ("a", 1)]


def test_upsert_last_row_of_a_key_wins_by_offset_without_comparison_column() -> None:
    spec = spec_of(mode="upsert", primary_key=["k"])
    rows = [row(0, 0, k="a", qty=1), row(0, 3, k="a", qty=2), row(0, 1, k="b", qty=9)]
    assert pick(current(spec, rows), "k", "qty") == [("a", 2), ("b", 9)]


def test_upsert_orders_by_partition_then_offset_and_sorts_its_rows_by_key_at_any_offset() -> None:
    """Without a comparison column the last position wins, whether the positions pack into
    one integer (the hash path: offsets close together, however high) or not (offsets spread
    over more than 2**59: the sorting path), and both return the rows in key order, null keys
    last."""
    spec = spec_of(mode="upsert", primary_key=["k"])
    placements = {
        "low offsets": lambda o: o,
        "high offsets": lambda o: 2**62 + o,
        "offsets spread over 2**61 and more": lambda o: o * 2**58,
    }
    for name, at in placements.items():
        rows = [
            row(1, at(0), k="b", qty=1),
            row(0, at(9), k="b", qty=2),  # a lower partition loses whatever its offset
            row(0, at(1), k="a", qty=3),
            row(0, at(2), k="a", qty=4),
            row(0, at(3), k=None, qty=5),
            row(2, at(4), k="c", qty=6),
            row(2, at(5), k="c", qty=None, tombstone=True),
        ]
        out = current(spec, rows)
        assert [(r["k"], r["qty"]) for r in out] == [("a", 4), ("b", 1), (None, 5)], name


def test_upsert_higher_comparison_value_wins_even_if_it_arrived_earlier() -> None:
    spec = spec_of(mode="upsert", primary_key=["k"], comparison_column="seq")
    rows = [row(0, 0, k="a", seq=5, qty=50), row(0, 1, k="a", seq=3, qty=30)]
    assert pick(current(spec, rows), "k", "qty") == [("a", 50)]


def test_upsert_comparison_ties_fall_back_to_partition_then_offset() -> None:
    spec = spec_of(mode="upsert", primary_key=["k"], comparison_column="seq")
    rows = [row(1, 0, k="a", seq=5, qty=10), row(0, 7, k="a", seq=5, qty=70)]
    assert pick(current(spec, rows), "k", "qty") == [("a", 10)]


def test_upsert_a_tombstone_removes_the_rows_up_to_the_highest_earlier_comparison_value() -> None:
    """A tombstone has no comparison value: it takes the highest one its key has at lower
    offsets of its partition. A re-insert with a higher or equal value brings the key back; a
    late record with a lower value does not."""
    spec = spec_of(mode="upsert", primary_key=["k"], comparison_column="seq")
    deleted = [row(0, 0, k="a", seq=1, qty=1), row(0, 1, k="a", tombstone=True)]
    assert current(spec, deleted) == []
    assert pick(current(spec, [*deleted, row(0, 2, k="a", seq=5, qty=5)]), "qty") == [(5,)]
    assert current(spec, [*deleted, row(0, 2, k="a", seq=0, qty=0)]) == []
    assert pick(current(spec, [*deleted, row(0, 2, k="a", seq=1, qty=9)]), "qty") == [(9,)]


COMPARISON_VALUES = {  # three increasing values of each orderable column type
    "long": [-(2**40), 0, 2**40],
    "int": [-7, 0, 7],
    "double": [-1.5, 0.25, 3.0],
    "timestamp": [T0, T0 + timedelta(microseconds=1), T0 + timedelta(days=400)],
    "date": [date(1999, 12, 31), date(2024, 1, 1), date(2024, 1, 2)],
    "string": ["", "a", "b"],
}


@pytest.mark.parametrize("column_type", sorted(COMPARISON_VALUES))
@pytest.mark.parametrize("mode", ["upsert", "dedup", "partial"])
def test_a_tombstone_takes_the_highest_earlier_value_for_every_comparison_column_type(
    column_type: str, mode: str
) -> None:
    low, mid, high = COMPARISON_VALUES[column_type]
    spec = TableSpec.parse(
        {
            "name": "t",
            "schema": {"k": "string", "c": column_type, "qty": "long"},
            "primary_key": ["k"],
            "mode": mode,
            "comparison_column": "c",
        }
    )

    def at(offset: int, c: Any = None, qty: int | None = None, tombstone: bool = False) -> Row:
        r: Row = {"k": "a", "c": c, "qty": qty}
        return {**r, PARTITION_COL: 0, OFFSET_COL: offset, TOMBSTONE_COL: tombstone}

    deleted = [at(0, high, 1), at(1, mid, 2), at(2, tombstone=True)]
    assert current(spec, [*deleted, at(3, mid, 3)]) == [], "older than the highest before"
    assert pick(current(spec, [*deleted, at(3, high, 4)]), "qty") == [(4,)], "equal: later wins"
    assert current(spec, [at(0, tombstone=True), at(1, low, 5)]) == [{"k": "a", "c": low, "qty": 5}]


def test_a_tombstone_without_an_earlier_value_in_its_partition_orders_first() -> None:
    """The effective value comes from the tombstone's own partition only; with none there the
    tombstone orders before every row that has a value, in any partition."""
    spec = spec_of(mode="upsert", primary_key=["k"], comparison_column="seq")
    rows = [
        row(0, 0, k="a", tombstone=True),
        row(0, 1, k="a", seq=-3, qty=1),
        row(1, 0, k="b", seq=2, qty=2),
        row(0, 2, k="b", tombstone=True),  # partition 0 has no earlier row of b
    ]
    assert pick(current(spec, rows), "k", "qty") == [("a", 1), ("b", 2)]


def test_a_delete_row_carrying_a_comparison_value_orders_by_that_value() -> None:
    """Debezium style: the delete row carries its own value; the tombstone after it takes that
    value (the highest before it), and only a newer row brings the key back."""
    spec = spec_of(mode="upsert", primary_key=["k"], comparison_column="seq", delete_column="gone")
    rows = [
        row(0, 0, k="a", seq=3, qty=3),
        row(0, 1, k="a", seq=7, gone=True),
        row(0, 2, k="a", tombstone=True),
        row(0, 3, k="a", seq=6, qty=6),  # older than the delete
    ]
    assert current(spec, rows) == []
    assert pick(current(spec, [*rows, row(0, 4, k="a", seq=8, qty=8)]), "qty") == [(8,)]


def test_upsert_tombstone_deletes_the_key_and_a_later_row_brings_it_back() -> None:
    spec = spec_of(mode="upsert", primary_key=["k"])
    deleted = [row(0, 0, k="a", qty=1), row(0, 1, k="a", tombstone=True)]
    assert current(spec, deleted) == []
    revived = [*deleted, row(0, 2, k="a", qty=3)]
    assert pick(current(spec, revived), "k", "qty") == [("a", 3)]


def test_upsert_delete_column_true_deletes_the_key_and_null_does_not() -> None:
    spec = spec_of(mode="upsert", primary_key=["k"], delete_column="gone")
    rows = [
        row(0, 0, k="a", qty=1),
        row(0, 1, k="a", qty=2, gone=True),
        row(0, 2, k="b", qty=3),
        row(0, 3, k="b", qty=4, gone=None),
        row(0, 4, k="c", qty=5, gone=False),
    ]
    assert pick(current(spec, rows), "k", "qty") == [("b", 4), ("c", 5)]


def test_upsert_composite_key_distinguishes_every_key_column() -> None:
    spec = spec_of(mode="upsert", primary_key=["k", "k2"])
    rows = [row(0, 0, k="a", k2=1, qty=1), row(0, 1, k="a", k2=2, qty=2), row(0, 2, k="a", k2=1)]
    assert pick(current(spec, rows), "k", "k2", "qty") == [("a", 1, None), ("a", 2, 2)]


def test_dedup_first_row_of_a_key_wins() -> None:
    spec = spec_of(mode="dedup", primary_key=["k"])
    rows = [row(0, 0, k="a", qty=1), row(0, 1, k="a", qty=2), row(1, 0, k="b", qty=3)]
    assert pick(current(spec, rows), "k", "qty") == [("a", 1), ("b", 3)]


def test_dedup_first_means_lowest_comparison_value_not_first_arrival() -> None:
    spec = spec_of(mode="dedup", primary_key=["k"], comparison_column="seq")
    rows = [row(0, 0, k="a", seq=9, qty=1), row(0, 1, k="a", seq=2, qty=2)]
    assert pick(current(spec, rows), "k", "qty") == [("a", 2)]


def test_dedup_delete_forgets_the_key_so_the_next_row_wins_again() -> None:
    spec = spec_of(mode="dedup", primary_key=["k"], delete_column="gone")
    rows = [
        row(0, 0, k="a", qty=1),
        row(0, 1, k="a", gone=True),
        row(0, 2, k="a", qty=3),
        row(0, 3, k="a", qty=4),
    ]
    assert pick(current(spec, rows), "k", "qty") == [("a", 3)]


def test_dedup_ttl_readmits_a_key_once_the_window_since_the_kept_row_has_passed() -> None:
    spec = spec_of(mode="dedup", primary_key=["k"], dedup_ttl="10s", time_column="evt_ms")
    rows = [
        row(0, 0, k="a", qty=1, evt_ms=0),
        row(0, 1, k="a", qty=2, evt_ms=9_999),  # inside the window: a duplicate
        row(0, 2, k="a", qty=3, evt_ms=10_000),  # the window has passed: kept
        row(0, 3, k="a", qty=4, evt_ms=19_999),  # inside the new window from 10_000
        row(0, 4, k="a", qty=5, evt_ms=None),  # no time: never expires anything
    ]
    assert pick(current(spec, rows), "k", "qty") == [("a", 1), ("a", 3)]


def test_dedup_ttl_on_a_timestamp_column() -> None:
    spec = spec_of(mode="dedup", primary_key=["k"], dedup_ttl="1m", time_column="ts")
    rows = [
        row(0, 0, k="a", qty=1, ts=T0),
        row(0, 1, k="a", qty=2, ts=T0 + timedelta(seconds=59)),
        row(0, 2, k="a", qty=3, ts=T0 + timedelta(minutes=1)),
    ]
    assert pick(current(spec, rows), "k", "qty") == [("a", 1), ("a", 3)]


def test_partial_folds_each_column_with_its_strategy() -> None:
    spec = spec_of(
        mode="partial",
        primary_key=["k"],
        partial={
            "qty": "sum",
            "price": "max",
            "note": "append",
            "seq": "overwrite",
            "evt_ms": "min",
        },  # ts and gone are unlisted: ignore_null
    )
    rows = [
        row(0, 0, k="a", qty=1, price=2.0, note="x", seq=1, evt_ms=5, ts=T0),
        row(0, 1, k="a", qty=None, price=9.0, note=None, seq=None, evt_ms=7, ts=None),
        row(0, 2, k="a", qty=4, price=None, note="y", seq=3, evt_ms=None, ts=None),
    ]
    (out,) = current(spec, rows)
    assert out == {
        "k": "a",
        "k2": None,
        "seq": 3,  # overwrite: the last value, even if it were null
        "qty": 5,  # sum ignores nulls
        "price": 9.0,  # max ignores nulls
        "note": "x,y",  # append joins non-null strings
        "gone": None,
        "ts": T0,  # ignore_null keeps the last non-null value
        "evt_ms": 5,  # min ignores nulls
    }


def test_partial_overwrite_takes_a_null_and_ignore_null_does_not() -> None:
    spec = spec_of(mode="partial", primary_key=["k"], partial={"qty": "overwrite"})
    rows = [row(0, 0, k="a", qty=1, note="keep"), row(0, 1, k="a", qty=None, note=None)]
    assert pick(current(spec, rows), "qty", "note") == [(None, "keep")]


def test_partial_delete_resets_the_key_and_later_rows_start_a_fresh_fold() -> None:
    spec = spec_of(mode="partial", primary_key=["k"], partial={"qty": "sum"})
    rows = [
        row(0, 0, k="a", qty=10),
        row(0, 1, k="a", tombstone=True),
        row(0, 2, k="a", qty=1),
        row(0, 3, k="a", qty=2),
        row(0, 4, k="b", qty=7),
        row(0, 5, k="b", tombstone=True),
    ]
    assert pick(current(spec, rows), "k", "qty") == [("a", 3)]


def test_partial_folds_in_comparison_order_not_arrival_order() -> None:
    spec = spec_of(
        mode="partial", primary_key=["k"], comparison_column="seq", partial={"note": "append"}
    )
    rows = [row(0, 0, k="a", seq=2, note="second"), row(0, 1, k="a", seq=1, note="first")]
    assert pick(current(spec, rows), "note") == [("first,second",)]


def test_keyed_engines_keep_the_identity_of_the_row_that_represents_the_key() -> None:
    spec = spec_of(mode="upsert", primary_key=["k"], comparison_column="seq")
    rows = [row(2, 40, k="a", seq=9, qty=1), row(0, 1, k="a", seq=3, qty=2)]
    out = resolved(spec, rows).to_pylist()
    assert [(r[PARTITION_COL], r[OFFSET_COL], r[TOMBSTONE_COL]) for r in out] == [(2, 40, False)]


# -- random inputs ------------------------------------------------------------------------

STRATEGIES_BY_COLUMN = {
    "seq": ["overwrite", "ignore_null", "max", "min", "sum"],
    "qty": ["overwrite", "ignore_null", "max", "min", "sum"],
    "price": ["overwrite", "ignore_null", "max", "min", "sum"],
    "note": ["overwrite", "ignore_null", "max", "min", "append"],
    "gone": ["overwrite", "ignore_null"],
    "ts": ["overwrite", "ignore_null", "max", "min"],
    "evt_ms": ["overwrite", "ignore_null", "max", "min", "sum"],
}


@st.composite
def specs(draw: st.DrawFn) -> TableSpec:
    mode = draw(st.sampled_from(["append", "dedup", "dedup_ttl", "upsert", "partial"]))
    if mode == "append":
        return spec_of(mode="append")
    fields: dict[str, Any] = {
        "mode": "dedup" if mode == "dedup_ttl" else mode,
        "primary_key": draw(st.sampled_from([["k"], ["k", "k2"]])),
        "comparison_column": draw(st.sampled_from([None, "seq"])),
        "delete_column": draw(st.sampled_from([None, "gone"])),
    }
    if mode == "dedup_ttl":
        fields["time_column"] = draw(st.sampled_from(["ts", "evt_ms"]))
        fields["dedup_ttl"] = draw(st.sampled_from(["1ms", "2s", "5s", "1m"]))
    if mode == "partial":
        fields["partial"] = {
            c: draw(st.sampled_from(options))
            for c, options in STRATEGIES_BY_COLUMN.items()
            if draw(st.booleans())
        }
    return spec_of(**fields)


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), strategy)


@st.composite
def row_values(draw: st.DrawFn, spec: TableSpec) -> Row:
    """One source record; integral doubles keep sums exact in any summation order. With a
    comparison column only a delete may lack its value (decode dead-letters other records)."""
    key = {
        "k": draw(st.sampled_from(["a", "b", "c", "a", "b", "c", None])),
        "k2": draw(st.sampled_from([0, 1, 0, 1, None])),
    }
    if draw(st.integers(0, 6)) == 0:  # a Kafka-style tombstone: key only, no value
        return {**key, TOMBSTONE_COL: True}
    gone = draw(st.sampled_from([None, False, False, True]))
    is_delete = bool(gone) and spec.delete_column == "gone"
    seq = st.integers(-3, 3)
    return {
        **key,
        "seq": draw(seq if spec.comparison_column == "seq" and not is_delete else maybe(seq)),
        "qty": draw(maybe(st.integers(-100, 100))),
        "price": draw(maybe(st.integers(-50, 50).map(float))),
        "note": draw(maybe(st.text(alphabet="xyz,é", max_size=3))),
        "gone": gone,
        "ts": draw(maybe(st.integers(0, 120_000).map(lambda ms: T0 + timedelta(milliseconds=ms)))),
        "evt_ms": draw(maybe(st.integers(0, 12_000))),
        TOMBSTONE_COL: False,
    }


@st.composite
def source_rows(draw: st.DrawFn, spec: TableSpec) -> list[Row]:
    """Rows over up to three partitions; offsets grow per partition in steps of 1 to 3."""
    values = draw(st.lists(row_values(spec), max_size=30))
    next_offset = {p: draw(st.integers(0, 3)) for p in range(3)}
    rows = []
    for v in values:
        p = draw(st.integers(0, 2))
        rows.append(row(p, next_offset[p], tombstone=v.pop(TOMBSTONE_COL), **v))
        next_offset[p] += draw(st.integers(1, 3))
    return rows


PROPERTY_SETTINGS = settings(max_examples=300, deadline=None, print_blob=True)


@PROPERTY_SETTINGS
@given(spec=specs(), data=st.data(), shuffle=st.randoms(use_true_random=False))
def test_resolve_equals_the_sequential_model_for_every_engine(
    spec: TableSpec, data: st.DataObject, shuffle: random.Random
) -> None:
    rows = data.draw(source_rows(spec), label="rows")
    note(f"spec: {spec.to_json_dict()}")
    arrived = list(rows)
    shuffle.shuffle(arrived)  # files are read in no particular order
    out = resolved(spec, arrived)
    assert canon(out.drop_columns(list(SYSTEM_COLUMNS)).to_pylist()) == canon(
        model_rows(spec, rows)
    )
    if spec.mode in ("append", "upsert", "dedup"):
        # Each current row is one of the input rows, named by (partition, offset).
        by_id = {(r[PARTITION_COL], r[OFFSET_COL]): r for r in rows}
        for r in out.to_pylist():
            assert canon([by_id[(r[PARTITION_COL], r[OFFSET_COL])]]) == canon([r])
    if spec.keyed:
        assert not any(out.column(TOMBSTONE_COL).to_pylist())


@st.composite
def batch_cuts(draw: st.DrawFn, rows: list[Row]) -> list[dict[int, tuple[int, int]]]:
    """Split each partition's offsets into a few consecutive ranges ``[lo, hi)``: one
    committed batch per list element, each batch covering every partition."""
    n_batches = draw(st.integers(1, 4))
    cuts: dict[int, list[int]] = {}
    for p in range(3):
        offsets = sorted(r[OFFSET_COL] for r in rows if r[PARTITION_COL] == p)
        end = (offsets[-1] + 1) if offsets else 0
        inner = draw(st.lists(st.integers(0, end), min_size=n_batches - 1, max_size=n_batches - 1))
        cuts[p] = [0, *sorted(inner), end]
    return [{p: (cuts[p][b], cuts[p][b + 1]) for p in range(3)} for b in range(n_batches)]


@settings(
    max_examples=60,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(spec=specs(), data=st.data())
def test_rows_committed_as_several_batches_read_back_as_the_model(
    spec: TableSpec, data: st.DataObject
) -> None:
    rows = data.draw(source_rows(spec), label="rows")
    batches = data.draw(batch_cuts(rows), label="batches")
    note(f"spec: {spec.to_json_dict()}")
    with tempfile.TemporaryDirectory() as home, Catalog.open(home=home) as cat:
        cat.create_table(spec)
        for batch_id, ranges in enumerate(batches):
            batch_rows = [
                r
                for r in rows
                if ranges[r[PARTITION_COL]][0] <= r[OFFSET_COL] < ranges[r[PARTITION_COL]][1]
            ]
            staged = stage_rows(cat.deep, spec, to_arrow(spec, batch_rows))
            result = commit_staged(
                cat.store, cat.deep, spec.name, staged, ranges, {}, batch_id=batch_id
            )
            for p, (lo, hi) in ranges.items():
                if lo < hi:
                    assert result.outcome(p) is Outcome.COMMIT
        assert canon(cat.read_table(spec.name).to_pylist()) == canon(model_rows(spec, rows))
        uppers = {sh.partition: sh.upper for sh in cat.store.list_shards(spec.name)}
        assert uppers == {p: batches[-1][p][1] for p in range(3) if batches[-1][p][1] > 0}


def test_a_null_key_is_a_key_of_its_own_in_every_keyed_engine() -> None:
    """Null key values group together, as in the model: a delete of the null key removes
    it, and dedup and partial keep its rows (regression: joins on the key columns never
    matched null to null, so dedup lost the key and partial ignored its deletes)."""
    rows = [
        row(0, 0, k=None, qty=1, note="x"),
        row(0, 1, k=None, gone=True),
        row(0, 2, k=None, qty=3, note="y"),
        row(0, 3, k=None, qty=4, note="z"),
        row(0, 4, k="a", qty=5),
    ]
    dedup = spec_of(mode="dedup", primary_key=["k"], delete_column="gone")
    assert pick(current(dedup, rows), "k", "qty") == [(None, 3), ("a", 5)]
    upsert = spec_of(mode="upsert", primary_key=["k"], delete_column="gone")
    assert pick(current(upsert, rows), "k", "qty") == [(None, 4), ("a", 5)]
    partial = spec_of(
        mode="partial",
        primary_key=["k"],
        delete_column="gone",
        partial={"qty": "sum", "note": "append"},
    )
    assert pick(current(partial, rows), "k", "qty", "note") == [(None, 7, "y,z"), ("a", 5, None)]
