"""A shared query (several datastreams in one Spark query) through its production pieces, on
every backend: the group source plans each member as it would alone, the group sink's write
tasks stage each member's ranges into its own table, and its commit commits every member in
one metadata transaction, each in a savepoint with its own compare-and-append checks. A member
whose commit is fenced, refused or loses a race does not keep the others from committing; its
error names it, so the worker can take it out alone.

Spark is not needed for these pieces (``tests/integration/test_shared_query.py`` runs them in
a worker's real query); the options go through ``to_options``/``from_options`` as Spark
hands them over."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, update

from millstream.catalog import Catalog
from millstream.datastream import DatastreamSpec, dead_letter_spec
from millstream.errors import (
    BadRecordError,
    StagedFileExpiredError,
    WriterFencedError,
    from_spark_failure,
)
from millstream.ingest.sources import config_for
from millstream.metastore import schema as ms
from millstream.metastore.store import MetadataStore
from millstream.reference.model import canonical
from millstream.spark.options import (
    GroupSinkOptions,
    GroupSourceOptions,
    SinkOptions,
    SourceOptions,
)
from millstream.spark.runner import bootstrap
from millstream.spark.shared import member_of
from millstream.spark.sink import GroupMessage, GroupSink, MemberWriteError
from millstream.spark.sources import SPLIT_MIN_RECORDS, GroupStreamReader
from millstream.table.gc import MAX_STAGED_AGE_SECONDS

LINES = 30  # per partition


def _datastream(
    tmp_path: Path, name: str, partitions: int, clean: tuple[int, ...] = ()
) -> DatastreamSpec:
    """A files datastream of ``partitions`` partitions of :data:`LINES` records; offset 7 is
    a bad record except in the ``clean`` partitions."""
    src = tmp_path / name
    for p in range(partitions):
        (src / str(p)).mkdir(parents=True)
        lines = [f'{{"id": {p * 1000 + i}, "v": "{name}{i}"}}' for i in range(LINES)]
        if p not in clean:
            lines[7] = "not json"  # a bad record per partition: dead-lettered
        (src / str(p) / "00000.jsonl").write_text("\n".join(lines) + "\n")
    return DatastreamSpec.parse(
        {
            "name": name,
            "source": {"kind": "files", "path": str(src)},
            "schema": {"id": "long", "v": "string"},
            "table": {"mode": "upsert", "primary_key": ["id"]},
        }
    )


def _options(
    catalog: Catalog,
    spec: DatastreamSpec,
    *,
    stale_epochs: bool = False,
    strict: bool = False,
    max_staged_age: float = MAX_STAGED_AGE_SECONDS,
) -> tuple[SourceOptions, SinkOptions]:
    table = spec.table_spec()
    catalog.create_table(table)
    catalog.create_table(dead_letter_spec(table))
    boot = bootstrap(spec, catalog.store)
    kind, config = config_for(spec.source)
    epochs = {p: e + 1 for p, e in boot.epochs.items()} if stale_epochs else boot.epochs
    return (
        SourceOptions(
            kind,
            config,
            start_offsets=boot.uppers,
            tasks=2,
            # the strict member's partitions go to different tasks, small as its batch is
            split_min_records=1 if strict else SPLIT_MIN_RECORDS,
        ),
        SinkOptions(
            settings=catalog.settings,
            table_spec=table,
            writer_id="w1",
            epochs=epochs,
            dead_letter_epochs=boot.dead_letter_epochs,
            source_kind=kind,
            source_config=config,
            bad_records="fail" if strict else "dead_letter",
            max_staged_age=max_staged_age,
            stats_file=str(_commit_log(catalog, spec)),
        ),
    )


def _commit_log(catalog: Catalog, spec: DatastreamSpec) -> Path:
    """The member's commit log (what its worker's row counters and metrics read), beside its
    source's files (the test's own directory)."""
    return Path(spec.source.path).parent / f"{spec.name}.commits.jsonl"  # type: ignore[union-attr]


def _batch(
    catalog: Catalog,
    specs: list[DatastreamSpec],
    fenced: str | None = None,
    strict: str | None = None,
    expired: str | None = None,
) -> tuple[GroupSink, Callable[[], list[Any]]]:
    """Plan one batch of every member; returns the sink and the batch's write tasks (run
    again, they are Spark's replay of the batch: the same ranges, new files). ``strict``
    names a member with ``bad_records: fail`` (its write fails on its bad records);
    ``expired`` one whose commit refuses any staged file (an age limit of a microsecond)."""
    opts = {
        s.name: _options(
            catalog,
            s,
            stale_epochs=s.name == fenced,
            strict=s.name == strict,
            max_staged_age=1e-6 if s.name == expired else MAX_STAGED_AGE_SECONDS,
        )
        for s in specs
    }
    source = GroupSourceOptions({n: o[0] for n, o in opts.items()})
    sink = GroupSinkOptions({n: o[1] for n, o in opts.items()})
    reader = GroupStreamReader(GroupSourceOptions.from_options(source.to_options()))
    start = reader.initialOffset()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    tasks = reader.partitions(start, end)
    assert len(tasks) <= 2, "the shared query runs its tasks, not each member's"
    writer = GroupSink(GroupSinkOptions.from_options(sink.to_options()))
    return writer, lambda: [writer.write(reader.read(t)) for t in tasks]


def _rows(catalog: Catalog, spec: DatastreamSpec) -> list[dict[str, Any]]:
    return canonical(catalog.read_table(spec.table_name).to_pylist())


def _expected(spec: DatastreamSpec, partitions: int) -> list[dict[str, Any]]:
    return canonical(
        [
            {"id": p * 1000 + i, "v": f"{spec.name}{i}"}
            for p in range(partitions)
            for i in range(LINES)
            if i != 7
        ]
    )


def test_every_member_lands_in_its_own_table_in_one_batch(catalog: Catalog, tmp_path: Path) -> None:
    a, b = _datastream(tmp_path, "ga", 2), _datastream(tmp_path, "gb", 3)
    writer, write_tasks = _batch(catalog, [a, b])
    messages = write_tasks()
    assert all(isinstance(m, GroupMessage) for m in messages)
    writer.commit(messages, 0)
    assert _rows(catalog, a) == _expected(a, 2)
    assert _rows(catalog, b) == _expected(b, 3)
    for spec, partitions in ((a, 2), (b, 3)):
        assert {s.partition: s.upper for s in catalog.store.list_shards(spec.table_name)} == {
            p: LINES for p in range(partitions)
        }
        assert catalog.read_table(spec.dead_letter_table).num_rows == partitions
    # A replay of the batch (Spark re-runs it after a crash) is a DROP for every member.
    writer.commit(write_tasks(), 0)
    assert _rows(catalog, a) == _expected(a, 2)
    assert _rows(catalog, b) == _expected(b, 3)


def test_a_fenced_member_does_not_keep_the_others_from_committing(
    catalog: Catalog, tmp_path: Path
) -> None:
    a, b = _datastream(tmp_path, "ga", 2), _datastream(tmp_path, "gb", 2)
    writer, write_tasks = _batch(catalog, [a, b], fenced="ga")
    with pytest.raises(WriterFencedError) as raised:
        writer.commit(write_tasks(), 0)
    # The error names its member, whatever Spark makes of the traceback's text.
    assert member_of(Exception("\n".join([str(raised.value), *raised.value.__notes__]))) == "ga"
    assert _rows(catalog, a) == []
    assert _rows(catalog, b) == _expected(b, 2), "gb committed although ga was fenced"
    logged = [json.loads(line) for line in _commit_log(catalog, b).read_text().splitlines()]
    assert [(e["batch_id"], e["rows"]) for e in logged] == [(0, 2 * (LINES - 1))], (
        "gb's commit is in its commit log although ga, before it, was fenced"
    )


def test_a_member_whose_write_fails_does_not_fail_the_others_tasks(
    catalog: Catalog, tmp_path: Path
) -> None:
    """ga's part of a write task fails (a bad record in its partition 0, with ``bad_records:
    fail``); the task, which holds gb's part too, succeeds: gb commits the batch, ga commits
    nothing of it (not even its partition 1, which another task wrote) and its error names
    it and keeps its kind (the worker puts ga alone in ERROR)."""
    a, b = _datastream(tmp_path, "ga", 2, clean=(1,)), _datastream(tmp_path, "gb", 2)
    writer, write_tasks = _batch(catalog, [a, b], strict="ga")
    messages = write_tasks()  # a member's failure does not fail its task
    assert all(isinstance(m, GroupMessage) for m in messages)
    assert [sorted(m.failed) for m in messages].count(["ga"]) == 1
    assert [sorted(m.messages) for m in messages].count(["ga", "gb"]) == 1, (
        "ga's partition 1 is written by the other task"
    )
    with pytest.raises(MemberWriteError) as raised:
        writer.commit(messages, 0)
    text = "\n".join([str(raised.value), *raised.value.__notes__])
    assert member_of(Exception(text)) == "ga"
    ours = from_spark_failure(Exception(text))
    assert ours is not None and ours.kind is BadRecordError and ours.fields["offset"] == 7
    assert _rows(catalog, a) == []
    assert {s.partition: s.upper for s in catalog.store.list_shards(a.table_name)} == {0: 0, 1: 0}
    assert _rows(catalog, b) == _expected(b, 2), "gb committed although ga's writes failed"


def _uppers(catalog: Catalog, spec: DatastreamSpec) -> dict[int, int]:
    return {s.partition: s.upper for s in catalog.store.list_shards(spec.table_name)}


def test_the_members_of_a_batch_commit_in_one_metadata_transaction(
    catalog: Catalog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three members' parts of a batch commit in ONE metadata transaction (a round trip and a
    COMMIT for the lot, not one per table), each table and its dead-letter table as it would
    alone; a replay of the batch is a DROP for each, in one transaction again."""
    specs = [_datastream(tmp_path, n, 2) for n in ("ga", "gb", "gc")]
    writer, write_tasks = _batch(catalog, specs)
    messages = write_tasks()
    transactions: list[str] = []
    write = MetadataStore.write

    def counted(self: MetadataStore) -> Any:
        transactions.append(self.url)
        return write(self)

    monkeypatch.setattr(MetadataStore, "write", counted)
    writer.commit(messages, 0)
    assert len(transactions) == 1, f"{len(transactions)} metadata transactions for one batch"
    for spec in specs:
        assert _rows(catalog, spec) == _expected(spec, 2), spec.name
        assert _uppers(catalog, spec) == {0: LINES, 1: LINES}
        assert catalog.read_table(spec.dead_letter_table).num_rows == 2
    transactions.clear()
    writer.commit(write_tasks(), 0)
    assert len(transactions) == 1
    for spec in specs:
        assert _rows(catalog, spec) == _expected(spec, 2), f"{spec.name}: the replay added rows"


