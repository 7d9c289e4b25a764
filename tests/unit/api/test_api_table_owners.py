"""A table has one writing datastream (issue 35, point 1). Two datastreams writing one table
shared its shards by partition number: the second started at the first one's upper and its
commits of its own offsets were decided already covered and dropped, with no error. A second
datastream naming a table another one owns (or its dead-letter table) is refused with a 409
naming the owner, by REST, the CLI and a writer run without the controller; the owner's table
names are free once it is removed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from harness.api_support import TestClient, serve, spec_body, store_snapshot
from millstream.api import create_app
from millstream.catalog import Catalog
from millstream.cli.app import app as cli
from millstream.clock import ManualClock
from millstream.control.controller import Controller
from millstream.datastream import DatastreamSpec
from millstream.errors import TableOwnedError
from millstream.spark.runner import DatastreamRunner


def _body(name: str, source: Path, table: str | None = None) -> dict[str, Any]:
    source.mkdir(parents=True, exist_ok=True)
    extra = {"name": table} if table else {}
    return spec_body(name, source, table={"mode": "upsert", "primary_key": ["id"], **extra})


def test_a_second_datastream_of_a_table_is_refused_naming_the_first(
    api: TestClient, controller: Controller, catalog: Catalog, tmp_path: Path
) -> None:
    assert api.post("/datastreams", json=_body("a", tmp_path / "a", "orders")).status_code == 201
    controller.tick()
    before = store_snapshot(catalog.store)

    r = api.post("/datastreams", json=_body("b", tmp_path / "b", "orders"))

    assert r.status_code == 409, r.text
    err = r.json()
    assert err["error"] == "TableOwnedError"
    assert "table 'orders' belongs to datastream 'a'" in err["message"]
    assert store_snapshot(catalog.store) == before, "nothing changed"
    assert [d["name"] for d in api.get("/datastreams").json()] == ["a"]


def test_a_table_named_like_another_datastreams_dead_letter_table_is_refused(
    api: TestClient, tmp_path: Path
) -> None:
    assert api.post("/datastreams", json=_body("x", tmp_path / "x")).status_code == 201

    r = api.post("/datastreams", json=_body("y", tmp_path / "y", "x__dead_letter"))

    assert r.status_code == 409, r.text
    assert "table 'x__dead_letter' belongs to datastream 'x'" in r.json()["message"]
    # ... and the other way round: a datastream whose dead-letter table is another's table.
    z = api.post("/datastreams", json=_body("z", tmp_path / "z", "t__dead_letter"))
    assert z.status_code == 201
    r = api.post("/datastreams", json=_body("t", tmp_path / "t"))
    assert r.status_code == 409, r.text
    assert "table 't__dead_letter' belongs to datastream 'z'" in r.json()["message"]


def test_a_deleted_datastream_frees_its_table_only_once_it_is_removed(
    api: TestClient, controller: Controller, tmp_path: Path
) -> None:
    assert api.post("/datastreams", json=_body("a", tmp_path / "a", "orders")).status_code == 201
    controller.tick()
    assert api.delete("/datastreams/a").status_code == 202  # DELETING until the leader acts

    refused = api.post("/datastreams", json=_body("b", tmp_path / "b", "orders"))
    assert refused.status_code == 409 and "datastream 'a'" in refused.json()["message"]

    controller.tick()  # removed
    assert api.get("/datastreams/a").status_code == 404
    assert api.post("/datastreams", json=_body("b", tmp_path / "b", "orders")).status_code == 201
    # The same name again is a new datastream of its own table names, not a collision.
    assert api.post("/datastreams", json=_body("c", tmp_path / "c", "orders")).status_code == 409


def test_the_cli_create_exits_with_the_409_code_and_names_the_owner(
    catalog: Catalog, controller: Controller, clock: ManualClock, tmp_path: Path
) -> None:
    files = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        f = tmp_path / f"{name}.yaml"
        f.write_text(
            f"name: {name}\nsource: {{kind: files, path: {tmp_path / name}}}\n"
            "table: {name: orders, mode: upsert, primary_key: [id]}\n"
            "schema: {id: long, status: string}\n"
        )
        files.append(f)
    with serve(create_app(catalog, controller=controller, clock=clock)) as url:
        runner = CliRunner(env={"COLUMNS": "200"})
        first = runner.invoke(
            cli, ["datastream", "create", "-f", str(files[0]), "--controller", url]
        )
        second = runner.invoke(
            cli, ["datastream", "create", "-f", str(files[1]), "--controller", url]
        )
    assert first.exit_code == 0, first.output
    assert second.exit_code == 4, second.output
    assert "table 'orders' belongs to datastream 'a'" in second.stderr


def test_a_writer_run_without_the_controller_refuses_another_datastreams_table(
    api: TestClient, catalog: Catalog, tmp_path: Path
) -> None:
    """``DatastreamRunner`` run directly claims its tables before its query starts: another
    datastream's table (registered, or claimed by another runner) is refused, naming it."""
    assert api.post("/datastreams", json=_body("a", tmp_path / "a", "orders")).status_code == 201
    mine = DatastreamRunner(
        DatastreamSpec.parse(_body("a", tmp_path / "a", "orders")), catalog, spark=None
    )
    mine.ensure_tables()  # its own table: fine (a worker's runner does this)

    other = DatastreamRunner(
        DatastreamSpec.parse(_body("b", tmp_path / "b", "orders")), catalog, spark=None
    )
    with pytest.raises(TableOwnedError, match="table 'orders' belongs to datastream 'a'"):
        other.ensure_tables()

    DatastreamRunner(
        DatastreamSpec.parse(_body("solo", tmp_path / "s", "events")), catalog, spark=None
    ).ensure_tables()
    intruder = DatastreamRunner(
        DatastreamSpec.parse(_body("intruder", tmp_path / "i", "events__dead_letter")),
        catalog,
        spark=None,
    )
    with pytest.raises(TableOwnedError, match="belongs to datastream 'solo'"):
        intruder.ensure_tables()
    r = api.post("/datastreams", json=_body("late", tmp_path / "l", "events"))
    assert r.status_code == 409 and "datastream 'solo'" in r.json()["message"]


