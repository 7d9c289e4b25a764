"""Decode and validate raw records against the table schema, vectorized.

Raw records (partition, offset, key, value) become table rows plus system columns. A record
that cannot be decoded or does not fit goes to the dead-letter rows with its partition, offset,
raw bytes and error text; it still counts toward the frontier (the sink commits the whole
offset range). A null value is a tombstone for keyed tables; its key comes from the record key.
With a comparison column, a record that is not a delete (tombstone or ``delete_column`` true)
and lacks the comparison value is bad: the merge order only derives a value for deletes.

JSON values are parsed by :mod:`millstream.ingest.formats.jsonblock` (one ``pyarrow.json``
call per batch, bisected around bad records).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from millstream.core.merge import lacks_comparison_value, missing_comparison_error
from millstream.datastream import dead_letter_spec
from millstream.ingest.formats import EnvelopeDecoder, RecordDecoder, SchemaDecoder
from millstream.ingest.formats.fit import cast_strings
from millstream.ingest.formats.jsonblock import VIA_STRING, parse_json
from millstream.ingest.formats.registry import SchemaNotFound
from millstream.spec import (
    OFFSET_COL,
    PARTITION_COL,
    TOMBSTONE_COL,
    TableSpec,
)
from millstream.types import arrow_type


@dataclass(frozen=True, slots=True)
class Decoded:
    rows: pa.Table  # table columns + system columns
    dead: list[
        tuple[int, int, bytes | None, bytes | None, str]
    ]  # partition, offset, raw, key, error


def decode_records(spec: TableSpec, raw: pa.Table, fmt: RecordDecoder | None = None) -> Decoded:
    """Decode raw records (RAW_SCHEMA, markers already removed) into table rows; ``fmt`` is
    the source's format (:func:`millstream.ingest.formats.decoder_for`; None: JSON)."""
    n = raw.num_rows
    parts = raw.column("partition").to_numpy()
    offs = raw.column("offset").to_numpy()
    values = raw.column("value").combine_chunks()
    keys = raw.column("key")
    dead: list[tuple[int, int, bytes | None, bytes | None, str]] = []

    record_keys = keys

    def kill(i: int, error: str) -> None:
        dead.append((int(parts[i]), int(offs[i]), values[i].as_py(), record_keys[i].as_py(), error))

    meta, meta_bad = _metadata(spec, fmt, raw)
    is_null = pc.is_null(values).to_numpy(zero_copy_only=False)
    any_null = bool(is_null.any())
    live_idx = np.flatnonzero(~is_null) if any_null else np.arange(n, dtype=np.int64)
    live_values = values.take(pa.array(live_idx)) if any_null else values
    if fmt is None:
        parsed = parse_json(spec, live_values)
    else:
        live_keys = keys.combine_chunks()
        parsed = fmt.parse(
            spec, live_values, live_keys.take(pa.array(live_idx)) if any_null else live_keys
        )
        if not fmt.record_keys:
            keys = pa.chunked_array([pa.nulls(n, pa.binary())])
    for pos, err in sorted(parsed.bad.items()):
        kill(int(live_idx[pos]), err)
    row_index = live_idx[parsed.positions]

    cast_errors: dict[int, str] = {}
    good = parsed.table
    good = good.append_column(PARTITION_COL, pa.array(parts[row_index].astype(np.int32)))
    good = good.append_column(OFFSET_COL, pa.array(offs[row_index].astype(np.int64)))
    deletes = parsed.deletes  # deletes in the values (a Debezium op d), as tombstones are
    if deletes is None:
        deletes = np.zeros(len(row_index), dtype=bool)
    good = good.append_column(TOMBSTONE_COL, pa.array(deletes))
    good = good.cast(spec.arrow_schema(system_columns=True))
    good = _set_columns(good, meta, row_index)
    for j in np.flatnonzero(np.isin(row_index, list(meta_bad))).tolist():
        cast_errors[j] = meta_bad[int(row_index[j])]

    # Keys: fill from the record key where the value lacks them; a null key is a bad record.
    if spec.keyed:
        good, key_errors = _fill_keys(spec, good, keys, row_index, fmt)
        for j, e in key_errors.items():
            cast_errors.setdefault(j, e)
    # A record that is not a delete must carry the comparison value (a tombstone never does).
    for position in np.flatnonzero(lacks_comparison_value(spec, good)).tolist():
        cast_errors.setdefault(position, missing_comparison_error(spec))
    if cast_errors:
        keep = np.ones(good.num_rows, dtype=bool)
        keep[list(cast_errors)] = False
        for j, e in sorted(cast_errors.items()):
            kill(int(row_index[j]), e)
        good = good.filter(pa.array(keep))

    tombstones = [int(i) for i in np.flatnonzero(is_null)] if any_null else []
    for i in [i for i in tombstones if i in meta_bad]:
        kill(i, meta_bad[i])
        tombstones.remove(i)
    if tombstones:
        stones, stone_errors = _tombstones(spec, tombstones, parts, offs, keys, fmt)
        for i, e in stone_errors:
            kill(i, e)
        failed = {i for i, _ in stone_errors}
        stone_index = np.asarray([i for i in tombstones if i not in failed], dtype=np.int64)
        good = pa.concat_tables([good, _set_columns(stones, meta, stone_index)])
    return Decoded(good.cast(spec.arrow_schema(system_columns=True)), dead)


