"""The ingest benchmark's local baselines, each in this one process on the same input files:

(b) the ceiling: ``pyarrow.json.read_json`` + ``pyarrow.parquet.write_table``;
(c) a plain pandas upsert loop: ``pd.read_json(lines=True, chunksize=...)``, keep the last row
    per key by (updated_at, partition, offset), drop deletes, write Parquet.
"""

from __future__ import annotations

import resource
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.json as pj
import pyarrow.parquet as pq
from ingest_input import Input


def self_cpu() -> float:
    """CPU seconds of this process, all threads (pyarrow's included)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def ceiling(inp: Input, out: Path) -> dict[str, Any]:
    """Single-process vectorized decode + Parquet write of the same files."""
    out.mkdir(parents=True, exist_ok=True)
    schema = pa.schema(
        [
            ("order_id", pa.int64()),
            ("customer", pa.string()),
            ("amount", pa.float64()),
            ("status", pa.string()),
            ("updated_at", pa.string()),
            ("is_deleted", pa.bool_()),
        ]
    )
    opts = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    cpu0 = self_cpu()
    t0 = time.perf_counter()
    rows = 0
    for p, files in inp.files.items():
        t = pa.concat_tables([pj.read_json(f, parse_options=opts) for f in files])
        i = t.schema.get_field_index("updated_at")
        t = t.set_column(
            i,
            pa.field("updated_at", pa.timestamp("us", tz="UTC")),
            t.column(i).cast(pa.timestamp("us", tz="UTC")),
        )
        t = t.append_column("_ms_partition", pa.array(np.full(t.num_rows, p, np.int32)))
        t = t.append_column("_ms_offset", pa.array(np.arange(t.num_rows, dtype=np.int64)))
        pq.write_table(t, out / f"{p}.parquet", compression="zstd")
        rows += t.num_rows
    s = time.perf_counter() - t0
    return {"rows": rows, "seconds": s, "rows_s": rows / s, "cpu_s": self_cpu() - cpu0}


def pandas_upsert(inp: Input, out: Path, chunk: int) -> tuple[dict[str, Any], pd.DataFrame]:
    """What a plain single-process pandas job would do: read JSON lines in chunks, keep the last
    row per key by (updated_at, partition, offset), drop deletes at the end, write Parquet."""
    out.mkdir(parents=True, exist_ok=True)
    dtype = {
        "order_id": "int64",
        "customer": "object",
        "amount": "float64",
        "status": "object",
        "is_deleted": "bool",
    }
    cpu0 = self_cpu()
    t0 = time.perf_counter()
    state: pd.DataFrame | None = None
    rows = 0
    for p, files in inp.files.items():
        offset = 0
        for f in files:
            with pd.read_json(
                f, lines=True, chunksize=chunk, dtype=dtype, convert_dates=["updated_at"]
            ) as reader:
                for df in reader:
                    n = len(df)
                    df["_p"] = p
                    df["_o"] = np.arange(offset, offset + n)
                    offset += n
                    rows += n
                    state = df if state is None else pd.concat([state, df], ignore_index=True)
                    state = state.sort_values(["updated_at", "_p", "_o"]).drop_duplicates(
                        "order_id", keep="last"
                    )
    assert state is not None
    result = state[~state["is_deleted"]].drop(columns=["_p", "_o"])
    result.to_parquet(out / "orders.parquet", index=False)
    s = time.perf_counter() - t0
    res = {"rows": rows, "seconds": s, "rows_s": rows / s, "table_rows": len(result)}
    res["cpu_s"] = self_cpu() - cpu0
    return res, result
