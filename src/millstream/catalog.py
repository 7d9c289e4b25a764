"""The entry point users hold: settings + metadata store + deep store, opened once."""

from __future__ import annotations

import os
import socket
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from millstream.config import Settings
from millstream.errors import SegmentUnavailableError, VersionExpiredError
from millstream.metastore.models import Manifest, TableInfo
from millstream.metastore.pins import Pin
from millstream.metastore.store import MetadataStore
from millstream.spec import TableSpec
from millstream.storage.deepstore import DeepStore
from millstream.table.cache import ReadCache
from millstream.table.read import Condition, read_manifest

AsOf = int | float | datetime | None
#: How long a pin holds its version unless released first: an hour, as GC's grace period.
PIN_SECONDS = 3600.0


class Catalog:
    """Tables of one Millstream deployment.

    >>> cat = Catalog.open(home="/tmp/ms")            # SQLite + local deep store under home
    >>> cat = Catalog.open(metadata_url="postgresql+psycopg://...", deep_store="s3://b/ms")
    """

    def __init__(
        self,
        settings: Settings,
        store: MetadataStore,
        deep: DeepStore,
        *,
        read_cache: ReadCache | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.deep = deep
        self.read_cache = read_cache

    @classmethod
    def open(
        cls,
        *,
        home: str | Path | None = None,
        metadata_url: str | None = None,
        deep_store: str | None = None,
        s3_endpoint: str | None = None,
        settings: Settings | None = None,
        read_cache_mb: float = 0,
    ) -> Catalog:
        """``read_cache_mb`` keeps up to that much decoded data in this process for the next
        :meth:`read_table` (off by default; see :mod:`millstream.table.cache` for when a
        long-lived reader wants it and the one thing it changes)."""
        if read_cache_mb < 0:
            raise ValueError(f"read_cache_mb must not be negative, got {read_cache_mb}")
        settings = settings or Settings.load(
            home=home, metadata_url=metadata_url, deep_store=deep_store, s3_endpoint=s3_endpoint
        )
        store = MetadataStore(settings.metadata_url)
        deep = DeepStore.from_uri(settings.deep_store, s3_endpoint=settings.s3_endpoint)
        cache = ReadCache(int(read_cache_mb * 1e6)) if read_cache_mb else None
        return cls(settings, store, deep, read_cache=cache)

    def create_table(
        self, spec: TableSpec | Mapping[str, Any], *, exist_ok: bool = True
    ) -> TableInfo:
        """Create a table from a :class:`TableSpec` or a plain mapping (validated first;
        an invalid spec raises InvalidSpecError naming the field and writes nothing)."""
        if not isinstance(spec, TableSpec):
            spec = TableSpec.parse(dict(spec))
        return self.store.create_table(spec, exist_ok=exist_ok)

    def table(self, name: str) -> TableInfo:
        return self.store.get_table(name)

    def manifest(self, name: str, *, as_of: AsOf = None) -> Manifest:
        return self.store.manifest(name, as_of=as_of)

    def pin(
        self, name: str, *, as_of: AsOf = None, seconds: float = PIN_SECONDS, holder: str = ""
    ) -> Pin:
        """Keep expiry off the version of ``name`` that ``as_of`` names (the current one by
        default) for ``seconds`` or until :meth:`unpin`: a reader that plans now and reads
        later (a Spark query's tasks, a long export) reads a version retention keeps for it.
        Raises VersionExpiredError if that version expired already."""
        return self.store.pin_version(
            name,
            as_of,
            holder=holder or f"pid {os.getpid()} on {socket.gethostname()}",
            seconds=seconds,
            now=self.store.clock.now(),
        )

    def unpin(self, pin: Pin) -> bool:
        """Release ``pin``; False if it had expired and been removed already."""
        return self.store.release_pin(pin)

    @contextmanager
    def pinned(
        self, name: str, *, as_of: AsOf = None, seconds: float = PIN_SECONDS
    ) -> Iterator[Manifest]:
        """The manifest of ``name`` at ``as_of`` (the current version by default), pinned
        while the block runs (and at most ``seconds``)::

            with cat.pinned("orders") as manifest:
                ...  # read manifest.entries at leisure; expiry keeps them
        """
        pin = self.pin(name, as_of=as_of, seconds=seconds)
        try:
            yield self.manifest(name, as_of=pin.version)
        finally:
            self.unpin(pin)

    def read_table(
        self,
        name: str,
        *,
        as_of: AsOf = None,
        include_system_columns: bool = False,
        partitions: Collection[int] | None = None,
        conditions: Sequence[Condition] = (),
    ) -> pa.Table:
        """The current rows of ``name`` (or as of a version / point in time), as Arrow.
        ``partitions`` and ``conditions`` narrow the read before the merge where that cannot
        change the answer (:func:`~millstream.table.read.read_manifest`).

        A version that expires while it is read (retention) raises
        :class:`~millstream.errors.VersionExpiredError`, never a partial result."""
        manifest = self.manifest(name, as_of=as_of)
        try:
            return read_manifest(
                self.deep,
                manifest,
                include_system_columns=include_system_columns,
                partitions=partitions,
                conditions=conditions,
                cache=self.read_cache,
                history=lambda after, upto: self.store.operations_between(name, after, upto),
            )
        except SegmentUnavailableError:
            # A file of this version is gone: garbage collection after an expiry, or a lost
            # file. Only the first is the reader's business to be told about.
            oldest = self.store.oldest_kept_version(name)
            if manifest.version < oldest:
                raise VersionExpiredError(name, manifest.version, oldest) from None
            raise

    def close(self) -> None:
        self.store.dispose()

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
