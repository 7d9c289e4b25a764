"""CSV values from the ``files`` source: one line per record, and the file's header line as
the record's key (the files source puts it there for ``format: csv``).

A batch is parsed per header with one ``pyarrow.csv`` call: columns are matched by name, a
column the header lacks is null, extra columns are ignored, and values are typed by the
table's schema. An unquoted empty field is null; a quoted one (``""``) is an empty string.
When the call fails (a row with the wrong number of fields, a value of the wrong type, an
unclosed quote), the rows are bisected until each bad one is isolated, as for JSON.
"""

from __future__ import annotations

import csv as pycsv
import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pv

from millstream.ingest.formats.fit import Parsed, assemble, concat, drop_rows
from millstream.spec import TableSpec
from millstream.types import arrow_type

#: Parsed as strings, then cast (per value, so a bad one names its row).
_VIA_STRING = {"timestamp", "date", "binary"}
_COLUMN_RE = re.compile(r"In CSV column #(\d+): ")


def join_lines(values: pa.Array) -> pa.Buffer:
    """The values one per line, as one buffer."""
    joined = pc.binary_join_element_wise(values, pa.scalar(b"", pa.binary()), b"\n")
    size = int(np.frombuffer(joined.buffers()[1], dtype=np.int32)[len(joined)])
    data = joined.buffers()[2]
    return data.slice(0, size) if data is not None else pa.py_buffer(b"")


def _header_names(header: bytes) -> list[str]:
    text = header.decode("utf-8", errors="replace").rstrip("\r\n")
    return next(pycsv.reader([text]), [])


def _parse_block(
    spec: TableSpec, header: bytes, names: list[str], values: pa.Array
) -> pa.Table | str:
    present = [c for c in spec.columns if c in names]
    types = {
        c: pa.string() if spec.columns[c] in _VIA_STRING else arrow_type(spec.columns[c])
        for c in present
    }
    data = pa.py_buffer(header.rstrip(b"\r\n") + b"\n" + join_lines(values).to_pybytes())
    try:
        table = pv.read_csv(
            pa.BufferReader(data),
            read_options=pv.ReadOptions(use_threads=False, block_size=max(1 << 20, data.size + 1)),
            convert_options=pv.ConvertOptions(
                column_types=types,
                include_columns=present,
                strings_can_be_null=True,
                quoted_strings_can_be_null=False,
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        text = str(exc)
        m = _COLUMN_RE.search(text)
        if m and int(m.group(1)) < len(names):
            text = _COLUMN_RE.sub(f"column {names[int(m.group(1))]!r}: ", text, count=1)
        return text
    if table.num_rows != len(values):
        if len(values) == 1 and not values[0].as_py().strip():
            return "empty line"
        return f"{len(values)} lines hold {table.num_rows} CSV rows, expected one per line"
    return table


def _parse_group(spec: TableSpec, header: bytes, values: pa.Array, where: np.ndarray) -> Parsed:
    names = _header_names(header)
    tables: list[pa.Table] = []
    pieces: list[np.ndarray] = []
    bad: dict[int, str] = {}
    stack = [(0, len(values))]
    while stack:
        lo, hi = stack.pop()
        result = _parse_block(spec, header, names, values.slice(lo, hi - lo))
        if isinstance(result, pa.Table):
            tables.append(result)
            pieces.append(where[lo:hi])
        elif hi - lo == 1:
            bad[int(where[lo])] = result
        else:
            mid = (lo + hi) // 2
            stack.append((mid, hi))
            stack.append((lo, mid))
    n = sum(t.num_rows for t in tables)
    columns = {
        c: pa.chunked_array([t.column(c) for t in tables]).combine_chunks()
        for c in spec.columns
        if c in names and tables
    }
    table, errors = assemble(spec, n, columns)
    positions = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
    return drop_rows(Parsed(table, positions, bad), errors)


class CsvDecoder:
    """Decodes CSV lines whose record key holds their file's header line."""

    record_keys = False

    def parse(self, spec: TableSpec, values: pa.Array, keys: pa.Array) -> Parsed:
        if len(values) == 0:
            return concat(spec, [])
        encoded = keys.dictionary_encode()
        codes = encoded.indices.to_numpy(zero_copy_only=False)
        parts: list[Parsed] = []
        for code, header in enumerate(encoded.dictionary.to_pylist()):
            where = np.flatnonzero(codes == code)
            if header is None:
                parts.append(
                    Parsed(
                        spec.arrow_schema().empty_table(),
                        np.zeros(0, dtype=np.int64),
                        dict.fromkeys(where.tolist(), "CSV line without a header"),
                    )
                )
                continue
            lines = values.take(pa.array(where)) if len(where) != len(values) else values
            parts.append(_parse_group(spec, header, lines, where))
        nulls = np.flatnonzero(pc.is_null(encoded.indices).to_numpy(zero_copy_only=False))
        if len(nulls):
            parts.append(
                Parsed(
                    spec.arrow_schema().empty_table(),
                    np.zeros(0, dtype=np.int64),
                    dict.fromkeys(nulls.tolist(), "CSV line without a header"),
                )
            )
        return concat(spec, parts)
