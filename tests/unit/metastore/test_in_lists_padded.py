"""The metadata store's ``IN (...)`` lists are padded to a power of two (``schema.in_list``):
each length of a list is a statement text of its own, and every connection keeps each text it
ran (SQLite's cache of 128 prepared statements, ~14 KB each for the entries' select; psycopg's
prepared statements). A seal's run of 1-150 entries by id made a text for every length; a
worker's SQLite grew by them over its first ten minutes (docs/performance.md, "The worker's own
process and the publisher over 7 minutes, by allocator")."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import event

from millstream.metastore import schema as s
from millstream.metastore.models import ShardAppend
from millstream.metastore.reads import get_entries
from millstream.metastore.store import MetadataStore
from millstream.spec import TableSpec


def test_in_list_pads_to_a_power_of_two_with_the_last_value() -> None:
    assert s.in_list([]) == []
    assert s.in_list([7]) == [7]
    assert s.in_list([1, 2, 3]) == [1, 2, 3, 3]
    assert s.in_list(range(5)) == [0, 1, 2, 3, 4, 4, 4, 4]
    assert len(s.in_list(range(129))) == 256
    assert len(s.in_list(range(128))) == 128


def test_reads_of_1_to_150_entries_by_id_run_9_statement_texts_and_find_each(
    tmp_path: Path,
) -> None:
    store = MetadataStore(f"sqlite:///{tmp_path / 'm.db'}")
    try:
        store.create_table(
            TableSpec.parse({"name": "events", "schema": {"id": "long"}, "mode": "append"})
        )
        for i in range(150):
            store.commit_batch(
                {"events": [ShardAppend(0, i, i + 1, 0, f"f-{i}.parquet", 1, 10)]},
                writer_id="w",
                batch_id=i,
            )
        with store.read() as conn:
            ids = sorted(
                r[0] for r in conn.execute(s.entries.select().with_only_columns(s.entries.c.id))
            )
        assert len(ids) == 150

        texts: set[str] = set()

        def seen(conn: object, cursor: object, statement: str, *args: object) -> None:
            texts.add(statement)

        event.listen(store.engine, "before_cursor_execute", seen)
        try:
            with store.read() as conn:
                for n in range(1, 151):
                    got = get_entries(conn, ids[:n])
                    assert sorted(got) == ids[:n], n
        finally:
            event.remove(store.engine, "before_cursor_execute", seen)
        by_id = {t for t in texts if "ms_entries" in t}
        # lengths 1, 2, 4, ..., 256: 9 texts for 150 lengths
        assert len(by_id) == 9, sorted(len(t) for t in by_id)
    finally:
        store.dispose()
