"""The ingest benchmark's input: the generator's orders stream written once as JSON-lines files
(what the ``files`` source reads), the datastream spec over them, and the oracle's row count.

A Kafka tombstone (null value) cannot be a JSON line, so it is written as a delete record
(``{"order_id": k, "is_deleted": true, "updated_at": ...}``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

PARTITIONS = 4
SEED = 7


@dataclass
class Input:
    root: Path
    rows: int
    #: partition -> JSON lines (offset = index)
    lines: dict[int, list[bytes]]
    #: partition -> the generator's (key, value) records (value None = Kafka tombstone)
    records: dict[int, list[tuple[bytes, bytes | None]]]
    files: dict[int, list[Path]]
    key_cardinality: int
    seconds: float

    def summary(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "key_cardinality": self.key_cardinality,
            "files": sum(len(f) for f in self.files.values()),
            "mb": sum(f.stat().st_size for fs in self.files.values() for f in fs) / 1e6,
            "seconds": self.seconds,
        }


def _line(offset: int, key: bytes, value: bytes | None) -> bytes:
    if value is not None:
        return value
    from millstream.ingest.sources.generator import BASE_TIME

    ts = BASE_TIME + timedelta(milliseconds=offset * 10)
    return json.dumps(
        {
            "order_id": int(key),
            "customer": None,
            "amount": None,
            "status": None,
            "updated_at": ts.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "is_deleted": True,
        },
        separators=(",", ":"),
    ).encode()


def write_files(root: Path, lines: dict[int, list[bytes]], file_rows: int) -> dict[int, list[Path]]:
    """One subdirectory per partition, ``file_rows`` lines per file."""
    files: dict[int, list[Path]] = {}
    for p, ls in lines.items():
        d = root / str(p)
        d.mkdir(parents=True, exist_ok=True)
        files[p] = []
        for i in range(0, max(len(ls), 1), file_rows):
            f = d / f"part-{i // file_rows:05d}.json"
            f.write_bytes(b"".join(x + b"\n" for x in ls[i : i + file_rows]))
            files[p].append(f)
    return files


def make_input(base: Path, rows: int, file_rows: int) -> Input:
    from millstream.ingest.sources.generator import GeneratorConfig, generate, partition_total

    t0 = time.perf_counter()
    cardinality = max(1000, rows // 5)
    cfg = GeneratorConfig(seed=SEED, partitions=PARTITIONS, key_cardinality=cardinality)
    records: dict[int, list[tuple[bytes, bytes | None]]] = {}
    lines: dict[int, list[bytes]] = {}
    for p in range(PARTITIONS):
        n = partition_total(rows, PARTITIONS, p)
        assert n is not None
        recs = list(generate(cfg, p, 0, n))
        records[p] = [(k, v) for _, k, v in recs]
        lines[p] = [_line(o, k, v) for o, k, v in recs]
    root = base / "input"
    files = write_files(root, lines, file_rows)
    return Input(root, rows, lines, records, files, cardinality, time.perf_counter() - t0)


UPSERT_TABLE = {
    "primary_key": ["order_id"],
    "mode": "upsert",
    "comparison_column": "updated_at",
    "delete_column": "is_deleted",
}


def files_spec(name: str, path: Path, batch: int | None) -> Any:
    """The datastream of (a): the ``files`` source into an upsert table (``batch`` None:
    ``max_records_per_batch`` unset, the adaptive budget)."""
    from millstream.datastream import DatastreamSpec
    from millstream.ingest.sources.generator import ORDERS_SCHEMA

    fields: dict[str, Any] = {
        "name": name,
        "source": {"kind": "files", "path": str(path)},
        "table": UPSERT_TABLE,
        "schema": ORDERS_SCHEMA,
    }
    if batch is not None:
        fields["max_records_per_batch"] = batch
    return DatastreamSpec.parse(fields)


def adaptive_batch(inp: Input, tasks: int) -> int:
    """The records per batch the adaptive budget plans over ``inp`` with ``tasks`` tasks."""
    from millstream.spark.sources import StreamReader

    return StreamReader(source_options(files_spec("orders", inp.root, None), tasks=tasks)).budget()


def source_options(spec: Any, **fields: Any) -> Any:
    """The stream source's options for ``spec``, as the runner builds them (``fields``
    override, e.g. ``tasks``)."""
    from millstream.ingest.sources import config_for
    from millstream.spark.options import SourceOptions

    kind, config = config_for(spec.source)
    return SourceOptions(
        kind,
        config,
        max_records_per_batch=spec.max_records_per_batch,
        task_memory_mb=spec.task_memory_mb,
        starting_offsets=spec.source.starting_offsets,
        **fields,
    )


def oracle_rows(inp: Input) -> int:
    """Expected table rows from the source-side oracle (per partition: keys are
    partition-affine, so this equals the whole-input model and bounds memory)."""
    from millstream.ingest.sources.generator import ORDERS_SCHEMA
    from millstream.reference.oracle import expected_table
    from millstream.spec import TableSpec

    spec = TableSpec.parse({"name": "orders", "schema": ORDERS_SCHEMA, **UPSERT_TABLE})
    total = 0
    for p, ls in inp.lines.items():
        rows, bad = expected_table(spec, ((p, o, None, v) for o, v in enumerate(ls)))
        assert not bad, f"the oracle found {len(bad)} bad records in partition {p}"
        total += len(rows)
    return total
