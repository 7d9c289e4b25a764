"""The workload of bench/peers.py, shaped like Paimon's cluster-benchmark q1: JSON records of
about 150 bytes, uniform random keys in ``[0, K)``, a monotonic comparison column ``seq`` and 2%
deletes; and the model every table is checked against (per key the row with the highest
``seq``; a key whose newest record is a delete is absent).

Plain numpy and pyarrow only: both the product's interpreter and the peers' venv import it.
Everything is drawn from a seed, chunk by chunk, so a record's content depends only on
``(seed, keys, its index)``: a producer, a checker and another process agree on it without
passing the records around.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

#: The table's columns (Millstream's spec types, and the Arrow schema every peer writes).
SCHEMA_SPEC = {
    "id": "long",
    "seq": "long",
    "customer": "string",
    "amount": "double",
    "status": "string",
    "note": "string",
    "is_deleted": "boolean",
}
ARROW_SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("seq", pa.int64()),
        ("customer", pa.string()),
        ("amount", pa.float64()),
        ("status", pa.string()),
        ("note", pa.string()),
        ("is_deleted", pa.bool_()),
    ]
)
DELETE_FRACTION = 0.02
CHUNK = 100_000
STATUSES = ("created", "paid", "packed", "shipped", "delivered", "returned")
#: The stream's seq starts here; a pre-loaded table's rows have seq 0 .. K-1.
STREAM_SEQ_BASE = 1 << 40


@dataclass(frozen=True)
class Records:
    """Records ``start .. start + len`` of a workload, as columns."""

    id: np.ndarray
    seq: np.ndarray
    amount: np.ndarray
    status: np.ndarray
    deleted: np.ndarray

    def __len__(self) -> int:
        return len(self.id)

    def json_lines(self) -> list[bytes]:
        """One JSON object per record, about 150 bytes each."""
        out = []
        for k, s, a, st, d in zip(
            self.id.tolist(),
            self.seq.tolist(),
            self.amount.tolist(),
            self.status.tolist(),
            self.deleted.tolist(),
            strict=True,
        ):
            out.append(
                json.dumps(
                    {
                        "id": k,
                        "seq": s,
                        "customer": f"customer-{k % 100_003:07d}",
                        "amount": a,
                        "status": STATUSES[st],
                        "note": f"order {k} revision {s} " + "x" * 16,
                        "is_deleted": d,
                    },
                    separators=(",", ":"),
                ).encode()
            )
        return out


def records(seed: int, keys: int, start: int, count: int, seq_base: int = 0) -> Records:
    """Records ``start .. start + count`` of the workload ``(seed, keys)``: record ``i`` has
    ``seq = seq_base + i``."""
    parts: list[tuple[np.ndarray, ...]] = []
    i = start
    end = start + count
    while i < end:
        c = i // CHUNK
        lo, hi = i - c * CHUNK, min(end - c * CHUNK, CHUNK)
        rng = np.random.default_rng([seed, keys, c])
        ids = rng.integers(0, keys, CHUNK, dtype=np.int64)
        amount = np.round(rng.random(CHUNK) * 1000, 2)
        status = rng.integers(0, len(STATUSES), CHUNK)
        deleted = rng.random(CHUNK) < DELETE_FRACTION
        parts.append((ids[lo:hi], amount[lo:hi], status[lo:hi], deleted[lo:hi]))
        i = c * CHUNK + hi
    if parts:
        ids, amount, status, deleted = (np.concatenate(x) for x in zip(*parts, strict=True))
    else:
        ids = np.zeros(0, np.int64)
        amount, status, deleted = np.zeros(0), np.zeros(0, np.int64), np.zeros(0, bool)
    seq = np.arange(seq_base + start, seq_base + end, dtype=np.int64)
    return Records(ids, seq, amount, status, deleted)


def preload(keys: int, start: int, count: int) -> Records:
    """The pre-loaded table's rows ``start .. start + count``: key ``i`` once, ``seq = i``."""
    ids = np.arange(start, min(start + count, keys), dtype=np.int64)
    return Records(
        ids, ids.copy(), (ids % 1000).astype(float), ids % len(STATUSES), np.zeros(len(ids), bool)
    )


