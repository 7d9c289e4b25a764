"""The one commit path: what the Spark sink's driver-side commit does with a micro-batch, and
what every test and campaign drives.

A batch is a set of :class:`StagedWrite` (one per write task: its source ranges, its staged data
file and dead-letter file). :func:`commit_writes` plans one ``ShardAppend`` per task and
partition for the table and its dead-letter table, commits them with ``compare_and_append`` in
ONE metadata transaction (``MetadataStore.commit_batch``), deletes the staged files nothing
references, and raises for gaps in either table. :func:`commit_many` does the same for several
tables at once (a shared query's members): one metadata transaction
(``MetadataStore.commit_batches``), each table in a savepoint of its own with every guard
below, a table that fails rolled back alone.

Guards, each with a test that fails without it (docs/design.md, "Guards and the tests that
catch them"):

* **Staged files are young enough.** Garbage collection deletes unreferenced files older than
  its grace period, and a staged file is unreferenced until its commit lands. A commit refuses
  files staged more than :data:`MAX_STAGED_AGE_SECONDS` ago (half the default grace period), so
  it can never reference a file GC has deleted or is about to (:class:`StagedFileExpiredError`).
  The age is checked inside the commit's transaction, right before COMMIT: a commit that
  waited on locks is judged by when it lands (the commit-path campaign found a commit that
  passed an up-front check, waited, and referenced a file GC had deleted meanwhile).
* **An unknown outcome keeps the files.** If COMMIT fails with an unknown outcome, the shards
  are re-read: if every range is persisted the batch is done (by this writer or a peer);
  otherwise :class:`CommitStateUnknownError` is raised and no staged file is deleted, since
  nothing proves the manifest does not reference it. Only GC, which checks, may delete them.
* **A referenced file is never deleted.** The staged files a commit did not reference (a
  replay's DROP, a refused commit) are deleted only if the manifest does not reference them
  either: the same staged write committed twice must not lose the first commit's file.
* **The dead-letter table gaps like the table.** Its shard decides like the table's; a gap in
  either raises :class:`ShardGapError` so the writer restarts from the lower upper instead of
  skipping bad records.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from millstream.clock import SYSTEM_CLOCK, Clock
from millstream.core.frontier import decide
from millstream.errors import (
    CommitStateUnknownError,
    InvalidSpecError,
    MillstreamError,
    StagedFileExpiredError,
)
from millstream.metastore.models import AppendResult, ShardAppend, ShardResult
from millstream.spec import DEAD_LETTER_SUFFIX
from millstream.storage.deepstore import DeepStore
from millstream.table.gc import MAX_STAGED_AGE_SECONDS

# Annotations only (the commit functions import what they run): a write task, which
# stages files and imports this module for them, loads no metadata store, SQLAlchemy
# included (~35 MiB a Python worker); the driver commits.
if TYPE_CHECKING:
    from millstream.metastore.append import BatchAppends
    from millstream.metastore.store import MetadataStore

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StagedFile:
    """A data file written to the deep store but not (yet) referenced by the manifest."""

    path: str | None
    size_bytes: int
    #: partition -> rows of that partition in the file
    row_counts: Mapping[int, int]


NO_FILE = StagedFile(None, 0, {})


@dataclass(frozen=True, slots=True)
class StagedWrite:
    """What one write task staged for a batch."""

    #: partition -> the source range ``[lo, hi)`` the task read (it may hold no row)
    ranges: Mapping[int, tuple[int, int]]
    data: StagedFile = NO_FILE
    dead: StagedFile = NO_FILE
    #: wall-clock time taken before the files were written (None: not checked)
    staged_at: float | None = None
    #: partition -> timestamp (epoch ms) of the last record read in its range, if any: the
    #: table's shard records it when the range commits (the ingestion delay)
    last_record_ms: Mapping[int, int] = field(default_factory=dict)

    @property
    def paths(self) -> set[str]:
        return {p for p in (self.data.path, self.dead.path) if p}


@dataclass(frozen=True, slots=True)
class BatchCommit:
    """The outcome of :func:`commit_writes`."""

    table: AppendResult
    dead_letter: AppendResult | None
    rows: int
    #: what was proposed to each table (:func:`plan_appends`)
    appends: tuple[ShardAppend, ...] = ()
    dead_letter_appends: tuple[ShardAppend, ...] = ()
    #: the COMMIT's outcome was unknown and a re-read showed every range persisted
    reconciled: bool = False

    @property
    def files_referenced(self) -> frozenset[str]:
        dl = self.dead_letter.files_referenced if self.dead_letter else frozenset()
        return self.table.files_referenced | dl

    def raise_for_gaps(self) -> None:
        """ShardGapError if a range started above its shard's upper, in either table."""
        self.table.raise_for_gaps(list(self.appends))
        if self.dead_letter is not None:
            self.dead_letter.raise_for_gaps(list(self.dead_letter_appends))


