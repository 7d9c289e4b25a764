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
import time
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from harness.iceberg_readers import duckdb_connection, duckdb_rows, pyiceberg_rows, s3_properties
from millstream.catalog import Catalog
from millstream.reference.model import canonical
from millstream.sealing.compaction import CompactionPolicy
from millstream.sealing.keyindex import IndexCache
from millstream.sealing.sealer import Sealer
from millstream.spec import OFFSET_COL, PARTITION_COL, TOMBSTONE_COL, TableSpec
from millstream.table.iceberg import location, publish
from millstream.table.writer import commit_staged, stage_rows

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
    st.tuples(st.just("rollback"), st.integers(0, PARTITIONS - 1), st.integers(0, 9)),
)


@dataclass
class History:
    catalog: Catalog
    spec: TableSpec

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
        # Each partition goes on from its shard's upper, in its epoch (a rollback moves both).
        shards = {sh.partition: sh for sh in self.catalog.store.list_shards(self.spec.name)}
        for p, rows in sorted(rows_of.items()):
            lo = shards[p].upper if p in shards else 0
            for i, r in enumerate(rows):
                out.append({**r, PARTITION_COL: p, OFFSET_COL: lo + i})
            ranges[p] = (lo, lo + len(rows))
        table = pa.Table.from_pylist(out, schema=self.spec.arrow_schema(system_columns=True))
        staged = stage_rows(self.catalog.deep, self.spec, table)
        epochs = {p: shards[p].epoch for p in ranges if p in shards}
        commit_staged(self.catalog.store, self.catalog.deep, self.spec.name, staged, ranges, epochs)

    def apply(self, sealer: Sealer, s: tuple[Any, ...]) -> bool:
        """Apply a drawn batch, seal, compaction or rollback step; False for a publish step,
        which each test does its own way."""
        if s[0] == "batch":
            self.batch(s[1], s[2])
        elif s[0] == "seal":
            sealer.seal_partition(s[1], force=True)
        elif s[0] == "compact":
            sealer.compact_partition(s[1])
        elif s[0] == "rollback":
            self.rollback(s[1], s[2])
        else:
            return False
        return True

    def rollback(self, partition: int, pick: int) -> None:
        """Roll ``partition`` back to before one of its live segments (sealed ones too)."""
        seqs = sorted(
            e.seq for e in self.catalog.manifest(self.spec.name).entries if e.partition == partition
        )
        if seqs:
            seq = seqs[pick % len(seqs)]
            self.catalog.store.rollback_partition(self.spec.name, partition, seq, dry_run=False)


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
    history = History(catalog, info.spec)
    sealer = Sealer(
        catalog, name, compaction=CompactionPolicy(min_segments=2), index_cache=IndexCache()
    )
    con = duckdb_connection(catalog)
    props = s3_properties(catalog)
    published: dict[int, str] = {}

    def check(version: int, metadata: str, snapshot: int | None = None) -> None:
        expected = millstream_rows(catalog, name, version)
        assert pyiceberg_rows(metadata, snapshot, props) == expected, (
            f"pyiceberg at version {version}"
        )
        assert duckdb_rows(con, metadata, snapshot) == expected, f"DuckDB at version {version}"

    for s in [*steps, ("publish",)]:
        note(f"step {s}")
        if history.apply(sealer, s):
            continue
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
    history = History(catalog, info.spec)
    assert publish(catalog.store, catalog.deep, "kv").pointer is None  # nothing committed yet
    history.batch(0, [(1, False, 0, 1, "a"), (1, False, 0, 2, "b")])
    first = publish(catalog.store, catalog.deep, "kv")
    assert first.published and first.pointer is not None
    again = publish(catalog.store, catalog.deep, "kv")
    assert not again.published and again.pointer == first.pointer


