"""``/iceberg/v1/...``: a read-only Iceberg REST catalog over the tables' Iceberg views.

Engines attach it by URL (pyiceberg's ``RestCatalog(uri=<api>/iceberg)``, Trino's and Spark's
REST catalogs) and load Millstream tables by name, in the one namespace ``default``. Loading a
table returns its current published metadata (:mod:`millstream.table.iceberg`); a table whose
view was never published is not listed and loads as not found. Every call is a read: behind
the read token when the API has one. Errors have the catalog API's shape
(``{"error": {"message", "type", "code"}}``), which the clients turn into their own errors.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Response
from fastapi.responses import JSONResponse

from millstream.api.context import ApiContext, get_context
from millstream.table.iceberg import load_metadata, location

NAMESPACE = "default"

router = APIRouter(prefix="/iceberg/v1", tags=["iceberg"])
Ctx = Annotated[ApiContext, Depends(get_context)]


def _error(code: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse(
        status_code=code, content={"error": {"message": message, "type": kind, "code": code}}
    )


def _no_namespace(namespace: str) -> JSONResponse:
    return _error(404, "NoSuchNamespaceException", f"Namespace does not exist: {namespace}")


def _published(ctx: ApiContext) -> list[str]:
    names = [t.name for t in ctx.catalog.store.list_tables()]
    return [n for n in names if ctx.catalog.store.read_pointer(n) is not None]


@router.get("/config")
def config(ctx: Ctx) -> dict[str, Any]:
    """The catalog's configuration: nothing to override."""
    return {"defaults": {}, "overrides": {}}


@router.get("/namespaces", response_model=None)
def namespaces(ctx: Ctx, parent: str | None = None) -> dict[str, Any] | JSONResponse:
    """The one namespace, ``default`` (it has no children)."""
    if parent is not None:
        return {"namespaces": []} if parent == NAMESPACE else _no_namespace(parent)
    return {"namespaces": [[NAMESPACE]]}


@router.get("/namespaces/{namespace}", response_model=None)
def namespace(ctx: Ctx, namespace: str) -> dict[str, Any] | JSONResponse:
    if namespace != NAMESPACE:
        return _no_namespace(namespace)
    return {"namespace": [NAMESPACE], "properties": {}}


@router.head("/namespaces/{namespace}", response_model=None)
def namespace_exists(ctx: Ctx, namespace: str) -> Response:
    return Response(status_code=204 if namespace == NAMESPACE else 404)


@router.get("/namespaces/{namespace}/tables", response_model=None)
def list_tables(ctx: Ctx, namespace: str) -> dict[str, Any] | JSONResponse:
    """The tables whose Iceberg view has been published."""
    if namespace != NAMESPACE:
        return _no_namespace(namespace)
    return {"identifiers": [{"namespace": [NAMESPACE], "name": n} for n in _published(ctx)]}


def _load(ctx: ApiContext, namespace: str, table: str) -> dict[str, Any] | JSONResponse:
    if namespace != NAMESPACE:
        return _no_namespace(namespace)
    pointer = ctx.catalog.store.read_pointer(table)
    if pointer is None:
        return _error(
            404,
            "NoSuchTableException",
            f"Table does not exist or has no published Iceberg view: {namespace}.{table}",
        )
    deep = ctx.catalog.deep
    metadata = load_metadata(deep, pointer.metadata_location)
    return {
        "metadata-location": location(deep, pointer.metadata_location),
        "metadata": json.loads(metadata.model_dump_json(exclude_none=True)),
        "config": {},
    }


@router.get("/namespaces/{namespace}/tables/{table}", response_model=None)
def load_table(ctx: Ctx, namespace: str, table: str) -> dict[str, Any] | JSONResponse:
    """The table's current Iceberg metadata and its location."""
    return _load(ctx, namespace, table)


@router.head("/namespaces/{namespace}/tables/{table}", response_model=None)
def table_exists(ctx: Ctx, namespace: str, table: str) -> Response:
    found = namespace == NAMESPACE and ctx.catalog.store.read_pointer(table) is not None
    return Response(status_code=204 if found else 404)
