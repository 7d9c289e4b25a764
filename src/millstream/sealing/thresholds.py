"""When a consuming segment is due to seal: rows, age or bytes (a datastream's ``segments``
section). A module of its own so the Spark adapters can carry thresholds without loading the
sealer and the metadata store."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Thresholds:
    flush_rows: int = 500_000
    flush_seconds: float = 300.0
    flush_bytes: int = 256 * 1024**2
    #: Whether age seals are spread over ``flush_seconds`` by table (each table sealing at its
    #: own slot, only ever earlier than ``flush_seconds``: :mod:`millstream.sealing.planning`).
    #: On for a datastream's sealing; off by default so a sealer built by hand seals by age at
    #: ``flush_seconds`` exactly.
    spread: bool = False

    @classmethod
    def of(cls, segments: Any) -> Thresholds:
        """From a datastream's ``segments`` section (:class:`millstream.datastream.SegmentsSection`),
        with age seals spread."""
        return cls(segments.flush_rows, segments.flush_seconds, segments.flush_bytes, spread=True)
