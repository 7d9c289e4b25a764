"""A shared query's write path keeps what it makes per process across batches (a table's
parsed spec, the query's sink made from its options), and uses each only while what it was
made from is unchanged: a schema change reaches the next batch, and two queries of different
options each write by their own.

Spark is stood in for as in ``test_shared_query_membership.py``: the sink comes from the
query's data source (``streamWriter``), travels to each write task through pickle, and every
batch's commit gets one from the data source again."""

from __future__ import annotations

import json
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from millstream.catalog import Catalog
from millstream.datastream import dead_letter_spec
from millstream.spark.options import GroupSinkOptions, SinkOptions
from millstream.spark.sink import GroupMessage, MemberWriteError
from millstream.spark.sources import markers_batch, with_member
from millstream.spark.table_source import MillstreamGroupSink
from millstream.spec import TableSpec

V1 = TableSpec.parse({"name": "t", "schema": {"id": "long", "qty": "int"}})
V2 = TableSpec.parse({"name": "t", "schema": {"id": "long", "qty": "long", "discount": "double"}})


@pytest.fixture
def cat(tmp_path: Path) -> Iterator[Catalog]:
    with Catalog.open(home=tmp_path / "home") as catalog:
        yield catalog


def _options(cat: Catalog, source: Path, **extra: str) -> dict[str, str]:
    """A one-member shared query's sink options (member ``m`` writes table ``t``)."""
    member = SinkOptions.from_options(
        {
            **cat.settings.as_options(),
            "table": "t",
            "tableSpec": json.dumps(V1.to_json_dict()),
            "sourceKind": "files",
            "sourceConfig": json.dumps({"path": str(source)}),
            **extra,
        }
    )
    return GroupSinkOptions({"m": member}).to_options()


def _writer(options: dict[str, str]) -> Any:
    return MillstreamGroupSink(options).streamWriter(None, False)  # type: ignore[arg-type]


def _batch(options: dict[str, str], batch_id: int, lo: int, hi: int) -> None:
    """One batch as Spark runs it: a write task with the query's sink unpickled, then a
    commit by the data source's sink. A member's error is raised by the commit."""
    task_sink = pickle.loads(pickle.dumps(_writer(options)))
    message = task_sink.write(iter([with_member(markers_batch([(0, lo, hi)]), "m")]))
    assert isinstance(message, GroupMessage)
    _writer(options).commit([pickle.loads(pickle.dumps(message))], batch_id)


def _source(tmp_path: Path, name: str, lines: list[bytes]) -> Path:
    d = tmp_path / name
    (d / "0").mkdir(parents=True)
    (d / "0" / "a.json").write_bytes(b"".join(line + b"\n" for line in lines))
    return d


def test_a_schema_change_between_batches_reaches_the_next_batch_of_a_shared_query(
    cat: Catalog, tmp_path: Path
) -> None:
    """The table's spec is read at each batch; the spec parsed at the first batch is not
    reused once the stored one changed (a column added, a type widened)."""
    records = [{"id": i, "qty": 2**31 + i, "discount": i / 2} for i in range(6)]
    d = _source(tmp_path, "src", [json.dumps(r).encode() for r in records])
    cat.create_table(V1)
    cat.create_table(dead_letter_spec(V1))
    options = _options(cat, d)

    _batch(options, 0, 0, 2)  # under v1: qty above 2**31 does not fit an int
    cat.store.evolve_table(V2)
    _batch(options, 1, 2, 6)  # under v2

    rows = sorted(cat.read_table("t").to_pylist(), key=lambda r: r["id"])
    assert rows == [{"id": i, "qty": 2**31 + i, "discount": i / 2} for i in range(2, 6)], (
        "the batch after the change carries the new column and the widened type"
    )
    assert [r["offset"] for r in cat.read_table("t__dead_letter").to_pylist()] == [0, 1]
    assert cat.store.get_shard("t", 0).upper == 6  # type: ignore[union-attr]


def test_two_queries_of_different_options_in_one_process_each_write_by_their_own(
    cat: Catalog, tmp_path: Path
) -> None:
    """A process keeps the sink of each query's options; another query's options (here
    ``bad_records: fail`` instead of ``dead_letter``; a restart's epochs likewise) get a sink
    of their own, never the first query's."""
    d = _source(tmp_path, "src", [b'{"id": 1, "qty": 1}', b"not json", b'{"id": 3, "qty": 3}'])
    cat.create_table(V1)
    cat.create_table(dead_letter_spec(V1))
    lenient = _options(cat, d)
    strict = _options(cat, d, badRecords="fail")

    _batch(lenient, 0, 0, 1)
    with pytest.raises(MemberWriteError, match=r"BadRecordError: .* offset 1"):
        _batch(strict, 1, 1, 3)
    assert cat.read_table("t__dead_letter").num_rows == 0, "the strict query dead-lettered"
    _batch(lenient, 1, 1, 3)
    assert [r["offset"] for r in cat.read_table("t__dead_letter").to_pylist()] == [1]
    assert sorted(r["id"] for r in cat.read_table("t").to_pylist()) == [1, 3]
