"""What a campaign prints and counts: its seed, its schedules, every fault with its time, every
anomaly a checker found, and the summary line ``N faults in M schedules, K anomalies``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Fault:
    #: seconds since the campaign started
    at: float
    schedule: int
    kind: str
    target: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Anomaly:
    schedule: int
    check: str
    detail: str


@dataclass
class CampaignLog:
    """Thread-safe record of one campaign run. ``out`` receives every line as it happens
    (``print`` for the CLI, a list's ``append`` in tests); ``verbose=False`` prints schedules
    and anomalies but not every fault."""

    layer: str
    seed: int
    out: Callable[[str], None] = print
    verbose: bool = True
    started: float = field(default_factory=time.monotonic)
    faults: list[Fault] = field(default_factory=list)
    anomalies: list[Anomaly] = field(default_factory=list)
    schedules: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def begin(self, description: str) -> None:
        self.out(f"{self.layer} campaign seed {self.seed}: {description}")
        self.out(f"re-run: the same command with --seed {self.seed}")

    def schedule(self, index: int, description: str) -> None:
        with self._lock:
            self.schedules = max(self.schedules, index + 1)
        if self.verbose:
            self.out(f"schedule {index} (+{self.elapsed():.1f}s): {description}")

    def fault(self, schedule: int, kind: str, target: str, detail: str = "") -> Fault:
        f = Fault(round(self.elapsed(), 3), schedule, kind, target, detail)
        with self._lock:
            self.faults.append(f)
        if self.verbose:
            extra = f" ({detail})" if detail else ""
            self.out(f"  +{f.at:.1f}s schedule {schedule}: {kind} {target}{extra}")
        return f

    def anomaly(self, schedule: int, check: str, detail: str) -> Anomaly:
        a = Anomaly(schedule, check, detail)
        with self._lock:
            self.anomalies.append(a)
        self.out(f"ANOMALY schedule {schedule}: {check}: {detail}")
        return a

    def summary(self) -> str:
        return (
            f"{len(self.faults)} faults in {self.schedules} schedules, "
            f"{len(self.anomalies)} anomalies"
        )

    def finish(self) -> str:
        line = self.summary()
        self.out(f"{self.layer} campaign seed {self.seed}: {line}")
        return line
