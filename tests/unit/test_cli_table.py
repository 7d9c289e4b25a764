"""``millstream table maintain`` and ``table compact``: what they print, what they change, and
what they refuse."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
from typer.testing import CliRunner

from millstream.catalog import Catalog
from millstream.cli import table as cli_table
from millstream.cli.app import app
from millstream.clock import ManualClock
from millstream.table import gc
from millstream.table.limits import MAX_PUBLISH_AGE_SECONDS
from millstream.table.writer import commit_staged, stage_rows

T0 = 1_700_000_000.0


def _history(home: Path) -> None:
    """Table t: three versions committed long ago (retention 1h, 1 version kept)."""
    with Catalog.open(home=home) as cat:
        cat.store.clock = ManualClock(T0)
        cat.create_table(
            {"name": "t", "schema": {"id": "long"}, "retention": {"time": "1h", "min_versions": 1}}
        )
        spec = cat.table("t").spec
        for i in range(3):
            rows = pa.table(
                {
                    "id": pa.array([i], pa.int64()),
                    "_ms_partition": pa.array([0], pa.int32()),
                    "_ms_offset": pa.array([i], pa.int64()),
                    "_ms_tombstone": pa.array([False]),
                }
            )
            commit_staged(
                cat.store, cat.deep, "t", stage_rows(cat.deep, spec, rows), {0: (i, i + 1)}, {}
            )


def test_a_dry_run_says_what_would_expire_and_removes_nothing(tmp_path: Path) -> None:
    _history(tmp_path)
    result = CliRunner().invoke(
        app, ["table", "maintain", "t", "--home", str(tmp_path), "--dry-run"]
    )
    assert result.exit_code == 0, result.output
    assert "t: would expire versions 0..2 (3 versions" in result.output
    with Catalog.open(home=tmp_path) as cat:
        assert cat.store.oldest_kept_version("t") == 0

    result = CliRunner().invoke(app, ["table", "maintain", "--home", str(tmp_path), "-o", "json"])
    assert result.exit_code == 0, result.output
    (report,) = json.loads(result.output)
    assert report["expired"]["floor"] == 3 and report["dry_run"] is False
    with Catalog.open(home=tmp_path) as cat:
        assert cat.store.oldest_kept_version("t") == 3
        assert cat.read_table("t").num_rows == 3


def test_an_unknown_table_exits_3_and_a_short_grace_is_refused_with_2(tmp_path: Path) -> None:
    _history(tmp_path)
    result = CliRunner().invoke(app, ["table", "maintain", "nope", "--home", str(tmp_path)])
    assert result.exit_code == 3
    assert "table 'nope' does not exist" in result.output
    result = CliRunner().invoke(
        app, ["table", "maintain", "t", "--home", str(tmp_path), "--grace", "60"]
    )
    assert result.exit_code == 2
    assert "invalid --grace" in result.output


def test_the_cli_defaults_are_the_garbage_collectors() -> None:
    """The CLI copies them to keep `millstream --help` fast; they must not drift."""
    assert cli_table.DEFAULT_GRACE_SECONDS == gc.DEFAULT_GRACE_SECONDS
    assert cli_table.MIN_GRACE_SECONDS == gc.MAX_STAGED_AGE_SECONDS
    # A publish of an Iceberg view moves its pointer only to files younger than this: below
    # the smallest grace accepted, or a collection may delete them first.
    assert MAX_PUBLISH_AGE_SECONDS < cli_table.MIN_GRACE_SECONDS


def _sealed_four_times(home: Path) -> None:
    """Upsert table u: partition 0 sealed four times, each seal superseding the last's keys."""
    from millstream.sealing.compaction import CompactionPolicy
    from millstream.sealing.keyindex import IndexCache
    from millstream.sealing.sealer import Sealer

    with Catalog.open(home=home) as cat:
        cat.create_table(
            {"name": "u", "schema": {"k": "long"}, "mode": "upsert", "primary_key": ["k"]}
        )
        spec = cat.table("u").spec
        sealer = Sealer(
            cat, "u", compaction=CompactionPolicy(enabled=False), index_cache=IndexCache()
        )
        for i in range(4):
            rows = pa.table(
                {
                    "k": pa.array([1, 2, 3], pa.int64()),
                    "_ms_partition": pa.array([0] * 3, pa.int32()),
                    "_ms_offset": pa.array([3 * i, 3 * i + 1, 3 * i + 2], pa.int64()),
                    "_ms_tombstone": pa.array([False] * 3),
                }
            )
            commit_staged(
                cat.store,
                cat.deep,
                "u",
                stage_rows(cat.deep, spec, rows),
                {0: (3 * i, 3 * i + 3)},
                {},
            )
            assert sealer.seal_partition(0, force=True) is not None


