"""Commits for the Iceberg publisher's tests: a ``{k: long, v: string}`` table's rows staged
and committed as a writer's batch would be, on partition 0."""

from __future__ import annotations

import pyarrow as pa

from millstream.catalog import Catalog
from millstream.table.writer import commit_staged, stage_rows


def commit_keys(cat: Catalog, table: str, keys: list[int], lo: int) -> None:
    """Commit one row per key (``v`` = ``"at <offset>"``) at offsets ``lo``, ``lo + 1``, ...
    of partition 0."""
    spec = cat.table(table).spec
    rows = pa.Table.from_pylist(
        [
            {
                "k": k,
                "v": f"at {lo + i}",
                "_ms_partition": 0,
                "_ms_offset": lo + i,
                "_ms_tombstone": False,
            }
            for i, k in enumerate(keys)
        ],
        schema=spec.arrow_schema(system_columns=True),
    )
    commit_staged(
        cat.store, cat.deep, table, stage_rows(cat.deep, spec, rows), {0: (lo, lo + len(keys))}, {}
    )
