"""A Spark Python worker's first task freezes what the process holds (Spark's daemon runs a
full ``gc.collect()`` after every task of a reused worker, which walked every module and the
query's reader and sink each time); what later tasks make is still collected."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

SRC = Path(__file__).resolve().parents[3] / "src"

CHILD = textwrap.dedent(
    """
    import gc
    import json
    import weakref

    from millstream.spark.options import SourceOptions
    from millstream.spark.sources import RangeTask, StreamReader

    reader = StreamReader(
        SourceOptions("kafka", {"bootstrap_servers": "127.0.0.1:1", "topic": "orders"})
    )
    before = gc.get_freeze_count()
    first = list(reader.read(RangeTask([(0, 0, 10)])))  # a process's first task
    after_first = gc.get_freeze_count()

    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle made after the first task
    gone = weakref.ref(a)
    del a, b
    list(reader.read(RangeTask([(0, 10, 20)])))  # a later task freezes nothing more
    after_second = gc.get_freeze_count()
    gc.collect()  # what Spark's daemon runs after each task
    print(json.dumps({
        "before": before, "after_first": after_first, "after_second": after_second,
        "cycle_collected": gone() is None, "markers": sum(b.num_rows for b in first),
    }))
    """
)


def test_a_workers_first_task_freezes_the_process_and_later_cycles_are_still_collected() -> None:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True
    )

    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["before"] == 0
    assert got["after_first"] > 10_000  # the modules and the reader, out of every collection
    assert got["after_second"] == got["after_first"]  # frozen once per process
    assert got["cycle_collected"] is True  # a task's garbage cycles are still freed
    assert got["markers"] == 1  # the task still did its work
