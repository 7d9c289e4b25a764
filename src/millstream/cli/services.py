"""Long-running services in one process: each runs in a thread, and SIGINT/SIGTERM (or one
of them dying) stops them all, in reverse order of start."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

from millstream.errors import ServiceStartError

log = logging.getLogger(__name__)


class ServiceGroup:
    def __init__(self) -> None:
        self._stop = threading.Event()
        self._services: list[tuple[str, threading.Thread, Callable[[], None]]] = []
        self.failures: list[str] = []
        self._old_handlers: dict[int, Any] = {}

    def start(self, name: str, run: Callable[[], None], stop: Callable[[], None]) -> None:
        def _run() -> None:
            failure = f"{name} exited on its own"
            try:
                run()
            except BaseException as exc:  # SystemExit from uvicorn on a bind failure, too
                failure = f"{name} failed: {exc!r}"
                log.error("%s", failure)
            finally:
                if not self._stop.is_set():  # nobody asked it to stop: stop the others too
                    self.failures.append(failure)
                    self._stop.set()

        thread = threading.Thread(target=_run, name=name, daemon=True)
        self._services.append((name, thread, stop))
        thread.start()

    def alive(self, name: str) -> bool:
        return any(n == name and t.is_alive() for n, t, _ in self._services)

    def handle_signals(self) -> None:
        """SIGINT and SIGTERM stop the group (main thread only; restored by :meth:`close`)."""

        def _handler(signum: int, _frame: FrameType | None) -> None:
            self._stop.set()

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                old = signal.signal(sig, _handler)  # again after Spark took SIGINT: keep the first
                self._old_handlers.setdefault(sig, old)

    def request_stop(self) -> None:
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def wait(self) -> None:
        """Block until a signal, :meth:`request_stop`, or a service exiting on its own."""
        while not self._stop.wait(0.5):
            pass

    def close(self, timeout: float = 60.0) -> None:
        self._stop.set()
        for name, _, stop in reversed(self._services):
            try:
                stop()
            except Exception as exc:
                log.warning("stopping %s: %r", name, exc)
        deadline = time.monotonic() + timeout
        for _, thread, _ in reversed(self._services):
            thread.join(max(0.0, deadline - time.monotonic()))
        for sig, handler in self._old_handlers.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, handler)
        self._old_handlers.clear()

    def __enter__(self) -> ServiceGroup:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def serve_api(group: ServiceGroup, app: Any, *, host: str, port: int, timeout: float = 30) -> str:
    """Serve ``app`` with uvicorn in a thread of ``group``; returns its URL once it listens."""
    # lazy: only the command that runs needs it; keeps `millstream --help` fast
    import uvicorn

    server = uvicorn.Server(
        uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
    )

    def _stop() -> None:
        server.should_exit = True

    group.start("api", server.run, _stop)
    deadline = time.monotonic() + timeout
    while not server.started:
        if not group.alive("api") or time.monotonic() > deadline:
            raise ServiceStartError("REST API", host, port)
        time.sleep(0.02)
    return f"http://{host}:{port}"
