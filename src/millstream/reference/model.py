"""Reference sequential models of the merge engines: the oracle tests hold everything to.

Deliberately naive: plain Python over dict rows, one row at a time, per key in the order key
``(effective comparison value with nulls first, partition, offset)``. No Arrow, no
vectorization, so it shares no code path with :mod:`millstream.core.merge`.

A row's effective comparison value is its comparison value; a delete (tombstone or
``delete_column`` true) without one takes the highest comparison value of its key at lower
offsets of its partition (none if there is none).

A row is a dict with the table's columns plus ``_ms_partition``, ``_ms_offset`` and
``_ms_tombstone``.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import date, datetime
from typing import Any

from millstream.spec import OFFSET_COL, PARTITION_COL, TOMBSTONE_COL, TableSpec

Row = dict[str, Any]


def is_delete(spec: TableSpec, row: Row) -> bool:
    if row.get(TOMBSTONE_COL):
        return True
    return bool(spec.delete_column and row.get(spec.delete_column))


def effective_comparison_values(spec: TableSpec, key_rows: list[Row]) -> dict[tuple[int, int], Any]:
    """The effective comparison value of each row of one key, by (partition, offset): walk each
    partition in offset order keeping the highest value seen so far."""
    column = spec.comparison_column
    out: dict[tuple[int, int], Any] = {}
    if column is None:
        return out
    highest: dict[int, Any] = {}
    for r in sorted(key_rows, key=lambda r: (r[PARTITION_COL], r[OFFSET_COL])):
        p = r[PARTITION_COL]
        value = r.get(column)
        if value is None and is_delete(spec, r):
            value = highest.get(p)
        out[(p, r[OFFSET_COL])] = value
        if value is not None and (highest.get(p) is None or value > highest[p]):
            highest[p] = value
    return out


def order_key(effective: Any, row: Row) -> tuple[Any, ...]:
    """(has a value, value, partition, offset): rows without an effective value come first."""
    has = effective is not None
    return (has, effective if has else 0, row[PARTITION_COL], row[OFFSET_COL])


def _seconds(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, date):
        return float(value.toordinal() * 86400)
    return float(value) / 1000.0


def _fold(spec: TableSpec, strategy: str, old: Any, new: Any) -> Any:
    if strategy == "overwrite":
        return new
    if new is None:
        return old
    if old is None:
        return new
    if strategy == "ignore_null":
        return new
    if strategy == "max":
        return max(old, new)
    if strategy == "min":
        return min(old, new)
    if strategy == "sum":
        return old + new
    if strategy == "append":
        return f"{old},{new}"
    raise AssertionError(strategy)


def model_rows(spec: TableSpec, rows: Iterable[Row]) -> list[Row]:
    """The current rows of the table holding ``rows``, as the sequential model defines them.

    Returns rows with user columns only, in no particular order (compare as multisets).
    """
    user_cols = list(spec.columns)
    if spec.mode == "append":
        return [{c: r.get(c) for c in user_cols} for r in rows]
    keyed: dict[tuple[Any, ...], list[Row]] = {}
    for r in rows:
        keyed.setdefault(tuple(r.get(k) for k in spec.primary_key), []).append(r)
    ttl = spec.ttl.total_seconds() if spec.ttl is not None else None
    out: list[Row] = []
    for key_rows in keyed.values():
        effective = effective_comparison_values(spec, key_rows)
        key_rows.sort(key=lambda r: order_key(effective.get((r[PARTITION_COL], r[OFFSET_COL])), r))
        if spec.mode == "upsert":
            last = key_rows[-1]
            if not is_delete(spec, last):
                out.append({c: last.get(c) for c in user_cols})
        elif spec.mode == "dedup":
            kept: list[Row] = []
            for r in key_rows:
                if is_delete(spec, r):
                    kept = []
                    continue
                if kept:
                    t_new = _seconds(r.get(spec.time_column)) if spec.time_column else None
                    t_old = _seconds(kept[-1].get(spec.time_column)) if spec.time_column else None
                    if ttl is None or t_new is None or t_old is None or t_new - t_old < ttl:
                        continue
                kept.append(r)
            out.extend({c: r.get(c) for c in user_cols} for r in kept)
        else:  # partial
            state: Row | None = None
            for r in key_rows:
                if is_delete(spec, r):
                    state = None
                elif state is None:
                    state = {c: r.get(c) for c in user_cols}
                else:
                    for c in user_cols:
                        if c not in spec.primary_key:
                            state[c] = _fold(spec, spec.strategy(c), state[c], r.get(c))
            if state is not None:
                out.append(state)
    return out


def canonical(rows: Iterable[Row]) -> list[tuple[tuple[str, Any], ...]]:
    """Rows as a sorted list of hashable tuples, for multiset comparison in tests."""
    return sorted(
        (tuple(sorted(r.items())) for r in rows),
        key=lambda t: tuple((k, (v is None, repr(v))) for k, v in t),
    )
