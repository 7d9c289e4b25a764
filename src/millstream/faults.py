"""Named fault points, for crash tests and for operators reproducing an incident.

``MILLSTREAM_FAULTS="before_commit:3,after_commit:5"`` makes the process that reaches the
point ``before_commit`` in batch 3 write ``<MILLSTREAM_FAULT_DIR>/before_commit-3`` and then
hang, so a test can SIGKILL it at exactly that moment. Unset (the default), every fault point
is a no-op. Points: ``after_stage`` (executor, files staged), ``before_commit`` (driver,
before compare_and_append), ``after_commit`` (driver, after compare_and_append and before
Spark's own commit log).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

POINTS = ("after_stage", "before_commit", "after_commit")


def hit(point: str, batch_id: int | str | None) -> None:
    spec = os.environ.get("MILLSTREAM_FAULTS")
    if not spec:
        return
    armed = {tuple(item.split(":", 1)) for item in spec.split(",") if ":" in item}
    if (point, str(batch_id)) not in armed:
        return
    marker = Path(os.environ.get("MILLSTREAM_FAULT_DIR", ".")) / f"{point}-{batch_id}"
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(str(os.getpid()))
    while True:  # wait to be killed
        time.sleep(1)