def _kv(catalog: Catalog, **retention: Any) -> History:
    spec: dict[str, Any] = {"name": "kv", "schema": SCHEMA, "mode": "upsert", "primary_key": ["k"]}
    if retention:
        spec["retention"] = retention
    return History(catalog, catalog.create_table(spec).spec)


def test_superseded_rows_tombstones_and_trimmed_ranges_are_hidden_by_position_deletes(
    catalog: Catalog,
) -> None:
    """An upsert table's file holds a superseded row and a tombstone, and a trimmed commit's
    file holds rows below its entry's start: the snapshot's delete file names each of them,
    and both readers return Millstream's rows."""
    kv = _kv(catalog)
    kv.batch(0, [(1, False, 0, 1, "a"), (2, False, 0, 2, "a"), (1, False, 0, 3, "b")])
    kv.batch(0, [(2, True, 0, None, None), (3, False, 0, 4, "c")])
    # A replayed range [3, 6): rows 3 and 4 are below the upper, only offset 5 is new.
    rows = [
        {
            "k": k,
            "cmp": 0,
            "qty": q,
            "note": "r",
            PARTITION_COL: 0,
            OFFSET_COL: o,
            TOMBSTONE_COL: False,
        }
        for k, q, o in [(7, 70, 3), (8, 80, 4), (3, 9, 5)]
    ]
    staged = stage_rows(
        catalog.deep,
        kv.spec,
        pa.Table.from_pylist(rows, schema=kv.spec.arrow_schema(system_columns=True)),
    )
    commit_staged(catalog.store, catalog.deep, "kv", staged, {0: (3, 6)}, {})
    result = publish(catalog.store, catalog.deep, "kv")
    assert result.published and result.pointer is not None
    metadata = location(catalog.deep, result.pointer.metadata_location)
    expected = millstream_rows(catalog, "kv", result.pointer.manifest_version)
    assert [dict(r)["k"] for r in expected] == [1, 3]
    assert duckdb_rows(duckdb_connection(catalog), metadata) == expected
    assert pyiceberg_rows(metadata, None, s3_properties(catalog)) == expected
    from pyiceberg.table import StaticTable

    tasks = list(
        StaticTable.from_metadata(metadata, properties=s3_properties(catalog)).scan().plan_files()
    )
    # Each of the three files holds rows the read does not return.
    assert len(tasks) == 3 and all(t.delete_files for t in tasks)
    deleted = sum(
        catalog.deep.read_parquet(relative_or_fail(catalog, d.file_path)).num_rows
        for d in {d.file_path: d for t in tasks for d in t.delete_files}.values()
    )
    # 8 physical rows, 2 returned: (1, a) and (3, c) superseded, key 2's row and its
    # tombstone, keys 7 and 8 below the trimmed entry's start.
    assert deleted == 6


def relative_or_fail(catalog: Catalog, uri: str) -> str:
    from millstream.table.iceberg import relative

    rel = relative(catalog.deep, uri)
    assert rel is not None, uri
    return rel


def test_of_two_publishers_that_read_the_same_pointer_only_one_moves_it(catalog: Catalog) -> None:

    kv = _kv(catalog)
    kv.batch(0, [(1, False, 0, 1, "a")])
    # Two first publishes: the second's insert is refused.
    assert catalog.store.swap_pointer(
        "kv", None, metadata_location="a", manifest_version=1, now=0.0
    )
    assert (
        catalog.store.swap_pointer("kv", None, metadata_location="b", manifest_version=1, now=0.0)
        is None
    )
    seen = catalog.store.read_pointer("kv")
    assert seen is not None and seen.metadata_location == "a"
    won = catalog.store.swap_pointer("kv", seen, metadata_location="c", manifest_version=2, now=0.0)
    assert won is not None and won.version == seen.version + 1
    # The slower one read the same pointer: it loses, and the winner's pointer stays.
    assert (
        catalog.store.swap_pointer("kv", seen, metadata_location="d", manifest_version=2, now=0.0)
        is None
    )
    assert catalog.store.read_pointer("kv") == won