def _set_columns(table: pa.Table, columns: dict[str, pa.Array], index: np.ndarray) -> pa.Table:
    """``table`` with ``columns`` (one value per raw record) taken at ``index`` (row ``j`` is
    raw record ``index[j]``'s)."""
    for c, arr in columns.items():
        i = table.schema.get_field_index(c)
        table = table.set_column(i, table.schema.field(c), arr.take(pa.array(index, pa.int64())))
    return table


def _metadata(
    spec: TableSpec, fmt: RecordDecoder | None, raw: pa.Table
) -> tuple[dict[str, pa.Array], dict[int, str]]:
    """The Kafka metadata columns (``source.metadata_columns``) of every raw record, typed,
    and the records whose metadata does not fit (a key that is no UTF-8 for a string column).
    A column the raw records do not carry (``timestamp``, ``headers``: only a reader that
    passes them on does) fails the batch rather than filling nulls."""
    if not isinstance(fmt, EnvelopeDecoder) or not fmt.kafka_metadata:
        return {}, {}
    n = raw.num_rows
    out: dict[str, pa.Array] = {}
    bad: dict[int, str] = {}
    for field, column in fmt.kafka_metadata.items():
        target = arrow_type(spec.columns[column])
        if field == "topic":
            out[column] = pa.array([fmt.topic] * n, pa.string())
            continue
        if field not in raw.column_names:
            raise ValueError(
                f"source.metadata_columns.{field}: the records read carry no {field!r} "
                f"(columns {raw.column_names})"
            )
        arr = raw.column(field).combine_chunks()
        if field == "timestamp" and pa.types.is_timestamp(target):
            arr = arr.cast(pa.int64()).cast(pa.timestamp("ms", tz="UTC"))
        elif field == "key" and pa.types.is_string(target):
            try:
                arr = arr.cast(pa.string())
            except pa.ArrowInvalid:
                texts = []
                for i, k in enumerate(arr.to_pylist()):
                    try:
                        texts.append(None if k is None else k.decode("utf-8"))
                    except UnicodeDecodeError:
                        bad.setdefault(i, f"metadata column {column!r}: the key is not UTF-8")
                        texts.append(None)
                arr = pa.array(texts, pa.string())
        out[column] = arr.cast(target)
    return out, bad


def _key_from_record(spec: TableSpec, key: bytes | None) -> dict[str, Any] | None:
    """The primary key carried by a record key: a JSON object (also inside Kafka Connect's
    ``{"schema": ..., "payload": {...}}`` wrapper), or the bare value of a single-column key."""
    if key is None:
        return None
    try:
        obj = json.loads(key)
    except (ValueError, UnicodeDecodeError):
        obj = key.decode("utf-8", errors="replace")
    if (
        isinstance(obj, dict)
        and set(obj) == {"schema", "payload"}
        and isinstance(obj["payload"], dict)
        and not {"schema", "payload"} & set(spec.primary_key)
    ):
        obj = obj["payload"]
    if isinstance(obj, dict):
        return {k: obj.get(k) for k in spec.primary_key}
    if len(spec.primary_key) == 1:
        return {spec.primary_key[0]: obj}
    return None


class _BadKey(ValueError):
    """A record key the format reads itself (an Avro key) that it cannot read."""


