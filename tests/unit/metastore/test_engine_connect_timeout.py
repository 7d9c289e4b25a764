"""A PostgreSQL server that accepts a connection and never answers (a stalled network, a
wedged proxy) must not hang the caller: a new connection gives up after the engine's connect
timeout and raises, so the caller's retry with backoff takes over (a heartbeat, a REST call
and a commit all go through it)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
from sqlalchemy.exc import OperationalError

import millstream.metastore.engine as engine_module
from millstream.metastore.engine import make_engine


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A TCP server on 127.0.0.1 that accepts connections and never sends a byte."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            accepted.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for c in accepted:
        c.close()
    server.close()


def test_a_server_that_never_answers_fails_the_connect_instead_of_hanging(
    silent_server: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_module, "CONNECT_TIMEOUT_SECONDS", 1)
    engine = make_engine(
        f"postgresql+psycopg://postgres@127.0.0.1:{silent_server}/millstream", is_sqlite=False
    )
    outcome: list[BaseException | None] = []

    def connect() -> None:
        try:
            with engine.connect():
                outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    caller = threading.Thread(target=connect, daemon=True)
    caller.start()
    caller.join(60)  # a bound on a hang, far above the 1 s timeout
    engine.dispose()
    assert not caller.is_alive(), "the connect hung on a server that never answers"
    assert len(outcome) == 1 and isinstance(outcome[0], OperationalError), outcome
