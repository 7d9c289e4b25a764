"""Shard rows of the metadata store: reading a table's shards and bootstrapping missing ones
(a table's together with its dead-letter table's)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from sqlalchemy import Connection, insert, select

from millstream.metastore import schema as s
from millstream.metastore.models import Shard
from millstream.metastore.tables import find_table


def shards_of(conn: Connection, table: str, partitions: Sequence[int] | None) -> dict[int, Shard]:
    """``table``'s shards by partition: those of ``partitions``, or all of them (None)."""
    q = select(s.shards).where(s.shards.c.table_name == table)
    if partitions is not None:
        q = q.where(s.shards.c.partition.in_(s.in_list(partitions)))
    return {
        r.partition: Shard(
            table, r.partition, r.upper, r.epoch, r.next_seq, r.version, r.last_record_ms
        )
        for r in conn.execute(q)
    }


def shards_of_tables(
    conn: Connection, partitions: Mapping[str, Iterable[int]]
) -> dict[str, dict[int, Shard]]:
    """The shards of several tables (``partitions``: table -> its partitions wanted), by
    table and partition, in ONE read."""
    wanted = {t: set(ps) for t, ps in partitions.items()}
    out: dict[str, dict[int, Shard]] = {t: {} for t in wanted}
    if not wanted:
        return out
    q = select(s.shards).where(s.shards.c.table_name.in_(s.in_list(sorted(wanted))))
    for r in conn.execute(q):
        if r.partition in wanted[r.table_name]:
            out[r.table_name][r.partition] = Shard(
                r.table_name, r.partition, r.upper, r.epoch, r.next_seq, r.version, r.last_record_ms
            )
    return out


def ensure_shards(
    conn: Connection, table: str, starts: dict[int, int], *, together_with: Sequence[str]
) -> dict[int, Shard]:
    """In ``conn``'s transaction: create the missing shards of ``table`` and of the
    ``together_with`` tables (see :meth:`MetadataStore.ensure_shards`); returns ``table``'s
    requested shards as they now are."""
    names = [table, *together_with]
    have = {}
    for name in names:
        find_table(conn, name)
        have[name] = shards_of(conn, name, list(starts))
    for p, start in sorted(starts.items()):
        existing = [have[name][p].upper for name in names if p in have[name]]
        upper = min(existing) if existing else start
        for name in names:
            if p not in have[name]:
                conn.execute(
                    insert(s.shards).values(
                        table_name=name,
                        partition=p,
                        upper=upper,
                        epoch=0,
                        next_seq=0,
                        version=1,
                    )
                )
    return shards_of(conn, table, list(starts))
