"""A stand-in for the worker's shared Spark query (``SharedQueryRunner``), for tests of the
worker's membership decisions without Spark: it records its members by member key, every
start, join and leave, and runs until stopped. ``refuse`` makes joins and leaves answer False
(the runner's answer when a change needs a restart)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from millstream.control import worker as worker_module
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
