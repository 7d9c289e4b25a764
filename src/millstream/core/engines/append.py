"""``append``: every row is kept. No key, no key index, nothing a seal may drop."""

from __future__ import annotations

import pyarrow as pa

from millstream.core.engines.base import MergeEngine
from millstream.core.merge import DEL, EFF, IDX, in_order, seal_order


class Append(MergeEngine):
    """Every row, in position (partition, offset) order. A comparison column, if the spec
    names one, orders nothing."""

    mode = "append"

    def resolve(self, rows: pa.Table) -> pa.Table:
        return in_order(self.spec, rows, by_key=False).drop_columns([IDX, DEL])

    def compact(self, rows: pa.Table, *, floor: pa.Table | None = None) -> pa.Table:
        ordered = in_order(self.spec, rows, by_key=False)
        if EFF in ordered.column_names:
            ordered = ordered.drop_columns([EFF])
        return seal_order(self.spec, ordered)
