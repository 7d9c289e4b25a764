"""Throwaway local servers for tests and benchmarks.

Both are :class:`~millstream.local.process.ManagedServer` children: listening on 127.0.0.1
only, on a free port, logging under the base directory they are given, stopped by their own
PID. (The Kafka-protocol broker, which ``millstream up`` and ``millstream demo`` run too, is
:class:`millstream.local.tansu.TansuBroker`.)

* :class:`PostgresServer` - a throwaway PostgreSQL cluster (``initdb`` + ``postgres``) with
  trust auth. When running as root the cluster is owned by and run as the ``postgres`` user.
* :class:`MotoS3Server` - ``moto_server`` speaking the S3 API.

boto3 is a test-only dependency without type stubs, so :meth:`MotoS3Server.client` loads it
with :func:`importlib.import_module` when called.
"""

from __future__ import annotations

import importlib
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from millstream.local.process import HOST, ManagedServer, ServerStartError, tail_log, wait_for_port

__all__ = [
    "MotoS3Server",
    "PostgresServer",
    "ServerStartError",
    "find_postgres_bin_dir",
]


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


class PostgresServer(ManagedServer):
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
                f"{tail_log(self.initdb_log_path)}"
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


class MotoS3Server(ManagedServer):
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
