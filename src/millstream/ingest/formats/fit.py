"""Fitting decoded values to the table's columns, shared by every record format.

A format decodes a batch into one Arrow array per column it carries, in the source's own
type; :func:`fit_column` casts it to the column's type, and a value that does not fit (a
string that is no timestamp, a long that overflows an int) makes an error for its row that
names the column. Whether a source type may be cast at all is the format's decision
(:func:`millstream.ingest.formats.avro` refuses a string for a double, as JSON does).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from millstream.spec import TableSpec
from millstream.types import (
    arrow_type,
    decimal_overflow,
    from_arrow,
    has_decimal,
    overflowing_decimal_text,
)


@dataclass(slots=True)
class Parsed:
    """A format's answer for a batch of live values: ``table`` (the table's columns, typed)
    holds row ``j`` for value ``positions[j]``; ``bad`` maps a value's position to the reason
    it was not decoded. ``deletes`` (a bool per row; None: no row is one) marks the rows that
    are deletes of their key (a Debezium ``op: d``), as a tombstone is."""

    table: pa.Table
    positions: np.ndarray
    bad: dict[int, str] = field(default_factory=dict)
    deletes: np.ndarray | None = None


def cast_strings(arr: pa.Array, target: pa.DataType) -> pa.Array:
    """Cast strings to ``target``; timestamps are ISO-8601 with "Z" or an offset, and a
    timestamp without a zone is taken as UTC."""
    if pa.types.is_timestamp(target):
        if pc.all(pc.ends_with(arr, "Z")).as_py() is not False:
            return arr.cast(target)  # all UTC already: no regex pass needed
        zoned = pc.match_substring_regex(arr, r"(Z|[+-]\d\d:?\d\d)$")
        arr = pc.if_else(zoned, arr, pc.binary_join_element_wise(arr, "Z", ""))
    return arr.cast(target)


def _cast(arr: pa.Array, target: pa.DataType) -> pa.Array:
    if pa.types.is_string(arr.type) and not pa.types.is_string(target):
        return cast_strings(arr, target)
    return arr.cast(target)


def fit_column(
    arr: pa.Array | pa.ChunkedArray, target: pa.DataType, name: str
) -> tuple[pa.Array, dict[int, str]]:
    """``arr`` cast to ``target``: positions whose value does not fit become errors (and
    null), the rest cast in one vectorized call when every value fits."""
    combined = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
    fitted, errors = _fit(combined, target, name)
    if has_decimal(target):
        return _no_overflow(fitted, errors, name)
    return fitted, errors


def _fit(combined: pa.Array, target: pa.DataType, name: str) -> tuple[pa.Array, dict[int, str]]:
    if combined.type == target:
        return combined, {}
    if target == pa.binary() and pa.types.is_string(combined.type):
        return combined.cast(pa.binary()), {}
    try:
        return _cast(combined, target), {}
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    errors: dict[int, str] = {}
    out: list[Any] = []
    for i, v in enumerate(combined.to_pylist()):
        try:
            out.append(_cast(pa.array([v], combined.type), target)[0].as_py())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            if has_decimal(target) or pa.types.is_nested(target):
                errors[i] = f"column {name!r}: {v!r} does not fit {from_arrow(target)}"
            else:
                errors[i] = f"column {name!r}: {v!r} is not a valid {target}"
            out.append(None)
    return pa.array(out, target), errors


def _no_overflow(
    arr: pa.Array, errors: dict[int, str], name: str
) -> tuple[pa.Array, dict[int, str]]:
    """A decimal with more integer digits than its precision is an error of its row (and
    null), never stored: Arrow builds such values without complaint in places (its JSON
    reader takes "1234.5" for a decimal(5,2)), and Parquet would keep them."""
    over = decimal_overflow(arr)
    if not over.any():
        return arr, errors
    errors = dict(errors)
    values = arr.to_pylist() if not pa.types.is_decimal(arr.type) else None
    for i in np.flatnonzero(over).tolist():
        text = overflowing_decimal_text(arr[i]) if values is None else values[i]
        errors.setdefault(
            i, f"column {name!r}: decimal overflow: {text} does not fit {from_arrow(arr.type)}"
        )
    return pc.if_else(pa.array(over), pa.nulls(len(arr), arr.type), arr), errors


def fit_values(
    values: list[Any], target: pa.DataType, name: str
) -> tuple[pa.Array, dict[int, str]]:
    """Python values (a nested format's decoded records) as ``target``: a value that does not
    convert is an error of its row naming the column, and null."""
    try:
        arr = pa.array(values, target)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError):
        arr = None
    if arr is not None:
        return fit_column(arr, target, name)
    errors: dict[int, str] = {}
    out: list[Any] = []
    for i, v in enumerate(values):
        try:
            pa.array([v], target)
            out.append(v)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError) as e:
            errors[i] = f"column {name!r}: {v!r} does not fit {from_arrow(target)} ({e})"
            out.append(None)
    arr, more = fit_column(pa.array(out, target), target, name)
    return arr, {**more, **errors}


def assemble(
    spec: TableSpec, n: int, columns: dict[str, pa.Array]
) -> tuple[pa.Table, dict[int, str]]:
    """The table's columns from ``columns`` (in any source type; a missing column is null):
    every column fitted to its type, with the errors of the rows that do not fit (the first
    error of a row wins)."""
    out: dict[str, pa.Array] = {}
    errors: dict[int, str] = {}
    for c, t in spec.columns.items():
        target = arrow_type(t)
        arr = columns.get(c)
        if arr is None:
            out[c] = pa.nulls(n, target)
            continue
        fitted, errs = fit_column(arr, target, c)
        for j, e in errs.items():
            errors.setdefault(j, e)
        out[c] = fitted
    return pa.table(out, schema=spec.arrow_schema()), errors


def drop_rows(parsed: Parsed, errors: dict[int, str]) -> Parsed:
    """``parsed`` without the rows (table positions) in ``errors``, which become bad values."""
    if not errors:
        return parsed
    keep = np.ones(parsed.table.num_rows, dtype=bool)
    keep[list(errors)] = False
    bad = dict(parsed.bad)
    for j, e in errors.items():
        bad.setdefault(int(parsed.positions[j]), e)
    deletes = None if parsed.deletes is None else parsed.deletes[keep]
    return Parsed(parsed.table.filter(pa.array(keep)), parsed.positions[keep], bad, deletes)


def concat(spec: TableSpec, parts: list[Parsed]) -> Parsed:
    """One :class:`Parsed` from several (for disjoint positions of one batch)."""
    if not parts:
        return Parsed(spec.arrow_schema().empty_table(), np.zeros(0, dtype=np.int64))
    if len(parts) == 1:
        return parts[0]
    bad: dict[int, str] = {}
    for p in parts:
        bad.update(p.bad)
    deletes = None
    if any(p.deletes is not None for p in parts):
        deletes = np.concatenate(
            [
                np.zeros(p.table.num_rows, dtype=bool) if p.deletes is None else p.deletes
                for p in parts
            ]
        )
    return Parsed(
        pa.concat_tables([p.table for p in parts]),
        np.concatenate([p.positions for p in parts]),
        bad,
        deletes,
    )


def all_rejected(spec: TableSpec, positions: np.ndarray, reason: str) -> Parsed:
    """No rows: every value at ``positions`` is refused for ``reason`` (a writer schema the
    table's schema cannot take)."""
    return Parsed(
        spec.arrow_schema().empty_table(),
        np.zeros(0, dtype=np.int64),
        {int(p): reason for p in positions},
    )