def plan_appends(
    writes: Sequence[StagedWrite],
    epochs: Mapping[int, int],
    dead_letter_epochs: Mapping[int, int],
) -> tuple[list[ShardAppend], list[ShardAppend], int]:
    """One append per task and partition for the table and the dead-letter table; the rows."""
    main: list[ShardAppend] = []
    dl: list[ShardAppend] = []
    rows = 0
    for w in writes:
        extra = (set(w.data.row_counts) | set(w.dead.row_counts)) - set(w.ranges)
        if extra:
            raise InvalidSpecError(
                "ranges", f"the staged files hold rows of partitions {sorted(extra)} with no range"
            )
        for part, (lo, hi) in sorted(w.ranges.items()):
            n = w.data.row_counts.get(part, 0)
            d = w.dead.row_counts.get(part, 0)
            rows += n
            main.append(
                ShardAppend(
                    part,
                    lo,
                    hi,
                    epochs.get(part, 0),
                    w.data.path if n else None,
                    n,
                    w.data.size_bytes,
                    w.last_record_ms.get(part),
                )
            )
            dl.append(
                ShardAppend(
                    part,
                    lo,
                    hi,
                    dead_letter_epochs.get(part, 0),
                    w.dead.path if d else None,
                    d,
                    w.dead.size_bytes,
                )
            )
    return main, dl, rows


def commit_writes(
    store: MetadataStore,
    deep: DeepStore,
    table: str,
    writes: Sequence[StagedWrite],
    *,
    dead_letter_table: str | None = None,
    epochs: Mapping[int, int] | None = None,
    dead_letter_epochs: Mapping[int, int] | None = None,
    writer_id: str | None = None,
    batch_id: int | None = None,
    max_staged_age: float = MAX_STAGED_AGE_SECONDS,
    clock: Clock = SYSTEM_CLOCK,
    raise_for_gaps: bool = True,
) -> BatchCommit:
    """Commit a batch's staged writes to ``table`` (and ``dead_letter_table``) in one
    transaction; see the module docstring for what it guarantees. Raises ShardGapError after
    committing when a range starts above a shard's upper in either table (unless
    ``raise_for_gaps`` is false: the caller reads the GAP outcomes from the result)."""
    main, dl, rows = plan_appends(writes, epochs or {}, dead_letter_epochs or {})
    staged = set().union(*(w.paths for w in writes)) if writes else set()
    young_enough = _young_enough(writes, max_staged_age, clock)
    changes: dict[str, Sequence[ShardAppend]] = {table: main}
    if dead_letter_table is not None:
        changes[dead_letter_table] = dl
    try:
        results = store.commit_batch(
            changes, writer_id=writer_id, batch_id=batch_id, precondition=young_enough
        )
    except CommitStateUnknownError:
        if _persisted(store, changes):
            # A peer's or this commit's: the ranges are in the manifest. Files stay for GC.
            return _reconciled(table, dead_letter_table, main, dl, rows)
        raise
    except MillstreamError:
        # the transaction rolled back: this commit references none of them
        _delete_unreferenced(store, deep, staged, (table, dead_letter_table))
        raise
    commit = BatchCommit(
        results[table], results.get(dead_letter_table or ""), rows, tuple(main), tuple(dl)
    )
    _delete_unreferenced(store, deep, staged - commit.files_referenced, (table, dead_letter_table))
    if raise_for_gaps:
        commit.raise_for_gaps()
    return commit


def _young_enough(
    writes: Sequence[StagedWrite], max_staged_age: float, clock: Clock
) -> Callable[[], None]:
    """The precondition that every staged file of ``writes`` is younger than
    ``max_staged_age`` (:class:`StagedFileExpiredError`)."""

    def young_enough() -> None:
        # Checked inside the transaction with every lock held, right before COMMIT: a commit
        # that waited on locks is judged by when it lands, not when it started.
        now = clock.now()
        for w in writes:
            if w.staged_at is not None and w.paths and now - w.staged_at > max_staged_age:
                # Nothing committed; the files are deleted below (nothing references them).
                raise StagedFileExpiredError(sorted(w.paths)[0], now - w.staged_at, max_staged_age)

    return young_enough


@dataclass(frozen=True, slots=True)
class TableBatch:
    """One table's part of a batch committed with others' (:func:`commit_many`): what
    :func:`commit_writes` takes for it."""

    table: str
    writes: Sequence[StagedWrite]
    dead_letter_table: str | None = None
    epochs: Mapping[int, int] = field(default_factory=dict)
    dead_letter_epochs: Mapping[int, int] = field(default_factory=dict)
    writer_id: str | None = None
    batch_id: int | None = None
    max_staged_age: float = MAX_STAGED_AGE_SECONDS


