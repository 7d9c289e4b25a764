"""Per-writer state directories with a file lock (the KAFKA-8187 invariants).

* The lock is an ``flock`` on ``<root>/.locks/<task>.lock``, a file that is never deleted, so
  deleting a state directory can never hand two owners "the same" lock.
* The checkpoint is **read only after the lock is held** and **written only while it is held**;
  both raise :class:`StateLockNotHeldError` otherwise. A writer that lost (or never got) the
  lock therefore cannot resurrect a directory the cleaner deleted with a stale checkpoint.
* The cleaner deletes a directory only after taking its lock itself, and only if it has been
  idle longer than ``state_cleanup_delay``.

Local state is a cache: even a correct checkpoint is trusted only if it agrees with the shards
(:func:`millstream.spark.runner.checkpoint_verdict`).
"""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path

from millstream.clock import SYSTEM_CLOCK, Clock
from millstream.errors import StateDirLockedError, StateLockNotHeldError

LOCKS = ".locks"


class StateDirectory:
    def __init__(self, root: Path, task_id: str) -> None:
        if not task_id or "/" in task_id or task_id.startswith("."):
            raise ValueError(f"invalid task id {task_id!r}")
        self.root = Path(root)
        self.task_id = task_id
        self.path = self.root / task_id
        self._fd: int | None = None

    @property
    def lock_path(self) -> Path:
        return self.root / LOCKS / f"{self.task_id}.lock"

    @property
    def held(self) -> bool:
        return self._fd is not None

    def _acquire(self) -> bool:
        if self._fd is not None:
            return True
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def _release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def lock(self) -> None:
        """Take the lock without waiting; StateDirLockedError if someone else has it."""
        if not self._acquire():
            raise StateDirLockedError(str(self.path))
        self.path.mkdir(parents=True, exist_ok=True)
        self.touch()

    def unlock(self) -> None:
        """Release the lock; the directory's mtime records the last use (for the cleaner)."""
        if self._fd is not None:
            self.touch()
            self._release()

    def _require_lock(self, what: str) -> None:
        if self._fd is None:
            raise StateLockNotHeldError(what, str(self.path))

    def touch(self) -> None:
        if self.path.is_dir():
            os.utime(self.path)

    @property
    def checkpoint_dir(self) -> Path:
        """Where the Spark checkpoint lives. Only meaningful while the lock is held."""
        self._require_lock("use the checkpoint of")
        return self.path / "checkpoint"

    def read_checkpoint(self, name: str) -> bytes | None:
        self._require_lock("read a checkpoint from")
        try:
            return (self.path / name).read_bytes()
        except FileNotFoundError:
            return None

    def write_checkpoint(self, name: str, data: bytes) -> None:
        self._require_lock("write a checkpoint to")
        target = self.path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_bytes(data)
        tmp.replace(target)  # atomic: a reader never sees half a checkpoint
        self.touch()


class StateDirCleaner:
    """Deletes state directories nobody holds that were idle longer than ``delay`` seconds."""

    def __init__(self, root: Path, *, delay: float, clock: Clock = SYSTEM_CLOCK) -> None:
        self.root = Path(root)
        self.delay = delay
        self.clock = clock

    def clean(self) -> list[str]:
        removed: list[str] = []
        if not self.root.is_dir():
            return removed
        for d in sorted(self.root.iterdir()):
            if not d.is_dir() or d.name.startswith("."):
                continue
            sd = StateDirectory(self.root, d.name)
            if not sd._acquire():
                continue
            try:
                if self.clock.now() - d.stat().st_mtime > self.delay:
                    shutil.rmtree(d)
                    removed.append(d.name)
            finally:
                sd._release()
        return removed
