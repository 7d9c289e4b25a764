"""A tiny threaded TCP proxy for fault campaigns: put it between the services and a server
(PostgreSQL, the S3 endpoint) and break the connections on demand.

* :meth:`TcpProxy.cut` resets every live connection (both sides get a TCP RST), as a network
  failure or a server restart would; new connections are accepted as before.
* :meth:`TcpProxy.stall` stops forwarding bytes (in both directions, on live and new
  connections) for some seconds, or until :meth:`TcpProxy.resume`: a hung network or server.
* :meth:`TcpProxy.down` cuts every live connection and resets every new one for some
  seconds: the server is down, then back.

It listens on 127.0.0.1 only, on a free port, and forwards to ``target_host:target_port``.
One thread accepts; each connection has one thread per direction.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
import time
from types import TracebackType

from millstream.local.process import HOST

__all__ = ["TcpProxy"]

_CHUNK = 64 * 1024
_POLL_S = 0.1


def _reset(sock: socket.socket) -> None:
    """Close ``sock`` with a TCP RST (SO_LINGER 0), not an orderly FIN."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


class _Pair:
    """A client connection and its upstream connection."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.closed = threading.Event()
        self._lock = threading.Lock()
        self._ended = 0  # directions that saw an orderly end of stream

    def ended_one_way(self) -> bool:
        """One direction is done; whether both are."""
        with self._lock:
            self._ended += 1
            return self._ended >= 2

    def close(self, *, reset: bool) -> None:
        with self._lock:
            if self.closed.is_set():
                return
            self.closed.set()
        for sock in (self.client, self.upstream):
            if reset:
                _reset(sock)
            else:
                with contextlib.suppress(OSError):
                    sock.close()


class TcpProxy:
    """``TcpProxy(target_port).start()``; ``.port`` is where clients connect instead."""

    def __init__(self, target_port: int, *, target_host: str = HOST, name: str = "proxy") -> None:
        self.target = (target_host, target_port)
        self.name = name
        self.cuts = 0  # connections reset by cut()
        self._listener: socket.socket | None = None
        self._pairs: set[_Pair] = set()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._flowing = threading.Event()
        self._flowing.set()
        self._resume_timer: threading.Timer | None = None
        self._refuse_until = 0.0
        self.refused = 0  # new connections reset by down()
        self._accept_thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        if self._listener is None:
            raise RuntimeError(f"proxy {self.name} is not started")
        port: int = self._listener.getsockname()[1]
        return port

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def live(self) -> int:
        """How many connections it forwards now."""
        with self._lock:
            return len(self._pairs)

    @property
    def stalled(self) -> bool:
        return not self._flowing.is_set()

    # -- faults -------------------------------------------------------------------------------

    def cut(self) -> int:
        """Reset every live connection; returns how many."""
        with self._lock:
            pairs = list(self._pairs)
            self._pairs.clear()
        for pair in pairs:
            pair.close(reset=True)
        self.cuts += len(pairs)
        return len(pairs)

    def down(self, seconds: float) -> int:
        """Reset every live connection, and every new one for ``seconds``; returns how many
        live ones were reset."""
        self._refuse_until = time.monotonic() + seconds
        return self.cut()

    def stall(self, seconds: float | None = None) -> None:
        """Stop forwarding until :meth:`resume`, or for ``seconds`` if given."""
        self._cancel_timer()
        self._flowing.clear()
        if seconds is not None:
            timer = threading.Timer(seconds, self.resume)
            timer.daemon = True
            self._resume_timer = timer
            timer.start()

    def resume(self) -> None:
        """End a :meth:`stall` and a :meth:`down` now: bytes flow, new connections are
        accepted."""
        self._cancel_timer()
        self._refuse_until = 0.0
        self._flowing.set()

    def _cancel_timer(self) -> None:
        timer, self._resume_timer = self._resume_timer, None
        if timer is not None and timer is not threading.current_thread():
            timer.cancel()

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> TcpProxy:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((HOST, 0))
        listener.listen(128)
        listener.settimeout(_POLL_S)
        self._listener = listener
        self._accept_thread = threading.Thread(
            target=self._accept, name=f"proxy-{self.name}", daemon=True
        )
        self._accept_thread.start()
        return self

    def close(self) -> None:
        self._closed.set()
        self.resume()
        if self._accept_thread is not None:
            self._accept_thread.join(5)
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.close()
        with self._lock:
            pairs = list(self._pairs)
            self._pairs.clear()
        for pair in pairs:
            pair.close(reset=False)

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- forwarding ---------------------------------------------------------------------------

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if time.monotonic() < self._refuse_until:
                self.refused += 1
                _reset(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                _reset(client)  # the server is down: the client sees a reset, as it would
                continue
            for sock in (client, upstream):
                sock.setblocking(True)
                sock.settimeout(None)
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pair = _Pair(client, upstream)
            with self._lock:
                self._pairs.add(pair)
            for src, dst, way in ((client, upstream, "up"), (upstream, client, "down")):
                threading.Thread(
                    target=self._pump,
                    args=(pair, src, dst),
                    name=f"proxy-{self.name}-{way}",
                    daemon=True,
                ).start()

    def _pump(self, pair: _Pair, src: socket.socket, dst: socket.socket) -> None:
        try:
            while not pair.closed.is_set() and not self._closed.is_set():
                if not self._flowing.wait(_POLL_S):
                    continue  # stalled: leave the bytes where they are
                readable, _, _ = select.select([src], [], [], _POLL_S)
                if not readable:
                    continue
                data = src.recv(_CHUNK)
                if not data:
                    with contextlib.suppress(OSError):
                        dst.shutdown(socket.SHUT_WR)  # pass the half-close on
                    if not pair.ended_one_way():
                        return  # the other direction may still carry a reply
                    break
                while not self._flowing.wait(_POLL_S):  # stalled meanwhile: hold the bytes
                    if pair.closed.is_set() or self._closed.is_set():
                        return
                dst.sendall(data)
        except (OSError, ValueError):  # reset, or closed under us by cut()
            pass
        with self._lock:
            self._pairs.discard(pair)
        pair.close(reset=False)
