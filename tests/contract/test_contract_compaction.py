"""Compaction of sealed segments on every backend (SQLite/PostgreSQL x local/S3): reads and time
travel keep equal to the model, garbage collection keeps what retained versions use and, once
they expire, collects the merged-away files; and a seal and a compaction of one partition
racing in real concurrent transactions (one starts inside the other's uncommitted
transaction) never both land: the loser is discarded, retried, and nothing is lost."""

from __future__ import annotations

import threading
from typing import Any

import pyarrow as pa
import pytest

from harness.contract_support import Backend
from harness.fault_points import at_commit, at_sealer
from millstream.catalog import Catalog
from millstream.errors import SegmentChangedError
from millstream.metastore.models import SegmentState
from millstream.reference.model import canonical, model_rows
from millstream.sealing.compaction import CompactionPolicy
from millstream.sealing.keyindex import IndexCache
from millstream.sealing.sealer import CompactionResult, Sealer, SealResult
from millstream.table.gc import collect_garbage
from millstream.table.read import read_manifest
from millstream.table.writer import commit_staged, stage_rows

SPEC = {
    "name": "kv",
    "schema": {"k": "long", "v": "string"},
    "mode": "upsert",
    "primary_key": ["k"],
    "retention": {"time": "1s", "min_versions": 1},
}
POLICY = CompactionPolicy(min_segments=3)


class KV:
    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.spec = catalog.create_table(SPEC).spec
        self.rows: list[dict[str, Any]] = []
        self.pos = 0

    def batch(self, keys: list[int], value: str) -> None:
        lo = self.pos
        rows = [
            {"k": k, "v": value, "_ms_partition": 0, "_ms_offset": lo + i, "_ms_tombstone": False}
            for i, k in enumerate(keys)
        ]
        table = pa.Table.from_pylist(rows, schema=self.spec.arrow_schema(system_columns=True))
        staged = stage_rows(self.catalog.deep, self.spec, table)
        commit_staged(
            self.catalog.store, self.catalog.deep, "kv", staged, {0: (lo, lo + len(keys))}, {0: 0}
        )
        self.rows += rows
        self.pos += len(keys)

    def expected(self) -> list[Any]:
        return canonical(model_rows(self.spec, self.rows))

    def read(self, catalog: Catalog | None = None, **kwargs: Any) -> list[Any]:
        return canonical((catalog or self.catalog).read_table("kv", **kwargs).to_pylist())


def _sealed(catalog: Catalog) -> list[int]:
    return [e.seq for e in catalog.manifest("kv").entries if e.state is SegmentState.ONLINE]


def _sealer(catalog: Catalog, **kwargs: Any) -> Sealer:
    return Sealer(catalog, "kv", compaction=POLICY, index_cache=IndexCache(), **kwargs)


def test_compaction_on_every_backend_keeps_reads_and_gc_exact(catalog: Catalog) -> None:
    kv = KV(catalog)
    sealer = _sealer(catalog)
    for i in range(4):
        kv.batch([0, 1, 2, 3, 4, 5][i:], f"v{i}")
        assert sealer.seal_partition(0, force=True) is not None
    before = catalog.manifest("kv")
    assert len(before.delete_vectors) == 3
    result = sealer.compact_partition(0)
    assert result is not None and len(result.replaced) == 4
    after = catalog.manifest("kv")
    assert _sealed(catalog) == [before.entries[0].seq]
    assert after.delete_vectors == ()
    (merged,) = after.entries
    assert merged.row_count == 6, "one row per key: the vectors' rows are gone"
    assert kv.read() == kv.expected()
    assert kv.read(as_of=before.version) == kv.expected()
    # GC keeps the merged-away files while a retained version uses them ...
    old_files = {e.file_path for e in before.entries} | {d.file_path for d in before.delete_vectors}
    collect_garbage(catalog.store, catalog.deep, "kv", grace_seconds=0)
    assert all(catalog.deep.exists(f) for f in old_files if f)
    # ... and collects them once expiry drops those versions.
    kv.batch([9], "late")  # a newer version, so the compaction's is not the only one kept
    catalog.store.expire_versions("kv", now=catalog.store.clock.now() + 3600)
    removed = collect_garbage(catalog.store, catalog.deep, "kv", grace_seconds=0)
    assert old_files <= set(removed)
    assert catalog.deep.exists(merged.file_path or "")
    assert kv.read() == kv.expected()


@pytest.mark.parametrize("inside", ["compaction", "seal"])
def test_a_seal_and_a_compaction_racing_in_real_transactions_never_both_land(
    backend: Backend, catalog: Catalog, inside: str
) -> None:
    """``inside="compaction"``: another process's compaction is about to COMMIT when this
    process's seal starts (and blocks on it, or runs first on SQLite's write lock); the
    reverse for ``"seal"``. Exactly one of the two swaps lands; the other is refused because
    the partition's sealed segments changed, and its retry lands afterwards."""
    kv = KV(catalog)
    here = _sealer(catalog)
    for i in range(3):
        kv.batch([0, 1, 2, 3][i:], f"v{i}")
        assert here.seal_partition(0, force=True) is not None
    kv.batch([0, 1], "racing")  # the run the seal will take
    outcome: dict[str, object] = {}

    def seal() -> None:
        try:
            outcome["seal"] = here.seal_partition(0, force=True)
        except SegmentChangedError as exc:
            outcome["seal_refused"] = exc

    def compact() -> None:
        try:
            outcome["compaction"] = here.compact_partition(0)
        except SegmentChangedError as exc:
            outcome["compaction_refused"] = exc

    racer = threading.Thread(target=seal if inside == "compaction" else compact)
    swapping = threading.Event()

    def at(point: str, partition: int) -> None:
        if point in ("before_swap", "before_compact_swap"):
            swapping.set()  # the next COMMIT is the swap's (not the seal's claim)

    with backend.open() as other:
        there = _sealer(other)
        at_sealer(there, hook=at)

        def start_the_other(landed: bool) -> None:
            if landed or not swapping.is_set():
                return
            uninstall()
            racer.start()
            racer.join(1.0)  # it runs (or waits on a lock) while this one is uncommitted

        uninstall = at_commit(other.store, start_the_other)
        if inside == "compaction":
            first: CompactionResult | SealResult | None = there.compact_partition(0)
        else:
            first = there.seal_partition(0, force=True)
    racer.join(60)
    assert not racer.is_alive()
    assert first is not None, "the transaction the other started inside lands"
    loser = "seal" if inside == "compaction" else "compaction"
    assert isinstance(outcome.get(f"{loser}_refused"), SegmentChangedError), outcome
    assert kv.read() == kv.expected()
    # The loser's retry lands on the new state, and reads stay exact.
    if loser == "seal":
        assert here.seal_partition(0, force=True) is not None
    else:
        assert here.compact_partition(0) is not None
    assert kv.read() == kv.expected()
    whole = read_manifest(catalog.deep, catalog.manifest("kv"), use_delete_vectors=False)
    assert canonical(whole.to_pylist()) == kv.expected()
