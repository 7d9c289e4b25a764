"""A busy table's publish writes a data manifest of its new files and lists the earlier ones
again, merging them by tiers (``MANIFEST_MERGE_FANOUT``): before, past 16 manifests every
publish of 16 wrote the entry of every live file again, so a publish's cost grew with the
table's files, not with its change (issue 38). A manifest is listed again only while every file
it lists is still in the view: after a seal replaced the micro-batch files, every snapshot
still reads in DuckDB and pyiceberg exactly as Millstream reads its version."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pyiceberg.manifest import ManifestContent
from pyiceberg.table import StaticTable

from harness.iceberg_readers import duckdb_connection, duckdb_rows, pyiceberg_rows
from harness.publish_support import commit_keys, create_kv_table
from millstream.catalog import Catalog
from millstream.reference.model import canonical
from millstream.sealing.keyindex import IndexCache
from millstream.sealing.sealer import Sealer
from millstream.table.iceberg import PublishCache, location, publish


def _data_manifests(uri: str) -> int:
    table = StaticTable.from_metadata(uri)
    snapshot = table.current_snapshot()
    assert snapshot is not None
    return sum(m.content == ManifestContent.DATA for m in snapshot.manifests(table.io))


def _kv(rows: list[Any]) -> list[Any]:
    """Rows (dicts, or a reader's canonical pairs) as their key and value, canonical."""
    return canonical({"k": dict(r)["k"], "v": dict(r)["v"]} for r in rows)


def test_a_publish_writes_the_entries_of_its_new_files_and_tiers_of_the_rest(
    tmp_path: Path,
) -> None:
    with Catalog.open(home=tmp_path) as cat:
        create_kv_table(cat, "kv")
        cache = PublishCache()
        con = duckdb_connection()
        written: list[int] = []
        lo = 0
        for i in range(40):
            commit_keys(cat, "kv", [i % 7, 100 + i], lo)  # a new file; key i % 7 updated
            lo += 2
            if i == 30:  # the 31 micro-batch files replaced by one sealed segment
                Sealer(cat, "kv", index_cache=IndexCache()).seal_partition(0, force=True)
            result = publish(cat.store, cat.deep, "kv", cache=cache)
            assert result.published and result.pointer is not None
            if i:
                assert result.stats["incremental"] == 1
                written.append(result.stats["data_entries_written"])
            uri = location(cat.deep, result.pointer.metadata_location)
            expected = _kv(cat.read_table("kv").to_pylist())
            assert _kv(duckdb_rows(con, uri)) == expected, i
            assert _kv(pyiceberg_rows(uri)) == expected, i
            assert _data_manifests(uri) <= 3 * 3 + 1  # 3 a tier below 64 files, and the new
        files = len(cat.manifest("kv").entries)
    # Each publish but the tier merges writes one entry (its new file); no publish wrote
    # every live file (the old rule did, every 16th: 17 and 33 entries here).
    assert max(written) <= 16, written
    assert sum(written) <= 3 * len(written), written
    assert sum(w == 1 for w in written) >= len(written) * 2 // 3, written
    assert files < 12  # the seal's segment and the micro-batch files since