def test_expired_versions_expire_their_snapshots_and_gc_keeps_every_file_a_retained_snapshot_needs(
    catalog: Catalog,
) -> None:
    from millstream.clock import ManualClock
    from millstream.table.iceberg import DeepStoreIO, load_metadata, view_prefix
    from millstream.table.maintain import maintain

    clock = ManualClock(time.time())
    catalog.store.clock = clock
    kv = _kv(catalog, time="1s", min_versions=2)
    published: dict[int, str] = {}
    for i in range(4):
        kv.batch(0, [(i % 2, False, 0, i, "v"), (5, i == 2, 0, i, "w")])
        clock.advance(10)
        result = publish(catalog.store, catalog.deep, "kv")
        assert result.pointer is not None
        published[result.pointer.manifest_version] = result.pointer.metadata_location
    before = {f.path for f in catalog.deep.list_files(view_prefix("kv"))}
    clock.advance(3600)
    maintain(catalog.store, catalog.deep, "kv", grace_seconds=0, clock=clock)
    oldest = catalog.store.oldest_kept_version("kv")
    assert oldest == 3
    pointer = catalog.store.read_pointer("kv")
    assert pointer is not None and pointer.manifest_version == 4
    current = location(catalog.deep, pointer.metadata_location)
    props = s3_properties(catalog)
    from pyiceberg.table import StaticTable

    assert [
        s.snapshot_id
        for s in StaticTable.from_metadata(current, properties=props).metadata.snapshots
    ] == [3, 4]
    after = {f.path for f in catalog.deep.list_files(view_prefix("kv"))}
    assert after < before | {pointer.metadata_location}, "expired snapshots' files were removed"
    assert published[1] not in after and published[2] not in after
    # Every retained snapshot reads, through the newest metadata and its own publish's file,
    # and every file they reference is there.
    io = DeepStoreIO(catalog.deep)
    con = duckdb_connection(catalog)
    for version in (3, 4):
        expected = millstream_rows(catalog, "kv", version)
        assert pyiceberg_rows(current, version, props) == expected
        assert pyiceberg_rows(location(catalog.deep, published[version]), None, props) == expected
        assert duckdb_rows(con, current, version) == expected
        assert duckdb_rows(con, location(catalog.deep, published[version])) == expected
        snap = load_metadata(catalog.deep, published[version]).snapshot_by_id(version)
        assert snap is not None
        for m in snap.manifests(io):
            for e in m.fetch_manifest_entry(io):
                assert catalog.deep.exists(relative_or_fail(catalog, e.data_file.file_path))


def test_an_unsealed_partial_update_is_published_as_its_merged_row(catalog: Catalog) -> None:
    """Two updates of a key in consuming segments merge (qty summed, notes appended) into a
    row no data file holds: the snapshot shows the merged row, not either physical row; once
    sealed, the merged row is a physical row and nothing is written beside the data files."""
    from millstream.table.iceberg import view_prefix

    spec = {
        "name": "p",
        "schema": SCHEMA,
        "mode": "partial",
        "primary_key": ["k"],
        "partial": {"qty": "sum", "note": "append"},
    }
    history = History(catalog, catalog.create_table(spec).spec)
    history.batch(0, [(1, False, 0, 2, "a"), (2, False, 0, 5, "x")])
    history.batch(0, [(1, False, 0, 3, "b")])
    props = s3_properties(catalog)
    for seal in (False, True):
        if seal:
            Sealer(catalog, "p", index_cache=IndexCache()).seal_partition(0, force=True)
        result = publish(catalog.store, catalog.deep, "p")
        assert result.published and result.pointer is not None
        metadata = location(catalog.deep, result.pointer.metadata_location)
        expected = millstream_rows(catalog, "p", result.pointer.manifest_version)
        assert expected == canonical(
            [
                {"k": 1, "cmp": 0, "qty": 5, "note": "a,b"},
                {"k": 2, "cmp": 0, "qty": 5, "note": "x"},
            ]
        )
        assert pyiceberg_rows(metadata, None, props) == expected
        assert duckdb_rows(duckdb_connection(catalog), metadata) == expected
        merged = [
            f
            for f in catalog.deep.list_files(f"{view_prefix('p')}/merged")
            if f.path.split("/")[-1].startswith(f"{result.pointer.manifest_version:012d}-")
        ]
        assert len(merged) == (0 if seal else 1)