def test_a_member_a_concurrent_transaction_fences_holds_back_no_other(
    catalog: Catalog, tmp_path: Path
) -> None:
    """While the batch commits, a concurrent transaction (another writer taking gb over: its
    shards' epoch bumped, its table row locked) holds gb's rows; the shared commit waits for
    it, then finds gb fenced: gb is rolled back to its savepoint alone, commits nothing and
    its error names it, while ga and gc, in the same transaction, commit their batch."""
    specs = {n: _datastream(tmp_path, n, 2) for n in ("ga", "gb", "gc")}
    writer, write_tasks = _batch(catalog, list(specs.values()))
    messages = write_tasks()
    stolen = specs["gb"].table_name
    holding, release = threading.Event(), threading.Event()

    def thief() -> None:
        with catalog.store.write() as conn:
            conn.execute(
                select(ms.tables.c.name).where(ms.tables.c.name == stolen).with_for_update()
            )
            conn.execute(
                update(ms.shards)
                .where(ms.shards.c.table_name == stolen)
                .values(epoch=ms.shards.c.epoch + 1, version=ms.shards.c.version + 1)
            )
            holding.set()
            release.wait(60)

    raised: list[BaseException] = []

    def commit() -> None:
        try:
            writer.commit(messages, 0)
        except BaseException as exc:
            raised.append(exc)

    other = threading.Thread(target=thief)
    other.start()
    assert holding.wait(60)
    committer = threading.Thread(target=commit)
    committer.start()
    time.sleep(1.0)  # the commit now waits for the thief's locks
    release.set()
    other.join(60)
    committer.join(120)
    assert not committer.is_alive()
    assert len(raised) == 1 and isinstance(raised[0], WriterFencedError), raised
    error = raised[0]
    assert member_of(Exception("\n".join([str(error), *error.__notes__]))) == "gb"
    assert _rows(catalog, specs["gb"]) == []
    assert _uppers(catalog, specs["gb"]) == {0: 0, 1: 0}
    for name in ("ga", "gc"):
        assert _rows(catalog, specs[name]) == _expected(specs[name], 2), (
            f"{name} was held back by gb's failed precondition"
        )
        assert _uppers(catalog, specs[name]) == {0: LINES, 1: LINES}


