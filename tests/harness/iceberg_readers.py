"""Real Iceberg readers for the tests: DuckDB with its avro and iceberg extensions loaded from
the files of their PyPI packages (nothing is ever downloaded), and pyiceberg's StaticTable."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import duckdb
import duckdb_extension_avro
import duckdb_extension_httpfs
import duckdb_extension_iceberg
import pyarrow as pa
from pyiceberg.table import StaticTable

from millstream.catalog import Catalog
from millstream.reference.model import canonical


def extension_file(module: Any, name: str) -> str:
    """The extension binary a ``duckdb-extension-*`` package ships for this DuckDB."""
    root = Path(module.__file__).parent / "extensions" / f"v{duckdb.__version__}"
    path = root / f"{name}.duckdb_extension"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the package holds no {name} extension for this DuckDB")
    return str(path)


def duckdb_connection(catalog: Catalog | None = None) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection that reads Iceberg tables and may download nothing: httpfs (HTTP
    for a REST catalog, S3), avro (the iceberg extension would try to download it otherwise),
    then iceberg, from their packages' files. Given a catalog whose deep store is on S3, a
    DuckDB secret points httpfs at its endpoint with the environment's credentials."""
    con = duckdb.connect(
        config={"autoinstall_known_extensions": False, "autoload_known_extensions": False}
    )
    con.execute(f"LOAD '{extension_file(duckdb_extension_httpfs, 'httpfs')}'")
    con.execute(f"LOAD '{extension_file(duckdb_extension_avro, 'avro')}'")
    con.execute(f"LOAD '{extension_file(duckdb_extension_iceberg, 'iceberg')}'")
    if catalog is not None and catalog.settings.deep_store.startswith("s3://"):
        create_s3_secret(con, catalog.settings.s3_endpoint)
    return con


def create_s3_secret(con: duckdb.DuckDBPyConnection, endpoint: str | None) -> None:
    """DuckDB's S3 secret for the deep store: the endpoint without its scheme, path-style URLs,
    TLS only for an https endpoint, the environment's credentials."""
    options = {
        "KEY_ID": os.environ.get("AWS_ACCESS_KEY_ID", ""),
        "SECRET": os.environ.get("AWS_SECRET_ACCESS_KEY", ""),
        "REGION": os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
    }
    ssl = "true"
    if endpoint:
        scheme, _, host = endpoint.partition("://")
        options["ENDPOINT"] = host.rstrip("/")
        options["URL_STYLE"] = "path"
        ssl = "true" if scheme == "https" else "false"
    settings = ", ".join(f"{k} '{v}'" for k, v in options.items())
    con.execute(f"CREATE OR REPLACE SECRET millstream_s3 (TYPE s3, {settings}, USE_SSL {ssl})")


def s3_properties(catalog: Catalog) -> dict[str, str]:
    """pyiceberg's FileIO settings for the catalog's deep store (S3 through its endpoint)."""
    endpoint = catalog.settings.s3_endpoint
    if not catalog.settings.deep_store.startswith("s3://"):
        return {}
    props = {
        "s3.access-key-id": os.environ.get("AWS_ACCESS_KEY_ID", ""),
        "s3.secret-access-key": os.environ.get("AWS_SECRET_ACCESS_KEY", ""),
        "s3.region": os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
    }
    if endpoint:
        props["s3.endpoint"] = endpoint
    return props


def rows(table: pa.Table) -> list[Any]:
    return canonical(table.to_pylist())


def duckdb_rows(
    con: duckdb.DuckDBPyConnection, metadata_location: str, snapshot_id: int | None = None
) -> list[Any]:
    if snapshot_id is None:
        cur = con.execute("SELECT * FROM iceberg_scan(?)", [metadata_location])
    else:
        cur = con.execute(
            "SELECT * FROM iceberg_scan(?, snapshot_from_id = ?)", [metadata_location, snapshot_id]
        )
    names = [d[0] for d in cur.description or ()]
    return canonical(dict(zip(names, r, strict=True)) for r in cur.fetchall())


def pyiceberg_rows(
    metadata_location: str, snapshot_id: int | None = None, properties: dict[str, str] | None = None
) -> list[Any]:
    table = StaticTable.from_metadata(metadata_location, properties=properties or {})
    return rows(table.scan(snapshot_id=snapshot_id).to_arrow())