def test_compact_says_what_it_would_merge_then_merges_it(tmp_path: Path) -> None:
    _sealed_four_times(tmp_path)
    args = ["table", "compact", "u", "--home", str(tmp_path)]
    result = CliRunner().invoke(app, [*args, "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "u partition 0: would merge 4 segments (12 rows, 3 delete vectors;" in result.output
    with Catalog.open(home=tmp_path) as cat:
        assert len(cat.manifest("u").entries) == 4

    result = CliRunner().invoke(app, [*args, "-o", "json"])
    assert result.exit_code == 0, result.output
    (report,) = json.loads(result.output)["partitions"]
    assert report["compacted"] is True and report["rows"] == 3
    with Catalog.open(home=tmp_path) as cat:
        (entry,) = cat.manifest("u").entries
        assert entry.row_count == 3 and cat.manifest("u").delete_vectors == ()
        assert sorted(cat.read_table("u").column("k").to_pylist()) == [1, 2, 3]

    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "u partition 0: nothing to merge" in result.output


def test_compact_names_an_unknown_table_or_partition(tmp_path: Path) -> None:
    _sealed_four_times(tmp_path)
    result = CliRunner().invoke(app, ["table", "compact", "nope", "--home", str(tmp_path)])
    assert result.exit_code == 3
    assert "table 'nope' does not exist" in result.output
    result = CliRunner().invoke(
        app, ["table", "compact", "u", "--home", str(tmp_path), "--partition", "7"]
    )
    assert result.exit_code == 2
    assert "table 'u' has no partition 7" in result.output


def test_a_dead_letter_tables_position_is_its_tables_after_batches_without_bad_records(
    tmp_path: Path,
) -> None:
    """A dead-letter table's shard moves only with a dead letter, so after clean batches its
    own upper stays behind; what ``table describe`` and ``consumingSegmentsInfo`` show as its
    position is how far its dead letters are recorded: its table's upper (no false lag)."""
    from millstream.datastream import dead_letter_spec
    from millstream.metastore.models import ShardAppend

    with Catalog.open(home=tmp_path) as cat:
        spec = cat.create_table(
            {"name": "orders", "schema": {"id": "long"}, "primary_key": ["id"], "mode": "upsert"}
        ).spec
        dl = cat.create_table(dead_letter_spec(spec)).spec
        cat.store.ensure_shards("orders", {0: 0, 1: 0}, together_with=[dl.name])
        for lo in (0, 6):
            cat.store.commit_batch(
                {
                    "orders": [ShardAppend(0, lo, lo + 6, 0, f"data/o/{lo}.parquet", 6, 10)],
                    dl.name: [ShardAppend(0, lo, lo + 6, 0, None, 0)],
                }
            )
        assert {s.partition: s.upper for s in cat.store.list_shards(dl.name)} == {0: 0, 1: 0}
    result = CliRunner().invoke(
        app, ["table", "describe", dl.name, "--home", str(tmp_path), "-o", "json"]
    )
    assert result.exit_code == 0, result.output
    parts = json.loads(result.output)["partitions"]
    assert {p: v["upper"] for p, v in parts.items()} == {"0": 12, "1": 0}
