"""A stand-in for the worker's shared Spark query (``SharedQueryRunner``), for tests of the
worker's membership decisions without Spark: it records its members by member key, every
start, join and leave, and runs until stopped. ``refuse`` makes joins and leaves answer False
(the runner's answer when a change needs a restart). :func:`members_as_a_worker_holds_them`
makes a real shared query's members."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from millstream.catalog import Catalog
from millstream.control import worker as worker_module
from millstream.datastream import DatastreamSpec
from millstream.spark.runner import DatastreamRunner
from millstream.storage.statedir import StateDirectory


class FakeSharedQuery:
    starts: list[list[str]] = []
    changes: list[str] = []
    refuse = False

    @classmethod
    def install(cls, monkeypatch: pytest.MonkeyPatch) -> type[FakeSharedQuery]:
        """Forget what an earlier test recorded and make the worker start this fake."""
        cls.starts, cls.changes, cls.refuse = [], [], False
        monkeypatch.setattr(worker_module, "SharedQueryRunner", cls)
        return cls

    def __init__(self, members: list[Any], spark: Any, state_dir: StateDirectory, **_: Any) -> None:
        self.members = {m.member: m for m in members}
        self.restarts: dict[str, Any] = {}  # none: it never meets a fenced commit
        self._stop = threading.Event()
        FakeSharedQuery.starts.append(sorted(self.members))

    def run(self) -> None:
        self._stop.wait(30)

    def stop(self) -> None:
        self._stop.set()

    def add(self, member: Any) -> bool:
        if FakeSharedQuery.refuse:
            return False
        self.members[member.member] = member
        FakeSharedQuery.changes.append(f"+{member.member}")
        return True

    def add_many(self, members: list[Any]) -> dict[str, bool]:
        """The worker's one membership change for the members that start together."""
        return {m.member: self.add(m) for m in members}

    def remove(self, name: str) -> bool:
        if FakeSharedQuery.refuse or len(self.members) == 1:
            return False
        del self.members[name]
        FakeSharedQuery.changes.append(f"-{name}")
        return True

    def status(self) -> dict[str, Any]:
        return {"members": sorted(self.members)}


def append_files_spec(
    root: Path,
    name: str,
    *,
    partitions: int,
    lines: int,
    max_records_per_batch: int,
    trigger: str,
) -> DatastreamSpec:
    """An append datastream ``name`` over a files source under ``root`` of ``partitions``
    partitions of ``lines`` JSON lines each (ids unique across partitions, written here): a
    member of a shared query in which a duplicate would be a second row."""
    for p in range(partitions):
        (root / name / str(p)).mkdir(parents=True)
        (root / name / str(p) / "00000.jsonl").write_text(
            "".join(f'{{"id": {p * 1000 + i}, "v": "{name}{i}"}}\n' for i in range(lines))
        )
    return DatastreamSpec.parse(
        {
            "name": name,
            "source": {"kind": "files", "path": str(root / name)},
            "schema": {"id": "long", "v": "string"},
            "table": {"mode": "append"},  # a duplicate would be a second row
            "max_records_per_batch": max_records_per_batch,
            "trigger_interval": trigger,
        }
    )


def members_as_a_worker_holds_them(
    specs: list[DatastreamSpec], catalog: Catalog, spark: Any, state_root: Path
) -> list[DatastreamRunner]:
    """A real shared query's members: a runner of writer ``w1`` per spec, each holding its
    state directory under ``state_root`` as a worker holds its members'."""
    members = [
        DatastreamRunner(
            s, catalog, spark, writer_id="w1", state_dir=StateDirectory(state_root, s.name)
        )
        for s in specs
    ]
    for m in members:
        m.state_dir.lock()
    return members
