"""Delete vectors on every backend: a seal that supersedes sealed rows records them, reads skip
them and still equal the model, time travel sees each version's vectors, GC keeps their files,
and a rollback brings the superseded rows back."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from millstream.catalog import Catalog
from millstream.reference.model import canonical, model_rows
from millstream.sealing.keyindex import CACHE
from millstream.sealing.sealer import Sealer
from millstream.table.gc import collect_garbage
from millstream.table.writer import commit_staged, stage_rows

SPEC = {
    "name": "kv",
    "schema": {"k": "long", "v": "string"},
    "mode": "upsert",
    "primary_key": ["k"],
}


def _rows(lo: int, keys: list[int], value: str) -> list[dict[str, Any]]:
    return [
        {"k": k, "v": value, "_ms_partition": 0, "_ms_offset": lo + i, "_ms_tombstone": False}
        for i, k in enumerate(keys)
    ]


def test_delete_vectors_on_every_backend(catalog: Catalog) -> None:
    CACHE.clear()
    spec = catalog.create_table(SPEC).spec
    sealer = Sealer(catalog, "kv")
    history: list[dict[str, Any]] = []
    for lo, value in ((0, "first"), (6, "second")):
        rows = _rows(lo, [0, 1, 2, 3, 4, 5], value)
        table = pa.Table.from_pylist(rows, schema=spec.arrow_schema(system_columns=True))
        staged = stage_rows(catalog.deep, spec, table)
        commit_staged(catalog.store, catalog.deep, "kv", staged, {0: (lo, lo + 6)}, {0: 0})
        history += rows
        assert sealer.seal_partition(0, force=True) is not None
    m = catalog.manifest("kv")
    (dv,) = m.delete_vectors
    assert dv.row_count == 6
    expected = canonical(model_rows(spec, history))
    assert canonical(catalog.read_table("kv").to_pylist()) == expected
    removed = collect_garbage(catalog.store, catalog.deep, "kv", grace_seconds=0)
    assert dv.file_path not in removed
    assert catalog.deep.exists(dv.file_path), "GC keeps a referenced delete vector"
    assert catalog.manifest("kv", as_of=dv.added_version - 1).delete_vectors == ()
    second_seal = next(e for e in m.entries if e.start == 6)
    catalog.store.rollback_partition("kv", 0, second_seal.seq, dry_run=False)
    assert catalog.manifest("kv").delete_vectors == ()
    assert canonical(catalog.read_table("kv").to_pylist()) == canonical(
        model_rows(spec, history[:6])
    )
    # The removed vector is still visible to time travel at the version that had it.
    assert [d.id for d in catalog.manifest("kv", as_of=m.version).delete_vectors] == [dv.id]
