"""Applying compare-and-append: a writer's batch decided per shard by
:func:`millstream.core.frontier.decide` and recorded (entries, shard uppers, a new manifest
version) in one transaction, for one table or for a table and its dead-letter table; and the
batches of several writers (a shared query's members) in one transaction, each in a savepoint
of its own (:func:`append_batches_txn`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from sqlalchemy import Connection, insert
from sqlalchemy.exc import IntegrityError

from millstream.clock import Clock
from millstream.core.frontier import Decision, Outcome, decide
from millstream.errors import (
    CommitConflictError,
    InvalidSpecError,
    MillstreamError,
    TableNotFoundError,
    WriterFencedError,
)
from millstream.metastore import schema as s
from millstream.metastore.cas import CasRow, cas_update_many
from millstream.metastore.manifest import (
    Publication,
    each_isolated,
    insert_entries,
    publish_versions,
)
from millstream.metastore.models import (
    AppendResult,
    SegmentState,
    Shard,
    ShardAppend,
    ShardResult,
    TableInfo,
)
from millstream.metastore.shards import shards_of, shards_of_tables
from millstream.metastore.tables import find_table, find_tables
from millstream.spec import DEAD_LETTER_SUFFIX


def checked_appends(appends: Sequence[ShardAppend]) -> list[ShardAppend]:
    """``appends`` sorted by (partition, lo), refused (:class:`InvalidSpecError`) unless each
    range is ordered and the ranges of one partition follow each other without a gap or an
    overlap: a batch may split a partition's range over several write tasks, and the pieces
    then commit one after the other, as one range would."""
    ordered = sorted(appends, key=lambda a: (a.partition, a.lo, a.hi))
    for a in ordered:
        if a.lo > a.hi:
            raise InvalidSpecError(
                "appends", f"partition {a.partition}: [{a.lo}, {a.hi}) is reversed"
            )
    for a, b in pairwise(ordered):
        if a.partition == b.partition and a.hi != b.lo:
            raise InvalidSpecError(
                "appends",
                f"partition {a.partition}: [{a.lo}, {a.hi}) and [{b.lo}, {b.hi}) "
                + ("overlap" if b.lo < a.hi else "leave a gap"),
            )
    return ordered


def _with_rows(a: ShardAppend) -> bool:
    return a.file_path is not None and a.row_count > 0


def _covered_only(
    table: str, appends: list[ShardAppend], covered: Mapping[int, Shard]
) -> AppendResult:
    """A dead-letter table's part of a batch without a dead letter: nothing is read or
    written (no statement, no new version). Its decisions are those of the table's uppers
    as read (``covered``), which the table's own append in the same transaction checked
    (epochs included), so a gap shows here as it does in the table."""
    results: list[ShardResult] = []
    running: dict[int, int] = {}
    for a in appends:
        base = covered.get(a.partition)
        upper = running.get(a.partition, base.upper if base else a.lo)
        d = decide(upper=upper, epoch=a.epoch, lo=a.lo, hi=a.hi, writer_epoch=a.epoch)
        running[a.partition] = d.new_upper
        results.append(ShardResult(a.partition, d, None))
    return AppendResult(table, None, tuple(results), 0, frozenset())


def append_txn(
    conn: Connection,
    clock: Clock,
    lock: bool,
    table: str,
    appends: list[ShardAppend],
    writer_id: str | None,
    batch_id: int | None,
    *,
    seen: dict[int, Shard] | None = None,
    covered: Mapping[int, Shard] | None = None,
) -> AppendResult:
    """Decide and record one table's ``appends`` (from :func:`checked_appends`: sorted by
    partition and offset, a partition's pieces contiguous) inside ``conn``'s transaction. A
    partition's pieces are decided one after the other, each against the upper the one before
    left (a piece a peer already persisted drops, the next one commits from there), and its
    shard is compare-and-set once, to the last piece's upper. A stale epoch on any shard
    raises :class:`WriterFencedError`. ``lock`` takes the table row's lock first
    (:func:`~millstream.metastore.tables.find_table`'s ``for_update``). ``seen``, if given,
    receives the shards as read (before this append moved them).

    ``covered`` makes this a dead-letter table's append in its table's transaction (the
    table's shards as read, before its own append): a dead-letter shard moves only with a
    dead letter. Its upper may lag the table's, because a table's range commits only in the
    transaction that records the range's dead letters: every offset below the table's upper
    is covered for dead letters too, and a dead-letter shard decides against the higher of
    the two uppers (:func:`dead_letter_upper`). A partition without a dead letter is left as
    it is, and a batch without any costs the dead-letter table nothing
    (:func:`_covered_only`)."""
    if covered is not None and not any(_with_rows(a) for a in appends):
        return _covered_only(table, appends, covered)
    info = find_table(conn, table, for_update=lock)
    assert info is not None
    current = shards_of(conn, table, sorted({a.partition for a in appends}))
    if seen is not None:
        seen.update(current)
    plan = _plan(table, appends, info, current, clock.now(), writer_id, batch_id, covered)
    _write(conn, [plan])
    return plan.result


@dataclass(slots=True)
class _Plan:
    """One table's part of a batch, decided against its rows as read: what to write."""

    result: AppendResult
    info: TableInfo
    now: float
    writer_id: str | None
    batch_id: int | None
    entries: list[dict[str, Any]]
    new_shards: list[dict[str, Any]]
    moved: list[CasRow]


def _plan(
    table: str,
    appends: list[ShardAppend],
    info: TableInfo,
    current: Mapping[int, Shard],
    now: float,
    writer_id: str | None,
    batch_id: int | None,
    covered: Mapping[int, Shard] | None,
) -> _Plan:
    """Decide ``appends`` against the table row ``info`` and its shards ``current`` as read
    (see :func:`append_txn`); raises :class:`WriterFencedError` on a stale epoch."""
    decisions: list[tuple[ShardAppend, Shard | None, Decision]] = []
    running: dict[int, tuple[int, int]] = {}  # partition -> (upper, epoch) after its pieces so far
    for a in appends:
        sh = current.get(a.partition)
        # A brand-new shard starts where its first batch starts.
        start = (sh.upper, sh.epoch) if sh else (a.lo, 0)
        if covered is not None:
            # Against the table's upper as read, or where its new shard starts (this batch's
            # start): the dead-letter shard never gaps where its table commits.
            base = covered.get(a.partition)
            start = (max(start[0], base.upper if base else a.lo), start[1])
        upper, epoch = running.get(a.partition, start)
        d = decide(upper=upper, epoch=epoch, lo=a.lo, hi=a.hi, writer_epoch=a.epoch)
        if d.outcome is Outcome.FENCED:
            raise WriterFencedError(table, a.partition, a.epoch, epoch)
        running[a.partition] = (d.new_upper, epoch)
        decisions.append((a, sh, d))
    # A dead-letter table moves only the partitions with a dead letter (their pieces without
    # one move along); a table moves every partition a piece appends to.
    moving = (
        {a.partition for a in appends}
        if covered is None
        else {a.partition for a in appends if _with_rows(a)}
    )

    changed = any(d.appends and a.partition in moving for a, _, d in decisions)
    new_version = info.manifest_version + 1 if changed else None
    results: list[ShardResult] = []
    files: set[str] = set()
    # Collected per partition, then written with one statement each (entries, new shards,
    # compare-and-sets of the existing shards): a statement per partition made a commit's
    # cost grow with the partitions a batch touched rather than with its rows.
    entries: list[dict[str, Any]] = []
    #: partition -> (its shard as read, its new upper, next_seq, last_record_ms) once a piece
    #: of it appends
    advanced: dict[int, tuple[Shard | None, int, int, int | None]] = {}
    for a, sh, d in decisions:
        seq: int | None = None
        if not d.appends or a.partition not in moving:
            results.append(ShardResult(a.partition, d, None))
            continue
        before = advanced.get(a.partition)
        next_seq = before[2] if before else sh.next_seq if sh else 0
        if a.file_path is not None and a.row_count > 0:
            seq = next_seq
            assert new_version is not None
            entries.append(
                {
                    "table": table,
                    "partition": a.partition,
                    "seq": seq,
                    "file_path": a.file_path,
                    "start": d.start,
                    "end": d.end,
                    "state": SegmentState.CONSUMING,
                    "row_count": a.row_count,
                    "size_bytes": a.size_bytes,
                    "added_version": new_version,
                    "now": now,
                    "writer_id": writer_id,
                    "batch_id": batch_id,
                }
            )
            files.add(a.file_path)
            next_seq += 1
        # The timestamp of the last record below the new upper: this range's last record,
        # or (a range without records: markers, compacted offsets) the one recorded before.
        last_ms = a.last_record_ms
        if last_ms is None:
            last_ms = before[3] if before else sh.last_record_ms if sh else None
        advanced[a.partition] = (sh, d.new_upper, next_seq, last_ms)
        results.append(ShardResult(a.partition, d, seq))

    new_shards: list[dict[str, Any]] = []
    moved: list[CasRow] = []
    for partition, (sh, upper, next_seq, last_ms) in advanced.items():
        if sh is None:
            new_shards.append(
                {
                    "table_name": table,
                    "partition": partition,
                    "upper": upper,
                    "epoch": 0,
                    "next_seq": next_seq,
                    "version": 1,
                    "last_record_ms": last_ms,
                }
            )
        else:
            moved.append(
                CasRow(
                    {"table_name": table, "partition": partition},
                    sh.version,
                    {"upper": upper, "next_seq": next_seq, "last_record_ms": last_ms},
                )
            )
    result = AppendResult(table, new_version, tuple(results), 0, frozenset(files))
    return _Plan(result, info, now, writer_id, batch_id, entries, new_shards, moved)


def _write(conn: Connection, plans: Sequence[_Plan]) -> None:
    """Record ``plans`` (several tables' parts of a batch, or of several batches) with one
    statement of each kind for them all: their entries, their new shards, the compare-and-sets
    of their shards and of their table rows (row counts checked: :class:`CommitConflictError`
    unless every row matched) and their version rows."""
    insert_entries(conn, [e for p in plans for e in p.entries])
    new_shards = [sh for p in plans for sh in p.new_shards]
    if new_shards:
        conn.execute(insert(s.shards), new_shards)
    cas_update_many(conn, s.shards, [m for p in plans for m in p.moved])
    publish_versions(
        conn,
        [
            Publication(p.info, "append", p.now, p.writer_id, p.batch_id)
            for p in plans
            if p.result.version is not None
        ],
    )


def dead_letter_upper(table: Shard | None, dead: Shard | None, lo: int) -> int:
    """Where a dead-letter shard's coverage ends: the higher of its own upper and its table's
    (a dead-letter shard moves only with a dead letter, and every offset below the table's
    upper had its dead letters recorded in the transaction that committed it). Without
    either shard: ``lo``, where a batch's range starts."""
    uppers = [sh.upper for sh in (table, dead) if sh is not None]
    return max(uppers) if uppers else lo


def append_tables_txn(
    conn: Connection,
    clock: Clock,
    lock: bool,
    changes: Mapping[str, Sequence[ShardAppend]],
    writer_id: str | None,
    batch_id: int | None,
) -> dict[str, AppendResult]:
    """:func:`append_txn` of each table of ``changes`` in name order, inside ``conn``'s
    transaction; a table's dead-letter table (``<table>__dead_letter``, which sorts after it)
    appends ``covered`` by the table's shards as read (a dead-letter shard moves only with a
    dead letter)."""
    seen: dict[str, dict[int, Shard]] = {}
    out: dict[str, AppendResult] = {}
    for t, a in sorted(changes.items()):
        base = _dead_letters_of(t, changes)
        if base is not None:
            out[t] = append_txn(
                conn, clock, lock, t, list(a), writer_id, batch_id, covered=seen[base]
            )
        else:
            seen[t] = {}
            out[t] = append_txn(conn, clock, lock, t, list(a), writer_id, batch_id, seen=seen[t])
    return out


@dataclass(frozen=True, slots=True)
class BatchAppends:
    """One writer's batch among several committed together (``MetadataStore.commit_batches``):
    its appends per table (a table and its dead-letter table, sorted by
    :func:`checked_appends`), who wrote it, and its precondition (run inside the transaction
    right before COMMIT; an exception fails the batch alone)."""

    changes: Mapping[str, Sequence[ShardAppend]]
    writer_id: str | None = None
    batch_id: int | None = None
    precondition: Callable[[], None] | None = None


class LatePreconditionError(Exception):
    """Batches whose precondition failed right before COMMIT (``errors``, by batch): the
    transaction is rolled back and run again without them. Not a :class:`MillstreamError`:
    no retry of a lost race may swallow it."""

    def __init__(self, errors: dict[str, MillstreamError]) -> None:
        super().__init__(f"preconditions failed right before COMMIT: {sorted(errors)}")
        self.errors = errors


def _together(
    conn: Connection, clock: Clock, lock: bool, batches: Mapping[str, BatchAppends]
) -> dict[str, dict[str, AppendResult] | MillstreamError]:
    """Every batch of ``batches`` decided as :func:`append_tables_txn` would, from ONE read of
    their table rows (locked, in name order) and ONE of their shards, and recorded with one
    statement of each kind for them all (:func:`_write`): a constant number of round trips
    for N tables. A batch that is fenced, or names a table that does not exist, gets its error
    in its place and writes nothing; a compare-and-set that falls short (a concurrent writer
    moved a row) raises :class:`CommitConflictError` for the caller to isolate."""
    wanted: dict[str, set[int]] = {}
    for b in batches.values():
        for t, a in b.changes.items():
            if _dead_letters_of(t, b.changes) and not any(_with_rows(x) for x in a):
                continue
            wanted.setdefault(t, set()).update(x.partition for x in a)
    infos = find_tables(conn, sorted(wanted), for_update=lock)
    shards = shards_of_tables(conn, wanted)
    now = clock.now()
    out: dict[str, dict[str, AppendResult] | MillstreamError] = {}
    plans: list[_Plan] = []
    for key, b in sorted(batches.items()):
        mine: dict[str, AppendResult] = {}
        theirs: list[_Plan] = []
        try:
            for t, a in sorted(b.changes.items()):
                base = _dead_letters_of(t, b.changes)
                covered = shards.get(base, {}) if base is not None else None
                if covered is not None and not any(_with_rows(x) for x in a):
                    mine[t] = _covered_only(t, list(a), covered)
                    continue
                info = infos.get(t)
                if info is None:
                    raise TableNotFoundError(t)
                plan = _plan(
                    t, list(a), info, shards.get(t, {}), now, b.writer_id, b.batch_id, covered
                )
                mine[t] = plan.result
                theirs.append(plan)
        except MillstreamError as exc:
            out[key] = exc
            continue
        out[key] = mine
        plans.extend(theirs)
    _write(conn, plans)
    return out


def _dead_letters_of(table: str, changes: Mapping[str, Any]) -> str | None:
    """The table of ``changes`` whose dead-letter table ``table`` is, if any."""
    base = table.removesuffix(DEAD_LETTER_SUFFIX)
    return base if base != table and base in changes else None


def append_batches_txn(
    conn: Connection,
    clock: Clock,
    lock: bool,
    batches: Mapping[str, BatchAppends],
) -> dict[str, dict[str, AppendResult] | MillstreamError]:
    """Decide and record several writers' ``batches`` inside ``conn``'s ONE transaction with a
    constant number of statements (:func:`_together`: one read of every table row, locked in
    name order, and of every shard; one write of each kind, every compare-and-set's row count
    checked). A batch that is fenced gets its error in its place and writes nothing. If a
    compare-and-set falls short (a concurrent writer moved a row) or an insert collides, that
    attempt is rolled back to its savepoint and each batch runs again in a savepoint of its
    own (:func:`~millstream.metastore.manifest.each_isolated`; per table :func:`append_txn`):
    the batch that loses a compare-and-set is rolled back alone, its error in its place, and
    the others commit. Tables are taken in name order within a batch and batches in key
    order.

    Then, right before COMMIT with every lock held, each recorded batch's precondition (a
    staged file is judged by when its commit lands, as in ``commit_batch``); if any fails,
    :class:`LatePreconditionError` rolls the whole transaction back and the caller runs it
    again without those batches."""

    def one(batch: BatchAppends) -> Callable[[Connection], dict[str, AppendResult]]:
        def run(c: Connection) -> dict[str, AppendResult]:
            return append_tables_txn(c, clock, lock, batch.changes, batch.writer_id, batch.batch_id)

        return run

    savepoint = conn.begin_nested()
    try:
        done = _together(conn, clock, lock, batches)
    except (CommitConflictError, IntegrityError):
        # A row one of the batches read moved meanwhile (a compare-and-set's row count fell
        # short) or was inserted by another writer: each batch again from a fresh read, in a
        # savepoint of its own, so the batch whose row moved fails alone and the others land.
        savepoint.rollback()
        done = each_isolated(conn, {k: one(b) for k, b in sorted(batches.items())})
    else:
        savepoint.commit()
    late: dict[str, MillstreamError] = {}
    for key, result in done.items():
        check = batches[key].precondition
        if isinstance(result, MillstreamError) or check is None:
            continue
        try:
            check()  # last, with every lock held: right before COMMIT
        except MillstreamError as exc:
            late[key] = exc
    if late:
        raise LatePreconditionError(late)
    return done
