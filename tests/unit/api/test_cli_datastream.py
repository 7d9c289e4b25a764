"""``millstream datastream ...`` and ``millstream segments`` against a real uvicorn server:
text and json output, and exit codes mapped back from the HTTP status (404 -> 3, 409 -> 4,
422 -> 2, 401 -> 2, nothing listening -> 1)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from harness.api_support import TOKEN, run_failing_writer, serve, store_snapshot, write_lines
from millstream.api import create_app
from millstream.catalog import Catalog
from millstream.cli.app import app as cli
from millstream.clock import ManualClock
from millstream.control.controller import Controller
from millstream.ingest.sources.kafka import CONSUMERS
from millstream.metastore.models import ShardAppend


@pytest.fixture
def url(catalog: Catalog, controller: Controller, clock: ManualClock) -> Iterator[str]:
    with serve(create_app(catalog, controller=controller, clock=clock)) as u:
        yield u


@pytest.fixture
def spec_file(tmp_path: Path, source_dir: Path) -> Path:
    f = tmp_path / "orders.yaml"
    f.write_text(
        f"""
name: orders
source: {{kind: files, path: {source_dir}}}
table: {{mode: upsert, primary_key: [id]}}
schema: {{id: long, status: string}}
"""
    )
    return f


class Cli:
    def __init__(self, url: str, env: dict[str, str] | None = None) -> None:
        self.url = url
        self.runner = CliRunner(env={"COLUMNS": "200", **(env or {})})

    def __call__(self, *args: str, controller: bool = True) -> Any:
        argv = [*args, "--controller", self.url] if controller else list(args)
        return self.runner.invoke(cli, argv)

    def json(self, *args: str) -> Any:
        result = self(*args, "--output", "json")
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)


@pytest.fixture
def run(url: str) -> Cli:
    return Cli(url)


@pytest.fixture
def created(run: Cli, controller: Controller, spec_file: Path) -> None:
    assert run("datastream", "create", "-f", str(spec_file)).exit_code == 0
    controller.tick()


def test_create_prints_the_record_in_text(run: Cli, spec_file: Path) -> None:
    result = run("datastream", "create", "-f", str(spec_file))

    assert result.exit_code == 0
    assert "datastream orders is INITIALIZING (created)" in result.stdout
    assert "table:      orders" in result.stdout


def test_create_prints_the_record_as_json(run: Cli, spec_file: Path) -> None:
    rec = run.json("datastream", "create", "-f", str(spec_file))

    assert (rec["name"], rec["state"], rec["version"]) == ("orders", "INITIALIZING", 1)
    assert rec["spec"]["table"]["mode"] == "upsert"


def test_list_and_show_in_text_and_json(run: Cli, created: None) -> None:
    listed = run("datastream", "list")
    shown = run("datastream", "show", "orders")

    assert listed.exit_code == 0
    assert "orders" in listed.stdout
    assert "READY" in listed.stdout
    assert shown.exit_code == 0
    assert "datastream orders is READY" in shown.stdout
    assert [r["name"] for r in run.json("datastream", "list")] == ["orders"]
    assert run.json("datastream", "show", "orders")["state"] == "READY"


def test_a_datastream_of_many_topics_shows_its_tables(
    run: Cli, controller: Controller, tmp_path: Path
) -> None:
    f = tmp_path / "inventory.yaml"
    f.write_text(
        """
name: inventory
source:
  kind: kafka
  bootstrap_servers: 127.0.0.1:1
  topics: [db.inventory.customers, db.inventory.orders]
table: {mode: upsert, primary_key: [id]}
schema: {id: long, status: string}
"""
    )
    assert run("datastream", "create", "-f", str(f)).exit_code == 0
    controller.tick()
    shown = run("datastream", "show", "inventory")
    assert shown.exit_code == 0, shown.output
    assert "tables (2): customers, orders" in shown.stdout
    assert "kafka db.inventory.customers, db.inventory.orders @ 127.0.0.1:1" in shown.stdout
    assert "2 tables" in run("datastream", "list").stdout
    assert run.json("datastream", "show", "inventory")["tables"] == ["customers", "orders"]
    tables = run("table", "list", "--home", str(tmp_path / "home"), controller=False)
    assert "customers" in tables.stdout and "orders" in tables.stdout, tables.output


def test_one_table_of_a_datastream_of_many_topics_pauses_and_resumes(
    run: Cli, controller: Controller, tmp_path: Path
) -> None:
    f = tmp_path / "inventory.yaml"
    f.write_text(
        """
name: inventory
source:
  kind: kafka
  bootstrap_servers: 127.0.0.1:1
  topics: [db.inventory.customers, db.inventory.orders]