def to_arrow(recs: Records) -> pa.Table:
    """The records as a table of :data:`ARROW_SCHEMA` (what a decoder of their JSON gives)."""
    k = recs.id
    return pa.table(
        {
            "id": k,
            "seq": recs.seq,
            "customer": [f"customer-{x % 100_003:07d}" for x in k.tolist()],
            "amount": recs.amount,
            "status": np.asarray(STATUSES)[recs.status].tolist(),
            "note": [
                f"order {x} revision {s} " + "x" * 16
                for x, s in zip(k.tolist(), recs.seq.tolist(), strict=True)
            ],
            "is_deleted": recs.deleted,
        },
        schema=ARROW_SCHEMA,
    )


# ---------------------------------------------------------------------------------------------
# Batch input: N records in 10 files
# ---------------------------------------------------------------------------------------------

#: The files source reads one subdirectory per partition; file i goes to partition i % 4.
PARTITIONS = 4


def batch_files(root: Path, seed: int, rows: int, keys: int, files: int = 10) -> list[Path]:
    """Write (once: kept when already complete) ``rows`` records in ``files`` JSON-lines files
    under ``root`` (``root/<i % 4>/part-<i>.json``) and return them in ``seq`` order."""
    out = []
    per = -(-rows // files)
    done = root / "COMPLETE"
    for i in range(files):
        out.append(root / str(i % PARTITIONS) / f"part-{i:05d}.json")
    if done.exists():
        return out
    for i, path in enumerate(out):
        path.parent.mkdir(parents=True, exist_ok=True)
        lo = i * per
        recs = records(seed, keys, lo, max(0, min(per, rows - lo)))
        path.write_bytes(b"".join(x + b"\n" for x in recs.json_lines()))
    done.write_text(json.dumps({"seed": seed, "rows": rows, "keys": keys, "files": files}))
    return out


def decode(lines: bytes) -> pa.Table:
    """JSON lines -> a table of :data:`ARROW_SCHEMA` (pyarrow's multithreaded reader)."""
    import io

    import pyarrow.json as pj

    if not lines.strip():
        return ARROW_SCHEMA.empty_table()
    t = pj.read_json(
        io.BytesIO(lines),
        read_options=pj.ReadOptions(block_size=1 << 24),
        parse_options=pj.ParseOptions(explicit_schema=ARROW_SCHEMA),
    )
    return t.select(ARROW_SCHEMA.names).cast(ARROW_SCHEMA)


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------


def model(parts: list[Records]) -> tuple[np.ndarray, np.ndarray]:
    """The live ``(id, seq)`` pairs, sorted by id, after applying ``parts`` in order (``seq``
    grows across them)."""
    ids = np.concatenate([p.id for p in parts]) if parts else np.zeros(0, np.int64)
    seq = np.concatenate([p.seq for p in parts]) if parts else np.zeros(0, np.int64)
    deleted = np.concatenate([p.deleted for p in parts]) if parts else np.zeros(0, bool)
    order = np.argsort(seq, kind="stable")
    ids, seq, deleted = ids[order], seq[order], deleted[order]
    # the last occurrence of each key
    rev_unique, rev_idx = np.unique(ids[::-1], return_index=True)
    last = len(ids) - 1 - rev_idx
    live = ~deleted[last]
    return rev_unique[live], seq[last][live]


def check(table: pa.Table, expected: tuple[np.ndarray, np.ndarray]) -> dict[str, object]:
    """Compare a table's ``(id, seq)`` with the model: equal sets, no duplicate key."""
    ids = table.column("id").to_numpy().astype(np.int64)
    seq = table.column("seq").to_numpy().astype(np.int64)
    order = np.argsort(ids, kind="stable")
    ids, seq = ids[order], seq[order]
    exp_ids, exp_seq = expected
    dup = int(len(ids) - len(np.unique(ids)))
    ok = dup == 0 and np.array_equal(ids, exp_ids) and np.array_equal(seq, exp_seq)
    out: dict[str, object] = {"ok": bool(ok), "rows": len(ids), "expected_rows": len(exp_ids)}
    if not ok:
        missing = np.setdiff1d(exp_ids, ids)
        extra = np.setdiff1d(ids, exp_ids)
        out.update(
            duplicates=dup,
            missing_keys=len(missing),
            extra_keys=len(extra),
            first_missing=missing[:5].tolist(),
            first_extra=extra[:5].tolist(),
        )
        if not missing.size and not extra.size and not dup:
            wrong = np.flatnonzero(seq != exp_seq)
            out.update(wrong_seq=len(wrong), first_wrong=ids[wrong[:5]].tolist())
    return out
