"""State directories: an exclusive lock, checkpoints read and written only under it, and a
cleaner that deletes only unlocked directories idle longer than the delay."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from millstream.clock import ManualClock
from millstream.errors import StateDirLockedError, StateLockNotHeldError
from millstream.storage.statedir import LOCKS, StateDirCleaner, StateDirectory

DELAY = 600.0


def age(path: Path, mtime: float) -> None:
    """Set the directory's last use to ``mtime`` (a ManualClock time)."""
    os.utime(path, (mtime, mtime))


def test_the_lock_is_exclusive_until_released(tmp_path: Path) -> None:
    a, b = StateDirectory(tmp_path, "t1"), StateDirectory(tmp_path, "t1")
    a.lock()
    assert a.held and a.path.is_dir()
    with pytest.raises(StateDirLockedError) as err:
        b.lock()
    assert err.value.fields == {"path": str(tmp_path / "t1")}
    assert not b.held
    a.lock()  # re-locking one's own directory is a no-op
    a.unlock()
    assert not a.held
    b.lock()
    assert b.held
    b.unlock()


def test_different_tasks_lock_independently(tmp_path: Path) -> None:
    a, b = StateDirectory(tmp_path, "t1"), StateDirectory(tmp_path, "t2")
    a.lock()
    b.lock()
    assert a.held and b.held
    a.unlock()
    b.unlock()


def test_checkpoints_are_read_and_written_only_under_the_lock(tmp_path: Path) -> None:
    sd = StateDirectory(tmp_path, "t1")
    with pytest.raises(StateLockNotHeldError):
        sd.read_checkpoint(".checkpoint")
    with pytest.raises(StateLockNotHeldError):
        sd.write_checkpoint(".checkpoint", b"offset=1")
    with pytest.raises(StateLockNotHeldError):
        _ = sd.checkpoint_dir
    assert not sd.path.exists(), "a refused write must not create the directory"

    sd.lock()
    assert sd.read_checkpoint(".checkpoint") is None
    sd.write_checkpoint(".checkpoint", b"offset=1")
    sd.write_checkpoint(".checkpoint", b"offset=2")
    assert sd.read_checkpoint(".checkpoint") == b"offset=2"
    assert sd.checkpoint_dir == sd.path / "checkpoint"
    assert sorted(p.name for p in sd.path.iterdir()) == [".checkpoint"]  # no temp file left
    sd.unlock()
    with pytest.raises(StateLockNotHeldError):
        sd.read_checkpoint(".checkpoint")


def test_a_second_handle_cannot_read_the_checkpoint_another_holds(tmp_path: Path) -> None:
    a, b = StateDirectory(tmp_path, "t1"), StateDirectory(tmp_path, "t1")
    a.lock()
    a.write_checkpoint(".checkpoint", b"offset=7")
    with pytest.raises(StateLockNotHeldError):
        b.read_checkpoint(".checkpoint")
    a.unlock()


@pytest.mark.parametrize("task", ["", ".locks", ".hidden", "a/b"])
def test_invalid_task_ids_are_refused(tmp_path: Path, task: str) -> None:
    with pytest.raises(ValueError, match="invalid task id"):
        StateDirectory(tmp_path, task)


def test_cleaner_deletes_only_unlocked_directories_idle_longer_than_the_delay(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    cleaner = StateDirCleaner(tmp_path, delay=DELAY, clock=clock)
    held, idle, recent = (StateDirectory(tmp_path, t) for t in ("held", "idle", "recent"))
    for sd in (held, idle, recent):
        sd.lock()
    idle.unlock()
    recent.unlock()
    age(held.path, clock.now() - 2 * DELAY)
    age(idle.path, clock.now() - DELAY - 1)
    age(recent.path, clock.now() - DELAY + 1)

    assert cleaner.clean() == ["idle"]
    assert not idle.path.exists()
    assert held.path.is_dir() and recent.path.is_dir()
    assert (tmp_path / LOCKS).is_dir(), "the lock files are never deleted"
    assert held.held, "the cleaner must not take or break a held lock"

    clock.advance(2)
    assert cleaner.clean() == ["recent"]
    held.unlock()
    assert cleaner.clean() == [], "unlocking records a use: the directory is not idle"
    assert held.path.is_dir()


def test_unlocking_records_the_last_use_on_the_directory(tmp_path: Path) -> None:
    sd = StateDirectory(tmp_path, "t1")
    sd.lock()
    age(sd.path, 1_000_000.0)
    sd.unlock()
    assert sd.path.stat().st_mtime > 1_000_000.0


def test_a_directory_at_exactly_the_delay_is_kept(tmp_path: Path) -> None:
    clock = ManualClock()
    sd = StateDirectory(tmp_path, "t1")
    sd.lock()
    sd.unlock()
    age(sd.path, clock.now() - DELAY)
    assert StateDirCleaner(tmp_path, delay=DELAY, clock=clock).clean() == []


def test_cleaner_ignores_files_and_a_missing_root(tmp_path: Path) -> None:
    clock = ManualClock(start=4_000_000_000.0)  # far in the future: everything is idle
    assert StateDirCleaner(tmp_path / "missing", delay=DELAY, clock=clock).clean() == []
    (tmp_path / "stray.txt").write_text("x")
    assert StateDirCleaner(tmp_path, delay=DELAY, clock=clock).clean() == []
    assert (tmp_path / "stray.txt").exists()


def test_a_cleaned_directory_can_be_locked_again_and_starts_empty(tmp_path: Path) -> None:
    clock = ManualClock(start=4_000_000_000.0)
    first = StateDirectory(tmp_path, "t1")
    first.lock()
    first.write_checkpoint(".checkpoint", b"offset=9")
    first.unlock()
    assert StateDirCleaner(tmp_path, delay=DELAY, clock=clock).clean() == ["t1"]

    second = StateDirectory(tmp_path, "t1")
    second.lock()
    assert second.path.is_dir()
    assert second.read_checkpoint(".checkpoint") is None
    # The lock file survived the deletion, so the old handle cannot "share" the new lock.
    with pytest.raises(StateDirLockedError):
        first.lock()
    second.unlock()
