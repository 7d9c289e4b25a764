"""The Confluent wire format: magic byte 0, a 4-byte big-endian schema id, then the payload
(Protobuf puts its message-index array in front of the message).

:func:`split_frames` reads the header of every value of a batch at once with numpy, so a
batch is grouped by schema id without a Python step per record.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

MAGIC = 0
HEADER = 5


@dataclass(frozen=True, slots=True)
class Frames:
    """``schema_ids[i]`` of value ``i`` (-1 where ``errors`` holds why it has no frame)."""

    schema_ids: np.ndarray
    errors: dict[int, str]


def _bounds(values: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Start offsets, lengths and data bytes of a binary array's values."""
    wide = pa.types.is_large_binary(values.type)
    n = len(values)
    offsets = np.frombuffer(values.buffers()[1], dtype=np.int64 if wide else np.int32)
    offsets = offsets[values.offset : values.offset + n + 1].astype(np.int64)
    data = values.buffers()[2]
    body = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)
    return offsets[:-1], np.diff(offsets), body


def split_frames(values: pa.Array) -> Frames:
    """The schema id of every (non-null) value, and the values without a valid frame."""
    n = len(values)
    ids = np.full(n, -1, dtype=np.int64)
    errors: dict[int, str] = {}
    if n == 0:
        return Frames(ids, errors)
    starts, lengths, body = _bounds(values)
    short = lengths < HEADER
    ok = ~short
    head = starts[ok]
    magic = np.zeros(n, dtype=np.int64)
    magic[ok] = body[head]
    wrong = ok & (magic != MAGIC)
    good = ok & ~wrong
    s = starts[good]
    ids[good] = (
        (body[s + 1].astype(np.int64) << 24)
        | (body[s + 2].astype(np.int64) << 16)
        | (body[s + 3].astype(np.int64) << 8)
        | body[s + 4].astype(np.int64)
    )
    for i in np.flatnonzero(short).tolist():
        errors[i] = (
            f"truncated: {int(lengths[i])} bytes, shorter than the 5-byte schema-registry "
            "header (magic byte 0 and a 4-byte schema id)"
        )
    for i in np.flatnonzero(wrong).tolist():
        errors[i] = (
            f"wrong magic byte {int(magic[i])} (the schema-registry wire format starts with 0)"
        )
    return Frames(ids, errors)


def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """A zigzag varint at ``pos``: (value, position after it)."""
    shift = 0
    result = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")
    return (result >> 1) ^ -(result & 1), pos


def message_indexes(buf: bytes, pos: int = 0) -> tuple[tuple[int, ...], int]:
    """Protobuf's message-index array at ``pos``: which message of the schema's file (and of
    its nested types) the payload is; a single 0 byte is the first message."""
    count, pos = read_varint(buf, pos)
    if count == 0:
        return (0,), pos
    if count < 0 or count > 64:
        raise ValueError(f"bad message-index count {count}")
    out = []
    for _ in range(count):
        v, pos = read_varint(buf, pos)
        out.append(v)
    return tuple(out), pos
