"""Child processes serving on a local port: the base of every server Millstream starts itself.

Each server runs as a child process listening on 127.0.0.1 only, on a free port, with its
output captured in a log file under the base directory it is given. Servers are stopped by
their own PID (terminate, wait, kill on timeout); nothing is ever killed by name. A server
still running when the interpreter exits is stopped by an ``atexit`` hook.

This module imports nothing outside the standard library.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import time
import weakref
from collections import deque
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

__all__ = [
    "HOST",
    "LOG_TAIL_LINES",
    "ManagedServer",
    "ServerStartError",
    "free_port",
    "stop_process",
    "tail_log",
    "wait_for_port",
]

HOST = "127.0.0.1"
#: How many lines of a server's log a start failure quotes.
LOG_TAIL_LINES = 40
_START_ATTEMPTS = 3  # a free_port() race with another process is retried on a fresh port


class ServerStartError(RuntimeError):
    """A server did not come up; the message names the binary and its log file."""


def free_port(host: str = HOST) -> int:
    """Return a TCP port on ``host`` that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for_port(
    host: str,
    port: int,
    timeout: float = 30.0,
    *,
    process: subprocess.Popen[bytes] | None = None,
) -> None:
    """Block until ``host:port`` accepts TCP connections.

    Raises :class:`TimeoutError` after ``timeout`` seconds, or :class:`ChildProcessError`
    as soon as ``process`` (if given) has exited.
    """
    deadline = time.monotonic() + timeout
    while True:
        if process is not None and process.poll() is not None:
            raise ChildProcessError(
                f"process {process.pid} exited with code {process.returncode} "
                f"before {host}:{port} accepted connections"
            )
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            pass
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{host}:{port} did not accept connections within {timeout:.1f}s")
        time.sleep(0.02)


def tail_log(path: Path, lines: int = LOG_TAIL_LINES, offset: int = 0) -> str:
    """The last ``lines`` lines of ``path`` after byte ``offset``."""
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            text = fh.read().decode("utf-8", errors="replace")
        return "\n".join(deque(text.splitlines(), maxlen=lines)).rstrip()
    except OSError as exc:
        return f"<could not read log: {exc}>"


def stop_process(
    proc: subprocess.Popen[bytes],
    sig: int = signal.SIGTERM,
    timeout: float = 10.0,
) -> None:
    """Signal one process by its PID, wait, and SIGKILL it if it is still alive."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(timeout)


_live_servers: weakref.WeakSet[ManagedServer] = weakref.WeakSet()


@atexit.register
def _stop_leftover_servers() -> None:  # safety net if a caller forgot stop()
    for server in list(_live_servers):
        with contextlib.suppress(Exception):
            server.stop()


class ManagedServer:
    """A child process with a log file, a port, and start/stop/context-manager plumbing.

    Subclasses set :attr:`name` and implement :meth:`_command`; the other hooks
    (:meth:`_prepare`, :meth:`_popen_kwargs`, :meth:`_wait_ready`, :meth:`_cleanup`) have
    defaults.
    """

    name = "server"
    #: SIGTERM by default; PostgreSQL wants SIGINT ("fast" shutdown, drops open sessions).
    stop_signal: int = signal.SIGTERM

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        port: int | None = None,
        *,
        startup_timeout: float = 60.0,
    ) -> None:
        self.base_dir = Path(base_dir)
        self._fixed_port = port
        self._port: int | None = port
        self.startup_timeout = startup_timeout
        self.log_path = self.base_dir / f"{self.name}.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_fh: IO[bytes] | None = None
        self._log_offset = 0
        self.startup_seconds: float | None = None

    # -- public ---------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError(f"{type(self).__name__} has not been started")
        return self._port

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> Self:
        """Start the server and block until it serves requests. Idempotent."""
        if self.running:
            return self
        self.base_dir.mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        try:
            self._prepare()
        except BaseException:
            self._cleanup()
            raise
        for attempt in range(1, _START_ATTEMPTS + 1):
            self._port = self._fixed_port if self._fixed_port is not None else free_port()
            try:
                cmd = self._command()
            except BaseException:
                self._cleanup()
                raise
            try:
                self._spawn(cmd)
                self._wait_ready()
            except BaseException as exc:
                self._kill_quietly()
                if not isinstance(exc, Exception):  # KeyboardInterrupt etc.: just clean up
                    self._cleanup()
                    raise
                log = tail_log(self.log_path, offset=self._log_offset)
                port_clash = "in use" in log.lower() or "addrinuse" in log.lower()
                if port_clash and self._fixed_port is None and attempt < _START_ATTEMPTS:
                    continue
                self._cleanup()
                raise ServerStartError(
                    f"{self.name} failed to start ({exc}).\n"
                    f"  binary: {cmd[0]}\n  command: {' '.join(cmd)}\n"
                    f"  log file: {self.log_path}\n"
                    f"  last lines of the log:\n{log}"
                ) from exc
            break
        self.startup_seconds = time.monotonic() - began
        _live_servers.add(self)
        return self

    def stop(self) -> None:
        """Stop the server by its PID (signal, wait, kill on timeout). Idempotent."""
        _live_servers.discard(self)
        if self._proc is not None:
            stop_process(self._proc, self.stop_signal)
            self._proc = None
        self._close_log()
        self._cleanup()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid={self.pid} port={self._port}" if self.running else "stopped"
        return f"<{type(self).__name__} {state} log={self.log_path}>"

    # -- hooks ----------------------------------------------------------------------------

    def _prepare(self) -> None:
        """One-off setup before the first spawn (e.g. initdb)."""

    def _command(self) -> list[str]:
        raise NotImplementedError

    def _popen_kwargs(self) -> dict[str, Any]:
        return {}

    def _wait_ready(self) -> None:
        wait_for_port(HOST, self.port, self.startup_timeout, process=self._proc)

    def _cleanup(self) -> None:
        """Remove runtime state after stop or a failed start."""

    # -- helpers --------------------------------------------------------------------------

    def _spawn(self, cmd: list[str]) -> None:
        self._close_log()
        self._log_fh = self.log_path.open("ab")
        self._log_offset = self._log_fh.tell()
        self._log_fh.write(f"\n=== {time.strftime('%H:%M:%S')} $ {' '.join(cmd)}\n".encode())
        self._log_fh.flush()
        kwargs: dict[str, Any] = {
            "stdin": subprocess.DEVNULL,
            "stdout": self._log_fh,
            "stderr": subprocess.STDOUT,
            "close_fds": True,
        }
        kwargs.update(self._popen_kwargs())
        self._proc = subprocess.Popen(cmd, **kwargs)

    def _kill_quietly(self) -> None:
        if self._proc is not None:
            stop_process(self._proc, signal.SIGKILL, timeout=5.0)
            self._proc = None
        self._close_log()

    def _close_log(self) -> None:
        if self._log_fh is not None:
            self._log_fh.close()
            self._log_fh = None

    def _check_alive(self) -> None:
        if self._proc is None or self._proc.poll() is not None:
            code = None if self._proc is None else self._proc.returncode
            raise ChildProcessError(f"process exited with code {code}")
