"""A seal lets its run's rows go once they are compacted: it encodes the sealed file and looks
its keys up in the key index holding the sealed rows, not the run's rows beside them (issue
39: a 10,000,000-key table over 4 partitions seals runs of 2,500,000 rows). Guard 831."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa

from millstream.catalog import Catalog
from millstream.spec import OFFSET_COL, PARTITION_COL, TOMBSTONE_COL
from millstream.table.read import read_entries
from millstream.table.writer import commit_staged, stage_rows

ROWS = 200_000
BATCHES = 8

#: The seal, in a fresh process: Arrow's peak allocation there is the seal's alone.
SEAL = """
import json, sys
from pathlib import Path
import pyarrow as pa
from millstream.catalog import Catalog
from millstream.sealing.sealer import Sealer
with Catalog.open(home=Path(sys.argv[1])) as cat:
    result = Sealer(cat, "t").seal_partition(0, force=True)
    assert result is not None
print(json.dumps({"arrow_peak": pa.default_memory_pool().max_memory(), "rows": result.rows_out}))
"""


def test_a_seal_holds_its_run_and_its_sealed_rows_at_most_about_three_times(
    tmp_path: Path,
) -> None:
    """A run of 200,000 rows of random keys (the peers' row shape) in 8 micro-batch files,
    sealed: the sealed file holds one row per key, and the seal's Arrow peak stays under 3.2
    times the run's rows (3.6 times while the run's rows were held through the encoding)."""
    rng = np.random.default_rng(7)
    with Catalog.open(home=tmp_path) as cat:
        spec = cat.create_table(
            {
                "name": "t",
                "schema": {"id": "long", "customer": "string", "note": "string", "seq": "long"},
                "primary_key": ["id"],
                "mode": "upsert",
                "comparison_column": "seq",
            }
        ).spec
        per = ROWS // BATCHES
        for b in range(BATCHES):
            ids = rng.integers(0, ROWS, per)
            lo = b * per
            rows = pa.table(
                {
                    "id": pa.array(ids, pa.int64()),
                    "customer": pa.array([f"customer-{i % 50_000:06d}" for i in ids]),
                    "note": pa.array([f"a note of some forty characters, number {i}" for i in ids]),
                    "seq": pa.array(np.arange(lo, lo + per), pa.int64()),
                    PARTITION_COL: pa.array(np.zeros(per, np.int32)),
                    OFFSET_COL: pa.array(np.arange(lo, lo + per, dtype=np.int64)),
                    TOMBSTONE_COL: pa.array(np.zeros(per, bool)),
                },
                schema=spec.arrow_schema(system_columns=True),
            )
            staged = stage_rows(cat.deep, spec, rows)
            commit_staged(cat.store, cat.deep, "t", staged, {0: (lo, lo + per)}, {})
        run_bytes = read_entries(cat.deep, spec, cat.manifest("t").entries).nbytes
        keys = len(set(read_entries(cat.deep, spec, cat.manifest("t").entries)["id"].to_pylist()))
    out = subprocess.run(
        [sys.executable, "-c", SEAL, str(tmp_path)], check=True, capture_output=True, text=True
    ).stdout
    sealed = json.loads(out.strip().splitlines()[-1])
    assert sealed["rows"] == keys
    with Catalog.open(home=tmp_path) as cat:
        assert cat.read_table("t").num_rows == keys
    peak = sealed["arrow_peak"]
    assert peak < 3.2 * run_bytes, f"Arrow peak {peak:,} B for a run of {run_bytes:,} B"
