"""``/tables/{table}/segments`` and ``/tables/{table}/consumingSegmentsInfo`` (Pinot's names)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends

from millstream.api.context import ApiContext, get_context
from millstream.api.models import (
    ConsumingSegmentsInfoOut,
    ErrorOut,
    PartitionSegmentsOut,
    SegmentOut,
    TableSegmentsOut,
)
from millstream.api.status import consuming_info, datastream_for_table, upstream_offsets

router = APIRouter(prefix="/tables", tags=["tables"])
Ctx = Annotated[ApiContext, Depends(get_context)]
NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorOut, "description": "No table by that name."}
}


@router.get("/{table}/segments", response_model=TableSegmentsOut, responses=NOT_FOUND)
def table_segments(ctx: Ctx, table: str) -> TableSegmentsOut:
    """The segments of the table's current manifest, grouped by partition."""
    manifest = ctx.catalog.manifest(table)
    by_partition: dict[int, list[SegmentOut]] = {}
    for e in manifest.entries:
        by_partition.setdefault(e.partition, []).append(SegmentOut.of(e))
    return TableSegmentsOut(
        table=table,
        manifest_version=manifest.version,
        segment_count=len(manifest.entries),
        row_count=manifest.row_count,
        partitions=[
            PartitionSegmentsOut(partition=p, segments=segs)
            for p, segs in sorted(by_partition.items())
        ],
    )


@router.get(
    "/{table}/consumingSegmentsInfo", response_model=ConsumingSegmentsInfoOut, responses=NOT_FOUND
)
def consuming_segments_info(ctx: Ctx, table: str) -> ConsumingSegmentsInfoOut:
    """Per partition: shard upper, the source's latest offset, records and availability lag,
    and the workers serving it. A source that cannot be reached gives nulls and an error."""
    ctx.catalog.table(table)  # 404 before asking any broker
    rec = datastream_for_table(ctx.registry.list(), table)
    upstream = (
        upstream_offsets([rec.spec], ctx.upstream_timeout)[rec.name] if rec is not None else None
    )
    return consuming_info(ctx, table, rec, upstream)