def commit_many(
    store: MetadataStore,
    deep: DeepStore,
    batches: Mapping[str, TableBatch],
    *,
    clock: Clock = SYSTEM_CLOCK,
) -> dict[str, BatchCommit | MillstreamError]:
    """:func:`commit_writes` of several tables' batches (a shared query's members, each a
    table and its dead-letter table) in ONE metadata transaction
    (``MetadataStore.commit_batches``): each keeps its own guards (its shards' epochs and
    decisions, its compare-and-sets, its staged files' age, its unreferenced files deleted,
    an unknown outcome reconciled by re-reading its shards), and one that fails is rolled back
    alone, its error in its place, while the others commit. Gaps are not raised: the caller
    raises each table's (``BatchCommit.raise_for_gaps``)."""
    # lazy: SQLAlchemy loads where a batch commits, not in a write task's worker
    from millstream.metastore.append import BatchAppends

    out: dict[str, BatchCommit | MillstreamError] = {}
    planned: dict[str, tuple[list[ShardAppend], list[ShardAppend], int, set[str]]] = {}
    appends: dict[str, BatchAppends] = {}
    for key, b in sorted(batches.items()):
        try:
            main, dl, rows = plan_appends(b.writes, b.epochs, b.dead_letter_epochs)
        except MillstreamError as exc:
            out[key] = exc
            continue
        staged = set().union(*(w.paths for w in b.writes)) if b.writes else set()
        planned[key] = (main, dl, rows, staged)
        changes: dict[str, Sequence[ShardAppend]] = {b.table: main}
        if b.dead_letter_table is not None:
            changes[b.dead_letter_table] = dl
        appends[key] = BatchAppends(
            changes, b.writer_id, b.batch_id, _young_enough(b.writes, b.max_staged_age, clock)
        )
    results: Mapping[str, dict[str, AppendResult] | MillstreamError]
    try:
        results = store.commit_batches(appends) if appends else {}
    except CommitStateUnknownError as exc:  # the shared COMMIT: each batch reconciles its own
        results = {k: _unknown_for(k, exc) for k in appends}
    for key, result in results.items():
        b = batches[key]
        main, dl, rows, staged = planned[key]
        tables = (b.table, b.dead_letter_table)
        if isinstance(result, CommitStateUnknownError):
            if _persisted(store, appends[key].changes):
                # A peer's or this commit's: the ranges are in the manifest. Files stay for GC.
                out[key] = _reconciled(b.table, b.dead_letter_table, main, dl, rows)
            else:
                out[key] = result  # nothing proves the manifest does not use its files
        elif isinstance(result, MillstreamError):
            # its savepoint rolled back: this commit references none of its files
            _delete_unreferenced(store, deep, staged, tables)
            out[key] = result
        else:
            commit = BatchCommit(
                result[b.table],
                result.get(b.dead_letter_table or ""),
                rows,
                tuple(main),
                tuple(dl),
            )
            _delete_unreferenced(store, deep, staged - commit.files_referenced, tables)
            out[key] = commit
    return dict(sorted(out.items()))


def _unknown_for(key: str, exc: CommitStateUnknownError) -> CommitStateUnknownError:
    """A batch's own copy of the shared COMMIT's unknown outcome (an error carries notes
    naming its member; one object for every member would name them all)."""
    own = CommitStateUnknownError(f"{exc.message} (the commit of {key} among others)")
    own.__cause__ = exc
    return own


def _persisted(store: MetadataStore, changes: Mapping[str, Sequence[ShardAppend]]) -> bool:
    """Whether every range of ``changes`` is below its shard's upper now (re-read). A
    dead-letter table's range is covered by its table's upper too (its shard moves only with a
    dead letter: :func:`~millstream.metastore.append.dead_letter_upper`)."""
    # lazy: as in commit_many
    from millstream.metastore.append import dead_letter_upper

    try:
        read = {name: {sh.partition: sh for sh in store.list_shards(name)} for name in changes}
        for name, appends in changes.items():
            base = name.removesuffix(DEAD_LETTER_SUFFIX)
            table = read[base] if base != name and base in read else {}
            for a in appends:
                upper = dead_letter_upper(table.get(a.partition), read[name].get(a.partition), a.lo)
                if upper < a.hi:
                    return False
    except MillstreamError:
        return False
    return True


def _reconciled(
    table: str,
    dead_letter_table: str | None,
    main: list[ShardAppend],
    dl: list[ShardAppend],
    rows: int,
) -> BatchCommit:
    def _dropped(name: str, appends: list[ShardAppend]) -> AppendResult:
        shards = tuple(
            ShardResult(
                a.partition, decide(upper=a.hi, epoch=0, lo=a.lo, hi=a.hi, writer_epoch=0), None
            )
            for a in appends
        )
        return AppendResult(name, None, shards)

    return BatchCommit(
        _dropped(table, main),
        _dropped(dead_letter_table, dl) if dead_letter_table else None,
        rows,
        tuple(main),
        tuple(dl),
        reconciled=True,
    )


def _delete_unreferenced(
    store: MetadataStore, deep: DeepStore, paths: set[str], tables: tuple[str, str | None]
) -> None:
    """Delete the staged ``paths`` this commit did not reference, unless the manifest
    references one anyway (the same staged write committed twice: the second is a DROP, and
    its files are the first one's). Asked only when there is something to delete (a replay's
    DROP, a refused commit); if the store cannot say, the files stay for GC, which checks."""
    if not paths:
        return
    try:
        referenced = set().union(*(store.referenced_files(t) for t in tables if t is not None))
    except Exception as exc:
        log.warning(
            "staged files %s stay for GC: cannot read what references them (%s)",
            sorted(paths)[:3],
            exc,
        )
        return
    for p in paths - referenced:
        deep.delete(p)
