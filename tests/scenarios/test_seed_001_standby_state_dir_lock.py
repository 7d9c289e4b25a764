"""Seed 001: KAFKA-8187, a standby's stale checkpoint resurrects a cleaned state directory.

Two StreamThreads in one JVM. A holds the state directory lock of task 1_0. A reassignment
gives B a standby for 1_0 while A still holds that lock. Then:

1. B creates the standby, which reads the checkpoint (an offset) from disk without the lock.
2. B fails to lock the directory, since A holds it. B still reports RUNNING, because only
   its active tasks are checked.
3. A closes its task and releases the lock. Nobody holds the directory now.
4. After the cleanup delay, the cleaner finds the directory unlocked and deletes it.
5. At the next reassignment, B writes back the offset it read in step 1. This re-creates
   the directory, holding only a ``.checkpoint`` and no store data.
6. A task restored from that directory is missing every record before the stale offset.

Millstream has a rule for each step. A checkpoint is read only after locking and written
only while locked (:class:`StateLockNotHeldError` otherwise). A worker reports RUNNING only
when every writer it hosts holds its lock. The cleaner deletes only directories it can lock
itself that have been idle longer than the delay. Local state is a cache: the runner reuses a
checkpoint only if it agrees with the shards, so even a stale checkpoint written back under
the lock is discarded, and the table still holds every record.

The threads below are real, and each step joins its thread before the next step starts, so
the order is fixed. Time is a ManualClock, and directory ages are set with ``os.utime``.
``test_control_...`` removes the lock guard and shows the resurrection, so the guard is what
the main test relies on.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from harness.ingest_support import run_until_caught_up
from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.control.controller import Controller, ControlSettings
from millstream.control.registry import Registry
from millstream.control.worker import Worker
from millstream.control.workers import heartbeat, list_workers
from millstream.core.assignment import ACTIVE, STANDBY
from millstream.datastream import DatastreamSpec
from millstream.errors import StateDirLockedError, StateLockNotHeldError
from millstream.reference.model import canonical
from millstream.reference.oracle import RawRecord, expected_table
from millstream.spark.runner import DatastreamRunner
from millstream.storage.statedir import StateDirCleaner, StateDirectory

T = TypeVar("T")
TASK = "1_0"
CHECKPOINT = ".checkpoint"
DELAY = 600.0  # state_cleanup_delay


def on_thread(name: str, fn: Callable[[], T]) -> T:
    """Run ``fn`` on a new thread named ``name``; wait for it; return or raise its result."""
    result: list[Any] = []

    def body() -> None:
        try:
            result.append(("ok", fn()))
        except BaseException as exc:
            result.append(("err", exc))

    t = threading.Thread(target=body, name=name)
    t.start()
    t.join()
    kind, value = result[0]
    if kind == "err":
        raise value
    return value  # type: ignore[no-any-return]


def raises(exc: type[BaseException], fn: Callable[[], object]) -> BaseException | None:
    """The exception of type ``exc`` that ``fn`` raised, or None if it returned."""
    try:
        fn()
    except exc as e:
        return e
    return None


def idle_since(path: Path, t: float) -> None:
    """Record ``t`` (a ManualClock time) as the directory's last use."""
    os.utime(path, (t, t))


def thread_a_owns_task(root: Path) -> StateDirectory:
    """Thread A has run task 1_0 for a while: lock held, store data, checkpoint at 150.
    Its checkpoint was 100 when B's standby was created (B reads it in the control test)."""
    a = StateDirectory(root, TASK)

    def run() -> None:
        a.lock()
        (a.path / "store").mkdir()
        (a.path / "store" / "000001.sst").write_bytes(b"records 0..150")
        a.write_checkpoint(CHECKPOINT, b"offset=100")

    on_thread("StreamThread-A", run)
    return a


