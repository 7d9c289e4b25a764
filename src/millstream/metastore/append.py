"""Applying compare-and-append: a writer's batch decided per shard by
:func:`millstream.core.frontier.decide` and recorded (entries, shard uppers, a new manifest
version) in one transaction, for one table or for a table and its dead-letter table."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import Any

from sqlalchemy import Connection, insert

from millstream.clock import Clock
from millstream.core.frontier import Decision, Outcome, decide
from millstream.errors import InvalidSpecError, WriterFencedError
from millstream.metastore import schema as s
from millstream.metastore.cas import CasRow, cas_update_many
from millstream.metastore.manifest import insert_entries, publish_version
from millstream.metastore.models import AppendResult, SegmentState, Shard, ShardAppend, ShardResult
from millstream.metastore.shards import shards_of
from millstream.metastore.tables import find_table


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


def append_txn(
    conn: Connection,
    clock: Clock,
    lock: bool,
    table: str,
    appends: list[ShardAppend],
    writer_id: str | None,
    batch_id: int | None,
) -> AppendResult:
    """Decide and record one table's ``appends`` (from :func:`checked_appends`: sorted by
    partition and offset, a partition's pieces contiguous) inside ``conn``'s transaction. A
    partition's pieces are decided one after the other, each against the upper the one before
    left (a piece a peer already persisted drops, the next one commits from there), and its
    shard is compare-and-set once, to the last piece's upper. A stale epoch on any shard
    raises :class:`WriterFencedError`. ``lock`` takes the table row's lock first
    (:func:`~millstream.metastore.tables.find_table`'s ``for_update``)."""
    info = find_table(conn, table, for_update=lock)
    assert info is not None
    current = shards_of(conn, table, sorted({a.partition for a in appends}))
    decisions: list[tuple[ShardAppend, Shard | None, Decision]] = []
    running: dict[int, tuple[int, int]] = {}  # partition -> (upper, epoch) after its pieces so far
    for a in appends:
        sh = current.get(a.partition)
        # A brand-new shard starts where its first batch starts.
        upper, epoch = running.get(a.partition, (sh.upper, sh.epoch) if sh else (a.lo, 0))
        d = decide(upper=upper, epoch=epoch, lo=a.lo, hi=a.hi, writer_epoch=a.epoch)
        if d.outcome is Outcome.FENCED:
            raise WriterFencedError(table, a.partition, a.epoch, epoch)
        running[a.partition] = (d.new_upper, epoch)
        decisions.append((a, sh, d))

    changed = any(d.appends for _, _, d in decisions)
    new_version = info.manifest_version + 1 if changed else None
    now = clock.now()
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
        if not d.appends:
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

    insert_entries(conn, entries)
    if new_shards:
        conn.execute(insert(s.shards), new_shards)
    cas_update_many(conn, s.shards, moved)

    if new_version is not None:
        publish_version(conn, info, "append", now, writer_id=writer_id, batch_id=batch_id)
    return AppendResult(table, new_version, tuple(results), 0, frozenset(files))