table: {mode: upsert, primary_key: [id]}
schema: {id: long, status: string}
"""
    )
    assert run("datastream", "create", "-f", str(f)).exit_code == 0
    controller.tick()
    paused = run("datastream", "pause", "inventory", "--table", "customers")
    assert paused.exit_code == 0, paused.output
    assert "datastream inventory is READY (table customers paused)" in paused.stdout
    assert "paused:     customers" in paused.stdout
    assert "paused:     customers" in run("datastream", "show", "inventory").stdout
    again = run("datastream", "pause", "inventory", "--table", "customers")
    assert again.exit_code == 4
    assert "table 'customers' of datastream 'inventory' is paused already" in again.stderr
    unknown = run("datastream", "resume", "inventory", "--table", "nope")
    assert unknown.exit_code == 3 and "'nope'" in unknown.stderr
    resumed = run.json("datastream", "resume", "inventory", "--table", "customers")
    assert (resumed["state"], resumed["paused_tables"]) == ("READY", [])


def test_list_with_no_datastreams_says_so(run: Cli) -> None:
    assert run("datastream", "list").stdout.strip() == "(no datastreams)"
    assert run.json("datastream", "list") == []


def test_pause_resume_stop_delete_walk_the_lifecycle(
    run: Cli, created: None, controller: Controller
) -> None:
    paused = run("datastream", "pause", "orders")
    resumed = run.json("datastream", "resume", "orders")
    stopping = run.json("datastream", "stop", "orders")
    controller.tick()
    deleting = run.json("datastream", "delete", "orders")

    assert paused.exit_code == 0
    assert "datastream orders is PAUSED" in paused.stdout
    assert [r["state"] for r in (resumed, stopping, deleting)] == ["READY", "STOPPING", "DELETING"]


def test_an_unknown_datastream_exits_3_naming_it(run: Cli) -> None:
    text = run("datastream", "show", "nope")
    as_json = run("datastream", "pause", "nope", "--output", "json")

    assert text.exit_code == 3
    assert "datastream 'nope' does not exist" in text.stderr
    assert as_json.exit_code == 3
    err = json.loads(as_json.stdout)
    assert (err["error"], err["name"], err["status"]) == ("NotFoundError", "nope", 404)


def test_an_illegal_transition_exits_4_naming_the_states(
    run: Cli, created: None, catalog: Catalog, controller: Controller
) -> None:
    run("datastream", "stop", "orders")
    controller.tick()
    before = store_snapshot(catalog.store)

    text = run("datastream", "pause", "orders")
    as_json = run("datastream", "pause", "orders", "-o", "json")

    assert text.exit_code == 4
    assert "cannot go from STOPPED to PAUSED" in text.stderr
    assert as_json.exit_code == 4
    err = json.loads(as_json.stdout)
    assert (err["error"], err["from_state"], err["to_state"]) == (
        "InvalidTransitionError",
        "STOPPED",
        "PAUSED",
    )
    assert store_snapshot(catalog.store) == before


def test_creating_an_existing_datastream_exits_4(run: Cli, created: None, spec_file: Path) -> None:
    result = run("datastream", "create", "-f", str(spec_file))

    assert result.exit_code == 4
    assert "datastream 'orders' already exists" in result.stderr


def test_an_invalid_spec_exits_2_naming_the_field(
    run: Cli, tmp_path: Path, catalog: Catalog
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: orders\nsource: {kind: kafka, bootstrap_servers: 'h:1'}\nschema: {id: long}\n"
    )
    before = store_snapshot(catalog.store)

    text = run("datastream", "create", "-f", str(bad))
    as_json = run("datastream", "create", "-f", str(bad), "-o", "json")

    assert text.exit_code == 2
    assert "invalid source.topic" in text.stderr
    assert as_json.exit_code == 2
    assert json.loads(as_json.stdout)["field"] == "source.topic"
    assert store_snapshot(catalog.store) == before


def test_a_spec_file_that_is_not_yaml_or_missing_exits_2(run: Cli, tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")

    not_yaml = run("datastream", "create", "-f", str(broken))
    missing = run("datastream", "create", "-f", str(tmp_path / "absent.yaml"))

    assert not_yaml.exit_code == 2
    assert "invalid spec: is not valid YAML" in not_yaml.stderr
    assert missing.exit_code == 2
    assert "invalid file" in missing.stderr


def test_segments_in_text_and_json(
    run: Cli, created: None, catalog: Catalog, source_dir: Path
) -> None:
    write_lines(source_dir, 0, 5)
    catalog.store.compare_and_append("orders", [ShardAppend(0, 0, 5, 0, "f.parquet", 5, 321)])

    text = run("segments", "orders")
    info = run.json("segments", "orders")

    assert text.exit_code == 0
    assert "orders: 1 segments, 5 rows (manifest version 1)" in text.stdout
    assert "orders__0__0" in text.stdout
    assert "[0, 5)" in text.stdout
    assert info["partitions"][0]["segments"][0]["name"] == "orders__0__0"


def test_segments_of_an_unknown_table_exits_3(run: Cli) -> None:
    result = run("segments", "nope")

    assert result.exit_code == 3
    assert "table 'nope' does not exist" in result.stderr


def test_a_controller_that_is_not_listening_exits_1(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    run = Cli(dead)

    text = run("datastream", "list")
    as_json = run("datastream", "list", "-o", "json")

    assert text.exit_code == 1
    assert f"cannot reach the controller at {dead}" in text.stderr
    assert as_json.exit_code == 1
    assert json.loads(as_json.stdout)["error"] == "ControllerUnreachableError"


def test_the_controller_url_comes_from_the_environment(url: str) -> None:
    run = Cli("unused", env={"MILLSTREAM_CONTROLLER": url})

    result = run("datastream", "list", controller=False)

    assert result.exit_code == 0


@pytest.fixture
def secured_url(catalog: Catalog, controller: Controller, clock: ManualClock) -> Iterator[str]:
    app = create_app(catalog, controller=controller, clock=clock, api_token=TOKEN)
    with serve(app) as u:
        yield u


def test_a_missing_or_wrong_token_exits_2_with_a_clear_message(
    secured_url: str, spec_file: Path, catalog: Catalog
) -> None:
    before = store_snapshot(catalog.store)

    missing = Cli(secured_url)("datastream", "create", "-f", str(spec_file))
    wrong = Cli(secured_url)("datastream", "create", "-f", str(spec_file), "--token", "nope")

    for result in (missing, wrong):
        assert result.exit_code == 2
        assert f"the controller at {secured_url} refused the call" in result.stderr
        assert "--token" in result.stderr
    assert store_snapshot(catalog.store) == before


def test_the_token_from_the_option_or_environment_is_sent(
    secured_url: str, spec_file: Path
) -> None:
    with_option = Cli(secured_url)("datastream", "create", "-f", str(spec_file), "--token", TOKEN)
    from_env = Cli(secured_url, env={"MILLSTREAM_API_TOKEN": TOKEN})(
        "datastream", "pause", "orders"
    )
    read = Cli(secured_url)("datastream", "show", "orders")  # reads need no token

    assert with_option.exit_code == 0, with_option.output
    assert from_env.exit_code == 4  # INITIALIZING cannot pause: the call got through
    assert read.exit_code == 0


# -- update (schema evolution) ----------------------------------------------------------------


def _evolved(spec_file: Path, schema: str) -> Path:
    f = spec_file.with_name("orders-v2.yaml")
    f.write_text(spec_file.read_text().replace("schema: {id: long, status: string}", schema))
    return f


def test_update_prints_each_change_and_a_dry_run_changes_nothing(
    run: Cli, created: None, catalog: Catalog, spec_file: Path
) -> None:
    new = _evolved(spec_file, "schema: {id: long, status: string, discount: double}")
    before = store_snapshot(catalog.store)

    dry = run("datastream", "update", "-f", str(new), "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "datastream orders would change (table schema version 1):" in dry.stdout
    assert "+ column discount double" in dry.stdout
    assert store_snapshot(catalog.store) == before

    done = run("datastream", "update", "-f", str(new))
    assert done.exit_code == 0, done.output
    assert "datastream orders changed (table schema version 2):" in done.stdout
    assert "+ column discount double" in done.stdout
    assert catalog.table("orders").schema_version == 2

    again = run.json("datastream", "update", "-f", str(new))
    assert again["changes"] == [] and again["schema_version"] == 2


def test_update_refuses_an_incompatible_change_with_exit_4_naming_column_and_rule(
    run: Cli, created: None, catalog: Catalog, spec_file: Path
) -> None:
    new = _evolved(spec_file, "schema: {id: long, status: long}")
    before = store_snapshot(catalog.store)

    result = run("datastream", "update", "-f", str(new))

    assert result.exit_code == 4
    assert "column 'status'" in result.output
    assert "string -> long is not a lossless widening" in result.output
    assert store_snapshot(catalog.store) == before


def test_a_failing_datastream_looks_failed_in_list_and_show_and_create_warns(
    run: Cli,
    catalog: Catalog,
    controller: Controller,
    clock: ManualClock,
    tmp_path: Path,
    kafka_broker: Any,
) -> None:
    spec = tmp_path / "broken.yaml"
    spec.write_text(
        f"""