def test_standby_without_the_lock_never_touches_the_checkpoint_nor_resurrects_a_cleaned_dir(
    tmp_path: Path,
) -> None:
    root, clock = tmp_path / "state", ManualClock()
    cleaner = StateDirCleaner(root, delay=DELAY, clock=clock)
    a = thread_a_owns_task(root)

    # Reassignment: B creates a standby for 1_0 while A still holds the lock.
    b = StateDirectory(root, TASK)

    def b_creates_standby() -> tuple[BaseException | None, BaseException | None, bytes | None]:
        read_before_lock = raises(StateLockNotHeldError, lambda: b.read_checkpoint(CHECKPOINT))
        lock_error = raises(StateDirLockedError, b.lock)
        still_refused = raises(StateLockNotHeldError, lambda: b.read_checkpoint(CHECKPOINT))
        return read_before_lock, lock_error, None if still_refused else b"read!"

    read_before_lock, lock_error, read_after = on_thread("StreamThread-B", b_creates_standby)
    assert isinstance(read_before_lock, StateLockNotHeldError), "B read before locking"
    assert isinstance(lock_error, StateDirLockedError), "B locked a directory A holds"
    assert read_after is None, "B read the checkpoint without the lock"
    assert not b.held

    # The cleaner never deletes a directory someone holds, however idle it looks.
    idle_since(a.path, clock.now() - 10 * DELAY)
    assert cleaner.clean() == []
    assert a.path.is_dir()

    # A closes its task (checkpoint at 150 first) and releases the lock.
    def a_closes() -> None:
        a.write_checkpoint(CHECKPOINT, b"offset=150")
        a.unlock()

    on_thread("StreamThread-A", a_closes)
    idle_since(a.path, clock.now())
    clock.advance(DELAY / 2)
    assert cleaner.clean() == [], "not idle for the whole delay yet"
    clock.advance(DELAY / 2 + 1)
    assert cleaner.clean() == [TASK]
    assert not (root / TASK).exists()

    # The next reassignment: B's stale attempt to write its checkpoint is refused and the
    # directory stays deleted.
    stale_write = on_thread(
        "StreamThread-B",
        lambda: raises(StateLockNotHeldError, lambda: b.write_checkpoint(CHECKPOINT, b"x")),
    )
    assert isinstance(stale_write, StateLockNotHeldError)
    assert not (root / TASK).exists(), "a refused write re-created the state directory"

    # Done properly (lock, then read), B starts from an empty directory, not a stale offset.
    def b_takes_over() -> bytes | None:
        b.lock()
        return b.read_checkpoint(CHECKPOINT)

    assert on_thread("StreamThread-B", b_takes_over) is None
    b.unlock()


