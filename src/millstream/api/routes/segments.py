"""``POST /segments/{name}/reingest`` and ``GET /reingestJobs``: rebuild a lost segment.

Jobs are stored in the metadata store (:mod:`millstream.metastore.jobs`): any controller lists
every job, after a restart too."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse

from millstream.api.context import ApiContext, get_context
from millstream.api.status import datastream_for_table
from millstream.errors import NotFoundError
from millstream.sealing.reingest import parse_segment_name

router = APIRouter(tags=["segments"])
Ctx = Annotated[ApiContext, Depends(get_context)]


@router.post("/segments/{name}/reingest", status_code=202)
def reingest(ctx: Ctx, name: str) -> JSONResponse:
    """Start re-reading the segment's offset range from its datastream's source and swap the
    rebuilt file in. 404 for an unknown segment, 409 if a job for it is already running (on
    any controller). A job whose controller died (ABANDONED) or that failed is taken over."""
    table, _, _ = parse_segment_name(name)
    ctx.catalog.table(table)
    rec = datastream_for_table(ctx, table)
    if rec is None:
        raise NotFoundError("datastream writing table", table)
    job = ctx.reingest.start(ctx.catalog, rec.spec, name, trigger="api")
    assert job is not None  # only the repair scan's starts respect the backoff
    return JSONResponse(job.to_dict(ctx.clock.now()), status_code=202)


def list_reingest_jobs(ctx: ApiContext) -> list[dict[str, Any]]:
    """Every stored re-ingestion job, oldest first: RUNNING, SUCCEEDED, FAILED, or ABANDONED
    (its controller stopped renewing it)."""
    now = ctx.clock.now()
    return [j.to_dict(now) for j in ctx.catalog.store.reingest_jobs()]


@router.get("/reingestJobs")
def reingest_jobs(ctx: Ctx) -> list[dict[str, Any]]:
    """Every re-ingestion job in the metadata store (any controller's, operators' and
    automatic repairs'; the newest 100 finished per table are kept), oldest first, with its
    state: RUNNING, SUCCEEDED, FAILED or ABANDONED (its controller stopped renewing it)."""
    return list_reingest_jobs(ctx)
