"""Backend parametrization for the contract suite.

Every test that asks for ``catalog`` (or ``backend``) runs once per combination of metadata
store and deep store, the way pyiceberg runs one suite against every catalog:

* ``sqlite-local``   - SQLite file + local directory (no servers)
* ``postgres-local`` - a fresh database on the session PostgreSQL server + local directory
* ``sqlite-s3``      - SQLite file + a fresh bucket on the session moto S3 server
* ``postgres-s3``    - both servers

Each test gets a fresh database and a fresh bucket, so tests never see each other's state.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from harness.contract_support import Backend
from millstream.catalog import Catalog
from millstream.storage.deepstore import DeepStore

os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")


def _unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:16]}"


@contextmanager
def _metadata_url(request: pytest.FixtureRequest, kind: str, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty metadata store URL; a PostgreSQL database is dropped afterwards."""
    if kind == "sqlite":
        yield f"sqlite:///{tmp_path / 'meta' / 'metadata.db'}"
        return
    pg = request.getfixturevalue("postgres_server")
    name = _unique("ms_")
    try:
        yield pg.create_database(name)
    finally:
        import psycopg
        from psycopg import sql

        with psycopg.connect(pg.dsn(), autocommit=True, connect_timeout=10) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def _deep_store(
    request: pytest.FixtureRequest, kind: str, tmp_path: Path
) -> tuple[str, str | None]:
    if kind == "local":
        return str(tmp_path / "deep"), None
    moto = request.getfixturevalue("moto_server")
    bucket = _unique("ms-")
    moto.create_bucket(bucket)
    return f"s3://{bucket}/warehouse", moto.endpoint


BACKENDS = [
    pytest.param(("sqlite", "local"), id="sqlite-local"),
    pytest.param(("postgres", "local"), id="postgres-local", marks=pytest.mark.postgres),
    pytest.param(("sqlite", "s3"), id="sqlite-s3", marks=pytest.mark.s3),
    pytest.param(
        ("postgres", "s3"), id="postgres-s3", marks=[pytest.mark.postgres, pytest.mark.s3]
    ),
]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    meta_kind, deep_kind = request.param
    with _metadata_url(request, meta_kind, tmp_path) as url:
        deep, endpoint = _deep_store(request, deep_kind, tmp_path)
        yield Backend(f"{meta_kind}-{deep_kind}", url, deep, endpoint)


@pytest.fixture
def catalog(backend: Backend) -> Iterator[Catalog]:
    with backend.open() as cat:
        yield cat


@pytest.fixture(
    params=[
        pytest.param("local", id="local"),
        pytest.param("s3", id="s3", marks=pytest.mark.s3),
    ]
)
def deep_store(request: pytest.FixtureRequest, tmp_path: Path) -> DeepStore:
    """A bare deep store, for the tests of the deep store itself."""
    uri, endpoint = _deep_store(request, request.param, tmp_path)
    return DeepStore.from_uri(uri, s3_endpoint=endpoint)