def _record_key(
    spec: TableSpec, fmt: RecordDecoder | None, key: bytes | None
) -> dict[str, Any] | None:
    """The primary key a record key carries: read by the format when it reads keys itself
    (keys in the wire format: Debezium's Avro keys, Protobuf keys;
    :meth:`SchemaDecoder.record_key`), else by the JSON rules. A registry that does not
    answer raises (the batch fails): a key is never given up on for that."""
    if key is not None and isinstance(fmt, (EnvelopeDecoder, SchemaDecoder)):
        try:
            found = fmt.record_key(spec, key)
        except SchemaNotFound as exc:
            raise _BadKey(str(exc) or "its schema id is unknown to the schema registry") from None
        except ValueError as exc:
            raise _BadKey(str(exc)) from None
        if found is not None:
            return found
    return _key_from_record(spec, key)


def _coerce(spec: TableSpec, column: str, value: Any) -> Any:
    if value is None:
        return None
    arr = pa.array([value])
    target = arrow_type(spec.columns[column])
    if pa.types.is_string(arr.type) and spec.columns[column] in VIA_STRING:
        return cast_strings(arr, target)[0].as_py()
    return arr.cast(target)[0].as_py()


def _fill_keys(
    spec: TableSpec,
    good: pa.Table,
    keys: pa.ChunkedArray,
    row_index: np.ndarray,
    fmt: RecordDecoder | None = None,
) -> tuple[pa.Table, dict[int, str]]:
    """Fill null key columns of ``good`` from the record keys (``keys[row_index[j]]`` is row
    ``j``'s); the keys are looked at only for rows that lack a key column."""
    errors: dict[int, str] = {}
    missing = None
    for k in spec.primary_key:
        m = pc.is_null(good.column(k))
        missing = m if missing is None else pc.or_(missing, m)
    if missing is None or not pc.any(missing).as_py():
        return good, errors
    cols = {k: good.column(k).to_pylist() for k in spec.primary_key}
    for j in pc.indices_nonzero(missing).to_pylist():
        try:
            from_key = _record_key(spec, fmt, keys[int(row_index[j])].as_py())
            for k in spec.primary_key:
                if cols[k][j] is None and from_key is not None:
                    cols[k][j] = _coerce(spec, k, from_key.get(k))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError, TypeError):
            pass
        absent = [k for k in spec.primary_key if cols[k][j] is None]
        if absent:
            errors[j] = f"primary key column {absent[0]!r} is null"
    for k in spec.primary_key:
        idx = good.schema.get_field_index(k)
        good = good.set_column(
            idx, good.schema.field(k), pa.array(cols[k], good.schema.field(k).type)
        )
    return good, errors


def _tombstones(
    spec: TableSpec,
    idx: list[int],
    parts: Any,
    offs: Any,
    keys: pa.ChunkedArray,
    fmt: RecordDecoder | None = None,
) -> tuple[pa.Table, list[tuple[int, str]]]:
    errors: list[tuple[int, str]] = []
    rows: list[dict[str, Any]] = []
    for i in idx:
        if not spec.keyed:
            errors.append((i, "null value (tombstone) in an append table"))
            continue
        why = ""
        try:
            key = _record_key(spec, fmt, keys[i].as_py())
            row = {k: _coerce(spec, k, key.get(k)) for k in spec.primary_key} if key else None
        except _BadKey as exc:
            row, why = None, f": {exc}"
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError, TypeError):
            row = None
        if row is None or any(v is None for v in row.values()):
            errors.append((i, f"tombstone without a usable record key{why}"))
            continue
        row.update({PARTITION_COL: int(parts[i]), OFFSET_COL: int(offs[i]), TOMBSTONE_COL: True})
        rows.append(row)
    schema = spec.arrow_schema(system_columns=True)
    return pa.Table.from_pylist(rows, schema=schema), errors


def dead_letter_rows(dead: list[tuple[int, int, bytes | None, bytes | None, str]]) -> pa.Table:
    """Dead-letter rows with system columns (row identity = the record's partition/offset)."""
    now = datetime.now(UTC)
    schema = dead_letter_spec("x").arrow_schema(system_columns=True)
    return pa.Table.from_pylist(
        [
            {
                "partition": p,
                "offset": o,
                "raw": raw,
                "key": key,
                "error": err,
                "failed_at": now,
                PARTITION_COL: p,
                OFFSET_COL: o,
                TOMBSTONE_COL: False,
            }
            for p, o, raw, key, err in dead
        ],
        schema=schema,
    )
