"""A sealer's key indexes (:mod:`millstream.sealing.keyindex`) for the partitions of one table:
finding the current one (in memory, else the local checkpoint, else rebuilt from the sealed
segments), advancing it past a seal, and checkpointing it now and then."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pyarrow as pa

from millstream.catalog import Catalog
from millstream.metastore.models import Manifest
from millstream.sealing.compaction import CompactionPlan
from millstream.sealing.keyindex import CACHE, IndexCache, KeyIndex, Reflects, indexed

#: The newest timings a sealer keeps (seal seconds, key-index merge seconds): a list of every
#: one grew a float a seal for the life of the worker.
TIMES_KEPT = 100

log = logging.getLogger(__name__)


class SealerIndexes:
    def __init__(
        self,
        catalog: Catalog,
        table: str,
        *,
        checkpoint_seconds: float,
        cache: IndexCache | None = None,
    ) -> None:
        #: The in-memory indexes, shared by the sealers of a process (:data:`CACHE` by default).
        self.cache = cache if cache is not None else CACHE
        self.catalog = catalog
        self.table = table
        #: How often (at most) a partition's key index is checkpointed after a seal.
        self.checkpoint_seconds = checkpoint_seconds
        #: Which deployment's indexes these are (the in-process cache is keyed by it).
        self.where = f"{catalog.settings.metadata_url}|{catalog.settings.deep_store}"
        #: Partitions sealed since their last checkpoint: when (monotonic) they became due.
        self.checkpointed: dict[int, float] = {}
        self.owner: str | None = None  # set from the manifest when an index is used
        #: Key indexes rebuilt by reading sealed segments.
        self.rebuilds = 0
        #: Seconds of key-index maintenance (run merges) after the newest seals
        #: (:data:`TIMES_KEPT`).
        self.seconds: list[float] = []

    def checkpoint_path(self, partition: int) -> Path:
        return (
            self.catalog.settings.home / "cache" / "keyindex" / self.table / f"p{partition}.arrow"
        )

    def current(self, partition: int, manifest: Manifest) -> KeyIndex | None:
        """The partition's key index as of ``manifest``: the in-memory one if current, else the
        local checkpoint if current, else rebuilt from the sealed segments."""
        spec = manifest.table.spec
        if not indexed(spec):
            return None
        want = Reflects.of(manifest, partition)
        # Whose index a checkpoint holds: this deployment's table, created at that time.
        self.owner = f"{self.where}|{spec.name}|{manifest.table.created_at!r}"
        index = self.cache.get(self.where, self.table, partition)
        if index is not None and index.reflects == want and index.spec == spec:
            return index
        index = KeyIndex.load(spec, partition, self.checkpoint_path(partition), owner=self.owner)
        if index is None or index.reflects != want:
            if not want.entries:  # nothing sealed yet: an empty index, nothing to read
                index = KeyIndex.build(spec, partition, self.catalog.deep, manifest)
                self.cache.put(self.where, self.table, index)
                return index
            log.info(
                "rebuilding the key index of %s partition %d from %d sealed segments",
                self.table,
                partition,
                len(want.entries),
            )
            index = KeyIndex.build(spec, partition, self.catalog.deep, manifest)
            self.rebuilds += 1
            self.checkpointed[partition] = 0.0  # checkpoint the rebuilt index
        self.cache.put(self.where, self.table, index)
        return index

    def sealed(
        self,
        partition: int,
        index: KeyIndex,
        dropped: np.ndarray,
        sealed_rows: pa.Table,
        sealed_id: int,
        dv_id: int | None,
    ) -> KeyIndex:
        """The index after a seal swapped in entry ``sealed_id`` (rows ``sealed_rows``) and
        delete vector ``dv_id`` (naming the index's rows at positions ``dropped``)."""
        reflects = Reflects(
            tuple(sorted((*index.reflects.entries, sealed_id))),
            tuple(sorted(index.reflects.delete_vectors + (() if dv_id is None else (dv_id,)))),
        )
        index = index.updated(dropped, sealed_rows, reflects)
        self.cache.put(self.where, self.table, index)
        self.checkpointed.setdefault(partition, time.monotonic())
        return index

    def compacted(
        self, partition: int, plan: CompactionPlan, merged_id: int, dv_id: int | None
    ) -> None:
        """Carry the partition's in-memory index past a compaction's swap. Its rows do not
        change (a compaction drops only rows delete vectors named, which the index holds as
        dead already, and keeps every offset): only the entries and vectors it reflects do.
        An index that was not current for the plan is dropped (the next seal rebuilds it)."""
        index = self.cache.get(self.where, self.table, partition)
        planned = Reflects(*plan.reflects)
        if index is None or index.reflects != planned:
            self.forget(partition)
            return
        gone = {e.id for e in plan.window}
        gone_dvs = {d.id for d in plan.vectors}
        reflects = Reflects(
            tuple(sorted({*(i for i in planned.entries if i not in gone), merged_id})),
            tuple(
                sorted(
                    {*(i for i in planned.delete_vectors if i not in gone_dvs)}
                    | (set() if dv_id is None else {dv_id})
                )
            ),
        )
        self.cache.put(
            self.where, self.table, KeyIndex(index.spec, partition, index.runs, reflects)
        )
        self.checkpointed.setdefault(partition, time.monotonic())

    def compact(self, index: KeyIndex) -> None:
        """Merge the index's sorted runs (off a seal's critical path) and time it."""
        t0 = time.monotonic()
        self.cache.put(self.where, self.table, index.compacted())
        self.seconds.append(time.monotonic() - t0)
        del self.seconds[:-TIMES_KEPT]

    def forget(self, partition: int) -> None:
        """Drop the partition's in-memory index (it may no longer match the manifest)."""
        self.cache.drop(self.where, self.table, partition)

    def checkpoint(self, partitions: Iterable[int], *, force: bool = False) -> int:
        """Write the key index checkpoint of every partition due for one (or all, ``force``);
        returns how many were written. A checkpoint only saves a rebuild after a restart."""
        written = 0
        for partition in partitions:
            index = self.cache.get(self.where, self.table, partition)
            last = self.checkpointed.get(partition)
            if index is None or last is None or self.owner is None:
                continue  # nothing sealed by this sealer since its last checkpoint
            if not force and time.monotonic() - last < self.checkpoint_seconds:
                continue
            try:
                index.save(self.checkpoint_path(partition), owner=self.owner)
            except OSError as exc:
                log.warning("could not checkpoint the key index of %s: %s", self.table, exc)
                continue
            self.checkpointed.pop(partition, None)
            written += 1
        return written