def test_schema_changes_keep_field_ids_and_old_snapshots_read_with_their_schema(
    catalog: Catalog,
) -> None:
    """A column added and an int widened to long: the next snapshot's schema keeps every
    field id and gives the new column a new one; the old snapshot reads with its own schema,
    the new one with nulls for the old rows' new column, both as Millstream reads them."""
    from pyiceberg.table import StaticTable

    from millstream.spec import TableSpec

    v1 = {"name": "ev", "schema": {"k": "long", "n": "int"}, "mode": "upsert", "primary_key": ["k"]}
    spec = catalog.create_table(v1).spec

    def commit(spec: TableSpec, rows: list[dict[str, Any]], lo: int) -> None:
        full = [
            {**r, PARTITION_COL: 0, OFFSET_COL: lo + i, TOMBSTONE_COL: False}
            for i, r in enumerate(rows)
        ]
        table = pa.Table.from_pylist(full, schema=spec.arrow_schema(system_columns=True))
        staged = stage_rows(catalog.deep, spec, table)
        commit_staged(catalog.store, catalog.deep, "ev", staged, {0: (lo, lo + len(rows))}, {})

    commit(spec, [{"k": 1, "n": 10}, {"k": 2, "n": 20}], 0)
    first = publish(catalog.store, catalog.deep, "ev").pointer
    assert first is not None
    v2 = TableSpec.parse({**v1, "schema": {"k": "long", "n": "long", "note": "string"}})
    evolved, _ = catalog.store.evolve_table(v2)
    commit(evolved.spec, [{"k": 2, "n": 2**40, "note": "big"}], 2)
    second = publish(catalog.store, catalog.deep, "ev").pointer
    assert second is not None
    props = s3_properties(catalog)
    metadata = location(catalog.deep, second.metadata_location)
    table = StaticTable.from_metadata(metadata, properties=props)
    old_schema = table.metadata.schema_by_id(
        table.metadata.snapshot_by_id(first.manifest_version).schema_id
    )
    new_schema = table.schema()
    assert old_schema is not None
    assert [(f.field_id, f.name, str(f.field_type)) for f in old_schema.fields] == [
        (1, "k", "long"),
        (2, "n", "int"),
    ]
    assert [(f.field_id, f.name, str(f.field_type)) for f in new_schema.fields] == [
        (1, "k", "long"),
        (2, "n", "long"),
        (3, "note", "string"),
    ]
    assert pyiceberg_rows(metadata, None, props) == millstream_rows(
        catalog, "ev", second.manifest_version
    )
    assert pyiceberg_rows(metadata, None, props) == canonical(
        [{"k": 1, "n": 10, "note": None}, {"k": 2, "n": 2**40, "note": "big"}]
    )
    old = location(catalog.deep, first.metadata_location)
    assert pyiceberg_rows(old, None, props) == canonical([{"k": 1, "n": 10}, {"k": 2, "n": 20}])
    assert duckdb_rows(duckdb_connection(catalog), metadata) == millstream_rows(
        catalog, "ev", second.manifest_version
    )


def _plain(value: Any) -> Any:
    """Timestamps as UTC microseconds (readers differ in tzinfo objects), nested values as
    sorted tuples (a map reads as a list of pairs or a dict)."""
    import datetime as dt

    if isinstance(value, dt.datetime):
        return ("ts", round(value.timestamp() * 1_000_000))
    if isinstance(value, dict):
        return tuple(sorted((k, _plain(v)) for k, v in value.items()))
    if isinstance(value, list):
        if value and all(isinstance(v, tuple) and len(v) == 2 for v in value):
            return tuple(sorted((k, _plain(v)) for k, v in value))
        return tuple(_plain(v) for v in value)
    return value


