"""A shared query (several datastreams in one Spark query) through its production pieces, on
every backend: the group source plans each member as it would alone, the group sink's write
tasks stage each member's ranges into its own table, and its commit commits each member in
its own compare-and-append transaction. A member whose commit is fenced does not keep the
others from committing; its error names it, so the worker can take it out alone.

Spark is not needed for these pieces (``tests/integration/test_shared_query.py`` runs them in
a worker's real query); the options go through ``to_options``/``from_options`` as Spark
hands them over."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from millstream.catalog import Catalog
from millstream.datastream import DatastreamSpec, dead_letter_spec
from millstream.errors import BadRecordError, WriterFencedError, from_spark_failure
from millstream.ingest.sources import config_for
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
    catalog: Catalog, spec: DatastreamSpec, *, stale_epochs: bool = False, strict: bool = False
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
        ),
    )


def _batch(
    catalog: Catalog,
    specs: list[DatastreamSpec],
    fenced: str | None = None,
    strict: str | None = None,
) -> tuple[GroupSink, Callable[[], list[Any]]]:
    """Plan one batch of every member; returns the sink and the batch's write tasks (run
    again, they are Spark's replay of the batch: the same ranges, new files). ``strict``
    names a member with ``bad_records: fail`` (its write fails on its bad records)."""
    opts = {
        s.name: _options(catalog, s, stale_epochs=s.name == fenced, strict=s.name == strict)
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
