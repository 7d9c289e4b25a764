"""A batch run's write task (a Spark Python worker that unpickles
``millstream.spark.catch_up._write`` and its ``SegmentSink``) stages files and commits
nothing: it must not load the metadata store, whose SQLAlchemy alone is ~15 MiB of each
worker's RSS, and the two workers are the largest part of an ``--available-now`` run's
peak memory (docs/performance.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any


def _child_json(code: str) -> Any:
    """What a fresh interpreter running ``code`` prints as JSON on its last line."""
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_a_write_tasks_modules_load_no_metadata_store() -> None:
    child = (
        "import json, sys\n"
        "import millstream.spark.catch_up\n"
        "print(json.dumps(sorted(m for m in sys.modules\n"
        "    if m.partition('.')[0] == 'sqlalchemy' or m.startswith('millstream.metastore.')\n"
        "    and m not in ('millstream.metastore.models',))))\n"
    )
    assert _child_json(child) == []


def test_a_catch_up_task_stages_its_ranges_without_loading_the_metadata_store(
    tmp_path: Path,
) -> None:
    """The task itself, not only its modules: a catch-up's write task, pickled as Spark
    pickles it (``cloudpickle``) with the spec the driver read for its batch, stages its
    records in a fresh interpreter without importing the metadata store (it read the spec
    from it before, in each of the run's two workers)."""
    from pyspark import cloudpickle

    from millstream.catalog import Catalog
    from millstream.datastream import dead_letter_spec
    from millstream.spark.catch_up import _write
    from millstream.spark.options import SinkOptions
    from millstream.spark.sink import SegmentSink
    from millstream.spec import TableSpec

    spec = TableSpec.parse({"name": "t", "schema": {"id": "long", "qty": "long"}})
    (tmp_path / "src" / "0").mkdir(parents=True)
    (tmp_path / "src" / "0" / "a.json").write_text(
        "".join(json.dumps({"id": i, "qty": i}) + "\n" for i in range(6))
    )
    with Catalog.open(home=tmp_path / "home") as cat:
        cat.create_table(spec)
        cat.create_table(dead_letter_spec(spec))
        options = SinkOptions.from_options(
            {
                **cat.settings.as_options(),
                "table": "t",
                "tableSpec": json.dumps(spec.to_json_dict()),
                "sourceKind": "files",
                "sourceConfig": json.dumps({"path": str(tmp_path / "src")}),
            }
        )
    task = tmp_path / "task.pickle"
    task.write_bytes(cloudpickle.dumps(partial(_write, SegmentSink(options), 0, spec)))
    child = (
        "import json, pickle, sys\n"
        f"task = pickle.loads(open({str(task)!r}, 'rb').read())\n"
        "[message] = list(task(iter([[(0, 0, 6)]])))\n"
        "print(json.dumps([dict(message.data_counts), sorted(m for m in sys.modules\n"
        "    if m.partition('.')[0] == 'sqlalchemy' or m == 'millstream.metastore.store')]))\n"
    )
    counts, loaded = _child_json(child)
    assert counts == {"0": 6}, "the task staged its six records"
    assert loaded == [], "the task loaded the metadata store"
