"""The Iceberg publisher in a process of its own, a child of the worker (or ``millstream run``).

A publish is NumPy, Arrow and pyiceberg work, much of it Python code holding the GIL: run on a
thread of the writer's process it delays the writer's commits while it computes (the commit
latency p99 doubled at 5,000 rows/s, docs/performance.md). :class:`PublisherProcess` runs the
same :class:`~millstream.sealing.maintenance.Publisher` (its per-table supervision, its
incremental :class:`~millstream.table.iceberg.PublishCache`) in a child process instead:

* The parent drives it from its own supervised loop (``loop="publishing"``): each step sends
  the tables to publish and the parent clock's time on the child's stdin (one JSON line) and
  waits for the child's reply (one JSON line on its stdout: what it published, its per-table
  loop statuses). Waiting on a pipe holds no GIL: the writer's threads run meanwhile.
* The child decides what is due by the parent's clock (the time each request carries), so a
  publish is due when it would be in the parent. It runs at a lower CPU priority
  (:data:`CHILD_NICENESS`) with one Arrow compute thread: on a busy machine the writer's
  commits get the CPU first, and a publish waits.
* A child that exits, crashes or does not answer within ``reply_timeout`` (then killed) fails
  the step: the error names the owner, the pid and the exit code, is logged, counted
  (``millstream_background_errors{loop="publishing"}``), shown in the loop's status (worker
  heartbeat, ``GET /workers``, ``debugInfo``) and the next step, after the loop's backoff,
  starts a new child. The new child's first publish of a table reads it in full.
* The child dies with its parent: it exits when its stdin reaches end of file (the parent
  closed it, or died: a SIGKILLed parent's pipe closes with it) and, while a publish runs,
  when its parent process is gone (a watcher thread compares ``os.getppid()``).

Run as ``python -m millstream.sealing.publishing`` by :class:`PublisherProcess` only.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any, NoReturn

import pyarrow as pa

from millstream.catalog import Catalog
from millstream.clock import SYSTEM_CLOCK, Clock
from millstream.config import Settings
from millstream.errors import PublisherProcessError
from millstream.sealing.maintenance import DEFAULT_PUBLISH_INTERVAL, Publisher
from millstream.supervise import LoopStatus

log = logging.getLogger(__name__)

#: Seconds a publisher process may take to answer one step (a first publish of a large table
#: reads it all) before it is killed and the step fails.
DEFAULT_REPLY_TIMEOUT = 900.0
#: Seconds between two checks of the child that its parent still lives.
PARENT_CHECK_SECONDS = 1.0
#: The publisher process's niceness increment (``os.nice``): it yields the CPU to the writer.
CHILD_NICENESS = 10


class PublisherProcess:
    """A :class:`~millstream.sealing.maintenance.Publisher` run in a child process (see the
    module's docstring). Same surface as the in-process one: :meth:`run_due`, :meth:`status`,
    :meth:`loop_statuses`; :meth:`flush` publishes every table now; :meth:`close` ends the
    child. Steps run on one thread (the caller's loop)."""

    def __init__(
        self,
        catalog: Catalog,
        *,
        interval: float = DEFAULT_PUBLISH_INTERVAL,
        clock: Clock = SYSTEM_CLOCK,
        owner: str = "",
        reply_timeout: float = DEFAULT_REPLY_TIMEOUT,
        niceness: int = CHILD_NICENESS,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"publish interval must be positive, got {interval}")
        self.settings: Settings = catalog.settings
        self.interval = interval
        self.clock = clock
        #: Who runs it (a worker id, a writer id): named in its errors and logs.
        self.owner = owner
        self.reply_timeout = reply_timeout
        #: The child's niceness increment (``os.nice``; 0: the parent's priority).
        self.niceness = niceness
        #: Children started in all (the first included) and the last one's pid.
        self.starts = 0
        self.pid: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._published: dict[str, dict[str, Any]] = {}
        self._loops: list[LoopStatus] = []

    #: No cache in this process: the child holds it (an expiry's publish is the child's, too).
    cache: Any = None

    @property
    def alive(self) -> bool:
        proc = self._proc
        return proc is not None and proc.poll() is None

    def run_due(self, tables: Mapping[str, Sequence[str]]) -> None:
        """``tables``: datastream -> its tables. The child publishes those whose turn has come
        (by this process's clock). Raises :class:`PublisherProcessError` if the child is gone
        or does not answer (the next call starts a new one)."""
        self._request({"tables": {ds: list(names) for ds, names in tables.items()}})

    def flush(self, tables: Mapping[str, Sequence[str]]) -> None:
        """Publish every table of ``tables`` now, due or not (``millstream run --available-now``
        before it exits). Raises the first table's error, or :class:`PublisherProcessError`."""
        reply = self._request(
            {"tables": {ds: list(names) for ds, names in tables.items()}, "flush": True}
        )
        if reply.get("error"):
            raise PublisherProcessError(
                f"publisher process of {self.owner or 'this process'}: {reply['error']}",
                table=reply.get("table"),
            )

    def status(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return {name: dict(view) for name, view in sorted(self._published.items())}

    def loop_statuses(self, *, alive: bool) -> list[LoopStatus]:
        """The child's per-table publisher statuses as it last reported them (``alive`` is the
        caller loop's and the child's)."""
        up = alive and self.alive
        with self._lock:
            return [LoopStatus(**{**s.to_dict(), "alive": up and s.alive}) for s in self._loops]

    def describe(self) -> dict[str, Any]:
        return {"pid": self.pid, "alive": self.alive, "starts": self.starts}

    def close(self, timeout: float = 10.0) -> None:
        """End the child: close its stdin (it exits after the publish in progress), kill it
        if it has not within ``timeout`` seconds."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        finally:
            if proc.stdout is not None:
                proc.stdout.close()

    # -- the parent's side of the protocol ---------------------------------------------------

    def _who(self, proc: subprocess.Popen[bytes]) -> str:
        return f"publisher process of {self.owner or 'this process'} (pid {proc.pid})"

    def _start(self) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "millstream.sealing.publishing"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,  # the child logs to the parent's stderr
            close_fds=True,
            # Its own session: a Ctrl-C at the terminal (SIGINT to the foreground process
            # group) is the parent's to handle; the child ends when the parent closes its stdin
            # or dies, not with a KeyboardInterrupt traceback mid-publish.
            start_new_session=True,
        )
        self.starts += 1
        self.pid = proc.pid
        self._proc = proc
        hello = {
            "settings": self.settings.model_dump(mode="json"),
            "interval": self.interval,
            "parent": os.getpid(),
            "owner": self.owner,
            "log_level": logging.getLogger().getEffectiveLevel(),
            "niceness": self.niceness,
        }
        self._send(proc, hello)
        log.info("started the %s", self._who(proc))
        return proc

    def _send(self, proc: subprocess.Popen[bytes], message: dict[str, Any]) -> None:
        assert proc.stdin is not None
        try:
            proc.stdin.write(json.dumps(message).encode() + b"\n")
            proc.stdin.flush()
        except OSError as exc:  # BrokenPipeError: it is gone
            self._lost(proc, f"cannot be written to ({exc})")

    def _lost(self, proc: subprocess.Popen[bytes], what: str) -> NoReturn:
        """The child failed: make sure it is gone, forget it, raise."""
        if proc.poll() is None:
            proc.kill()
        code = proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        if self._proc is proc:
            self._proc = None
        raise PublisherProcessError(f"{self._who(proc)} {what}; exit code {code}")

    def _request(self, message: dict[str, Any]) -> dict[str, Any]:
        proc = self._proc
        if proc is not None and proc.poll() is not None:
            self._lost(proc, "exited")
        if proc is None:
            proc = self._start()
        self._send(proc, {**message, "now": self.clock.now()})
        reply = self._reply(proc)
        with self._lock:
            self._published = dict(reply.get("published") or {})
            self._loops = [LoopStatus(**s) for s in reply.get("loops") or []]
        return reply

    def _reply(self, proc: subprocess.Popen[bytes]) -> dict[str, Any]:
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        deadline = time.monotonic() + self.reply_timeout
        buf = b""
        while not buf.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0:
                self._lost(proc, f"did not answer within {self.reply_timeout:g} s (killed)")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                self._lost(proc, "exited")
            buf += chunk
        try:
            reply = json.loads(buf)
        except ValueError:
            self._lost(proc, f"answered something else than JSON ({buf[:200]!r}; killed)")
        if not isinstance(reply, dict):
            self._lost(proc, "answered something else than a JSON object (killed)")
        return reply


# -- the child --------------------------------------------------------------------------------


class _ParentTime:
    """The child's clock: the time the parent's last request carried."""

    def __init__(self) -> None:
        self.t = time.time()

    def now(self) -> float:
        return self.t


def _watch_parent(parent: int) -> None:
    """End this process as soon as its parent is gone (reparented), even mid-publish."""
    while True:
        if os.getppid() != parent:
            os._exit(0)
        time.sleep(PARENT_CHECK_SECONDS)


#: Linux's scheduler autogroup of this process (``kernel.sched_autogroup_enabled``).
AUTOGROUP = Path("/proc/self/autogroup")


def lower_priority(niceness: int) -> None:
    """Run below the writer: ``os.nice`` and, where the kernel groups the CPU by session
    (autogroup, on by default in most Linux distributions), the session's niceness too. The
    child runs in a session of its own (``start_new_session``), so the kernel first shares the
    CPU equally between its session and the writer's, and ``os.nice`` alone only orders the
    threads inside each: a publish then took half the cores from the writer's commits."""
    os.nice(niceness)
    try:
        AUTOGROUP.write_text(str(niceness))
    except OSError as exc:  # no autogroups here (or not ours to change): os.nice is it
        log.debug("could not lower the publisher's autogroup priority: %s", exc)


def serve(requests: IO[bytes], replies: IO[bytes]) -> None:
    """The child's loop: the first line configures it, each next one is a step."""
    first = requests.readline()
    if not first:
        return
    hello = json.loads(first)
    logging.basicConfig(
        level=int(hello.get("log_level", logging.WARNING)),
        format="%(asctime)s %(levelname)s [iceberg publisher %(process)d] %(name)s: %(message)s",
    )
    # Below the writer: on a busy machine the CPU goes to its commits first (a publish only
    # waits), and Arrow computes on one thread here, so a publish takes at most about a core.
    lower_priority(int(hello.get("niceness", CHILD_NICENESS)))
    pa.set_cpu_count(1)
    threading.Thread(
        target=_watch_parent, args=(int(hello["parent"]),), daemon=True, name="parent-watch"
    ).start()
    clock = _ParentTime()
    catalog = Catalog.open(settings=Settings.model_validate(hello["settings"]))
    publisher = Publisher(catalog, interval=float(hello["interval"]), clock=clock)
    for line in iter(requests.readline, b""):
        request = json.loads(line)
        clock.t = float(request["now"])
        tables: dict[str, list[str]] = request.get("tables") or {}
        reply: dict[str, Any] = {}
        if request.get("flush"):
            for names in tables.values():
                for name in names:
                    try:
                        publisher.publish([name])
                    except Exception as exc:  # reported to the parent, which raises it
                        log.warning("publishing the Iceberg view of %s failed: %s", name, exc)
                        reply.setdefault("error", f"table {name!r}: {type(exc).__name__}: {exc}")
                        reply.setdefault("table", name)
        else:
            publisher.run_due(tables)
        reply["published"] = publisher.status()
        reply["loops"] = [s.to_dict() for s in publisher.loop_statuses(alive=True)]
        replies.write(json.dumps(reply).encode() + b"\n")
        replies.flush()


def main() -> None:
    # Stopped by its parent only (stdin closed, or the parent gone): never by a terminal's
    # Ctrl-C, should one reach it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The protocol owns the original stdout; anything else printed goes to stderr.
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    serve(sys.stdin.buffer, replies)


if __name__ == "__main__":
    main()
