"""Table maintenance: expire the history retention no longer keeps, then collect the files
nothing references any more. What ``millstream table maintain`` runs (and, on a schedule, the
controller's leader)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from millstream.clock import SYSTEM_CLOCK, Clock
from millstream.metastore.expiry import Expiry
from millstream.metastore.store import MetadataStore
from millstream.storage.deepstore import DeepStore
from millstream.table.gc import DEFAULT_GRACE_SECONDS, collect_garbage_files


@dataclass(frozen=True, slots=True)
class Maintenance:
    """One table's maintenance: the expiry, then the files removed (or, in a dry run, those
    that would be: already collectable ones; files the expiry would release become
    collectable only after it ran and after the grace period)."""

    table: str
    dry_run: bool
    expiry: Expiry
    files_removed: tuple[str, ...]
    bytes_removed: int
    #: The Iceberg view's collection (None: the table has no view): its CPU seconds (this
    #: thread's), the files found kept in the references and read (``hits``, ``misses``,
    #: ``read`` by kind), and the references' whole status after it (``references``).
    view_gc: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "table": self.table,
            "dry_run": self.dry_run,
            "expired": self.expiry.to_dict(),
            "files_removed": len(self.files_removed),
            "bytes_removed": self.bytes_removed,
        }
        if self.view_gc is not None:
            out["view_gc"] = {k: v for k, v in self.view_gc.items() if k != "references"}
        return out

    def describe(self) -> str:
        e = self.expiry
        verb = "would expire" if self.dry_run else "expired"
        gone = "would remove" if self.dry_run else "removed"
        history = (
            f"{verb} versions {e.floor_before}..{e.floor - 1} ({e.versions} versions, "
            f"{e.entries} entries, {e.delete_vectors} delete vectors; "
            f"{len(e.released_files)} files released)"
            if e.floor > e.floor_before
            else f"nothing to expire (oldest kept version {e.floor})"
        )
        return (
            f"{self.table}: {history}; {gone} {len(self.files_removed)} unreferenced files "
            f"({self.bytes_removed} bytes)"
        )


def maintain(
    store: MetadataStore,
    deep: DeepStore,
    table: str,
    *,
    dry_run: bool = False,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    clock: Clock = SYSTEM_CLOCK,
    publish_cache: Any = None,
    publish_view: bool = True,
    view_references: Any = None,
) -> Maintenance:
    """Expire ``table``'s old versions, then delete the files no kept version references and
    that are older than the grace period (see :func:`millstream.table.gc.collect_garbage`).
    A table with an Iceberg view is then published (its expired snapshots dropped), through
    ``publish_cache`` if given (a :class:`~millstream.table.iceberg.PublishCache`: the
    process's publisher's, so its next publish still builds on the snapshot); not with
    ``publish_view=False`` (a publisher of another process drops the expired snapshots at its
    next publish). What the view's immutable files reference is kept between two collections
    of its garbage in ``view_references`` (a :class:`~millstream.table.iceberg.ViewReferences`;
    None: the process's, :data:`~millstream.table.iceberg.VIEW_REFERENCES`)."""
    expiry = store.expire_versions(table, now=clock.now(), dry_run=dry_run)
    removed = collect_garbage_files(
        store, deep, table, grace_seconds=grace_seconds, clock=clock, dry_run=dry_run
    )
    view_gc: dict[str, Any] | None = None
    if store.read_pointer(table) is not None:
        # lazy: pyiceberg (about a second to import) loads only where a table has a view
        from millstream.table.iceberg import VIEW_REFERENCES, collect_view_garbage, publish

        if not dry_run and publish_view:
            # The Iceberg view drops the snapshots of the versions that just expired.
            publish(store, deep, table, cache=publish_cache)
        references = VIEW_REFERENCES if view_references is None else view_references
        before = references.status()
        cpu = time.thread_time()
        removed_view = collect_view_garbage(
            store,
            deep,
            table,
            grace_seconds=grace_seconds,
            now=clock.now(),
            dry_run=dry_run,
            references=references,
        )
        after = references.status()
        view_gc = {
            "cpu_seconds": round(time.thread_time() - cpu, 6),
            "files_removed": len(removed_view),
            "hits": after["hits"] - before["hits"],
            "misses": after["misses"] - before["misses"],
            "read": {k: n - before["read"][k] for k, n in after["read"].items()},
            "references": after,
        }
        removed += removed_view
    return Maintenance(
        table,
        dry_run,
        expiry,
        tuple(f.path for f in removed),
        sum(f.size for f in removed),
        view_gc,
    )
