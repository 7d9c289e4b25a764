"""``millstream run`` publishes the Iceberg views of its tables, as a worker does: an
``--available-now`` run publishes once more before it exits, so DuckDB reads everything it
committed right after (the summary says where); ``--iceberg-publish-interval 0`` turns
publishing off."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from harness.cli_run import run_available_now
from harness.iceberg_readers import duckdb_connection
from millstream.catalog import Catalog
from millstream.reference.model import canonical


def _lines(source: Path, partition: int, rows: list[dict[str, Any]]) -> None:
    d = source / str(partition)
    d.mkdir(parents=True, exist_ok=True)
    n = len(list(d.iterdir()))
    (d / f"{n:05d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _run(spec: Path, home: Path, *extra: str) -> dict[str, Any]:
    proc = run_available_now(spec, home, *extra)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    # The JVM logs through the package's log4j2.properties: none of Spark's start-up noise
    # (a profile banner, a log-level hint, Hadoop's native-library warning) on the terminal.
    for noise in ("log4j profile", "Setting default log level", "NativeCodeLoader"):
        assert noise not in proc.stderr, proc.stderr[-3000:]
    summary: dict[str, Any] = json.loads(proc.stdout)
    return summary


def _duckdb_rows(metadata_location: str) -> list[Any]:
    con = duckdb_connection()
    cur = con.execute("SELECT id, status FROM iceberg_scan(?)", [metadata_location])
    return canonical({"id": i, "status": st} for i, st in cur.fetchall())


def test_an_available_now_run_publishes_before_it_exits_and_duckdb_reads_it(
    tmp_path: Path,
) -> None:
    source, home = tmp_path / "source", tmp_path / "home"
    _lines(source, 0, [{"id": i, "status": "new"} for i in range(40)])
    _lines(source, 1, [{"id": i, "status": "new"} for i in range(40, 60)])
    _lines(source, 0, [{"id": i, "status": "paid"} for i in range(0, 40, 3)])  # upserts
    (source / "1" / "00001.jsonl").write_text("not json\n")  # one dead letter
    spec = tmp_path / "shop.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "shop",
                "source": {"kind": "files", "path": str(source)},
                "schema": {"id": "long", "status": "string"},
                "table": {"mode": "upsert", "primary_key": ["id"]},
            }
        )
    )

    summary = _run(spec, home)
    with Catalog.open(home=home) as cat:
        version = cat.manifest("shop").version
        expected = canonical(cat.read_table("shop").select(["id", "status"]).to_pylist())
    assert len(expected) == 60 and version >= 1
    # the summary says how often the run restarted from the shard uppers, of each kind
    assert (summary["restarts"], summary["restarts_in_a_row"], summary["transient_restarts"]) == (
        0,
        0,
        0,
    )
    view = summary["iceberg"]["shop"]
    assert view["manifest_version"] == version
    assert _duckdb_rows(view["metadata_location"]) == expected
    # the dead-letter table (its view comes with its first dead letter) is published too
    dead = summary["iceberg"]["shop__dead_letter"]
    con = duckdb_connection()
    assert con.execute(
        "SELECT count(*) FROM iceberg_scan(?)", [dead["metadata_location"]]
    ).fetchone() == (1,)

    # Publishing off: the run commits, and the view stays where it was.
    _lines(source, 1, [{"id": i, "status": "shipped"} for i in range(40, 45)])
    summary = _run(spec, home, "--iceberg-publish-interval", "0")
    assert "iceberg" not in summary
    with Catalog.open(home=home) as cat:
        assert cat.manifest("shop").version > version
        pointer = cat.store.read_pointer("shop")
        assert pointer is not None and pointer.manifest_version == version
