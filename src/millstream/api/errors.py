"""Errors as HTTP responses: the status comes from :func:`millstream.errors.http_status` and
the body is ``err.to_dict()``. FastAPI's own validation errors (malformed JSON, a bad query or
path parameter) are reshaped into the same body, with the offending field named."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from millstream.errors import (
    InvalidSpecError,
    MetadataStoreUnavailableError,
    MillstreamError,
    http_status,
)
from millstream.metastore.engine import STORE_ERRORS, first_line, unreachable

log = logging.getLogger(__name__)


def error_response(err: MillstreamError) -> JSONResponse:
    status = http_status(err)
    if status >= 500:
        log.error("request failed: %s", err.message)
    return JSONResponse(err.to_dict(), status_code=status)


def validation_error(exc: RequestValidationError) -> InvalidSpecError:
    """The first problem FastAPI found, as an InvalidSpecError naming the field."""
    errors = exc.errors()
    if not errors:
        return InvalidSpecError("body", "is invalid")
    err: dict[str, Any] = dict(errors[0])
    loc = [str(p) for p in err.get("loc", ())]
    where, rest = (loc[0], loc[1:]) if loc else ("body", [])
    if err.get("type") == "json_invalid":
        reason = (err.get("ctx") or {}).get("error", "JSON decode error")
        pos = f" at character {rest[0]}" if rest else ""
        return InvalidSpecError("body", f"is not valid JSON: {reason}{pos}")
    if where == "body":
        field = ".".join(rest) or "body"
        if err.get("type") == "missing" and not rest:
            return InvalidSpecError("body", "is required: send the datastream spec as JSON")
        if err.get("type") == "dict_type" and not rest:
            return InvalidSpecError("body", "must be a JSON object (the datastream spec)")
    else:
        field = ".".join(rest) or where
    return InvalidSpecError(field, str(err.get("msg", "is invalid")))


def install_error_handlers(app: FastAPI) -> None:
    async def on_millstream_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, MillstreamError)
        return error_response(exc)

    async def on_validation_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error_response(validation_error(exc))

    async def on_http_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        body = {"error": "HTTPError", "message": str(exc.detail), "status": exc.status_code}
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    async def on_store_error(_: Request, exc: Exception) -> JSONResponse:
        # A metadata store that did not answer is the store's outage, not the request's
        # fault nor a bug: 503 with the driver's reason, one log line, no traceback. Any
        # other database error (a bad statement, a constraint) stays a 500 with its traceback.
        assert isinstance(exc, STORE_ERRORS)
        if not unreachable(exc):
            raise exc
        return error_response(
            MetadataStoreUnavailableError(
                f"the metadata store did not answer ({first_line(exc)}); retry once it is reachable"
            )
        )

    app.add_exception_handler(MillstreamError, on_millstream_error)
    for store_error in STORE_ERRORS:
        app.add_exception_handler(store_error, on_store_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
