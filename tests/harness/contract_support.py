"""Helpers shared by the contract tests: deterministic rows, staging + committing, reading
back as multisets, and the worker that commits from another process."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from millstream.catalog import Catalog
from millstream.metastore.models import AppendResult
from millstream.reference.model import canonical, model_rows
from millstream.spec import OFFSET_COL, PARTITION_COL, TOMBSTONE_COL, TableSpec
from millstream.storage.deepstore import table_data_prefix
from millstream.table.writer import StagedFile, commit_staged, stage_rows

TABLE = "events"
#: An append table: every committed row shows up, so a duplicate or a lost row is visible.
EVENTS: dict[str, Any] = {"name": TABLE, "schema": {"id": "long", "payload": "string"}}

Ranges = Mapping[int, tuple[int, int]]


@dataclass(frozen=True)
class Backend:
    """Where one test's deployment lives; ``open()`` gives an independent Catalog on it."""

    id: str
    metadata_url: str
    deep_store: str
    s3_endpoint: str | None

    def open(self) -> Catalog:
        return Catalog.open(
            metadata_url=self.metadata_url,
            deep_store=self.deep_store,
            s3_endpoint=self.s3_endpoint,
        )

    def as_dict(self) -> dict[str, Any]:
        """Plain, picklable form for worker processes."""
        return {
            "metadata_url": self.metadata_url,
            "deep_store": self.deep_store,
            "s3_endpoint": self.s3_endpoint,
        }


def source_rows(ranges: Ranges) -> list[dict[str, Any]]:
    """The source records of ``{partition: (lo, hi)}``: one per offset, same every time."""
    return [
        {
            "id": p * 1_000_000 + o,
            "payload": f"p{p}-o{o}",
            PARTITION_COL: p,
            OFFSET_COL: o,
            TOMBSTONE_COL: False,
        }
        for p, (lo, hi) in sorted(ranges.items())
        for o in range(lo, hi)
    ]


def to_arrow(spec: TableSpec, rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=spec.arrow_schema(system_columns=True))


def stage(cat: Catalog, ranges: Ranges, *, table: str = TABLE) -> StagedFile:
    spec = cat.table(table).spec
    return stage_rows(cat.deep, spec, to_arrow(spec, source_rows(ranges)))


def commit(
    cat: Catalog,
    ranges: Ranges,
    *,
    epochs: Mapping[int, int] | None = None,
    table: str = TABLE,
    writer_id: str | None = None,
    batch_id: int | None = None,
    staged: StagedFile | None = None,
) -> AppendResult:
    """Stage the source rows of ``ranges`` as one file (unless ``staged`` is given) and
    compare-and-append it for every partition of ``ranges``."""
    if staged is None:
        staged = stage(cat, ranges, table=table)
    return commit_staged(
        cat.store,
        cat.deep,
        table,
        staged,
        ranges,
        epochs or {},
        writer_id=writer_id,
        batch_id=batch_id,
    )


def data_files(cat: Catalog, *, table: str = TABLE) -> set[str]:
    """Every data file of ``table`` in the deep store, referenced or not."""
    return {f.path for f in cat.deep.list_files(table_data_prefix(table))}


def uppers(cat: Catalog, *, table: str = TABLE) -> dict[int, int]:
    return {s.partition: s.upper for s in cat.store.list_shards(table)}


def table_rows(cat: Catalog, *, table: str = TABLE, as_of: Any = None) -> list[Any]:
    """The table's current rows (or as of ``as_of``) as a canonical multiset."""
    return canonical(cat.read_table(table, as_of=as_of).to_pylist())


def expected_rows(spec: TableSpec, committed: Iterable[Ranges]) -> list[Any]:
    """What the sequential model says the table holds once each range was committed once."""
    rows = [r for ranges in committed for r in source_rows(ranges)]
    return canonical(model_rows(spec, rows))


def commit_worker(
    backend: dict[str, Any],
    batches: list[dict[int, tuple[int, int]]],
    writer_id: str,
    barrier: Any,
    results: Any,
) -> None:
    """Run in a spawned process. Waits for the peer, opens the (possibly brand-new) store and
    creates the table - racing the peer's migration and create_table - stages every batch,
    waits again, then commits the batches in order.

    Puts ``(writer_id, [(batch index, {partition: outcome})], error or None)``."""
    outcomes: list[tuple[int, dict[int, str]]] = []
    try:
        barrier.wait(timeout=60)
        with Catalog.open(**backend) as cat:
            cat.create_table(EVENTS)
            staged = [stage(cat, b) for b in batches]
            barrier.wait(timeout=60)
            for i, (b, st) in enumerate(zip(batches, staged, strict=True)):
                res = commit_staged(cat.store, cat.deep, TABLE, st, b, {}, writer_id=writer_id)
                outcomes.append((i, {s.partition: s.decision.outcome.value for s in res.shards}))
    except BaseException as exc:
        results.put((writer_id, outcomes, f"{type(exc).__name__}: {exc}"))
        raise
    results.put((writer_id, outcomes, None))
