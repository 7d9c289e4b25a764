"""``POST /segments/{name}/reingest`` and ``GET /reingestJobs``: rebuild a lost segment."""

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
    rebuilt file in. 404 for an unknown segment, 409 if a job for it is already running."""
    table, _, _ = parse_segment_name(name)
    ctx.catalog.table(table)
    rec = datastream_for_table(ctx.registry.list(), table)
    if rec is None:
        raise NotFoundError("datastream writing table", table)
    job = ctx.reingest_jobs.start(ctx.catalog, rec.spec, name, ctx.clock.now())
    return JSONResponse(job.to_dict(), status_code=202)


@router.get("/reingestJobs")
def reingest_jobs(ctx: Ctx) -> list[dict[str, Any]]:
    """Every re-ingestion job this controller ran, oldest first, with its state."""
    return [j.to_dict() for j in ctx.reingest_jobs.list()]
