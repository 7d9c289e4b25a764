"""A batch run's write task (a Spark Python worker that unpickles
``millstream.spark.catch_up._write`` and its ``SegmentSink``) stages files and commits
nothing: it must not load the metadata store, whose SQLAlchemy alone is ~15 MiB of each
worker's RSS, and the two workers are the largest part of an ``--available-now`` run's
peak memory (docs/performance.md)."""

from __future__ import annotations

import json
import subprocess
import sys


def test_a_write_tasks_modules_load_no_metadata_store() -> None:
    child = (
        "import json, sys\n"
        "import millstream.spark.catch_up\n"
        "print(json.dumps(sorted(m for m in sys.modules\n"
        "    if m.partition('.')[0] == 'sqlalchemy' or m.startswith('millstream.metastore.')\n"
        "    and m not in ('millstream.metastore.models',))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", child], check=True, capture_output=True, text=True
    ).stdout
    loaded = json.loads(out.strip().splitlines()[-1])
    assert loaded == []
