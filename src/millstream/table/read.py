"""Snapshot reads: merge-on-read of one manifest version, returning Arrow (no Spark needed)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.compute as pc

from millstream.core.merge import resolve
from millstream.errors import SegmentUnavailableError
from millstream.metastore.models import Entry, Manifest
from millstream.spec import OFFSET_COL, PARTITION_COL, SYSTEM_COLUMNS, TableSpec
from millstream.storage.deepstore import DeepStore

READ_THREADS = 8


def _valid_rows(data: pa.Table, entries: Iterable[Entry]) -> pa.Table:
    """Keep only rows some entry declares valid: its partition and offset range."""
    part = data.column(PARTITION_COL)
    off = data.column(OFFSET_COL)
    mask = None
    for e in entries:
        m = pc.and_(
            pc.equal(part, e.partition),
            pc.and_(pc.greater_equal(off, e.start), pc.less(off, e.end)),
        )
        mask = m if mask is None else pc.or_(mask, m)
    assert mask is not None
    return data.filter(mask)


def read_entries(deep: DeepStore, spec: TableSpec, entries: Iterable[Entry]) -> pa.Table:
    """The raw rows (with system columns) of ``entries``, before merging. Each data file is
    read once even when it holds several partitions' segments."""
    by_file: dict[str, list[Entry]] = defaultdict(list)
    for e in entries:
        if e.file_path is not None:
            by_file[e.file_path].append(e)
    schema = spec.arrow_schema(system_columns=True)
    if not by_file:
        return schema.empty_table()

    def load(item: tuple[str, list[Entry]]) -> pa.Table:
        path, file_entries = item
        try:
            data = deep.read_parquet(path)
        except (OSError, pa.ArrowInvalid) as exc:
            e = file_entries[0]
            raise SegmentUnavailableError(
                spec.name, e.name, path, str(exc).splitlines()[0]
            ) from exc
        return _valid_rows(data.select(schema.names).cast(schema), file_entries)

    items = sorted(by_file.items())
    if len(items) == 1:
        parts = [load(items[0])]
    else:
        with ThreadPoolExecutor(max_workers=min(READ_THREADS, len(items))) as pool:
            parts = list(pool.map(load, items))
    return pa.concat_tables(parts)


def read_manifest(
    deep: DeepStore, manifest: Manifest, *, include_system_columns: bool = False
) -> pa.Table:
    """The table's current rows at ``manifest``'s version, merged by its engine."""
    spec = manifest.table.spec
    rows = resolve(spec, read_entries(deep, spec, manifest.entries))
    if include_system_columns:
        return rows
    return rows.drop_columns(list(SYSTEM_COLUMNS))
