"""A view computed in full (a publisher's first publish of a table, or after a seal of most of
it) of a table whose engine returns its data files' rows as they are (every mode but
``partial``) holds where each returned row lies, not the table's rows (issue 39: the
publisher of a 10,000,000-key table held 5.35 GB of RSS, several copies of its rows, while
the view only needs each winner's partition and offset). Guard 830."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from harness.iceberg_readers import pyiceberg_rows
from harness.publish_support import commit_rows, create_kv_table
from millstream.catalog import Catalog
from millstream.reference.model import canonical
from millstream.table.iceberg import location

ROWS_A_BATCH = 2_000
VALUE_BYTES = 4_000

#: The publish, in a fresh process: Arrow's peak allocation there is the publish's alone.
PUBLISH = """
import json, sys
from pathlib import Path
import pyarrow as pa
from millstream.catalog import Catalog
from millstream.table.iceberg import publish
with Catalog.open(home=Path(sys.argv[1])) as cat:
    result = publish(cat.store, cat.deep, "t")
    assert result.published
print(json.dumps({"arrow_peak": pa.default_memory_pool().max_memory()}))
"""


def test_a_first_publish_of_an_upsert_table_holds_no_copy_of_its_rows(tmp_path: Path) -> None:
    """Four batches of 2,000 rows of 4 KB values, half of them updates of earlier keys: 32 MB
    of values, 16 MB of them in the table's read. The first publish (a view computed in
    full) reads as the table and its Arrow peak stays under a quarter of the read's values
    (reading every column, it held the read and every data file's rows: several copies)."""
    with Catalog.open(home=tmp_path) as cat:
        create_kv_table(cat, "t")
        lo = 0
        for batch in range(4):
            first = (batch % 2) * ROWS_A_BATCH  # batches 2 and 3 update batches 0 and 1's keys
            rows = [(first + i, f"{batch}:" + "x" * VALUE_BYTES) for i in range(ROWS_A_BATCH)]
            lo = commit_rows(cat, "t", rows, lo)
        expected = canonical(cat.read_table("t").to_pylist())
        read_values = sum(len(r["v"]) for r in cat.read_table("t").to_pylist())
    assert len(expected) == 2 * ROWS_A_BATCH
    out = subprocess.run(
        [sys.executable, "-c", PUBLISH, str(tmp_path)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    peak = json.loads(out.strip().splitlines()[-1])["arrow_peak"]
    with Catalog.open(home=tmp_path) as cat:
        pointer = cat.store.read_pointer("t")
        assert pointer is not None
        assert pyiceberg_rows(location(cat.deep, pointer.metadata_location)) == expected
    assert peak < read_values / 4, f"Arrow peak {peak:,} B for {read_values:,} B of values"
