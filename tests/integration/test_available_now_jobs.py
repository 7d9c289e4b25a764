"""``run(available_now=True)`` runs its batches as Spark jobs (``millstream.spark.catch_up``):
planned by the stream source's reader, staged by the sink's write tasks, committed by the
sink's one commit path. What a user would notice if it went wrong: a commit fenced in the
middle of a run (a rollback, a second writer) must make the run start again from the shard
uppers, not fail or skip records; a Spark checkpoint left by an earlier streaming run of the
same writer, which such a run moves past, must not be trusted by the next streaming run; and
stopping a run (Ctrl-C, SIGTERM, a worker's stop) ends it at a batch boundary, leaves the
caller's Spark job group as it was, and the next run goes on from there.

The tables are append tables: a record ingested twice would be a row twice.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.ingest_support import SPARK_MASTER, run_until_caught_up
from millstream.catalog import Catalog
from millstream.datastream import DatastreamSpec
from millstream.ingest.sources.generator import ORDERS_SCHEMA, GeneratorConfig, generate
from millstream.reference.model import canonical
from millstream.reference.oracle import RawRecord, expected_table
from millstream.spark.runner import DatastreamRunner

pytestmark = [pytest.mark.spark]

PARTITIONS = 2
BATCH = 1_000  # records a batch plans over both partitions


def _append_source(root: Path, part: int, per_partition: int) -> list[RawRecord]:
    """Write file ``part`` of ``per_partition`` more records to each partition; returns every
    record written so far (the oracle's input)."""
    records: list[RawRecord] = []
    for p in range(PARTITIONS):
        cfg = GeneratorConfig(seed=71, partitions=PARTITIONS, key_cardinality=800)
        d = root / str(p)
        d.mkdir(parents=True, exist_ok=True)
        lines = [v if v is not None else b"" for _, _, v in generate(cfg, p, 0, per_partition * 3)]
        (d / f"{part:04d}.jsonl").write_bytes(
            b"\n".join(lines[part * per_partition : (part + 1) * per_partition]) + b"\n"
        )
        upto = (part + 1) * per_partition
        records += [(p, o, None, v) for o, v in enumerate(lines[:upto])]
    return records


def _fields(root: Path) -> dict[str, Any]:
    return {
        "name": "jobs",
        "source": {"kind": "files", "path": str(root)},
        "table": {"mode": "append"},  # a record ingested twice would be a row twice
        "schema": ORDERS_SCHEMA,
        "max_records_per_batch": BATCH,
    }


def _spec(root: Path) -> DatastreamSpec:
    return DatastreamSpec.parse(_fields(root))


#: A run on the session ``millstream run --available-now`` starts (the spec's fields, the
#: home), in a process of its own; prints what the JVM holds after it as JSON.
JOBS_RUN = """
import json, sys
from millstream.catalog import Catalog
from millstream.datastream import DatastreamSpec
from millstream.spark.runner import DatastreamRunner
from millstream.spark.session import SessionStart, batch_run_settings

fields, home = json.loads(sys.argv[1]), sys.argv[2]
spark = SessionStart(config=batch_run_settings(None), jobs_only=True).result()
with Catalog.open(home=home) as cat:
    DatastreamRunner(DatastreamSpec.parse(fields), cat, spark, writer_id="w").run(
        available_now=True
    )
jvm = spark.sparkContext._jvm
sessions = getattr(jvm, "org.apache.spark.sql.classic.SparkSession")
seen = {
    "jvm_time_zone": jvm.java.util.TimeZone.getDefault().getID(),
    "session_after_run": {
        "default": sessions.getDefaultSession().isDefined(),
        "active": sessions.getActiveSession().isDefined(),
    },
}
# the session's own SQL settings, which its queries run with (created here, at first use)
seen["time_zone"] = spark.conf.get("spark.sql.session.timeZone")
seen["shuffle_partitions"] = spark.conf.get("spark.sql.shuffle.partitions")
print(json.dumps(seen), flush=True)
spark.stop()
"""


def _rows(cat: Catalog, table: str) -> list[Any]:
    return canonical(cat.read_table(table).to_pylist())


def test_a_commit_fenced_in_the_middle_of_a_run_restarts_it_from_the_shard_uppers(
    tmp_path: Path, spark: Any
) -> None:
    """After the run's first batch, partition 0 is rolled back (its epoch moves on, its upper
    goes back). The next batch's commit is fenced; the run starts again from the shard
    uppers and ingests the rolled-back range again: the table equals the model."""
    records = _append_source(tmp_path / "src", 0, 2_000)
    spec = _spec(tmp_path / "src")
    cat = Catalog.open(home=tmp_path / "home")
    rolled: list[int] = []

    def roll_back_once(runner: DatastreamRunner) -> None:
        if rolled:
            return
        seqs = sorted(e.seq for e in cat.manifest(spec.table_name).entries if e.partition == 0)
        plan = cat.store.rollback_partition(spec.table_name, 0, seqs[-1], dry_run=False)
        rolled.append(plan.new_upper)

    stats = DatastreamRunner(spec, cat, spark, writer_id="w").run(
        available_now=True, on_tick=roll_back_once
    )

    assert rolled == [0], "the rollback went back to the start of partition 0"
    assert stats.restarts == 1, "the fenced commit made the run start again"
    expected, bad = expected_table(spec.table_spec(), records)
    assert _rows(cat, spec.table_name) == canonical(expected)
    assert cat.read_table(spec.dead_letter_table).num_rows == len(bad)
    uppers = {s.partition: s.upper for s in cat.store.list_shards(spec.table_name)}
    assert uppers == {0: 2_000, 1: 2_000}
    commits = DatastreamRunner(spec, cat, spark, writer_id="w").commits()
    assert [c["batch_id"] for c in commits][:2] == [0, 0], commits  # the second run began at 0


def test_a_streaming_checkpoint_the_run_moves_past_is_removed_not_left_to_be_discarded(
    tmp_path: Path, spark: Any
) -> None:
    """A writer that ran as a streaming query, then as an available-now run, then as a query
    again: the query resumes from the shard uppers without finding a checkpoint behind them,
    and every record is in the table once."""
    root = tmp_path / "src"
    spec = _spec(root)
    cat = Catalog.open(home=tmp_path / "home")

    def runner() -> DatastreamRunner:
        return DatastreamRunner(spec, cat, spark, writer_id="w")

    _append_source(root, 0, 600)
    first = runner()
    assert run_until_caught_up(first).discarded_checkpoints == []
    checkpoint = first.state_dir.path / "checkpoint"
    assert (checkpoint / "offsets").is_dir()

    _append_source(root, 1, 600)
    runner().run(available_now=True)
    assert not checkpoint.exists(), "the shards moved past it: the jobs run removed it"

    records = _append_source(root, 2, 600)
    assert run_until_caught_up(runner()).discarded_checkpoints == []
    expected, _ = expected_table(spec.table_spec(), records)
    assert _rows(cat, spec.table_name) == canonical(expected)
    uppers = {s.partition: s.upper for s in cat.store.list_shards(spec.table_name)}
    assert uppers == {0: 1_800, 1: 1_800}


def test_a_stopped_run_ends_after_its_batch_and_the_next_run_goes_on_from_there(
    tmp_path: Path, spark: Any
) -> None:
    from millstream.cli.progress import ProgressView

    records = _append_source(tmp_path / "src", 0, 1_500)  # 3 batches of 1,000
    spec = _spec(tmp_path / "src")
    cat = Catalog.open(home=tmp_path / "home")
    sc = spark.sparkContext
    sc.setJobGroup("the-callers-group", "the caller's own jobs")
    seen: list[tuple[str | None, float]] = []

    def stop_after_the_first_batch(runner: DatastreamRunner) -> None:
        rate = ProgressView(runner).snapshot()["rows_per_second"]
        seen.append((sc.getLocalProperty("spark.jobGroup.id"), rate))
        runner.stop()

    try:
        runner = DatastreamRunner(spec, cat, spark, writer_id="w")
        runner.run(available_now=True, on_tick=stop_after_the_first_batch)
        assert sc.getLocalProperty("spark.jobGroup.id") == "the-callers-group"
    finally:
        for key in ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel"):
            sc.setLocalProperty(key, None)

    assert len(seen) == 2, seen  # after its first batch, then the run's last tick
    group, rate = seen[0]
    assert group == "the-callers-group", "the callback ran inside the run's job group"
    assert rate > 0, "progress shows the batch's rows/s"
    assert [c["batch_id"] for c in runner.commits()] == [0]
    uppers = {s.partition: s.upper for s in cat.store.list_shards(spec.table_name)}
    assert sum(uppers.values()) == BATCH

    stats = DatastreamRunner(spec, cat, spark, writer_id="w").run(available_now=True)
    assert stats.restarts == 0
    expected, _ = expected_table(spec.table_spec(), records)
    assert _rows(cat, spec.table_name) == canonical(expected)


def test_an_available_now_run_publishes_its_views_in_its_own_process_before_it_exits(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's one publish, after its final seal, runs in the run's own process: a
    publisher process would add its start (an interpreter and its imports, ~2-3 s) to the
    end of every ``millstream run --available-now``. The views show the run's last version,
    and a table whose publish fails does not keep the other's from being published."""
    from millstream.spark import runner as runner_mod
    from millstream.table import iceberg

    def no_process(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("an available-now run started a publisher process")

    monkeypatch.setattr(runner_mod, "PublisherProcess", no_process)
    real_publish = iceberg.publish

    def publish(store: Any, deep: Any, name: str, **kwargs: Any) -> Any:
        if name.endswith("__dead_letter"):
            raise OSError("the deep store refused the dead-letter view")
        return real_publish(store, deep, name, **kwargs)

    monkeypatch.setattr(iceberg, "publish", publish)
    _append_source(tmp_path / "src", 0, 500)
    cat = Catalog.open(home=tmp_path / "home")
    run = DatastreamRunner(
        _spec(tmp_path / "src"), cat, spark, writer_id="w", publish_interval=15.0
    )
    stats = run.run(available_now=True)

    views = stats.iceberg
    assert views is not None
    assert views["jobs"]["manifest_version"] == cat.manifest("jobs").version
    pointer = cat.store.read_pointer("jobs")
    assert pointer is not None and pointer.manifest_version == cat.manifest("jobs").version
    assert "jobs__dead_letter" in views["error"]
    assert "jobs__dead_letter" not in views


def test_each_batch_of_a_run_decodes_under_the_spec_read_for_it(tmp_path: Path, spark: Any) -> None:
    """The run reads the table's spec in this process once a batch is planned and sends it
    to the batch's tasks (a task's worker loads no metadata store for it): a column added
    while the run goes on reaches its next batch, as when each task read the spec itself."""
    root = tmp_path / "src"
    (root / "0").mkdir(parents=True)
    records = [{"id": i, "qty": i, "discount": i / 2} for i in range(3 * BATCH)]
    (root / "0" / "a.jsonl").write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in records))
    v1 = {"id": "long", "qty": "long"}

    def spec(schema: dict[str, str]) -> DatastreamSpec:
        return DatastreamSpec.parse(
            {
                "name": "grows",
                "source": {"kind": "files", "path": str(root)},
                "table": {"mode": "append"},
                "schema": schema,
                "max_records_per_batch": BATCH,
            }
        )

    cat = Catalog.open(home=tmp_path / "home")
    evolved: list[int] = []

    def add_the_column_after_the_first_batch(runner: DatastreamRunner) -> None:
        if not evolved:
            cat.store.evolve_table(spec({**v1, "discount": "double"}).table_spec())
            evolved.append(len(runner.commits()))

    DatastreamRunner(spec(v1), cat, spark, writer_id="w").run(
        available_now=True, on_tick=add_the_column_after_the_first_batch
    )

    assert evolved == [1], "the column was added after the first of three batches"
    rows = sorted(cat.read_table("grows").to_pylist(), key=lambda r: r["id"])
    assert [r["id"] for r in rows] == list(range(3 * BATCH))
    assert all(r["discount"] is None for r in rows[:BATCH]), "the first batch: v1's columns"
    assert [r["discount"] for r in rows[BATCH:]] == [i / 2 for i in range(BATCH, 3 * BATCH)], (
        "the batches after the change keep the added column"
    )


def test_a_run_on_a_jobs_session_never_starts_its_sql_session(tmp_path: Path) -> None:
    """``millstream run --available-now`` starts a SparkContext only (``JobsSession``): its
    batches are RDD jobs, and creating the JVM's SparkSession was ~1 s of the run's start.
    In a process of its own (a JVM with no session yet, as the CLI's), a run on the session
    the CLI starts leaves the JVM without a SparkSession, whatever ``register_sources`` says;
    a session created at its first use afterwards has the run's SQL settings, which only
    the context was given: the time zone (UTC, not the JVM's own, which ``TZ`` sets here)."""
    records = _append_source(tmp_path / "src", 0, BATCH // PARTITIONS)  # one batch
    home = tmp_path / "home"
    done = subprocess.run(
        [sys.executable, "-c", JOBS_RUN, json.dumps(_fields(tmp_path / "src")), str(home)],
        capture_output=True,
        text=True,
        env={**os.environ, "TZ": "Asia/Kathmandu", "MILLSTREAM_SPARK_MASTER": SPARK_MASTER},
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-6000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])

    assert seen["jvm_time_zone"] == "Asia/Kathmandu", "the JVM's own zone is not the run's"
    assert seen["session_after_run"] == {"default": False, "active": False}, (
        "the run started the JVM's SparkSession"
    )
    assert (seen["time_zone"], seen["shuffle_partitions"]) == ("UTC", "2"), (
        "the session started after the run lost the run's settings"
    )
    spec = _spec(tmp_path / "src")
    expected, _ = expected_table(spec.table_spec(), records)
    with Catalog.open(home=home) as cat:
        assert _rows(cat, spec.table_name) == canonical(expected)
