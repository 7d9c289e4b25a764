"""Tables and commits for the Iceberg publisher's tests and others: a ``{k: long, v: string}``
upsert table's rows, or a one-column ``{id: long}`` table's ids, staged and committed as a
writer's batch would be, on partition 0, and the scenario of a published batch rolled back
whose next publish fails at the pointer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

from millstream.catalog import Catalog
from millstream.table.iceberg import PublishCache, live_files, publish
from millstream.table.writer import commit_staged, stage_rows


def create_kv_table(cat: Catalog, name: str, *, iceberg_snapshots: int | None = None) -> None:
    """An upsert table ``name`` of ``k: long`` (the key) and ``v: string``; with
    ``iceberg_snapshots``, its view keeps that many snapshots (and its versions a day)."""
    spec: dict[str, Any] = {
        "name": name,
        "schema": {"k": "long", "v": "string"},
        "mode": "upsert",
        "primary_key": ["k"],
    }
    if iceberg_snapshots is not None:
        spec["retention"] = {
            "time": "24h",
            "min_versions": 1,
            "iceberg_snapshots": iceberg_snapshots,
        }
    cat.create_table(spec)


def commit_rows(
    cat: Catalog, table: str, rows: list[tuple[int, str]], lo: int, epoch: int = 0
) -> int:
    """Commit ``rows`` (``(k, v)``) at offsets ``lo``, ``lo + 1``, ... of partition 0 (at
    ``epoch`` if not 0); the offset after them."""
    spec = cat.table(table).spec
    batch = pa.Table.from_pylist(
        [
            {"k": k, "v": v, "_ms_partition": 0, "_ms_offset": lo + i, "_ms_tombstone": False}
            for i, (k, v) in enumerate(rows)
        ],
        schema=spec.arrow_schema(system_columns=True),
    )
    commit_staged(
        cat.store,
        cat.deep,
        table,
        stage_rows(cat.deep, spec, batch),
        {0: (lo, lo + len(rows))},
        {0: epoch} if epoch else {},
    )
    return lo + len(rows)


def commit_ids(cat: Catalog, table: str, lo: int, n: int, epoch: int = 0) -> None:
    """Commit ids ``lo`` .. ``lo + n - 1`` of the ``{id: long}`` table ``table``, each at its
    own offset of partition 0 (at ``epoch`` if not 0), one staged file."""
    spec = cat.table(table).spec
    rows = pa.table(
        {
            "id": pa.array(range(lo, lo + n), pa.int64()),
            "_ms_partition": pa.array([0] * n, pa.int32()),
            "_ms_offset": pa.array(range(lo, lo + n), pa.int64()),
            "_ms_tombstone": pa.array([False] * n),
        }
    )
    staged = stage_rows(cat.deep, spec, rows)
    commit_staged(
        cat.store, cat.deep, table, staged, {0: (lo, lo + n)}, {0: epoch} if epoch else {}
    )


def commit_keys(cat: Catalog, table: str, keys: list[int], lo: int) -> None:
    """Commit one row per key (``v`` = ``"at <offset>"``) at offsets ``lo``, ``lo + 1``, ...
    of partition 0."""
    commit_rows(cat, table, [(k, f"at {lo + i}") for i, k in enumerate(keys)], lo)


def roll_back_a_published_batch_and_fail_its_publish(
    cat: Catalog, table: str, cache: PublishCache, monkeypatch: pytest.MonkeyPatch
) -> set[str]:
    """On the empty upsert table ``table``: two batches, each published (the second hides
    key 1's first row), then a rollback of the second (key 1 is "old" again) and a publish of
    that which fails at the pointer's compare-and-set (the metadata store unreachable), so the
    view ``cache`` holds still lists the rolled-back batch. The batch's files."""
    lo = commit_rows(cat, table, [(1, "old"), (2, "two")], 0)
    assert publish(cat.store, cat.deep, table, cache=cache).published
    first = {e.seq for e in cat.manifest(table).entries}
    commit_rows(cat, table, [(1, "new")], lo)  # hides key 1's first row
    assert publish(cat.store, cat.deep, table, cache=cache).stats["incremental"] == 1
    batch = live_files(cat.manifest(table)) - live_files(cat.manifest(table, as_of=1))
    (later,) = [e.seq for e in cat.manifest(table).entries if e.seq not in first]
    cat.store.rollback_partition(table, 0, later, dry_run=False)  # key 1 is "old" again
    real: Callable[..., object] = cat.store.swap_pointer

    def unreachable(*args: object, **kwargs: object) -> object:
        raise ConnectionError("metadata store unreachable")

    monkeypatch.setattr(cat.store, "swap_pointer", unreachable)
    with pytest.raises(ConnectionError):
        publish(cat.store, cat.deep, table, cache=cache)
    monkeypatch.setattr(cat.store, "swap_pointer", real)
    return batch
