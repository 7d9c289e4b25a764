"""The Iceberg view equals Millstream's own read, at every published snapshot, read by real
Iceberg readers: DuckDB's ``iceberg_scan`` (extensions loaded from their packages' files) and
pyiceberg's StaticTable.

Hypothesis draws a table (every mode: append, dedup, upsert with and without a comparison
column, partial with its merge functions; partitioned by key or not, so a key may move between
partitions) and a history of batches (tombstones, re-created keys, late older records), seals,
compactions and publishes. Every publish is checked at once, and at the end every snapshot
still listed is read again through the newest metadata (time travel) and through the metadata
file its publish wrote: each equals ``read_table(as_of=V)`` of its manifest version V.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from iceberg_readers import duckdb_connection, duckdb_rows, pyiceberg_rows, s3_properties

from millstream.catalog import Catalog
from millstream.sealing.compaction import CompactionPolicy
from millstream.sealing.keyindex import IndexCache
from millstream.sealing.sealer import Sealer
from millstream.spec import OFFSET_COL, PARTITION_COL, TOMBSTONE_COL, TableSpec
from millstream.table.iceberg import location, publish
from millstream.table.writer import commit_staged, stage_rows
from millstream.testing.model import canonical

SCHEMA = {"k": "long", "cmp": "long", "qty": "long", "note": "string"}
PARTITIONS = 2
_names = itertools.count()


@st.composite
def table_specs(draw: st.DrawFn) -> dict[str, Any]:
    mode = draw(st.sampled_from(["append", "dedup", "upsert", "upsert-cmp", "partial"]))
    spec: dict[str, Any] = {"name": f"t{next(_names)}", "schema": SCHEMA}
    if mode == "append":
        return {**spec, "mode": "append"}
    spec["primary_key"] = ["k"]
    spec["partitioned_by_key"] = draw(st.booleans())
    if mode == "upsert-cmp":
        return {**spec, "mode": "upsert", "comparison_column": "cmp"}
    if mode == "partial":
        spec["partial"] = {
            "qty": draw(st.sampled_from(["sum", "max", "min", "overwrite", "ignore_null"])),
            "note": draw(st.sampled_from(["append", "overwrite", "ignore_null"])),
        }
        if draw(st.booleans()):
            spec["comparison_column"] = "cmp"
    return {**spec, "mode": mode}


record = st.tuples(
    st.integers(0, 5),  # key
    st.booleans() | st.just(False),  # tombstone (rarer)
    st.integers(0, 4),  # comparison value: late older records happen
    st.none() | st.integers(-3, 9),  # qty
    st.none() | st.sampled_from(["a", "b", "c"]),  # note
)
step = st.one_of(
    st.tuples(
        st.just("batch"), st.integers(0, PARTITIONS - 1), st.lists(record, min_size=1, max_size=6)
    ),
    st.tuples(st.just("seal"), st.integers(0, PARTITIONS - 1)),
    st.tuples(st.just("compact"), st.integers(0, PARTITIONS - 1)),
    st.tuples(st.just("publish")),
)


@dataclass
class History:
    catalog: Catalog
    spec: TableSpec
    uppers: dict[int, int]

    def batch(self, partition: int, records: list[tuple[Any, ...]]) -> None:
        rows_of: dict[int, list[dict[str, Any]]] = {}
        for k, tomb, cmp, qty, note_ in records:
            # A table partitioned by key holds each key in one partition.
            p = k % PARTITIONS if self.spec.partitioned_by_key else partition
            keyed_tomb = tomb and self.spec.keyed
            rows_of.setdefault(p, []).append(
                {
                    "k": k,
                    "cmp": None if keyed_tomb and self.spec.comparison_column is None else cmp,
                    "qty": None if keyed_tomb else qty,
                    "note": None if keyed_tomb else note_,
                    TOMBSTONE_COL: keyed_tomb,
                }
            )
        ranges: dict[int, tuple[int, int]] = {}
        out = []
        for p, rows in sorted(rows_of.items()):
            lo = self.uppers.get(p, 0)
            for i, r in enumerate(rows):
                out.append({**r, PARTITION_COL: p, OFFSET_COL: lo + i})
            ranges[p] = (lo, lo + len(rows))
            self.uppers[p] = lo + len(rows)
        table = pa.Table.from_pylist(out, schema=self.spec.arrow_schema(system_columns=True))
        staged = stage_rows(self.catalog.deep, self.spec, table)
        commit_staged(self.catalog.store, self.catalog.deep, self.spec.name, staged, ranges, {})


def millstream_rows(catalog: Catalog, table: str, version: int) -> list[Any]:
    return canonical(catalog.read_table(table, as_of=version).to_pylist())


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(spec=table_specs(), steps=st.lists(step, min_size=1, max_size=12))
def test_every_published_snapshot_reads_as_millstreams_read_of_its_version(
    catalog: Catalog, spec: dict[str, Any], steps: list[tuple[Any, ...]]
) -> None:
    info = catalog.create_table(spec)
    name = info.name
    note(f"spec: {spec}")
    history = History(catalog, info.spec, {})
    sealer = Sealer(
        catalog, name, compaction=CompactionPolicy(min_segments=2), index_cache=IndexCache()
    )
    local = not catalog.settings.deep_store.startswith("s3://")
    con = duckdb_connection() if local else None
    props = s3_properties(catalog)
    published: dict[int, str] = {}

    def check(version: int, metadata: str, snapshot: int | None = None) -> None:
        expected = millstream_rows(catalog, name, version)
        assert pyiceberg_rows(metadata, snapshot, props) == expected, (
            f"pyiceberg at version {version}"
        )
        if con is not None and snapshot is None:
            assert duckdb_rows(con, metadata) == expected, f"DuckDB at version {version}"

    for s in [*steps, ("publish",)]:
        note(f"step {s}")
        if s[0] == "batch":
            history.batch(s[1], s[2])
        elif s[0] == "seal":
            sealer.seal_partition(s[1], force=True)
        elif s[0] == "compact":
            sealer.compact_partition(s[1])
        else:
            result = publish(catalog.store, catalog.deep, name)
            if result.pointer is None:
                assert catalog.manifest(name).version == 0
                continue
            pointer = result.pointer
            assert pointer.manifest_version == catalog.manifest(name).version
            metadata = location(catalog.deep, pointer.metadata_location)
            published[pointer.manifest_version] = metadata
            check(pointer.manifest_version, metadata)

    # Time travel: every snapshot the newest metadata lists, and every publish's own file.
    if published:
        newest = published[max(published)]
        for version, metadata in sorted(published.items()):
            check(version, newest, snapshot=version)
            check(version, metadata)


def test_a_version_already_published_is_not_published_again(catalog: Catalog) -> None:
    info = catalog.create_table(
        {"name": "kv", "schema": SCHEMA, "mode": "upsert", "primary_key": ["k"]}
    )
    history = History(catalog, info.spec, {})
    assert publish(catalog.store, catalog.deep, "kv").pointer is None  # nothing committed yet
    history.batch(0, [(1, False, 0, 1, "a"), (1, False, 0, 2, "b")])
    first = publish(catalog.store, catalog.deep, "kv")
    assert first.published and first.pointer is not None
    again = publish(catalog.store, catalog.deep, "kv")
    assert not again.published and again.pointer == first.pointer
