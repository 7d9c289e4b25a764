"""Pinot's controller endpoints, with Pinot's paths, parameters and JSON shapes, where
Millstream has the same concept, so that a Pinot operator's runbook (the pauseless-consumption
guide's pause, check, resume; its rollback and its debugging calls) works as written.

A Pinot table is a Millstream table; pausing or resuming it pauses or resumes the datastream
writing it, or, for a table of a datastream that writes a table per topic, that table alone
(:meth:`~millstream.control.registry.Registry.pause_table`). Fields a Pinot response does not have are Millstream's own and say so in the
OpenAPI schema (``datastream``, ``state``). What differs is documented in
docs/operations.md, "Pinot-compatible endpoints".
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query

from millstream.api.context import ApiContext, get_context
from millstream.api.models import ErrorOut, PauseStatusOut
from millstream.api.routes.segments import list_reingest_jobs
from millstream.api.sealing import debug_info
from millstream.api.status import consuming_info, require_writer_stopped
from millstream.control.registry import DatastreamRecord
from millstream.core.lifecycle import Command, State
from millstream.errors import InvalidSpecError, NotFoundError
from millstream.metastore.jobs import pending_segments
from millstream.sealing.reingest import parse_segment_name
from millstream.spec import DEAD_LETTER_SUFFIX

router = APIRouter(tags=["pinot-compatible"])
Ctx = Annotated[ApiContext, Depends(get_context)]
RESPONSES: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorOut, "description": "No table by that name, or no datastream writes it."},
    409: {"model": ErrorOut, "description": "Not allowed from the datastream's state."},
}
PAUSED_STATES = (State.PAUSED, State.STOPPING, State.STOPPED)


def _writer_of(ctx: ApiContext, table: str) -> DatastreamRecord:
    """The record of the datastream writing ``table`` (not a dead-letter table), found by the
    table's owner: no broker is asked."""
    ctx.catalog.table(table)  # 404 for an unknown table
    owner = ctx.registry.owner_of(table)
    rec = ctx.registry.find(owner) if owner is not None else None
    if rec is None or table.endswith(DEAD_LETTER_SUFFIX):
        raise NotFoundError("datastream writing table", table)
    return rec


def _table_paused(rec: DatastreamRecord, table: str) -> bool:
    return rec.state in PAUSED_STATES or table in rec.paused_tables


def _pause_status(
    ctx: ApiContext, rec: DatastreamRecord, table: str, comment: str | None
) -> PauseStatusOut:
    info = consuming_info(ctx, table, rec, None)
    paused = _table_paused(rec, table)
    return PauseStatusOut(
        pauseFlag=paused,
        consumingSegments=sorted(info.segment_to_consuming_info_map),
        reasonCode="ADMINISTRATIVE" if paused else None,
        comment=comment
        or ("Table is paused." if paused else "Table is unpaused.")
        + ("" if rec.state in (State.PAUSED, State.READY) else f" Datastream is {rec.state}."),
        timestamp=datetime.fromtimestamp(rec.updated_at, tz=UTC).isoformat(),
        datastream=rec.name,
        state=rec.state,
    )


@router.post(
    "/tables/{tableName}/pauseConsumption", response_model=PauseStatusOut, responses=RESPONSES
)
def pause_consumption(
    ctx: Ctx,
    tableName: str,
    comment: Annotated[str | None, Query(description="Kept in the response only.")] = None,
) -> PauseStatusOut:
    """Pause the datastream writing the table (READY -> PAUSED), or, for a table of a
    datastream that writes a table per topic, that table alone (the others run on). Every
    writer stops at its shard upper; ``consumingSegments`` lists the segments still being
    consumed into until the workers report their writers stopped (poll ``pauseStatus``)."""
    rec = _writer_of(ctx, tableName)
    if rec.spec.multi_table:
        if tableName not in rec.paused_tables:
            rec = ctx.registry.pause_table(rec.name, tableName)
    elif rec.state is not State.PAUSED:
        rec = ctx.registry.command(rec.name, Command.PAUSE)
    return _pause_status(ctx, rec, tableName, comment)


@router.post(
    "/tables/{tableName}/resumeConsumption",
    response_model=PauseStatusOut,
    responses={
        **RESPONSES,
        422: {"model": ErrorOut, "description": "consumeFrom other than lastConsumed."},
    },
)
def resume_consumption(
    ctx: Ctx,
    tableName: str,
    consumeFrom: Annotated[
        Literal["lastConsumed", "smallest", "largest"] | None,
        Query(description="Only lastConsumed (the default): writers resume at each shard upper."),
    ] = None,
    comment: Annotated[str | None, Query(description="Kept in the response only.")] = None,
) -> PauseStatusOut:
    """Resume the datastream (PAUSED | STOPPED | ERROR -> READY), or the table alone if it
    was paused on its own (a table of a datastream that writes a table per topic; the
    datastream's own state is left as it is). Millstream resumes exactly
    at each partition's shard upper: ``smallest`` (re-read from the earliest offset) and
    ``largest`` (skip to the latest) would duplicate or drop records, and are refused; replay
    a range with ``DELETE /deleteSegmentsFromSequenceNum`` instead."""
    if consumeFrom not in (None, "lastConsumed"):
        raise InvalidSpecError(
            "consumeFrom",
            f"{consumeFrom!r} is not supported: a datastream resumes at each shard's upper "
            "(lastConsumed); roll back segments to re-read a range",
        )
    rec = _writer_of(ctx, tableName)
    if rec.spec.multi_table:
        if tableName in rec.paused_tables:
            rec = ctx.registry.resume_table(rec.name, tableName)
    elif rec.state is not State.READY:
        rec = ctx.registry.command(rec.name, Command.RESUME)
    return _pause_status(ctx, rec, tableName, comment)