def test_every_column_type_and_a_dead_letter_table_read_as_millstream_reads_them(
    catalog: Catalog,
) -> None:
    """decimal, nested list/struct/map, timestamp (microseconds, UTC), date and binary, and a
    dead-letter table's schema, through pyiceberg and DuckDB."""
    import datetime as dt
    from decimal import Decimal

    from millstream.datastream import dead_letter_spec

    spec = catalog.create_table(
        {
            "name": "typed",
            "schema": {
                "id": "long",
                "price": "decimal(10,2)",
                "tags": "list<string>",
                "where": "struct<city:string,zip:int>",
                "attrs": "map<string,long>",
                "at": "timestamp",
                "day": "date",
                "blob": "binary",
                "ok": "boolean",
                "ratio": "double",
            },
        }
    ).spec
    row = {
        "id": 1,
        "price": Decimal("12.34"),
        "tags": ["a", "b"],
        "where": {"city": "Oslo", "zip": 150},
        "attrs": [("x", 1), ("y", 2)],
        "at": dt.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=dt.UTC),
        "day": dt.date(2024, 5, 6),
        "blob": b"\x00\x01",
        "ok": True,
        "ratio": 0.5,
    }
    empty = {k: None for k in row} | {"id": 2}
    rows = [
        {**r, PARTITION_COL: 0, OFFSET_COL: i, TOMBSTONE_COL: False}
        for i, r in enumerate([row, empty])
    ]
    table = pa.Table.from_pylist(rows, schema=spec.arrow_schema(system_columns=True))
    commit_staged(
        catalog.store, catalog.deep, "typed", stage_rows(catalog.deep, spec, table), {0: (0, 2)}, {}
    )
    dl = catalog.create_table(dead_letter_spec(spec))
    bad = {
        "partition": 0,
        "offset": 7,
        "raw": b"{oops",
        "key": None,
        "error": "not JSON",
        "failed_at": dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
        PARTITION_COL: 0,
        OFFSET_COL: 7,
        TOMBSTONE_COL: False,
    }
    dl_rows = pa.Table.from_pylist([bad], schema=dl.spec.arrow_schema(system_columns=True))
    commit_staged(
        catalog.store,
        catalog.deep,
        dl.name,
        stage_rows(catalog.deep, dl.spec, dl_rows),
        {0: (7, 8)},
        {},
    )
    props = s3_properties(catalog)
    for name in ("typed", dl.name):
        pointer = publish(catalog.store, catalog.deep, name).pointer
        assert pointer is not None
        metadata = location(catalog.deep, pointer.metadata_location)

        def plain(rows: list[dict[str, Any]]) -> list[Any]:
            return canonical({k: _plain(v) for k, v in r.items()} for r in rows)

        expected = plain(catalog.read_table(name).to_pylist())
        from pyiceberg.table import StaticTable

        got = StaticTable.from_metadata(metadata, properties=props).scan().to_arrow()
        assert plain(got.to_pylist()) == expected
        cur = duckdb_connection(catalog).execute("SELECT * FROM iceberg_scan(?)", [metadata])
        names = [d[0] for d in cur.description or ()]
        assert plain([dict(zip(names, r, strict=True)) for r in cur.fetchall()]) == expected


