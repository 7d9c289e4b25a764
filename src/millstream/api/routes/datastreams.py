"""``/datastreams``: create, list, show, update (schema evolution), pause/resume/stop
(compare-and-set), delete; pause/resume of one table of a datastream that writes a table per
topic."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Query, Response, status

from millstream.api.context import ApiContext, get_context
from millstream.api.models import ChangeOut, DatastreamOut, DatastreamUpdateOut, ErrorOut
from millstream.api.status import upstream_offsets, writer_health
from millstream.core.lifecycle import Command
from millstream.datastream import DatastreamSpec

router = APIRouter(prefix="/datastreams", tags=["datastreams"])
Ctx = Annotated[ApiContext, Depends(get_context)]

NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorOut, "description": "No datastream by that name."}
}
CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {"model": ErrorOut, "description": "Not allowed from the current state."}
}

#: The body is the datastream spec: the same fields as the YAML spec file. It is parsed by
#: DatastreamSpec.parse so a 422 names the field (``source.topic``, ``table.mode`` ...).
SPEC_BODY = Body(
    description="The datastream spec as JSON: the same fields as the YAML spec file.",
    openapi_examples={
        "kafka upsert": {
            "value": {
                "name": "orders",
                "source": {
                    "kind": "kafka",
                    "bootstrap_servers": "127.0.0.1:9092",
                    "topic": "orders",
                },
                "table": {"primary_key": ["order_id"], "mode": "upsert"},
                "schema": {"order_id": "long", "status": "string"},
            }
        }
    },
)


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=DatastreamOut,
    responses={
        409: {"model": ErrorOut, "description": "A datastream by that name exists."},
        422: {"model": ErrorOut, "description": "Invalid spec; `field` names the field."},
    },
)
def create_datastream(
    ctx: Ctx, response: Response, spec: Annotated[dict[str, Any], SPEC_BODY]
) -> DatastreamOut:
    """Create a datastream (INITIALIZING); the leader creates its table and makes it READY.
    Its source is probed first (its latest offsets, within the API's upstream timeout): one
    that cannot be reached does not stop the create, the response's ``warnings`` say why."""
    parsed = DatastreamSpec.parse(spec)
    # a multi-table datastream's topics are its worker's to find (its listed ones may not
    # exist yet): its tables' sources are shown per table once they run
    probe = (
        None
        if parsed.multi_table
        else upstream_offsets([parsed], ctx.upstream_timeout)[parsed.name]
    )
    rec = ctx.registry.create(parsed)
    response.headers["Location"] = f"/datastreams/{rec.name}"
    warnings = []
    if probe is not None and probe.error is not None:
        warnings.append(
            f"{probe.error}; the datastream was created and its writer will retry (its "
            "health shows the error)"
        )
    return DatastreamOut.of(rec, warnings=warnings)


@router.get("", response_model=list[DatastreamOut])
def list_datastreams(ctx: Ctx) -> list[DatastreamOut]:
    """Every datastream, with its writer's ``health`` while READY."""
    records = ctx.registry.list()
    health = writer_health(ctx, records)
    return [
        DatastreamOut.of(r, health=health.get(r.name), tables=ctx.registry.tables_of(r.name))
        for r in records
    ]


@router.get("/{name}", response_model=DatastreamOut, responses=NOT_FOUND)
def get_datastream(ctx: Ctx, name: str) -> DatastreamOut:
    """The datastream's record, with its writer's ``health`` while READY."""
    rec = ctx.registry.get(name)
    return DatastreamOut.of(
        rec, health=writer_health(ctx, [rec]).get(rec.name), tables=ctx.registry.tables_of(name)
    )


@router.patch(
    "/{name}",
    response_model=DatastreamUpdateOut,
    responses={
        **NOT_FOUND,
        409: {
            "model": ErrorOut,
            "description": "An incompatible change (IncompatibleChangeError): `field`, "
            "`column` and `rule` say which and why; nothing was changed.",
        },
        422: {"model": ErrorOut, "description": "Invalid spec; `field` names the field."},
    },
)
def update_datastream(
    ctx: Ctx,
    name: str,
    spec: Annotated[dict[str, Any], SPEC_BODY],
    dry_run: Annotated[
        bool, Query(description="Check the change and list it; write nothing.")
    ] = False,
) -> DatastreamUpdateOut:
    """Evolve the datastream's schema without downtime: the body is the whole new spec.
    Compatible changes (a column added at the end, int -> long or int -> double, a decimal's
    precision raised, retention) are applied in one transaction; the running writer picks them
    up at its next batch, and rows written before read the new column as null. Anything else
    is refused with 409 naming the field, the column and the rule."""
    rec, changes, schema_version = ctx.registry.update(
        name, DatastreamSpec.parse(spec), dry_run=dry_run
    )
    return DatastreamUpdateOut(
        datastream=DatastreamOut.of(rec),
        changes=[ChangeOut.of(c) for c in changes],
        dry_run=dry_run,
        schema_version=schema_version,
    )


@router.delete(
    "/{name}",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=DatastreamOut,
    responses=NOT_FOUND,
)
def delete_datastream(ctx: Ctx, name: str) -> DatastreamOut:
    """Move to DELETING; the leader removes it once no worker runs it."""
    return DatastreamOut.of(ctx.registry.command(name, Command.DELETE))


@router.post("/{name}/pause", response_model=DatastreamOut, responses={**NOT_FOUND, **CONFLICT})
def pause_datastream(ctx: Ctx, name: str) -> DatastreamOut:
    """READY -> PAUSED: writers stop at the shard upper and resume exactly there."""
    return DatastreamOut.of(ctx.registry.command(name, Command.PAUSE))


@router.post("/{name}/resume", response_model=DatastreamOut, responses={**NOT_FOUND, **CONFLICT})
def resume_datastream(ctx: Ctx, name: str) -> DatastreamOut:
    """PAUSED | STOPPED | ERROR -> READY."""
    return DatastreamOut.of(ctx.registry.command(name, Command.RESUME))


@router.post("/{name}/stop", response_model=DatastreamOut, responses={**NOT_FOUND, **CONFLICT})
def stop_datastream(ctx: Ctx, name: str) -> DatastreamOut:
    """READY | PAUSED -> STOPPING; the leader completes STOPPED once no worker runs it."""
    return DatastreamOut.of(ctx.registry.command(name, Command.STOP))


TABLE_RESPONSES: dict[int | str, dict[str, Any]] = {
    404: {
        "model": ErrorOut,
        "description": "No datastream by that name, or the table is not one of its tables.",
    },
    409: {
        "model": ErrorOut,
        "description": "The table is paused already (pause), not paused (resume), or the "
        "datastream is being deleted.",
    },
    422: {"model": ErrorOut, "description": "The datastream writes one table: pause it instead."},
}


@router.post(
    "/{name}/tables/{table}/pause", response_model=DatastreamOut, responses=TABLE_RESPONSES
)
def pause_table(ctx: Ctx, name: str, table: str) -> DatastreamOut:
    """Pause one table of a datastream that writes a table per topic: its writer stops at its
    shard uppers while the other tables keep committing (``paused_tables`` lists it)."""
    rec = ctx.registry.pause_table(name, table)
    return DatastreamOut.of(rec, tables=ctx.registry.tables_of(name))


@router.post(
    "/{name}/tables/{table}/resume", response_model=DatastreamOut, responses=TABLE_RESPONSES
)
def resume_table(ctx: Ctx, name: str, table: str) -> DatastreamOut:
    """Resume a table paused on its own: its writer rejoins at its shard uppers (nothing
    skipped, nothing read twice)."""
    rec = ctx.registry.resume_table(name, table)
    return DatastreamOut.of(rec, tables=ctx.registry.tables_of(name))
