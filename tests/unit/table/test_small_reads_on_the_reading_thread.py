"""A read of a local store's few small files (a seal's run of micro-batch files of a few rows
each: ~150 of them at 100 busy tables) decodes them on the reading thread, one after the
other: handed to the read pool each tiny decode cost about twice its CPU in the threads'
hand-offs and GIL contention (issue 38). A larger read still uses the pool. Either way the
rows are the same."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from harness.publish_support import commit_ids
from millstream.catalog import Catalog
from millstream.spec import TableSpec
from millstream.storage.deepstore import DeepStore
from millstream.table import read
from millstream.table.read import read_entries

SPEC = TableSpec.parse({"name": "t", "schema": {"id": "long"}})


@pytest.fixture
def cat(tmp_path: Path) -> Iterator[Catalog]:
    """A table of 12 committed micro-batches of 10 rows, one file each."""
    with Catalog.open(
        metadata_url=f"sqlite:///{tmp_path / 'm.db'}", deep_store=str(tmp_path / "deep")
    ) as c:
        c.create_table(SPEC)
        for batch in range(12):
            commit_ids(c, "t", batch * 10, 10)
        yield c


def _decoding_threads(cat: Catalog, monkeypatch: pytest.MonkeyPatch) -> tuple[set[str], pa.Table]:
    """The threads the files of the table's entries were decoded on, and the rows read."""
    seen: set[str] = set()
    real = DeepStore.read_parquet_choosing

    def spy(self: DeepStore, *args: object, **kwargs: object) -> pa.Table:
        seen.add(threading.current_thread().name)
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(DeepStore, "read_parquet_choosing", spy)
    entries = cat.manifest("t").entries
    assert len(entries) == 12
    rows = read_entries(cat.deep, SPEC, entries)
    monkeypatch.undo()
    return seen, rows


def test_a_read_of_a_few_small_local_files_decodes_them_on_the_reading_thread(
    cat: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen, rows = _decoding_threads(cat, monkeypatch)
    assert seen == {threading.current_thread().name}
    assert sorted(rows.column("id").to_pylist()) == list(range(120))


def test_a_larger_read_still_uses_the_read_pool(
    cat: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(read, "SERIAL_READ_BYTES", 0)
    seen, rows = _decoding_threads(cat, monkeypatch)
    assert seen and all(name.startswith("millstream-read-files") for name in seen)
    assert sorted(rows.column("id").to_pylist()) == list(range(120))


def test_a_remote_stores_small_files_still_use_the_read_pool(
    cat: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A remote store's reads wait on requests: the pool overlaps their latency."""
    monkeypatch.setattr(cat.deep, "local", False)
    seen, rows = _decoding_threads(cat, monkeypatch)
    assert seen and all(name.startswith("millstream-read-files") for name in seen)
    assert sorted(rows.column("id").to_pylist()) == list(range(120))
