"""The controller's read-only Iceberg REST catalog, attached by pyiceberg's ``RestCatalog``
over HTTP against a real server: namespaces, tables, and a loaded table that reads as
Millstream's read of its published version; behind the read token when one is set."""

from __future__ import annotations

import httpx
import pyarrow as pa
import pytest
from api_support import serve
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

from millstream.api.app import create_app
from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.control.controller import Controller
from millstream.table.iceberg import publish
from millstream.table.writer import commit_staged, stage_rows
from millstream.testing.model import canonical

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
            # Without the token, every catalog call is refused.
            assert httpx.get(f"{url}/iceberg/v1/config").status_code == 401
            assert (
                httpx.get(f"{url}/iceberg/v1/namespaces/default/tables/orders").status_code == 401
            )


def test_workers_learn_the_publish_interval_from_the_controllers_settings(
    catalog: Catalog, clock: ManualClock
) -> None:
    from api_support import TestClient

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
