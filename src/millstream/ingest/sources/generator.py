"""A deterministic synthetic stream of orders: the demo's and benchmarks' input.

Record ``(partition, offset)`` is a pure function of the seed and the config, so any range can
be re-read (replays, re-ingestion) and the model can be recomputed. Keys are
partition-affine (``order_id % partitions == partition``), like Kafka's key partitioner.
"""

from __future__ import annotations

import functools
import json
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa

from millstream.ingest.sources.base import PartitionReader, records_batch

BLOCK = 1024
BASE_TIME = datetime(2026, 1, 1, tzinfo=UTC)
STATUSES = ("new", "paid", "shipped", "delivered", "cancelled")
ORDERS_SCHEMA = {
    "order_id": "long",
    "customer": "string",
    "amount": "double",
    "status": "string",
    "updated_at": "timestamp",
    "is_deleted": "boolean",
}


@dataclass(frozen=True, slots=True)
class GeneratorConfig:
    seed: int = 0
    partitions: int = 4
    key_cardinality: int = 10_000
    update_fraction: float = 0.3
    delete_fraction: float = 0.02
    duplicate_fraction: float = 0.02
    malformed_fraction: float = 0.0
    #: rows/s over all partitions (0 = unthrottled)
    rate: float = 0.0
    #: rows over all partitions; None = unbounded (1,000,000 when ``rate`` is 0)
    total: int | None = None


@functools.lru_cache(maxsize=64)
def _block(
    cfg: GeneratorConfig, partition: int, block: int
) -> tuple[tuple[bytes, bytes | None], ...]:
    """The records of one block of ``BLOCK`` offsets (cached: small ranges, replays and
    re-ingestion read the same blocks again)."""
    rnd = random.Random(f"{cfg.seed}/{partition}/{block}")
    per_part = max(1, cfg.key_cardinality // cfg.partitions)
    out: list[tuple[bytes, bytes | None]] = []
    for i in range(BLOCK):
        offset = block * BLOCK + i
        if out and rnd.random() < cfg.duplicate_fraction:
            out.append(out[-1])
            continue
        if rnd.random() < cfg.update_fraction:
            key_idx = rnd.randrange(per_part)
        else:
            key_idx = offset % per_part
        order_id = key_idx * cfg.partitions + partition
        key = str(order_id).encode()
        if rnd.random() < cfg.malformed_fraction:
            bad = rnd.choice(
                [
                    b'{"order_id": ',
                    b"not json at all",
                    b'{"order_id": "x-%d"}' % order_id,
                    b"[1, 2]",
                ]
            )
            out.append((key, bad))
            continue
        deleting = rnd.random() < cfg.delete_fraction
        if deleting and rnd.random() < 0.5:
            out.append((key, None))  # a Kafka tombstone
            continue
        jitter = rnd.randrange(0, 50)
        updated = BASE_TIME + timedelta(milliseconds=offset * 10 - jitter)
        value = {
            "order_id": order_id,
            "customer": f"c{rnd.randrange(1000)}",
            "amount": round(rnd.uniform(1, 500), 2),
            "status": rnd.choice(STATUSES),
            "updated_at": updated.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "is_deleted": deleting,
        }
        out.append((key, json.dumps(value, separators=(",", ":")).encode()))
    return tuple(out)


def generate(
    cfg: GeneratorConfig, partition: int, lo: int, hi: int
) -> Iterator[tuple[int, bytes, bytes | None]]:
    """(offset, key, value) of ``partition`` for offsets in ``[lo, hi)``."""
    for block in range(lo // BLOCK, (hi + BLOCK - 1) // BLOCK if hi > lo else lo // BLOCK):
        first = block * BLOCK
        start, stop = max(lo, first) - first, min(hi, first + BLOCK) - first
        for i, (key, value) in enumerate(_block(cfg, partition, block)[start:stop], start):
            yield first + i, key, value


def partition_total(total: int | None, partitions: int, partition: int) -> int | None:
    if total is None:
        return None
    return total // partitions + (1 if partition < total % partitions else 0)


class GeneratorReader(PartitionReader):
    """Reads :func:`generate`'s records. With a ``rate``, the latest offsets grow with the time
    since the reader was created, counted from ``start_offsets``; ``total`` caps them."""

    kind = "generator"
    Config = GeneratorConfig
    typical_record_bytes = 160  # an orders JSON object is 110-140 bytes

    def __init__(
        self, config: GeneratorConfig, *, start_offsets: dict[int, int] | None = None
    ) -> None:
        super().__init__(config, start_offsets=start_offsets)
        self.cfg: GeneratorConfig = config
        self.rate = config.rate
        self.total = config.total
        if self.rate <= 0 and self.total is None:
            self.total = 1_000_000
        self.t0 = time.time()

    @classmethod
    def config_from_spec(cls, fields: dict[str, Any]) -> GeneratorConfig:
        return GeneratorConfig(
            **{k: fields[k] for k in GeneratorConfig.__dataclass_fields__ if k in fields}
        )

    def list_partitions(self) -> list[int]:
        return list(range(self.cfg.partitions))

    def earliest_offsets(self) -> dict[int, int]:
        return dict.fromkeys(self.list_partitions(), 0)

    def latest_offsets(self) -> dict[int, int]:
        out = {}
        for p in self.list_partitions():
            cap = partition_total(self.total, self.cfg.partitions, p)
            if self.rate > 0:
                produced = self.start_offsets.get(p, 0) + int(
                    self.rate / self.cfg.partitions * (time.time() - self.t0)
                )
                out[p] = produced if cap is None else min(cap, produced)
            else:
                assert cap is not None
                out[p] = cap
        return out

    def read_range(self, partition: int, lo: int, hi: int) -> Iterator[pa.RecordBatch]:
        recs = list(generate(self.cfg, partition, lo, hi))
        yield records_batch(
            partition, [r[0] for r in recs], [r[1] for r in recs], [r[2] for r in recs]
        )
