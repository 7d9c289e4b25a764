"""Named fault points, for crash tests and for operators reproducing an incident.

``MILLSTREAM_FAULTS="before_commit:3,after_commit:5"`` makes the process that reaches the
point ``before_commit`` in batch 3 write ``<MILLSTREAM_FAULT_DIR>/before_commit-3`` and then
hang, so a test can SIGKILL it at exactly that moment. Unset (the default), every fault point
is a no-op. Points: ``after_stage`` (executor, files staged), ``before_commit`` (driver,
before compare_and_append), ``after_commit`` (driver, after compare_and_append and before
Spark's own commit log).

``MILLSTREAM_SEAL_FAULTS="before_swap:2,before_upload:1"`` arms the sealer's named points
(:data:`millstream.sealing.sealer.FAULT_POINTS`) in a worker process: each sealer the worker
builds (one per datastream it seals) fails its next 2 seals before the swap and its next seal
before the upload (``SealFaults``; the seal is retried as any failed seal). Unset, nothing is
armed. :func:`seal_faults` parses it; a malformed item is ignored.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

POINTS = ("after_stage", "before_commit", "after_commit")
SEAL_FAULTS_ENV = "MILLSTREAM_SEAL_FAULTS"


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


def seal_faults() -> dict[str, int]:
    """``MILLSTREAM_SEAL_FAULTS`` as ``{point: how many seals fail there}`` (empty if unset)."""
    armed: dict[str, int] = {}
    for item in os.environ.get(SEAL_FAULTS_ENV, "").split(","):
        point, _, count = item.strip().partition(":")
        if point and count.strip().isdigit():
            armed[point] = armed.get(point, 0) + int(count)
    return armed