def test_control_without_the_lock_guard_a_stale_checkpoint_resurrects_the_deleted_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: with ``_require_lock`` a no-op, KAFKA-8187 happens as reported. B reads
    offset 100 before locking, and after the cleaner ran it writes that offset back. The
    directory comes back with only a ``.checkpoint`` (and no store data), which is the
    assertion ``not (root / TASK).exists()`` in the test above turned false."""
    monkeypatch.setattr(StateDirectory, "_require_lock", lambda self, what: None)
    root, clock = tmp_path / "state", ManualClock()
    cleaner = StateDirCleaner(root, delay=DELAY, clock=clock)
    a = thread_a_owns_task(root)
    b = StateDirectory(root, TASK)

    def b_creates_standby() -> bytes | None:
        stale = b.read_checkpoint(CHECKPOINT)  # read at creation, before (failing to) lock
        with pytest.raises(StateDirLockedError):
            b.lock()
        return stale

    stale = on_thread("StreamThread-B", b_creates_standby)
    assert stale == b"offset=100"

    def a_closes() -> None:
        a.write_checkpoint(CHECKPOINT, b"offset=150")
        a.unlock()

    on_thread("StreamThread-A", a_closes)
    idle_since(a.path, clock.now())
    clock.advance(DELAY + 1)
    assert cleaner.clean() == [TASK]

    on_thread("StreamThread-B", lambda: b.write_checkpoint(CHECKPOINT, stale))
    assert (root / TASK).exists(), "the stale write resurrected the directory"
    assert sorted(p.name for p in (root / TASK).iterdir()) == [CHECKPOINT]
    assert (root / TASK / CHECKPOINT).read_bytes() == b"offset=100"


# -- the worker's status -------------------------------------------------------------------


def test_worker_reports_starting_not_running_while_its_standby_waits_for_the_lock(
    tmp_path: Path,
) -> None:
    """KAFKA-8187 step 2: B went RUNNING because only its active tasks were checked. A
    Millstream worker whose standby writer cannot lock its state directory reports STARTING,
    and lists that writer as neither locked nor running."""
    clock = ManualClock()
    root = tmp_path / "state"
    settings = ControlSettings(lease_ttl=3600, worker_ttl=3600, tick_seconds=1)
    with Catalog.open(home=tmp_path / "home") as cat:
        registry = Registry(cat.store, clock=clock)
        registry.create(
            DatastreamSpec.parse(
                {
                    "name": TASK,
                    "source": {"kind": "files", "path": str(tmp_path / "source")},
                    "schema": {"id": "long"},
                    "replicas": 2,
                }
            )
        )
        heartbeat(cat.store, "worker-a", status="RUNNING", info={"writers": []}, clock=clock)
        # Spark is never reached: worker B's writer stops at the state directory lock.
        worker_b = Worker(
            cat, None, worker_id="worker-b", settings=settings, clock=clock, state_root=root
        )
        worker_b.tick()  # registers worker-b (nothing assigned yet)
        leader = Controller(cat, controller_id="leader", settings=settings, clock=clock)
        assert leader.tick()
        assert cat.store.read_assignments() == {TASK: [("worker-a", ACTIVE), ("worker-b", STANDBY)]}

        a = StateDirectory(root, TASK)  # thread A of the same process still holds 1_0
        on_thread("StreamThread-A", a.lock)
        on_thread("StreamThread-B", worker_b.tick)

        info = {w.id: w for w in list_workers(cat.store)}["worker-b"]
        assert info.status == "STARTING"
        [writer] = info.info["writers"]
        assert {k: writer[k] for k in ("datastream", "role", "running", "locked", "error")} == {
            "datastream": TASK,
            "role": STANDBY,
            "running": False,
            "locked": False,
            "error": None,
        }
        assert writer["health"]["status"] == "starting"  # never running without its lock
        assert not worker_b.writers[TASK].state_dir.held
        a.unlock()


# -- the table is complete -----------------------------------------------------------------


def write_source(root: Path, part: str, rows: dict[int, list[dict[str, Any]]]) -> None:
    """Append a file ``part`` of JSON lines to each partition directory."""
    for p, lines in rows.items():
        d = root / str(p)
        d.mkdir(parents=True, exist_ok=True)
        (d / part).write_text("".join(json.dumps(r) + "\n" for r in lines))


def source_records(root: Path) -> list[RawRecord]:
    """Every record in the files source, as the oracle wants it: offset = line number."""
    out: list[RawRecord] = []
    for pdir in sorted(root.iterdir()):
        lines = [
            line.encode() for f in sorted(pdir.iterdir()) for line in f.read_text().splitlines()
        ]
        out.extend((int(pdir.name), o, None, v) for o, v in enumerate(lines))
    return out


def rows(part: int, n: int) -> dict[int, list[dict[str, Any]]]:
    """``n`` rows per partition; ids repeat across parts, so later parts update earlier rows
    (ids are per partition: id % 2 == partition)."""
    return {
        p: [{"id": 2 * (i % 5) + p, "amount": 100 * part + i, "part": part} for i in range(n)]
        for p in (0, 1)
    }


@pytest.mark.spark
def test_stale_checkpoint_written_back_after_cleanup_is_discarded_and_table_has_every_record(
    spark: Any, tmp_path: Path
) -> None:
    """KAFKA-8187 step 6, end to end. Standby B ingested part 0 and keeps a copy of its
    checkpoint. The active A ingests part 1. B's idle directory is cleaned, and later B (now
    holding the lock) writes its stale checkpoint copy back. When B then runs, it must discard
    that checkpoint, because it disagrees with the shards, and resume from the shard uppers.
    The table equals the source model."""
    src, clock = tmp_path / "source", ManualClock()
    spec = DatastreamSpec.parse(
        {
            "name": "orders",
            "source": {"kind": "files", "path": str(src)},
            "schema": {"id": "long", "amount": "long", "part": "long"},
            "table": {"mode": "upsert", "primary_key": ["id"]},
            "max_records_per_batch": 16,
        }
    )
    b_root, a_root = tmp_path / "worker-b", tmp_path / "worker-a"
    with Catalog.open(home=tmp_path / "home") as cat:
        # B ingests part 0, then keeps a copy of its checkpoint (taken under the lock).
        write_source(src, "000.jsonl", rows(0, 8))
        b_dir = StateDirectory(b_root, TASK)
        first = DatastreamRunner(spec, cat, spark, writer_id="b", state_dir=b_dir)
        assert run_until_caught_up(first).discarded_checkpoints == []
        b_dir.lock()
        stale_copy = tmp_path / "b-stale-checkpoint"
        shutil.copytree(b_dir.checkpoint_dir, stale_copy)
        b_dir.unlock()

        # The active A ingests part 1: the shards move past B's checkpoint.
        write_source(src, "001.jsonl", rows(1, 8))
        a_run = run_until_caught_up(
            DatastreamRunner(
                spec, cat, spark, writer_id="a", state_dir=StateDirectory(a_root, TASK)
            )
        )
        assert a_run.discarded_checkpoints == []
        uppers = {s.partition: s.upper for s in cat.store.list_shards(spec.table_name)}
        assert uppers == {0: 16, 1: 16}

        # B's directory is idle and unlocked: the cleaner deletes it.
        idle_since(b_dir.path, clock.now())
        clock.advance(DELAY + 1)
        assert StateDirCleaner(b_root, delay=DELAY, clock=clock).clean() == [TASK]
        assert not b_dir.path.exists()

        # Reassignment: B gets 1_0 back and, holding the lock, writes its stale copy back.
        b_dir.lock()
        shutil.copytree(stale_copy, b_dir.checkpoint_dir)
        b_dir.unlock()

        write_source(src, "002.jsonl", rows(2, 5))
        again = DatastreamRunner(spec, cat, spark, writer_id="b", state_dir=b_dir)
        stats = run_until_caught_up(again)

        assert len(stats.discarded_checkpoints) == 1, stats.discarded_checkpoints
        assert "the shard upper is 16" in stats.discarded_checkpoints[0]
        assert stats.restarts == 0
        records = source_records(src)
        assert len(records) == 42
        expected, bad = expected_table(spec.table_spec(), records)
        assert bad == []
        got = cat.read_table(spec.table_name).to_pylist()
        assert canonical(got) == canonical(expected)
        uppers = {s.partition: s.upper for s in cat.store.list_shards(spec.table_name)}
        assert uppers == {0: 21, 1: 21}
