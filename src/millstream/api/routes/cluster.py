"""``/workers``, ``/health`` and ``/settings`` (what a worker needs to join)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends

from millstream.api.context import ApiContext, get_context
from millstream.api.models import ControlSettingsOut, HealthOut, SettingsOut, WorkerOut
from millstream.control.workers import list_workers
from millstream.metastore.engine import public_url

router = APIRouter(tags=["cluster"])
Ctx = Annotated[ApiContext, Depends(get_context)]


@router.get("/workers", response_model=list[WorkerOut])
def workers(ctx: Ctx) -> list[WorkerOut]:
    now = ctx.clock.now()
    assigned: dict[str, list[dict[str, str]]] = {}
    for ds, placement in ctx.catalog.store.read_assignments().items():
        for worker_id, role in placement:
            assigned.setdefault(worker_id, []).append({"datastream": ds, "role": role})
    return [
        WorkerOut(
            id=w.id,
            url=w.url,
            status=w.status,
            alive=w.alive(now, ctx.worker_ttl),
            heartbeat_age_s=round(now - w.heartbeat_at, 3),
            started_at=w.started_at,
            heartbeat_at=w.heartbeat_at,
            writers=list(w.info.get("writers", [])),
            assignments=assigned.get(w.id, []),
            loops=list(w.info.get("loops") or []),
            shared_query=w.info.get("shared_query"),
        )
        for w in list_workers(ctx.catalog.store)
    ]


@router.get("/health", response_model=HealthOut)
def health(ctx: Ctx) -> HealthOut:
    c = ctx.controller
    return HealthOut(leader=c is not None and c.is_leader, controller_id=c.id if c else None)


@router.get("/settings", response_model=SettingsOut)
def settings(ctx: Ctx) -> SettingsOut:
    st = ctx.catalog.settings
    return SettingsOut(
        metadata_url=public_url(st.metadata_url),
        deep_store=st.deep_store,
        s3_endpoint=st.s3_endpoint,
        control=ControlSettingsOut(
            lease_ttl=ctx.control.lease_ttl,
            worker_ttl=ctx.control.worker_ttl,
            takeover_ttl=ctx.control.takeover_ttl,
            tick_seconds=ctx.control.tick_seconds,
            stall_seconds=ctx.control.stall_seconds,
            iceberg_publish_interval=ctx.control.iceberg_publish_interval,
        ),
    )
