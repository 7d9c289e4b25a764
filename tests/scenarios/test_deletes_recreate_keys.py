"""Deletes on tables with a comparison column: a deleted key can come back, and only a newer
record brings it back.

The defect (found on main): a row without a comparison value ordered after every row that had
one, and a Kafka tombstone never has one, so ``insert k (ts=1) -> tombstone k -> insert k (ts=5)``
left k absent forever. The rule now: a delete without a comparison value takes the highest value
its key has at lower offsets of its partition, and the order is (that value, nulls first;
partition; offset). So after ``insert(ts=1), tombstone``:

* ``insert(ts=5)`` or ``insert(ts=1)`` (equal is not older: the later offset wins) -> present;
* ``insert(ts=0)`` (a late older record) -> still absent.

The last test re-ingests a sealed delete whose value came from a row a delete vector has
since removed: the rebuilt segment must carry the same value.

Each scenario goes through the real write, read and seal path (``stage_rows`` /
``commit_staged``, ``read_manifest``, the :class:`Sealer`), one record per commit, for upsert,
dedup and partial, and is checked after every step both before and after sealing: sealed after
each step, or only at the end. Sealing compacts the earlier rows a tombstone's value derives
from away (and upsert seals name older sealed rows in delete vectors), so the seal has to write
the value into the sealed tombstone.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pytest

from millstream.catalog import Catalog
from millstream.datastream import DatastreamSpec
from millstream.ingest.decode import decode_records
from millstream.ingest.sources import spec_reader
from millstream.ingest.sources.base import RAW_SCHEMA
from millstream.reference.model import canonical, model_rows
from millstream.reference.oracle import expected_table
from millstream.sealing.reingest import reingest_segment
from millstream.sealing.sealer import Sealer
from millstream.spec import OFFSET_COL, PARTITION_COL, TOMBSTONE_COL, TableSpec
from millstream.table.read import read_entries, read_manifest
from millstream.table.writer import commit_staged, stage_rows

SCHEMA = {"k": "long", "v": "string", "updated_at": "long", "deleted": "boolean"}
ENGINES: dict[str, dict[str, Any]] = {
    "upsert": {"mode": "upsert"},
    "dedup": {"mode": "dedup"},
    "partial": {"mode": "partial", "partial": {"v": "overwrite"}},
}
Sealing = Literal["after_each_step", "at_the_end"]
KEY = 1
#: A key of another partition, written once, that every scenario must leave alone.
BYSTANDER = {"k": 2, "v": "bystander", "updated_at": 1}


class Scenario:
    """One table; records of KEY go to partition 0, one committed batch per record."""

    def __init__(self, home: Path, engine: str, sealing: Sealing) -> None:
        self.cat = Catalog.open(home=home)
        self.spec = TableSpec.parse(
            {
                "name": "t",
                "schema": SCHEMA,
                "primary_key": ["k"],
                "comparison_column": "updated_at",
                "delete_column": "deleted",
                **ENGINES[engine],
            }
        )
        self.cat.create_table(self.spec)
        self.sealing = sealing
        self.sealer = Sealer(self.cat, "t")
        self.rows: list[dict[str, Any]] = []
        self.next_offset = {0: 0, 1: 0}
        self.steps: list[str] = []
        self._commit(1, {**BYSTANDER, "deleted": False}, tombstone=False)

    def insert(self, ts: int, v: str) -> None:
        self.steps.append(f"insert(ts={ts})")
        self._commit(0, {"k": KEY, "v": v, "updated_at": ts, "deleted": False}, tombstone=False)

    def tombstone(self) -> None:
        self.steps.append("tombstone")
        self._commit(0, {"k": KEY}, tombstone=True)

    def delete_row(self, ts: int) -> None:
        """A Debezium-style delete: a value with the delete column true and its own ts."""
        self.steps.append(f"delete(ts={ts})")
        self._commit(0, {"k": KEY, "updated_at": ts, "deleted": True}, tombstone=False)

    def _commit(self, partition: int, values: dict[str, Any], *, tombstone: bool) -> None:
        offset = self.next_offset[partition]
        row = {c: values.get(c) for c in SCHEMA}
        row.update({PARTITION_COL: partition, OFFSET_COL: offset, TOMBSTONE_COL: tombstone})
        table = pa.Table.from_pylist([row], schema=self.spec.arrow_schema(system_columns=True))
        staged = stage_rows(self.cat.deep, self.spec, table)
        commit_staged(
            self.cat.store, self.cat.deep, "t", staged, {partition: (offset, offset + 1)}, {}
        )
        self.rows.append(row)
        self.next_offset[partition] = offset + 1

    def seal(self) -> None:
        for p in (0, 1):
            self.sealer.seal_partition(p, force=True)

    def read(self, *, use_delete_vectors: bool = True) -> list[tuple[Any, ...]]:
        m = self.cat.manifest("t")
        rows = read_manifest(self.cat.deep, m, use_delete_vectors=use_delete_vectors)
        return sorted((r["k"], r["v"], r["updated_at"]) for r in rows.to_pylist())

    def check(self, expected_key: tuple[str, int] | None) -> None:
        """The table after this step: KEY's (v, updated_at) or absent, and the bystander; the
        same before and after the seal (after each step, or at the end), with and without
        delete vectors, and equal to the sequential model."""
        expected = [(BYSTANDER["k"], BYSTANDER["v"], BYSTANDER["updated_at"])]
        if expected_key is not None:
            expected.insert(0, (KEY, *expected_key))
        when = [("before sealing", False)]
        if self.sealing == "after_each_step":
            when.append(("after sealing", True))
        for what, seal in when:
            if seal:
                self.seal()
            context = f"{' -> '.join(self.steps)} ({what})"
            assert self.read() == expected, context
            assert self.read(use_delete_vectors=False) == expected, context
            model = canonical(model_rows(self.spec, self.rows))
            table = canonical(self.cat.read_table("t").to_pylist())
            assert table == model, f"{context}: the table is not the model"

    def check_sealed_at_the_end(self, expected_key: tuple[str, int] | None) -> None:
        if self.sealing == "at_the_end":
            self.sealing = "after_each_step"  # one seal now, then the same checks
        self.check(expected_key)


ENGINE_IDS = sorted(ENGINES)


@pytest.fixture(params=["after_each_step", "at_the_end"])
def sealing(request: pytest.FixtureRequest) -> Sealing:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def scenario(
    tmp_path: Path, request: pytest.FixtureRequest, sealing: Sealing
) -> Iterator[Scenario]:
    s = Scenario(tmp_path, request.param, sealing)
    yield s
    s.cat.close()


@pytest.mark.parametrize("scenario", ENGINE_IDS, indirect=True)
@pytest.mark.parametrize("reinsert_ts", [5, 1], ids=["newer", "equal"])
def test_delete_then_recreate_brings_the_key_back(scenario: Scenario, reinsert_ts: int) -> None:
    scenario.insert(1, "first")
    scenario.check(("first", 1))
    scenario.tombstone()
    scenario.check(None)
    scenario.insert(reinsert_ts, "again")
    scenario.check(("again", reinsert_ts))
    scenario.check_sealed_at_the_end(("again", reinsert_ts))


@pytest.mark.parametrize("scenario", ENGINE_IDS, indirect=True)
def test_late_older_record_after_a_tombstone_stays_deleted(scenario: Scenario) -> None:
    scenario.insert(1, "first")
    scenario.check(("first", 1))
    scenario.tombstone()
    scenario.check(None)
    scenario.insert(0, "late and older")
    scenario.check(None)
    # The key is not frozen: a newer record still brings it back.
    scenario.insert(2, "newer")
    scenario.check(("newer", 2))
    scenario.check_sealed_at_the_end(("newer", 2))


@pytest.mark.parametrize("scenario", ENGINE_IDS, indirect=True)
def test_debezium_delete_then_tombstone_deletes_once_and_recreate_works(
    scenario: Scenario,
) -> None:
    scenario.insert(3, "first")
    scenario.check(("first", 3))
    scenario.delete_row(7)
    scenario.check(None)
    scenario.tombstone()  # Debezium's tombstone after the delete: no value, takes ts=7
    scenario.check(None)
    scenario.insert(6, "older than the delete")
    scenario.check(None)
    scenario.insert(8, "recreated")
    scenario.check(("recreated", 8))
    scenario.check_sealed_at_the_end(("recreated", 8))


def test_reingesting_a_sealed_delete_keeps_the_value_it_took_from_a_row_no_longer_live(
    tmp_path: Path,
) -> None:
    """insert(ts=5) sealed; a delete without a ts sealed next (it takes ts=5, and its seal's
    delete vector removes the insert); a late insert(ts=2). The delete's sealed file is lost
    and re-ingested from the source: the live sealed rows no longer hold ts=5, so the rebuilt
    delete must take it from the stored rows below it, or the late record would resurrect k."""
    source = tmp_path / "source"
    (source / "0").mkdir(parents=True)
    lines = [
        {"k": KEY, "v": "first", "updated_at": 5},
        {"k": KEY, "deleted": True},
        {"k": KEY, "v": "late and older", "updated_at": 2},
    ]
    (source / "0" / "0.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    spec = DatastreamSpec.parse(
        {
            "name": "s",
            "source": {"kind": "files", "path": str(source)},
            "schema": SCHEMA,
            "table": {
                "name": "t",
                "mode": "upsert",
                "primary_key": ["k"],
                "comparison_column": "updated_at",
                "delete_column": "deleted",
            },
        }
    )
    table = spec.table_spec()
    records = [(0, o, None, json.dumps(x).encode()) for o, x in enumerate(lines)]
    with Catalog.open(home=tmp_path / "home") as cat:
        cat.create_table(table)
        sealer = Sealer(cat, "t")
        for offset in range(3):
            batches = list(spec_reader(spec.source).read_range(0, offset, offset + 1))
            raw = pa.Table.from_batches(batches).select(["partition", "offset", "key", "value"])
            raw = raw.append_column("range_lo", pa.array([offset], pa.int64()))
            raw = raw.append_column("range_hi", pa.array([offset + 1], pa.int64()))
            raw = raw.append_column("is_marker", pa.array([False])).cast(RAW_SCHEMA)
            staged = stage_rows(cat.deep, table, decode_records(table, raw).rows)
            commit_staged(cat.store, cat.deep, "t", staged, {0: (offset, offset + 1)}, {})
            if offset < 2:
                assert sealer.seal_partition(0, force=True) is not None
        expected, bad = expected_table(table, records)
        assert (expected, bad) == ([], [])
        assert cat.read_table("t").num_rows == 0

        def delete_segment_rows() -> list[tuple[int, int]]:
            (entry,) = [e for e in cat.manifest("t").entries if e.start == 1]
            rows = read_entries(cat.deep, table, [entry]).to_pylist()
            return [(r[OFFSET_COL], r["updated_at"]) for r in rows]

        assert delete_segment_rows() == [(1, 5)], "the seal materialized the delete's value"
        (dv,) = cat.manifest("t").delete_vectors
        assert cat.deep.read_parquet(dv.file_path).column(OFFSET_COL).to_pylist() == [0]
        (delete_segment,) = [e for e in cat.manifest("t").entries if e.start == 1]
        assert delete_segment.file_path is not None
        cat.deep.delete(delete_segment.file_path)
        reingest_segment(cat, spec, delete_segment.name)

        assert delete_segment_rows() == [(1, 5)], "the re-ingested delete kept its value"
        assert cat.read_table("t").num_rows == 0, "the late older record resurrected the key"
        m = cat.manifest("t")
        assert read_manifest(cat.deep, m, use_delete_vectors=False).num_rows == 0
