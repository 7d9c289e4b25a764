"""What a data file's Parquet footer proves about its rows, so a read may skip work.

A read checks every row against the range of its entry (``_ms_partition`` equal, ``_ms_offset``
in ``[start, end)``: a trimmed entry's file holds rows below its start) and drops the rows its
partition's delete vectors name (by ``_ms_offset``). Both need the ``_ms_offset`` column, about
a quarter of a sealed file's bytes, that the answer itself does not show. The footer's
statistics (each row group's minimum, maximum and null count of a column) are written by the
same writer from the same values, so when they place every row inside the entry's range, and
no vector offset inside ``[min, max]`` of the file's offsets, no row can fail either check,
and the column need not be read. A statistic that is missing proves nothing: the file is then
read and checked row by row, as before.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from millstream.metastore.models import Entry
from millstream.spec import OFFSET_COL, PARTITION_COL


def _span(metadata: pq.FileMetaData, column: str) -> tuple[Any, Any] | None:
    """The lowest and highest value of a top-level ``column`` over the file's row groups, if
    every row group with rows has both and counts no null; else None."""
    index = {metadata.schema.column(i).path: i for i in range(metadata.num_columns)}
    if column not in index:
        return None
    lo: Any = None
    hi: Any = None
    for g in range(metadata.num_row_groups):
        group = metadata.row_group(g)
        if group.num_rows == 0:
            continue
        stats = group.column(index[column]).statistics
        if stats is None or not stats.has_min_max or not stats.has_null_count:
            return None
        if stats.null_count != 0:
            return None
        lo = stats.min if lo is None else min(lo, stats.min)
        hi = stats.max if hi is None else max(hi, stats.max)
    if lo is None:
        return None
    return lo, hi


def rows_proven_valid(metadata: pq.FileMetaData, entry: Entry, deleted: pa.Array | None) -> bool:
    """Whether ``metadata`` (the footer of ``entry``'s data file, holding that entry alone)
    proves that every row of the file is ``entry``'s (its partition, an offset in ``[start,
    end)``) and that none is named by ``deleted`` (the offsets of the partition's delete
    vectors): then the file's rows need neither the range mask nor the vectors, nor their
    ``_ms_offset`` column. False whenever a statistic it needs is missing."""
    if metadata.num_rows == 0:
        return True
    partitions = _span(metadata, PARTITION_COL)
    offsets = _span(metadata, OFFSET_COL)
    if partitions is None or offsets is None:
        return False
    if partitions != (entry.partition, entry.partition):
        return False
    lo, hi = offsets
    if lo < entry.start or hi >= entry.end:
        return False
    if deleted is None or len(deleted) == 0:
        return True
    inside = pc.and_(pc.greater_equal(deleted, lo), pc.less_equal(deleted, hi))
    return not pc.any(inside).as_py()
