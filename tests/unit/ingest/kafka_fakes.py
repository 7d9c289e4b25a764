"""Test doubles for the Kafka source's unit tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from millstream.ingest.sources.kafka import ConsumerPool


class OneConsumerPool(ConsumerPool):
    """A pool that lends every caller the same fake consumer (a broker's stand-in)."""

    def __init__(self, consumer: Any) -> None:
        super().__init__()
        self.consumer = consumer

    @contextmanager
    def lease(self, conf: dict[str, Any], topic: str | None = None) -> Iterator[Any]:
        yield self.consumer
