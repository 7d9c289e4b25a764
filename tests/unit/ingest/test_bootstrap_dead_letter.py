"""Bootstrap never lets the dead-letter table start ahead of the table: the bad records in
between would be in neither (found: the two tables' shards were created in two transactions,
each at the source's position at that moment). A writer starts at the table's uppers: a
dead-letter shard behind them only lags (it moves only with a dead letter)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from millstream.catalog import Catalog
from millstream.datastream import DatastreamSpec, dead_letter_spec
from millstream.spark.runner import DatastreamRunner

TABLE = "events"
DL = dead_letter_spec(TABLE).name


def _write(source: Path, n: int) -> None:
    d = source / "0"
    d.mkdir(parents=True, exist_ok=True)
    lines = "".join('{"id": 1}\n' if i % 3 else "not json\n" for i in range(n))
    (d / f"{len(list(d.iterdir())):05d}.jsonl").write_text(lines)


def _runner(tmp_path: Path) -> tuple[Catalog, DatastreamRunner, Path]:
    source = tmp_path / "source"
    _write(source, 10)
    spec = DatastreamSpec.parse(
        {
            "name": TABLE,
            "source": {"kind": "files", "path": str(source), "starting_offsets": "latest"},
            "schema": {"id": "long"},
            "table": {"mode": "append"},
        }
    )
    cat = Catalog.open(home=tmp_path / "home")
    runner = DatastreamRunner(spec, cat, spark=None, writer_id="w1")
    runner.ensure_tables()
    return cat, runner, source


def test_a_dead_letter_shard_missing_after_a_crash_starts_where_the_tables_shard_is(
    tmp_path: Path,
) -> None:
    cat, runner, source = _runner(tmp_path)
    # An earlier bootstrap crashed after creating the table's shard at the source's end (10).
    cat.store.ensure_shards(TABLE, {0: 10})
    _write(source, 7)  # traffic meanwhile: the source's end is 17 now
    boot = runner.bootstrap()
    assert cat.store.get_shard(DL, 0).upper == 10  # type: ignore[union-attr]
    assert boot.uppers == {0: 10}, "records 10..17 (bad ones included) are read once"


def test_two_replicas_bootstrapping_a_new_datastream_start_both_tables_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cat, active, source = _runner(tmp_path)
    standby = DatastreamRunner(active.spec, cat, spark=None, writer_id="w2")
    real = cat.store.ensure_shards
    seen: list[dict[int, int]] = []

    def standby_bootstraps_in_between(*args: Any, **kwargs: Any) -> Any:
        """Right after the active's first shard creation, records arrive and the standby
        bootstraps completely (two replicas starting a new datastream under traffic)."""
        out = real(*args, **kwargs)
        if not seen:
            seen.append({})
            _write(source, 5)
            seen.append(standby.bootstrap().uppers)
        return out

    monkeypatch.setattr(cat.store, "ensure_shards", standby_bootstraps_in_between)
    first = active.bootstrap()
    assert first.uppers == seen[1] == {0: 10}
    table, dead = cat.store.get_shard(TABLE, 0), cat.store.get_shard(DL, 0)
    assert table is not None and dead is not None
    assert dead.upper == table.upper == 10, "bad records 10..15 would be in neither table"


def test_a_writer_starts_at_the_tables_shard_when_the_dead_letter_shard_lags(
    tmp_path: Path,
) -> None:
    """A dead-letter shard moves only with a dead letter: after batches without one it lags
    the table's, and the offsets between are covered (their dead letters, none, were recorded
    in the transactions that committed them). Starting at the lower upper re-read every batch
    since the last dead letter: on a topic without bad records, all of it."""
    cat, runner, _ = _runner(tmp_path)
    cat.store.ensure_shards(DL, {0: 4})
    cat.store.ensure_shards(TABLE, {0: 10})
    assert runner.bootstrap().uppers == {0: 10}


def test_the_dead_letter_table_keeps_its_tables_history_window(tmp_path: Path) -> None:
    """It gets a version per micro-batch with a bad record (it got one per micro-batch before
    issue 38): with the default 24 h it kept a day of versions (and their manifest rows) behind
    a table whose window is 5 minutes (bench/soak.py saw manifest rows grow 7,000 an hour)."""
    source = tmp_path / "source"
    _write(source, 3)
    raw: dict[str, Any] = {
        "name": TABLE,
        "source": {"kind": "files", "path": str(source)},
        "schema": {"id": "long"},
        "table": {"mode": "append", "retention": {"time": "5m", "min_versions": 2}},
    }
    spec = DatastreamSpec.parse(raw)
    with Catalog.open(home=tmp_path / "home") as cat:
        DatastreamRunner(spec, cat, spark=None, writer_id="w1").ensure_tables()
        retention = cat.table(DL).spec.retention
        assert (retention.time, retention.min_versions) == ("5m", 2)
        # A datastream re-created with another window moves its dead-letter table's too.
        longer = DatastreamSpec.parse(raw | {"table": {"retention": {"time": "1h"}}})
        DatastreamRunner(longer, cat, spark=None, writer_id="w1").ensure_tables()
        assert cat.table(DL).spec.retention.time == "1h"
