"""Garbage collection of data files no manifest entry references."""

from __future__ import annotations

from typing import TYPE_CHECKING

from millstream.clock import SYSTEM_CLOCK, Clock
from millstream.errors import InvalidSpecError
from millstream.storage.deepstore import DeepStore, StoredFile, table_data_prefix
from millstream.table.limits import DEFAULT_GRACE_SECONDS as DEFAULT_GRACE_SECONDS
from millstream.table.limits import MAX_PUBLISH_AGE_SECONDS
from millstream.table.limits import MAX_STAGED_AGE_SECONDS as MAX_STAGED_AGE_SECONDS

# Annotations only: a write task (which stages files; the driver commits) loads no metadata
# store, SQLAlchemy included (~35 MiB a Python worker).
if TYPE_CHECKING:
    from millstream.metastore.store import MetadataStore


def check_gc_grace(
    grace_seconds: float,
    max_staged_age: float = MAX_STAGED_AGE_SECONDS,
    *,
    publishes: bool = True,
) -> None:
    """Refuse (:class:`~millstream.errors.InvalidSpecError` naming ``gc_grace_seconds``) a
    grace period under which garbage collection could delete a file still about to be
    referenced: a staged file a commit accepts up to ``max_staged_age``, or, where Iceberg
    views are published (``publishes``), a snapshot a publish may still point at up to
    :data:`MAX_PUBLISH_AGE_SECONDS`."""
    if grace_seconds < max_staged_age:
        raise InvalidSpecError(
            "gc_grace_seconds",
            f"{grace_seconds:g} s is shorter than the staged-file age limit "
            f"{max_staged_age:g} s: GC could delete a staged file a commit still accepts",
        )
    if publishes and grace_seconds <= MAX_PUBLISH_AGE_SECONDS:
        raise InvalidSpecError(
            "gc_grace_seconds",
            f"{grace_seconds:g} s is not longer than the Iceberg publish age limit "
            f"{MAX_PUBLISH_AGE_SECONDS:g} s: the view's GC could delete a snapshot's files "
            "a publish still points at",
        )


def collect_garbage(
    store: MetadataStore,
    deep: DeepStore,
    table: str,
    *,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    clock: Clock = SYSTEM_CLOCK,
    dry_run: bool = False,
) -> list[str]:
    return [
        f.path
        for f in collect_garbage_files(
            store, deep, table, grace_seconds=grace_seconds, clock=clock, dry_run=dry_run
        )
    ]


def collect_garbage_files(
    store: MetadataStore,
    deep: DeepStore,
    table: str,
    *,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    clock: Clock = SYSTEM_CLOCK,
    dry_run: bool = False,
) -> list[StoredFile]:
    """Delete staged files of ``table`` that no entry references and that are older than the
    grace period. A file a writer has staged but not yet committed is unreferenced, too, so the
    grace period must exceed :data:`MAX_STAGED_AGE_SECONDS`, the oldest staged file a commit
    accepts (a shorter one is for tests that know no writer is running). Returns the paths
    removed (or that would be, with ``dry_run``); :func:`collect_garbage_files` returns them
    with their sizes.
    """
    store.get_table(table)  # raises TableNotFoundError
    # The cutoff is taken before the references are read: a commit accepts a staged file only
    # while it is younger than MAX_STAGED_AGE_SECONDS, so a file older than the grace period
    # at this instant was committed (if ever) before the references' snapshot, whatever this
    # pass waits for afterwards. Taken after the snapshot, a pass stalled between the two
    # (found by the commit-path campaign on PostgreSQL, seed 2743901968) judged a file by a
    # later instant and deleted one a commit referenced right after the snapshot.
    cutoff = clock.now() - grace_seconds
    # List files before reading references: a file committed in between is then referenced.
    files = deep.list_files(table_data_prefix(table))
    referenced = store.referenced_files(table)
    doomed = [
        f
        for f in files
        if f.path not in referenced and f.mtime is not None and f.mtime.timestamp() < cutoff
    ]
    if not dry_run:
        for f in doomed:
            deep.delete(f.path)
    return doomed
