"""The app factory. Everything the routes use is passed in here, once, and held on
``app.state``; nothing reads the environment or a global (the CLI does, at the edge)."""

from __future__ import annotations

import socket
import uuid

from fastapi import FastAPI

from millstream.api.console import install_console
from millstream.api.context import ApiContext
from millstream.api.errors import install_error_handlers
from millstream.api.metrics import make_registry
from millstream.api.middleware import MAX_BODY_BYTES, BearerAuthMiddleware, BodyLimitMiddleware
from millstream.api.openapi import openapi_factory
from millstream.api.routes import cluster, datastreams, iceberg, metrics, pinot, segments, tables
from millstream.api.rows import LiveRows
from millstream.catalog import Catalog
from millstream.clock import SYSTEM_CLOCK, Clock
from millstream.control.controller import Controller, ControlSettings
from millstream.control.registry import Registry
from millstream.sealing.repair import ReingestRunner

DESCRIPTION = """Millstream's control plane: datastreams and their lifecycle, table segments
and consumption status, workers, health and Prometheus metrics. A web console over this API
is served at `/ui`.

Errors are JSON: `{"error": <class in Millstream's error tree>, "message": ..., <ids>}` with
404 unknown, 409 illegal transition / conflict / already exists, 422 invalid input (`field`
names it), 413 body over 1 MiB, 401 missing bearer token on a mutating call (when the API
was started with a token) or on a read (when it was started with a read token)."""


def create_app(
    catalog: Catalog,
    *,
    controller: Controller | None = None,
    api_token: str | None = None,
    read_token: str | None = None,
    clock: Clock = SYSTEM_CLOCK,
    upstream_timeout: float = 5.0,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> FastAPI:
    """The REST API over ``catalog``'s metadata store.

    ``controller`` (optional) answers ``/health``'s leadership and supplies the worker TTL.
    ``api_token``: if set, POST/PUT/PATCH/DELETE need ``Authorization: Bearer <token>``.
    ``read_token``: if set, every other call needs it (or ``api_token``), except ``/health``,
    the console's pages and the API's description (``/docs``, ``/openapi.json``).
    ``upstream_timeout``: seconds to wait for a source's latest offsets (a broker may be down).
    """
    app = FastAPI(
        title="Millstream",
        version="0.1.0",
        description=DESCRIPTION,
        docs_url="/docs",
        openapi_url="/openapi.json",
    )
    ctx = ApiContext(
        catalog=catalog,
        registry=Registry(catalog.store, clock=clock),
        controller=controller,
        control=controller.settings if controller is not None else ControlSettings(),
        clock=clock,
        upstream_timeout=upstream_timeout,
        reingest=controller.reingest
        if controller is not None
        else ReingestRunner(
            catalog.store, owner=f"api-{socket.gethostname()}-{uuid.uuid4().hex[:6]}", clock=clock
        ),
    )
    app.state.millstream = ctx
    #: live rows per table, counted by a read once per manifest version: one count for the
    #: metrics and the table page's figure, so the two agree
    app.state.live_rows = LiveRows(catalog, clock=clock)
    app.state.metrics_registry = make_registry(ctx, app.state.live_rows)
    install_error_handlers(app)
    for router in (
        datastreams.router,
        tables.router,
        segments.router,
        cluster.router,
        metrics.router,
        pinot.router,
        iceberg.router,
    ):
        app.include_router(router)
    install_console(app)
    # The last added runs first: auth is checked before any body byte is read.
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_body_bytes)
    if api_token or read_token:
        app.add_middleware(BearerAuthMiddleware, token=api_token, read_token=read_token)
    app.openapi = openapi_factory(  # type: ignore[method-assign]
        app, bearer=bool(api_token or read_token), read_bearer=bool(read_token)
    )
    return app
