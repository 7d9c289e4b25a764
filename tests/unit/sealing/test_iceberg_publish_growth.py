"""A long-lived publisher's round grows with what changed since a table's last published view,
not with every unsealed entry (issue 38): which rows of a data file lie in its segments is
computed once per file and segments (``PublishCache.in_segments``), and computed again when
the file's segments change while the file stays, as a seal of one partition of a micro-batch
file shared by two partitions does. The view read by DuckDB and pyiceberg equals Millstream's
read after every publish."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from harness.iceberg_readers import duckdb_connection, duckdb_rows, pyiceberg_rows
from millstream.catalog import Catalog
from millstream.reference.model import canonical
from millstream.sealing.keyindex import IndexCache
from millstream.sealing.sealer import Sealer
from millstream.table.iceberg import PublishCache, location, publish
from millstream.table.writer import commit_staged, stage_rows


def _commit(cat: Catalog, rows: dict[int, list[tuple[int, str]]], upper: dict[int, int]) -> None:
    """One micro-batch file holding the rows of every partition in ``rows``."""
    spec = cat.table("t").spec
    out: list[dict[str, Any]] = []
    ranges: dict[int, tuple[int, int]] = {}
    for p, kvs in sorted(rows.items()):
        lo = upper.get(p, 0)
        out += [
            {"k": k, "v": v, "_ms_partition": p, "_ms_offset": lo + i, "_ms_tombstone": False}
            for i, (k, v) in enumerate(kvs)
        ]
        ranges[p] = (lo, lo + len(kvs))
        upper[p] = lo + len(kvs)
    batch = pa.Table.from_pylist(out, schema=spec.arrow_schema(system_columns=True))
    commit_staged(cat.store, cat.deep, "t", stage_rows(cat.deep, spec, batch), ranges, {})


def _check(cat: Catalog, cache: PublishCache) -> dict[str, int]:
    result = publish(cat.store, cat.deep, "t", cache=cache)
    assert result.published and result.pointer is not None
    metadata = location(cat.deep, result.pointer.metadata_location)
    expected = canonical(cat.read_table("t").to_pylist())
    assert pyiceberg_rows(metadata) == expected
    assert duckdb_rows(duckdb_connection(), metadata) == expected
    return result.stats


def test_a_seal_of_one_partition_of_a_shared_file_hides_that_partitions_rows_in_it(
    tmp_path: Path,
) -> None:
    """Micro-batch files each hold rows of partitions 0 and 1; incremental publishes compute
    and keep which rows of each file lie in its segments. Then partition 0 is sealed: its
    rows move to a sealed file, and the micro-batch files keep only partition 1's segments.
    The next incremental publish hides partition 0's rows in those files (their segments
    changed: computed again); with the mask of their earlier segments, those rows would count
    twice (in the sealed file too) and the publish fails or shows a superseded row."""
    with Catalog.open(home=tmp_path) as cat:
        cat.create_table(
            {
                "name": "t",
                "schema": {"k": "long", "v": "string"},
                "mode": "upsert",
                "primary_key": ["k"],
            }
        )
        cache = PublishCache()
        upper: dict[int, int] = {}
        _commit(cat, {0: [(1, "a"), (2, "b")], 1: [(10, "x")]}, upper)
        assert _check(cat, cache)["incremental"] == 0  # the first publish reads in full
        _commit(cat, {0: [(1, "a2"), (3, "c")], 1: [(11, "y")]}, upper)
        assert _check(cat, cache)["incremental"] == 1  # every file's segment mask computed
        _commit(cat, {0: [(2, "b2")], 1: [(10, "x2")]}, upper)
        assert _check(cat, cache)["incremental"] == 1
        shared = {e.file_path for e in cat.manifest("t").entries}
        Sealer(cat, "t", index_cache=IndexCache()).seal_partition(0, force=True)
        entries = cat.manifest("t").entries
        # The micro-batch files stay, with partition 1's segments only.
        assert {e.file_path for e in entries if e.partition == 1} == shared
        assert not shared & {e.file_path for e in entries if e.partition == 0}
        stats = _check(cat, cache)
        assert stats["incremental"] == 1 and stats["read_in_full"] == 0
        _commit(cat, {0: [(1, "a3")], 1: [(11, "y2")]}, upper)
        assert _check(cat, cache)["incremental"] == 1