def test_the_snapshot_the_pointer_shows_keeps_its_files_after_its_version_would_expire(
    catalog: Catalog,
) -> None:
    """Retention never expires the version the Iceberg pointer shows: engines load that
    snapshot by name until the next publish, so expiry and GC keep its files (a rolled-back
    segment's file here, which no newer version references)."""
    from millstream.clock import ManualClock
    from millstream.table.gc import collect_garbage

    clock = ManualClock(time.time())
    catalog.store.clock = clock
    kv = _kv(catalog, time="1s", min_versions=1)
    kv.batch(0, [(1, False, 0, 1, "a"), (2, False, 0, 2, "b")])
    shown = publish(catalog.store, catalog.deep, "kv").pointer
    assert shown is not None and shown.manifest_version == 1
    expected = millstream_rows(catalog, "kv", 1)
    kv.rollback(0, 0)  # version 2: the segment is gone, its file referenced by version 1 only
    clock.advance(3600)
    catalog.store.expire_versions("kv", now=clock.now())
    collect_garbage(catalog.store, catalog.deep, "kv", grace_seconds=0, clock=clock)
    assert catalog.store.read_pointer("kv") == shown  # nothing published since
    metadata = location(catalog.deep, shown.metadata_location)
    assert pyiceberg_rows(metadata, None, s3_properties(catalog)) == expected
    assert duckdb_rows(duckdb_connection(catalog), metadata) == expected
    # The next publish shows version 2 and lets version 1 go.
    moved = publish(catalog.store, catalog.deep, "kv").pointer
    assert moved is not None and moved.manifest_version == 2
    catalog.store.expire_versions("kv", now=clock.now())
    assert catalog.store.oldest_kept_version("kv") == 2
    current = location(catalog.deep, moved.metadata_location)
    assert pyiceberg_rows(current, None, s3_properties(catalog)) == []


def test_a_first_publish_whose_version_expires_and_is_collected_meanwhile_moves_no_pointer(
    catalog: Catalog, monkeypatch: Any
) -> None:
    """The race of garbage collection with a table's first publish: with no pointer yet,
    nothing keeps the version a publish is writing a snapshot of. Here, between the publish's
    read of version 1 and its pointer swap, a rollback commits version 2, retention expires
    version 1 and GC deletes its file. The pointer must not then name a snapshot whose file is
    gone: the publish moves nothing, and the next one shows version 2."""
    from millstream.clock import ManualClock
    from millstream.table.gc import collect_garbage

    clock = ManualClock(time.time())
    catalog.store.clock = clock
    kv = _kv(catalog, time="1s", min_versions=1)
    kv.batch(0, [(1, False, 0, 1, "a"), (2, False, 0, 2, "b")])
    real = catalog.store.version_committed_at
    raced: list[int] = []

    def expire_and_collect_first(table: str, version: int) -> float:
        # Called by publish after it computed the view of ``version``, before the swap.
        if not raced:
            raced.append(version)
            kv.rollback(0, 0)  # version 2: version 1's file is referenced by version 1 only
            clock.advance(3600)
            catalog.store.expire_versions("kv", now=clock.now())
            collect_garbage(catalog.store, catalog.deep, "kv", grace_seconds=0, clock=clock)
            assert catalog.store.oldest_kept_version("kv") == 2
        return real(table, version)

    monkeypatch.setattr(catalog.store, "version_committed_at", expire_and_collect_first)
    result = publish(catalog.store, catalog.deep, "kv")
    assert raced == [1]
    pointer = catalog.store.read_pointer("kv")
    if pointer is not None:  # whatever it names reads, as Millstream reads that version
        metadata = location(catalog.deep, pointer.metadata_location)
        assert pyiceberg_rows(metadata, None, s3_properties(catalog)) == millstream_rows(
            catalog, "kv", pointer.manifest_version
        )
    assert not result.published and pointer is None
    monkeypatch.undo()
    again = publish(catalog.store, catalog.deep, "kv")
    assert again.published and again.pointer is not None
    assert again.pointer.manifest_version == 2
    metadata = location(catalog.deep, again.pointer.metadata_location)
    assert pyiceberg_rows(metadata, None, s3_properties(catalog)) == []


