"""The membership of a running shared query: which datastreams it runs *now*.

A shared query's members are no longer fixed for its life. The worker's
:class:`~millstream.spark.shared.SharedQueryRunner` keeps them in a small JSON file beside
the query's checkpoint (``members.json`` in the query's state directory, on the driver), and
the query reads it:

* its source (:class:`~millstream.spark.sources.GroupStreamReader`, in Spark's source
  process on the driver) at each batch it plans: a member that joined enters at the start
  offsets in its entry (its shard uppers), a member that left is planned no more;
* its sink's commit (:class:`~millstream.spark.sink.GroupSink`, in Spark's commit process on
  the driver), under a shared lock of the file: a member's part of a batch commits only while
  the member is still in it with the same incarnation (``since``). The runner removes a member
  under the exclusive lock, so once :meth:`Membership.exclusive` has returned no commit of the
  removed member is in flight and none starts later.

Each entry carries the generation at which the member joined (``since``), its source's and
its sink's options (``SourceOptions.to_options`` / ``SinkOptions.to_options``). A member
removed and added again is a new incarnation (a new ``since``, new start offsets): what the
old one planned or staged never commits.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from millstream.errors import InvalidSpecError

#: The membership file's name in the shared query's state directory.
MEMBERSHIP_FILE = "members.json"


@dataclass(frozen=True, slots=True)
class Member:
    """A member datastream's entry: the generation it joined at and its options."""

    since: int
    source: dict[str, str]
    sink: dict[str, str]

    def to_json(self) -> dict[str, Any]:
        return {"since": self.since, "source": self.source, "sink": self.sink}

    @classmethod
    def from_json(cls, name: str, data: Any) -> Member:
        if not isinstance(data, dict) or not isinstance(data.get("since"), int):
            raise InvalidSpecError(
                "members", f"the shared query's member {name!r} has no valid entry: {data!r}"
            )
        return cls(data["since"], dict(data.get("source") or {}), dict(data.get("sink") or {}))


class MembershipLockTimeout(Exception):
    """The exclusive lock was not had in time (a commit still holds the shared one)."""


class Membership:
    """The membership file at ``path`` and its lock (``path`` + ``.lock``, never deleted)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        #: The file's bytes at the last :meth:`read_changed` that parsed them.
        self._raw: bytes | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_raw": None}  # the file's bytes never travel to a task

    def read(self) -> tuple[int, dict[str, Member]]:
        """The generation and the members; ``(-1, {})`` when there is no file yet."""
        try:
            return self._parse(self.path.read_bytes())
        except FileNotFoundError:
            return -1, {}

    def read_changed(self) -> tuple[int, dict[str, Member]] | None:
        """:meth:`read`, or None when the file holds the bytes the last call parsed: a shared
        query's source reads it at every tick of the query (ten a second at the default
        trigger), and parsing every member's entry each time cost the 100 tables of one
        datastream milliseconds a tick for a file that changes at a join or a leave."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return -1, {}
        if raw == self._raw:
            return None
        parsed = self._parse(raw)
        self._raw = raw
        return parsed

    @staticmethod
    def _parse(raw: bytes) -> tuple[int, dict[str, Member]]:
        data = json.loads(raw)
        members = data.get("members") or {}
        return int(data["generation"]), {
            str(n): Member.from_json(str(n), m) for n, m in members.items()
        }

    def write(self, generation: int, members: dict[str, Member]) -> None:
        """Replace the file at once (a reader sees the old or the new membership, whole)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(
            json.dumps(
                {
                    "generation": generation,
                    "members": {n: m.to_json() for n, m in sorted(members.items())},
                }
            )
        )
        os.replace(tmp, self.path)

    @contextmanager
    def _locked(self, mode: int, timeout: float | None) -> Iterator[None]:
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if timeout is None:
                fcntl.flock(fd, mode)
            else:
                deadline = time.monotonic() + timeout
                while True:
                    try:
                        fcntl.flock(fd, mode | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() >= deadline:
                            raise MembershipLockTimeout(str(self.lock_path)) from None
                        time.sleep(0.02)
            yield
        finally:
            os.close(fd)  # releases the lock

    @contextmanager
    def shared(self) -> Iterator[dict[str, Member]]:
        """The members, held for the block: no member leaves meanwhile (a commit's fence)."""
        with self._locked(fcntl.LOCK_SH, None):
            yield self.read()[1]

    @contextmanager
    def exclusive(self, timeout: float) -> Iterator[None]:
        """Held while the membership changes: waits for the commits in flight (at most
        ``timeout`` seconds, else :class:`MembershipLockTimeout`)."""
        with self._locked(fcntl.LOCK_EX, timeout):
            yield