def test_migrating_a_version_9_store_makes_each_datastream_own_its_tables(
    api: TestClient, catalog: Catalog, tmp_path: Path
) -> None:
    from sqlalchemy import text

    from millstream.control.registry import Registry
    from millstream.metastore.store import MetadataStore

    assert api.post("/datastreams", json=_body("a", tmp_path / "a", "orders")).status_code == 201
    with catalog.store.write() as conn:  # what a version 9 database looks like
        conn.execute(text("DROP TABLE ms_table_owners"))
        conn.execute(text("UPDATE ms_meta SET value = '9' WHERE key = 'schema_version'"))
    again = MetadataStore(catalog.store.url)
    try:
        with pytest.raises(TableOwnedError, match="belongs to datastream 'a'"):
            Registry(again).create(DatastreamSpec.parse(_body("b", tmp_path / "b", "orders")))
    finally:
        again.dispose()


def test_an_update_cannot_point_a_datastream_at_another_datastreams_table(
    api: TestClient, controller: Controller, catalog: Catalog, tmp_path: Path
) -> None:
    """An update changes a datastream's schema, never its table: pointed at another
    datastream's table with a compatible schema change, it evolved that table and wrote it."""
    from millstream.control.registry import Registry
    from millstream.errors import IncompatibleChangeError

    assert api.post("/datastreams", json=_body("a", tmp_path / "a", "orders")).status_code == 201
    assert api.post("/datastreams", json=_body("b", tmp_path / "b", "events")).status_code == 201
    controller.tick()
    moved = _body("a", tmp_path / "a", "events")
    moved["schema"] = {"id": "long", "status": "string", "extra": "string"}
    before = store_snapshot(catalog.store)
    with pytest.raises(IncompatibleChangeError, match=r"table\.name"):
        Registry(catalog.store).update("a", DatastreamSpec.parse(moved))
    assert store_snapshot(catalog.store) == before
    assert catalog.table("events").spec.columns == {"id": "long", "status": "string"}