name: broken
source: {{kind: kafka, bootstrap_servers: "{kafka_broker.bootstrap}", topic: no-such}}
table: {{mode: upsert, primary_key: [id]}}
schema: {{id: long, status: string}}
"""
    )
    created = run("datastream", "create", "-f", str(spec))
    assert created.exit_code == 0, created.output  # created all the same
    assert "datastream broken is INITIALIZING (created)" in created.stdout
    assert "warning: cannot read the latest offsets of kafka topic 'no-such'" in created.stderr
    assert "the topic was not found" in created.stderr

    worker = run_failing_writer(catalog, controller, clock, tmp_path / "state", "worker-b")
    try:
        listed = run("datastream", "list")
        assert listed.exit_code == 0, listed.output
        row = next(line for line in listed.stdout.splitlines() if "broken" in line)
        assert "READY" in row and "retrying for" in row and "(1 failure)" in row
        shown = run("datastream", "show", "broken")
        assert shown.exit_code == 0, shown.output
        writer = next(line for line in shown.stdout.splitlines() if "writer:" in line)
        assert "retrying for" in writer and "kafka topic 'no-such'" in writer
        assert "the topic was not found" in writer
        assert "last error" not in shown.stdout  # the record's own error is empty: READY
    finally:
        worker._stop_shared()
        CONSUMERS.close()  # its clients of the test broker, before the broker stops
