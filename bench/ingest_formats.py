"""(f) Avro vs JSON decode catch-up on the same input (``bench/ingest.py``, part f).

The generator records of the run's input, decoded by the sink's decoder
(``millstream.ingest.decode.decode_records``) in the sink's pieces (``DECODE_ROWS``), once
as the JSON lines the files source reads and once as Confluent-framed Avro produced by
confluent-kafka's ``AvroSerializer`` against the test schema registry. One process, no
Spark: the per-record work that differs between the formats (read + decode + fit to the
table schema + key and tombstone handling), rows/s of each and their ratio.
"""

from __future__ import annotations

import time
from typing import Any

import pyarrow as pa
from ingest_input import UPSERT_TABLE, Input


def _raw(p: int, keys: list[bytes | None], values: list[bytes | None]) -> pa.Table:
    n = len(values)
    return pa.table(
        {
            "partition": pa.array([p] * n, pa.int32()),
            "offset": pa.array(range(n), pa.int64()),
            "key": pa.array(keys, pa.binary()),
            "value": pa.array(values, pa.binary()),
        }
    )


def formats_catch_up(inp: Input, rounds: int = 2) -> dict[str, Any]:
    from harness.formats import OrdersEncoder
    from harness.schema_registry import TestSchemaRegistry
    from millstream.ingest.decode import decode_records
    from millstream.ingest.formats import decoder_for, format_config
    from millstream.ingest.sources.generator import ORDERS_SCHEMA
    from millstream.spark.sink import DECODE_ROWS
    from millstream.spec import TableSpec

    spec = TableSpec.parse({"name": "orders", "schema": dict(ORDERS_SCHEMA), **UPSERT_TABLE})
    with TestSchemaRegistry() as reg:
        t0 = time.perf_counter()
        enc = OrdersEncoder("avro", reg.url, "bench-orders")
        tables: dict[str, list[pa.Table]] = {"json": [], "avro": []}
        for p, recs in inp.records.items():
            keys = [k for k, _ in recs]
            avro = [enc.encode(v) for _, v in recs]
            for i in range(0, len(recs), DECODE_ROWS):
                tables["json"].append(
                    _raw(p, keys[i : i + DECODE_ROWS], [v for _, v in recs[i : i + DECODE_ROWS]])
                )
                tables["avro"].append(_raw(p, keys[i : i + DECODE_ROWS], avro[i : i + DECODE_ROWS]))
        encode_s = time.perf_counter() - t0
        fmts = {
            "json": None,
            "avro": decoder_for(
                {"format": format_config({"format": "avro", "schema_registry": {"url": reg.url}})}
            ),
        }
        out: dict[str, Any] = {"encode_s": encode_s, "rows": inp.rows}
        for name, fmt in fmts.items():
            best = float("inf")
            rows = dead = 0
            for _ in range(rounds):
                t = time.perf_counter()
                rows = dead = 0
                for raw in tables[name]:
                    d = decode_records(spec, raw, fmt)
                    rows += d.rows.num_rows
                    dead += len(d.dead)
                best = min(best, time.perf_counter() - t)
            out[name] = {"seconds": best, "rows_s": inp.rows / best, "rows": rows, "dead": dead}
        out["avro_over_json"] = out["avro"]["rows_s"] / out["json"]["rows_s"]
        assert out["avro"]["rows"] == out["json"]["rows"], "the formats decoded different rows"
        return out
