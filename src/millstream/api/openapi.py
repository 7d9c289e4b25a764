"""The OpenAPI document: FastAPI's, plus the datastream spec's JSON schema as the body of
``POST /datastreams`` (the route reads raw JSON so that a 422 names the spec's field) and the
bearer-token scheme on mutating operations when the API requires one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from millstream.api.middleware import MUTATING_METHODS, is_open_read
from millstream.datastream import DatastreamSpec


def openapi_factory(
    app: FastAPI, *, bearer: bool, read_bearer: bool = False
) -> Callable[[], dict[str, Any]]:
    """``bearer``: mutating operations need a token; ``read_bearer``: the others too (except
    the open paths of the auth middleware)."""

    def build() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        spec_schema = DatastreamSpec.model_json_schema(
            by_alias=True, ref_template="#/components/schemas/{model}"
        )
        schemas.update(spec_schema.pop("$defs", {}))
        schemas["DatastreamSpec"] = spec_schema
        create = doc["paths"]["/datastreams"]["post"]
        create["requestBody"]["content"]["application/json"]["schema"] = {
            "$ref": "#/components/schemas/DatastreamSpec"
        }
        if bearer:
            doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
            for path, ops in doc["paths"].items():
                for method, op in ops.items():
                    if method.upper() in MUTATING_METHODS or (
                        read_bearer and not is_open_read(path)
                    ):
                        op["security"] = [{"bearer": []}]
                        op.setdefault("responses", {})["401"] = {
                            "description": "Missing or invalid bearer token."
                        }
        app.openapi_schema = doc
        return doc

    return build
