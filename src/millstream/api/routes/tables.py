"""``/tables/{table}/segments`` and ``/tables/{table}/consumingSegmentsInfo`` (Pinot's names)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request

from millstream.api.context import ApiContext, get_context
from millstream.api.models import (
    ConsumingSegmentsInfoOut,
    ErrorOut,
    PartitionSegmentsOut,
    SegmentOut,
    TableSegmentsOut,
)
from millstream.api.sealing import debug_info
from millstream.api.status import (
    consuming_info,
    datastream_for_table,
    require_writer_stopped,
    upstream_offsets,
)

router = APIRouter(prefix="/tables", tags=["tables"])
Ctx = Annotated[ApiContext, Depends(get_context)]
NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorOut, "description": "No table by that name."}
}


@router.get("/{table}/segments", response_model=TableSegmentsOut, responses=NOT_FOUND)
def table_segments(ctx: Ctx, request: Request, table: str) -> TableSegmentsOut:
    """The segments of the table's current manifest, grouped by partition, and the table's
    live rows (what a read returns, as ``millstream_table_rows`` says)."""
    manifest = ctx.catalog.manifest(table)
    live = request.app.state.live_rows.rows().get(table)
    by_partition: dict[int, list[SegmentOut]] = {}
    for e in manifest.entries:
        by_partition.setdefault(e.partition, []).append(SegmentOut.of(e))
    dvs = manifest.delete_vector_totals()
    deleted = sum(rows for _, rows in dvs.values())
    return TableSegmentsOut(
        table=table,
        manifest_version=manifest.version,
        segment_count=len(manifest.entries),
        row_count=manifest.row_count - deleted,
        deleted_rows=deleted,
        live_rows=live,
        partitions=[
            PartitionSegmentsOut(
                partition=p,
                segments=segs,
                delete_vectors=dvs.get(p, (0, 0))[0],
                deleted_rows=dvs.get(p, (0, 0))[1],
            )
            for p, segs in sorted(by_partition.items())
        ],
    )


@router.delete("/{table}/segments", responses=NOT_FOUND)
def rollback_segments(
    ctx: Ctx,
    table: str,
    partition: Annotated[int, Query(ge=0, description="The partition to roll back.")],
    fromSequence: Annotated[int, Query(ge=0, description="First segment sequence to remove.")],
    dryRun: Annotated[bool, Query(description="Only show what would be removed.")] = True,
    force: Annotated[bool, Query(description="Roll back even if the datastream runs.")] = False,
) -> dict[str, Any]:
    """Roll partition back: remove its segments with sequence >= fromSequence, move the shard
    upper to that segment's start and bump the epoch (every writer is fenced and restarts from
    the new upper). A dry run (the default) changes nothing. A real run needs the datastream
    writing the table to be PAUSED or STOPPED unless ``force``."""
    ctx.catalog.table(table)
    if not dryRun and not force:
        require_writer_stopped(ctx, table)
    plan = ctx.catalog.store.rollback_partition(table, partition, fromSequence, dry_run=dryRun)
    return plan.to_dict()


@router.get("/{table}/debugInfo", responses=NOT_FOUND)
def table_debug_info(ctx: Ctx, table: str) -> dict[str, Any]:
    """Committing segments with their age, segments in ERROR with the last error, the sealer
    queue per partition, and the sealing status workers report."""
    return debug_info(ctx, table)


@router.get(
    "/{table}/consumingSegmentsInfo", response_model=ConsumingSegmentsInfoOut, responses=NOT_FOUND
)
def consuming_segments_info(ctx: Ctx, table: str) -> ConsumingSegmentsInfoOut:
    """Per partition: shard upper, the source's latest offset, records and availability lag,
    and the workers serving it. A source that cannot be reached gives nulls and an error."""
    ctx.catalog.table(table)  # 404 before asking any broker
    rec = datastream_for_table(ctx, table)
    upstream = (
        upstream_offsets([rec.spec], ctx.upstream_timeout)[rec.name] if rec is not None else None
    )
    return consuming_info(ctx, table, rec, upstream)