def test_a_member_whose_staged_files_are_too_old_commits_nothing_and_the_others_commit(
    catalog: Catalog, tmp_path: Path
) -> None:
    """gb's commit refuses its staged files (too old for garbage collection's grace, checked
    right before the shared COMMIT): gb commits nothing of the batch, its error names it,
    and ga, in the same transaction, commits."""
    a, b = _datastream(tmp_path, "ga", 2), _datastream(tmp_path, "gb", 2)
    writer, write_tasks = _batch(catalog, [a, b], expired="gb")
    with pytest.raises(StagedFileExpiredError) as raised:
        writer.commit(write_tasks(), 0)
    assert member_of(Exception("\n".join([str(raised.value), *raised.value.__notes__]))) == "gb"
    assert _rows(catalog, b) == []
    assert _uppers(catalog, b) == {0: 0, 1: 0}
    assert catalog.read_table(b.dead_letter_table).num_rows == 0
    assert _rows(catalog, a) == _expected(a, 2), "ga was held back by gb's expired files"


@pytest.mark.parametrize(
    "backend",
    [pytest.param(("postgres", "local"), id="postgres-local", marks=pytest.mark.postgres)],
    indirect=True,
)
def test_a_member_that_loses_a_race_in_the_shared_commit_commits_alone_after_it(
    catalog: Catalog, tmp_path: Path
) -> None:
    """PostgreSQL, where transactions interleave: a concurrent transaction moves gb's shard
    rows (their version) after the shared commit read them, so gb's compare-and-set finds 0
    rows. gb is rolled back to its savepoint (none of its entries stay), ga and gc commit, and
    gb then commits alone from a fresh read: every table holds its batch exactly once."""
    specs = {n: _datastream(tmp_path, n, 2) for n in ("ga", "gb", "gc")}
    writer, write_tasks = _batch(catalog, list(specs.values()))
    messages = write_tasks()
    moved = specs["gb"].table_name
    holding, release = threading.Event(), threading.Event()

    def mover() -> None:
        with catalog.store.write() as conn:
            conn.execute(
                update(ms.shards)
                .where(ms.shards.c.table_name == moved)
                .values(version=ms.shards.c.version + 1)
            )
            holding.set()
            release.wait(60)

    raised: list[BaseException] = []

    def commit() -> None:
        try:
            writer.commit(messages, 0)
        except BaseException as exc:
            raised.append(exc)

    other = threading.Thread(target=mover)
    other.start()
    assert holding.wait(60)
    committer = threading.Thread(target=commit)
    committer.start()
    time.sleep(1.0)  # the commit read gb's shards and now waits for the mover's row locks
    release.set()
    other.join(60)
    committer.join(120)
    assert not committer.is_alive()
    assert raised == []
    for name, spec in specs.items():
        assert _rows(catalog, spec) == _expected(spec, 2), name
        assert _uppers(catalog, spec) == {0: LINES, 1: LINES}
        entries = catalog.store.manifest(spec.table_name).entries
        assert sorted(e.partition for e in entries) == [0, 1], f"{name}: {entries}"
