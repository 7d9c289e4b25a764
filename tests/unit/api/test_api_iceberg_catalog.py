"""The controller's read-only Iceberg REST catalog, attached by pyiceberg's ``RestCatalog``
and DuckDB's ``ATTACH ... (TYPE iceberg)`` over HTTP against a real server: namespaces,
tables, and a loaded table that reads as Millstream's read of its published version, on a
local deep store and on S3; behind the read token when one is set."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import duckdb
import httpx
import pyarrow as pa
import pytest
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError, UnauthorizedError

from harness.api_support import serve
from harness.iceberg_readers import duckdb_connection, s3_properties
from millstream.api.app import create_app
from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.config import Settings
from millstream.control.controller import Controller
from millstream.metastore.store import MetadataStore
from millstream.reference.model import canonical
from millstream.storage.deepstore import DeepStore
from millstream.table.iceberg import publish
from millstream.table.writer import commit_staged, stage_rows

READ_TOKEN = "reader-token"


def _orders(catalog: Catalog) -> None:
    spec = catalog.create_table(
        {
            "name": "orders",
            "schema": {"id": "long", "qty": "long"},
            "mode": "upsert",
            "primary_key": ["id"],
        }
    ).spec
    catalog.create_table({"name": "unpublished", "schema": {"id": "long"}})
    rows = pa.Table.from_pylist(
        [
            {"id": i % 3, "qty": i, "_ms_partition": 0, "_ms_offset": i, "_ms_tombstone": False}
            for i in range(7)
        ],
        schema=spec.arrow_schema(system_columns=True),
    )
    commit_staged(
        catalog.store, catalog.deep, "orders", stage_rows(catalog.deep, spec, rows), {0: (0, 7)}, {}
    )
    assert publish(catalog.store, catalog.deep, "orders").published


@pytest.mark.parametrize("read_token", [None, READ_TOKEN], ids=["open", "read-token"])
def test_pyiceberg_attaches_the_catalog_and_reads_a_table_as_millstream_does(
    catalog: Catalog, controller: Controller, clock: ManualClock, read_token: str | None
) -> None:
    _orders(catalog)
    app = create_app(catalog, controller=controller, clock=clock, read_token=read_token)
    with serve(app) as url:
        props = {"uri": f"{url}/iceberg"}
        if read_token:
            props["token"] = read_token
        rest = RestCatalog("millstream", **props)
        assert rest.list_namespaces() == [("default",)]
        assert rest.list_tables("default") == [("default", "orders")]
        table = rest.load_table("default.orders")
        got = canonical(table.scan().to_arrow().to_pylist())
        assert got == canonical(catalog.read_table("orders").to_pylist())
        assert got == canonical([{"id": 0, "qty": 6}, {"id": 1, "qty": 4}, {"id": 2, "qty": 5}])
        with pytest.raises(NoSuchTableError):
            rest.load_table("default.unpublished")
        with pytest.raises(NoSuchNamespaceError):
            rest.list_tables("other")
        if read_token:
            # Without the token, or with a wrong one, every catalog call is refused.
            assert httpx.get(f"{url}/iceberg/v1/config").status_code == 401
            assert (
                httpx.get(f"{url}/iceberg/v1/namespaces/default/tables/orders").status_code == 401
            )
            for wrong in ({}, {"token": "not-the-token"}):
                with pytest.raises(UnauthorizedError):
                    RestCatalog("millstream", uri=f"{url}/iceberg", **wrong)


@pytest.fixture(
    params=[pytest.param("local", id="local"), pytest.param("s3", id="s3", marks=pytest.mark.s3)]
)
def deep_catalog(
    request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock
) -> Iterator[Catalog]:
    """A catalog on a local deep store, or on a fresh bucket of the moto S3 server."""
    deep, endpoint = None, None
    if request.param == "s3":
        moto = request.getfixturevalue("moto_server")
        bucket = f"ms-{uuid.uuid4().hex[:16]}"
        moto.create_bucket(bucket)
        deep, endpoint = f"s3://{bucket}/warehouse", moto.endpoint
    settings = Settings.load(home=tmp_path / "home", deep_store=deep, s3_endpoint=endpoint)
    store = MetadataStore(settings.metadata_url, clock=clock)
    with Catalog(
        settings, store, DeepStore.from_uri(settings.deep_store, s3_endpoint=endpoint)
    ) as cat:
        yield cat


def _attach(con: duckdb.DuckDBPyConnection, url: str, token: str | None) -> None:
    """DuckDB's ATTACH of the catalog, with the token as an iceberg secret, or with none."""
    auth = "AUTHORIZATION_TYPE 'none'"
    if token is not None:
        con.execute("CREATE OR REPLACE SECRET ms_token (TYPE iceberg, TOKEN ?)", [token])
        auth = "SECRET ms_token"
    con.execute("DETACH DATABASE IF EXISTS ms")
    con.execute(f"ATTACH 'warehouse' AS ms (TYPE iceberg, ENDPOINT '{url}/iceberg', {auth})")


@pytest.mark.parametrize("read_token", [None, READ_TOKEN], ids=["open", "read-token"])
def test_duckdb_attaches_the_catalog_and_reads_a_table_as_millstream_does(
    deep_catalog: Catalog, clock: ManualClock, read_token: str | None
) -> None:
    """DuckDB's REST catalog client (httpfs, avro and iceberg loaded from their packages'
    files) lists and reads the published table; on S3 it reads the files with its own S3
    secret. With a read token set, no token and a wrong one are refused with 401."""
    catalog = deep_catalog
    _orders(catalog)
    ctl = Controller(catalog, controller_id="controller-1", clock=clock)
    app = create_app(catalog, controller=ctl, clock=clock, read_token=read_token)
    with serve(app) as url:
        con = duckdb_connection(catalog)
        if read_token:
            for wrong in (None, "not-the-token"):
                with pytest.raises(duckdb.Error, match="401"):
                    _attach(con, url, wrong)
        _attach(con, url, read_token)
        listed = con.execute("SELECT database, schema, name FROM (SHOW ALL TABLES)").fetchall()
        assert listed == [("ms", "default", "orders")]
        cur = con.execute("SELECT * FROM ms.default.orders")
        names = [d[0] for d in cur.description or ()]
        got = canonical(dict(zip(names, r, strict=True)) for r in cur.fetchall())
        assert got == canonical(catalog.read_table("orders").to_pylist())
        assert got == canonical([{"id": 0, "qty": 6}, {"id": 1, "qty": 4}, {"id": 2, "qty": 5}])
        # pyiceberg's RestCatalog reads the same table through the same catalog.
        props = {"uri": f"{url}/iceberg", **s3_properties(catalog)}
        if read_token:
            props["token"] = read_token
        table = RestCatalog("millstream", **props).load_table("default.orders")
        assert canonical(table.scan().to_arrow().to_pylist()) == got


def test_workers_learn_the_publish_interval_from_the_controllers_settings(
    catalog: Catalog, clock: ManualClock
) -> None:
    from harness.api_support import TestClient
    from millstream.control.controller import ControlSettings

    ctl = Controller(
        catalog,
        controller_id="c",
        settings=ControlSettings(iceberg_publish_interval=15.0),
        clock=clock,
    )
    with TestClient(create_app(catalog, controller=ctl, clock=clock)) as client:
        remote = client.get("/settings").json()
    # What `millstream worker` builds its settings from.
    assert ControlSettings(**remote["control"]).iceberg_publish_interval == 15.0
