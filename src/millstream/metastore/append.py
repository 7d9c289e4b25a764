"""Applying compare-and-append: a writer's batch decided per shard by
:func:`millstream.core.frontier.decide` and recorded (entries, shard uppers, a new manifest
version) in one transaction, for one table or for a table and its dead-letter table."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, insert

from millstream.core.frontier import Decision, Outcome, decide
from millstream.errors import InvalidSpecError, WriterFencedError
from millstream.metastore import schema as s
from millstream.metastore.cas import CasRow, cas_update_many
from millstream.metastore.manifest import insert_entries, publish_version
from millstream.metastore.models import AppendResult, SegmentState, Shard, ShardAppend, ShardResult
from millstream.metastore.shards import shards_of

if TYPE_CHECKING:
    from millstream.metastore.store import MetadataStore


def compare_and_append(
    store: MetadataStore,
    table: str,
    appends: Sequence[ShardAppend],
    *,
    writer_id: str | None,
    batch_id: int | None,
) -> AppendResult:
    """One table's batch in one transaction (see :meth:`MetadataStore.compare_and_append`)."""
    parts = [a.partition for a in appends]
    if len(set(parts)) != len(parts):
        raise InvalidSpecError("appends", "lists a partition twice")
    for a in appends:
        if a.lo > a.hi:
            raise InvalidSpecError(
                "appends", f"partition {a.partition}: [{a.lo}, {a.hi}) is reversed"
            )
    ordered = sorted(appends, key=lambda a: a.partition)
    result, retries = store.retrying(append_txn, store, table, ordered, writer_id, batch_id)
    assert isinstance(result, AppendResult)
    return AppendResult(
        result.table, result.version, result.shards, retries, result.files_referenced
    )


def commit_batch(
    store: MetadataStore,
    changes: dict[str, Sequence[ShardAppend]],
    *,
    writer_id: str | None,
    batch_id: int | None,
    precondition: Callable[[], None] | None = None,
) -> dict[str, AppendResult]:
    """Several tables' batches in one transaction (see :meth:`MetadataStore.commit_batch`)."""
    for appends in changes.values():
        if len({a.partition for a in appends}) != len(appends):
            raise InvalidSpecError("appends", "lists a partition twice")

    def _txn(conn: Connection) -> dict[str, AppendResult]:
        results = {
            t: append_txn(conn, store, t, sorted(a, key=lambda x: x.partition), writer_id, batch_id)
            for t, a in sorted(changes.items())
        }
        if precondition is not None:
            precondition()  # last, with every lock held: right before COMMIT
        return results

    results, retries = store.retrying(_txn)
    return {
        t: AppendResult(r.table, r.version, r.shards, retries, r.files_referenced)
        for t, r in results.items()
    }


def append_txn(
    conn: Connection,
    store: MetadataStore,
    table: str,
    appends: list[ShardAppend],
    writer_id: str | None,
    batch_id: int | None,
) -> AppendResult:
    """Decide and record one table's ``appends`` (sorted by partition) inside ``conn``'s
    transaction. A stale epoch on any shard raises :class:`WriterFencedError`."""
    info = store.table_row(conn, table, lock=True)
    current = shards_of(conn, table, [a.partition for a in appends])
    decisions: list[tuple[ShardAppend, Shard | None, Decision]] = []
    for a in appends:
        sh = current.get(a.partition)
        if sh is None:
            # A brand-new shard starts where its first batch starts.
            d = decide(upper=a.lo, epoch=0, lo=a.lo, hi=a.hi, writer_epoch=a.epoch)
        else:
            d = decide(upper=sh.upper, epoch=sh.epoch, lo=a.lo, hi=a.hi, writer_epoch=a.epoch)
        if d.outcome is Outcome.FENCED:
            raise WriterFencedError(table, a.partition, a.epoch, sh.epoch if sh else 0)
        decisions.append((a, sh, d))

    changed = any(d.appends for _, _, d in decisions)
    new_version = info.manifest_version + 1 if changed else None
    now = store.clock.now()
    results: list[ShardResult] = []
    files: set[str] = set()
    # Collected per partition, then written with one statement each (entries, new shards,
    # compare-and-sets of the existing shards): a statement per partition made a commit's
    # cost grow with the partitions a batch touched rather than with its rows.
    entries: list[dict[str, Any]] = []
    new_shards: list[dict[str, Any]] = []
    moved: list[CasRow] = []
    for a, sh, d in decisions:
        seq: int | None = None
        if not d.appends:
            results.append(ShardResult(a.partition, d, None))
            continue
        next_seq = sh.next_seq if sh else 0
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
        if last_ms is None and sh is not None:
            last_ms = sh.last_record_ms
        if sh is None:
            new_shards.append(
                {
                    "table_name": table,
                    "partition": a.partition,
                    "upper": d.new_upper,
                    "epoch": 0,
                    "next_seq": next_seq,
                    "version": 1,
                    "last_record_ms": last_ms,
                }
            )
        else:
            moved.append(
                CasRow(
                    {"table_name": table, "partition": a.partition},
                    sh.version,
                    {"upper": d.new_upper, "next_seq": next_seq, "last_record_ms": last_ms},
                )
            )
        results.append(ShardResult(a.partition, d, seq))

    insert_entries(conn, entries)
    if new_shards:
        conn.execute(insert(s.shards), new_shards)
    cas_update_many(conn, s.shards, moved)

    if new_version is not None:
        publish_version(conn, info, "append", now, writer_id=writer_id, batch_id=batch_id)
    return AppendResult(table, new_version, tuple(results), 0, frozenset(files))
