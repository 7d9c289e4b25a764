"""Rollback of a partition: remove its segments from sequence N on, move the shard upper back to
that segment's start, and bump the epoch so every writer (standbys included) is fenced and must
restart from the new upper. The table's dead-letter shard moves back with it, so bad records
in the re-read range are re-recorded exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection

from millstream.clock import Clock
from millstream.errors import InvalidSpecError, NotFoundError
from millstream.metastore.manifest import Reconcilable, remove_segments
from millstream.metastore.models import Entry
from millstream.metastore.reads import get_entry, live_entries
from millstream.metastore.shards import shards_of
from millstream.metastore.tables import find_table
from millstream.spec import DEAD_LETTER_SUFFIX, dead_letter_name


@dataclass(frozen=True, slots=True)
class RollbackPlan:
    table: str
    partition: int
    from_seq: int
    dry_run: bool
    old_upper: int
    new_upper: int
    old_epoch: int
    new_epoch: int
    removed: tuple[Entry, ...]
    dead_letter_removed: int = 0
    manifest_version: int | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "partition": self.partition,
            "from_sequence": self.from_seq,
            "dry_run": self.dry_run,
            "upper": {"from": self.old_upper, "to": self.new_upper},
            "epoch": {"from": self.old_epoch, "to": self.new_epoch},
            "removed_segments": [
                {
                    "name": e.name,
                    "seq": e.seq,
                    "start_offset": e.start,
                    "end_offset": e.end,
                    "rows": e.row_count,
                    "state": e.state.value,
                }
                for e in self.removed
            ],
            "dead_letter_segments_removed": self.dead_letter_removed,
            "manifest_version": self.manifest_version,
        }


def rollback_partition(
    clock: Clock, table: str, partition: int, from_seq: int, *, dry_run: bool = True
) -> Reconcilable[RollbackPlan]:
    """Plan (``dry_run``, the default) or apply a rollback of ``table`` partition ``partition``
    to before segment ``from_seq`` (for :func:`~millstream.metastore.manifest.reconcile` to
    run). Raises NotFoundError if the table, shard or segment does not exist. Callers decide
    whether the datastream must be paused first."""
    if from_seq < 0:
        raise InvalidSpecError("fromSequence", "must be >= 0")

    def _txn(conn: Connection) -> RollbackPlan:
        info = find_table(conn, table)
        assert info is not None
        base = table.removesuffix(DEAD_LETTER_SUFFIX)
        if base != table and find_table(conn, base, missing_ok=True) is not None:
            # Its shard moves only with a dead letter and the table's upper covers it: moved
            # back alone, the range between would count as covered and never be read again.
            raise InvalidSpecError(
                "table",
                f"{table} is the dead-letter table of {base}: roll back {base} instead "
                "(its dead letters at or above the new upper are rolled back with it)",
            )
        shard = shards_of(conn, table, [partition]).get(partition)
        if shard is None:
            raise NotFoundError("shard", f"{table}/{partition}")
        entries = live_entries(conn, table, partition)
        doomed = [e for e in entries if e.seq >= from_seq]
        if not doomed or doomed[0].seq != from_seq:
            have = ", ".join(str(e.seq) for e in entries) or "none"
            raise NotFoundError(
                "segment", f"{table}__{partition}__{from_seq} (sequences present: {have})"
            )
        new_upper = doomed[0].start
        plan = RollbackPlan(
            table,
            partition,
            from_seq,
            dry_run,
            shard.upper,
            new_upper,
            shard.epoch,
            shard.epoch + 1,
            tuple(doomed),
        )
        if dry_run:
            return plan
        now = clock.now()
        version = remove_segments(
            conn, info, (partition, shard.epoch, shard.version), doomed, new_upper, now
        )
        dl_removed = _rollback_dead_letters(conn, table, partition, new_upper, now)
        return RollbackPlan(
            table,
            partition,
            from_seq,
            False,
            shard.upper,
            new_upper,
            shard.epoch,
            shard.epoch + 1,
            tuple(doomed),
            dl_removed,
            version,
        )

    attempted: list[RollbackPlan] = []

    def _recorded(conn: Connection) -> RollbackPlan:
        plan = _txn(conn)
        attempted.append(plan)
        return plan

    def _landed(conn: Connection) -> RollbackPlan | None:
        """After an unknown outcome: the rollback landed iff the shard reached its new epoch
        and every segment it removes is removed (a writer may have committed since, so the
        upper proves nothing)."""
        if not attempted:
            return None
        plan = attempted[-1]
        shard = shards_of(conn, table, [partition]).get(partition)
        if shard is None or shard.epoch < plan.new_epoch:
            return None
        for e in plan.removed:
            cur = get_entry(conn, e.id)
            if cur is None or cur.removed_version is None:
                return None
        return plan

    return Reconcilable(
        _recorded,
        _landed,
        f"rollback of {table} partition {partition}",
        aftermath="nothing was rolled back; look at the shard and retry",
    )


def _rollback_dead_letters(
    conn: Connection, table: str, partition: int, new_upper: int, now: float
) -> int:
    """Dead-letter entries mirror the table's batch ranges: drop those at or above the new upper."""
    dl = dead_letter_name(table)
    info = find_table(conn, dl, missing_ok=True)
    if info is None:
        return 0
    shard = shards_of(conn, dl, [partition]).get(partition)
    if shard is None:
        return 0
    doomed = [e for e in live_entries(conn, dl, partition) if e.start >= new_upper]
    remove_segments(
        conn,
        info,
        (partition, shard.epoch, shard.version),
        doomed,
        min(shard.upper, new_upper),
        now,
    )
    return len(doomed)