@router.get("/tables/{tableName}/pauseStatus", response_model=PauseStatusOut, responses=RESPONSES)
def pause_status(ctx: Ctx, tableName: str) -> PauseStatusOut:
    """Whether the table is paused (its datastream, or the table on its own), and the segments
    still consumed into."""
    return _pause_status(ctx, _writer_of(ctx, tableName), tableName, None)


@router.get("/tables/{tableName}/pauselessDebugInfo", responses=RESPONSES)
def pauseless_debug_info(ctx: Ctx, tableName: str) -> dict[str, Any]:
    """Pinot's ``instanceToErrorSegmentsMap`` (segments in ERROR, under the worker that last
    sealed the table, or ``unknown``) and ``committingSegments`` (segments being sealed), plus
    Millstream's whole ``/tables/{t}/debugInfo`` under ``millstream``."""
    debug = debug_info(ctx, tableName)
    errors: dict[str, list[str]] = {}
    for e in debug["segments_in_error"]:
        errors.setdefault(e.get("claimed_by") or "unknown", []).append(e["segment"])
    return {
        "instanceToErrorSegmentsMap": errors,
        "committingSegments": [c["segment"] for c in debug["committing_segments"]],
        "millstream": debug,
    }


@router.delete("/deleteSegmentsFromSequenceNum/{tableNameWithType}", responses=RESPONSES)
def delete_segments_from_sequence_num(
    ctx: Ctx,
    tableNameWithType: str,
    segments: Annotated[
        str, Query(description="Comma-separated segment names, one per partition at most.")
    ],
    dryRun: Annotated[bool, Query(description="Only show what would be removed.")] = True,
    force: Annotated[bool, Query(description="Even if the datastream runs.")] = False,
) -> dict[str, Any]:
    """For each named segment ``table__partition__seq``, remove that partition's segments
    with a sequence number >= seq (Pinot's rollback), move its shard upper back to the
    segment's start and fence its writers, which re-read from there once resumed. Needs the
    datastream PAUSED or STOPPED (409 otherwise) unless ``force``; ``dryRun`` (the default,
    as in Pinot) changes nothing. A ``_REALTIME`` suffix on the table name is ignored."""
    table = tableNameWithType.removesuffix("_REALTIME")
    ctx.catalog.table(table)
    targets: dict[int, int] = {}
    for name in (n.strip() for n in segments.split(",") if n.strip()):
        seg_table, partition, seq = parse_segment_name(name)
        if seg_table != table:
            raise InvalidSpecError("segments", f"segment {name!r} is not of table {table!r}")
        if partition in targets:
            raise InvalidSpecError("segments", f"two segments of partition {partition}")
        targets[partition] = seq
    if not targets:
        raise InvalidSpecError("segments", "names no segment")
    if not dryRun and not force:
        require_writer_stopped(ctx, table)
    # Every named segment is checked (a dry run each) before any partition is rolled back.
    plans = [
        ctx.catalog.store.rollback_partition(table, p, seq, dry_run=True)
        for p, seq in sorted(targets.items())
    ]
    if not dryRun:
        plans = [
            ctx.catalog.store.rollback_partition(table, p, seq, dry_run=False)
            for p, seq in sorted(targets.items())
        ]
    return {"table": table, "dryRun": dryRun, "partitions": [x.to_dict() for x in plans]}


@router.post("/tables/{tableName}/forceCommit", responses=RESPONSES)
def force_commit(ctx: Ctx, tableName: str) -> dict[str, Any]:
    """Seal now every segment of the table not sealed yet, instead of waiting for its
    thresholds: the request is stored as a job that every worker's sealer reads on its next
    pass (it survives a controller restart). Poll ``GET /tables/forceCommitStatus/{jobId}``."""
    manifest = ctx.catalog.manifest(tableName)  # 404 for an unknown table
    job = ctx.catalog.store.submit_force_commit(manifest, now=ctx.clock.now())
    return {
        "forceCommitJobId": job.id,
        "forceCommitStatus": "SUCCESS",
        "jobMetaZKWriteStatus": "SUCCESS",
        "segmentsForceCommitted": _names(job.table, job.payload["segments"]),
    }


@router.get("/tables/forceCommitStatus/{jobId}", responses={404: RESPONSES[404]})
def force_commit_status(ctx: Ctx, jobId: str) -> dict[str, Any]:
    """Pinot's job status: the segments the force commit named and those not sealed yet
    (computed from the current manifest; 0 yet to be committed means done)."""
    job = ctx.catalog.store.get_job(jobId)
    pending = pending_segments(job, ctx.catalog.manifest(job.table))
    return {
        "jobId": job.id,
        "jobType": job.kind,
        "tableName": job.table,
        "submissionTimeMs": round(job.created_at * 1000),
        "segmentsForceCommitted": _names(job.table, job.payload["segments"]),
        "segmentsYetToBeCommitted": _names(job.table, pending),
        "numberOfSegmentsYetToBeCommitted": len(pending),
    }


def _names(table: str, segments: list[Any]) -> list[str]:
    return [f"{table}__{p}__{seq}" for p, seq in segments]


@router.get("/reingestSegment/jobs")
def reingest_segment_jobs(ctx: Ctx) -> list[dict[str, Any]]:
    """Pinot's path for ``GET /reingestJobs``: every stored re-ingestion job."""
    return list_reingest_jobs(ctx)
