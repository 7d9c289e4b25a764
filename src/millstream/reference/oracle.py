"""The source-side oracle: what a table must hold after ingesting a list of raw records.

Decodes each record on its own with ``json.loads`` (no Arrow, no bisection: a code path
independent of :mod:`millstream.ingest.decode`), then applies the sequential model. Used by the
integration tests and by ``make demo``'s final ``OK: table matches the source model`` check.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, date, datetime
from typing import Any

from millstream.reference.model import Row, model_rows
from millstream.spec import OFFSET_COL, PARTITION_COL, TOMBSTONE_COL, TableSpec

RawRecord = tuple[int, int, bytes | None, bytes | None]  # partition, offset, key, value


def _typed(kind: str, v: Any) -> Any:
    if v is None:
        return None
    if kind in ("long", "int"):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{v!r} is not an integer")
        return v
    if kind == "double":
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ValueError(f"{v!r} is not a number")
        return float(v)
    if kind == "boolean":
        if not isinstance(v, bool):
            raise ValueError(f"{v!r} is not a boolean")
        return v
    if not isinstance(v, str):
        raise ValueError(f"{v!r} is not a string")
    if kind == "timestamp":
        ts = datetime.fromisoformat(v)
        return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)
    if kind == "date":
        return date.fromisoformat(v)
    if kind == "binary":
        return v.encode()
    return v


def _record_key(spec: TableSpec, key: bytes | None) -> dict[str, Any]:
    if key is None:
        return {}
    try:
        obj = json.loads(key)
    except ValueError:
        obj = key.decode()
    if isinstance(obj, dict):
        return {k: obj.get(k) for k in spec.primary_key}
    if len(spec.primary_key) == 1:
        kind = spec.columns[spec.primary_key[0]]
        if kind in ("long", "int") and isinstance(obj, str):
            obj = int(obj)
        return {spec.primary_key[0]: obj}
    return {}


def decode_one(spec: TableSpec, rec: RawRecord) -> Row | None:
    """The table row of one raw record (with system columns), or None if it is bad."""
    partition, offset, key, value = rec
    sys_cols = {PARTITION_COL: partition, OFFSET_COL: offset, TOMBSTONE_COL: value is None}
    try:
        if value is None:
            if not spec.keyed:
                return None
            k = _record_key(spec, key)
            if any(k.get(c) is None for c in spec.primary_key):
                return None
            row: Row = dict.fromkeys(spec.columns)
            row.update({c: _typed(spec.columns[c], k[c]) for c in spec.primary_key})
            return {**row, **sys_cols}
        obj = json.loads(value)
        if not isinstance(obj, dict):
            return None
        row = {c: _typed(t, obj.get(c)) for c, t in spec.columns.items()}
        if spec.keyed and any(row[c] is None for c in spec.primary_key):
            k = _record_key(spec, key)
            for c in spec.primary_key:
                if row[c] is None and k.get(c) is not None:
                    row[c] = _typed(spec.columns[c], k[c])
            if any(row[c] is None for c in spec.primary_key):
                return None
        cmp, deleted = spec.comparison_column, spec.delete_column
        if spec.keyed and cmp is not None and row[cmp] is None and not (deleted and row[deleted]):
            return None  # only a delete may lack the comparison value
        return {**row, **sys_cols}
    except (ValueError, TypeError, UnicodeDecodeError):
        return None


def expected_table(
    spec: TableSpec, records: Iterable[RawRecord]
) -> tuple[list[Row], list[tuple[int, int]]]:
    """(the model's rows, the (partition, offset) of every bad record)."""
    good: list[Row] = []
    bad: list[tuple[int, int]] = []
    for rec in records:
        row = decode_one(spec, rec)
        if row is None:
            bad.append((rec[0], rec[1]))
        else:
            good.append(row)
    return model_rows(spec, good), bad
