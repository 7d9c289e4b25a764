"""A reader's cache of decoded data files, for processes that read the same table again and
again (a dashboard, a service answering queries, a notebook polling a table).

Every file Millstream writes to the deep store gets a new name (a random suffix) and is never
written again, so a file's decoded rows never go stale: a cached table is exactly what a new
read of the file returns. What changes between two reads of a current table is which files its
manifest names; the cache only saves decoding the ones it named before. Most of a current
table's rows sit in sealed segments that stay the same for many reads, which is why a
read through the cache costs little more than merging the newest micro-batches. An upsert
table's whole-table reads also keep the read's winning rows, one entry per table replaced at
each read, and merge only the rows since onto them (:mod:`millstream.table.poll`).

One difference a user can notice: a file deleted from the deep store behind Millstream's back
(a lost segment) is served from the cache until it is evicted, rather than failing the read
with :class:`~millstream.errors.SegmentUnavailableError`. Garbage collection never deletes a
file a retained version names, so it causes no such difference. The cache is therefore off
unless a reader asks for it (``Catalog.open(read_cache_mb=...)``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable

import pyarrow as pa


class ReadCache:
    """Tables computed from immutable files only, each under a key that names those files (a
    file's valid rows; a partition's sealed rows after its delete vectors), least recently
    used evicted first once they hold more than ``max_bytes`` (a table larger than the whole
    budget is not kept). Thread-safe; a key two threads miss at once is computed twice, and
    the second copy kept."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError(f"read cache size must be positive, got {max_bytes} bytes")
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        # key -> (tag, table, its size as counted when put: a table's nbytes walks every
        # chunk, ~0.1 ms for a merged partition, paid once, not again at replace or evict)
        self._items: OrderedDict[Hashable, tuple[Hashable, pa.Table, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, load: Callable[[], pa.Table]) -> pa.Table:
        """The table under ``key``, from the cache or from ``load()``. The key must name every
        file the table is computed from (they never change), and anything else it depends on."""
        found = self.lookup(key)
        if found is None:
            found = load()
            self.put(key, found)
        return found

    def lookup(self, key: Hashable) -> pa.Table | None:
        found = self.lookup_tagged(key)
        return None if found is None else found[1]

    def lookup_tagged(self, key: Hashable) -> tuple[Hashable, pa.Table] | None:
        """The (tag, table) under ``key``: the tag says which files the table was computed
        from when the key alone does not (:meth:`put`)."""
        with self._lock:
            found = self._items.get(key)
            if found is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return found[0], found[1]

    def put(self, key: Hashable, table: pa.Table, tag: Hashable = None) -> None:
        size = table.nbytes
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.bytes -= old[2]
            self._items[key] = (tag, table, size)
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, (_, _, evicted) = self._items.popitem(last=False)
                self.bytes -= evicted

    def __len__(self) -> int:
        return len(self._items)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.bytes = 0

    def discard(self, keys: Iterable[Hashable]) -> int:
        """Drop the tables under ``keys`` (a caller that knows their files left every table it
        reads); returns how many were held."""
        dropped = 0
        with self._lock:
            for key in keys:
                old = self._items.pop(key, None)
                if old is not None:
                    self.bytes -= old[2]
                    dropped += 1
        return dropped