def test_a_publish_stalled_past_gcs_grace_before_its_swap_moves_no_pointer(
    catalog: Catalog, monkeypatch: Any
) -> None:
    """A publisher that froze between writing a snapshot's files and the pointer's
    compare-and-set (a paused VM, SIGSTOP, a long GC pause) for longer than the view's garbage
    collection grace: meanwhile a maintainer found those files unreferenced and old enough,
    and deleted them. The pointer must not then name that metadata (every engine would fail
    to read the table): the publish is refused and moves nothing, its supervised loop counts
    the refusal naming the table, and its next turn publishes the version again, building on
    the snapshot the pointer still shows (whose files the collection kept)."""
    from millstream.clock import ManualClock
    from millstream.sealing.maintenance import Publisher
    from millstream.table.gc import DEFAULT_GRACE_SECONDS
    from millstream.table.maintain import maintain

    # Starts at the real time: the deep store dates the files it writes by the real clock.
    clock = ManualClock(time.time())
    catalog.store.clock = clock
    kv = _kv(catalog)
    tables = {"kv": ["kv"]}
    publisher = Publisher(catalog, interval=15, clock=clock)
    kv.batch(0, [(1, False, 0, 1, "a"), (2, False, 0, 2, "b")])
    publisher.run_due(tables)
    shown = catalog.store.read_pointer("kv")
    assert shown is not None and shown.manifest_version == 1
    kv.batch(0, [(2, False, 1, 3, "c"), (3, False, 0, 4, "d")])  # version 2
    real_swap = catalog.store.swap_pointer
    stalled: list[str] = []

    def stall_then_swap(table: str, *args: Any, **kwargs: Any) -> Any:
        # Called by publish once every file of its snapshot is written, right before the
        # compare-and-set: the publisher freezes here for twice the grace period, and a
        # maintainer (whose process publishes nothing: the publisher runs in its own) runs.
        stalled.append(kwargs["metadata_location"])
        clock.advance(2 * DEFAULT_GRACE_SECONDS)
        maintain(
            catalog.store,
            catalog.deep,
            "kv",
            grace_seconds=DEFAULT_GRACE_SECONDS,
            clock=clock,
            publish_view=False,
        )
        assert not catalog.deep.exists(kwargs["metadata_location"])  # collected meanwhile
        return real_swap(table, *args, **kwargs)

    monkeypatch.setattr(catalog.store, "swap_pointer", stall_then_swap)
    clock.advance(15)
    publisher.run_due(tables)
    assert len(stalled) == 1
    monkeypatch.undo()

    # Whatever the pointer names reads, as Millstream reads that version.
    pointer = catalog.store.read_pointer("kv")
    assert pointer is not None
    metadata = location(catalog.deep, pointer.metadata_location)
    expected = millstream_rows(catalog, "kv", pointer.manifest_version)
    assert pyiceberg_rows(metadata, None, s3_properties(catalog)) == expected
    assert duckdb_rows(duckdb_connection(catalog), metadata) == expected
    assert pointer == shown  # nothing moved
    (status,) = publisher.loop_statuses(alive=True)
    assert status.loop == "publisher" and status.errors == 1
    assert status.last_error is not None and "'kv'" in status.last_error

    # The next turn (after the loop's backoff) publishes version 2 on the kept snapshot.
    assert status.next_attempt_at is not None
    clock.advance(status.next_attempt_at - clock.now() + 1)
    publisher.run_due(tables)
    again = catalog.store.read_pointer("kv")
    assert again is not None and again.manifest_version == 2
    assert publisher.status()["kv"]["last"]["incremental"] == 1
    metadata = location(catalog.deep, again.metadata_location)
    expected = millstream_rows(catalog, "kv", 2)
    assert pyiceberg_rows(metadata, None, s3_properties(catalog)) == expected
    assert duckdb_rows(duckdb_connection(catalog), metadata) == expected
    (status,) = publisher.loop_statuses(alive=True)
    assert status.consecutive_failures == 0
