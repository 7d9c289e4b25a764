"""What the sealer is doing, for ``/tables/{t}/debugInfo`` and the sealing metrics."""

from __future__ import annotations

from typing import Any

from millstream.api.context import ApiContext
from millstream.api.status import datastream_for_table, writer_health
from millstream.control.workers import list_workers
from millstream.metastore.jobs import (
    FAILED,
    RUNNING,
    newest_per_segment,
    unrecoverable_segments,
)
from millstream.metastore.models import Manifest, SegmentState


def repair_info(ctx: ApiContext, manifest: Manifest) -> dict[str, Any]:
    """Automatic repair of the table: whether it is on, its re-ingest jobs running, the
    segments waiting for a retry (backoff) and those that cannot be repaired (the source range
    is gone; counted in ``millstream_segments_unrecoverable``), plus, on the leader, its scan
    loop's status and what the last scan found."""
    table = manifest.table.name
    now = ctx.clock.now()
    jobs = ctx.catalog.store.reingest_jobs(table)
    stuck = unrecoverable_segments(jobs, manifest, now)
    stuck_ids = {j.id for j in stuck}
    live = {e.name: e.id for e in manifest.entries}
    retrying = [
        j
        for j in newest_per_segment(jobs).values()
        if j.status(now) == FAILED
        and j.id not in stuck_ids
        and j.next_attempt_at is not None
        and live.get(j.segment) == j.entry_id
    ]
    scan = None
    if ctx.controller is not None and ctx.controller.is_leader:
        scan = ctx.controller.repair.status(table)
    return {
        "auto_repair": ctx.control.auto_repair,
        "running_jobs": [j.to_dict(now) for j in jobs if j.status(now) == RUNNING],
        "retrying": [
            {
                "segment": j.segment,
                "job": j.id,
                "attempts": j.attempts,
                "last_error": j.payload.get("error"),
                "next_attempt_in_s": round(max(0.0, (j.next_attempt_at or now) - now), 3),
            }
            for j in retrying
        ],
        "unrecoverable_segments": [
            {
                "segment": j.segment,
                "reason": j.unrecoverable,
                "error": j.payload.get("error"),
                "job": j.id,
                "attempts": j.attempts,
                "next_attempt_in_s": round(max(0.0, (j.next_attempt_at or now) - now), 3),
            }
            for j in stuck
        ],
        "leader_scan": scan,
    }


def debug_info(ctx: ApiContext, table: str) -> dict[str, Any]:
    """Committing segments with their age, segments in ERROR with the last error, and the
    sealer queue (segments not sealed yet) and the delete vectors (count, superseded rows) per
    partition, plus what workers report."""
    manifest = ctx.catalog.manifest(table)
    now = ctx.clock.now()
    queue: dict[int, int] = {}
    committing, errors = [], []
    for e in manifest.entries:
        if e.state is not SegmentState.ONLINE:
            queue[e.partition] = queue.get(e.partition, 0) + 1
        if e.state is SegmentState.COMMITTING:
            expires = e.claim_expires_at
            committing.append(
                {
                    "segment": e.name,
                    "partition": e.partition,
                    "age_s": round(now - e.created_at, 3),
                    # Who is sealing it; an expired claim is taken over by the next seal.
                    "claimed_by": e.claimed_by,
                    "claim_expires_in_s": None if expires is None else round(expires - now, 3),
                }
            )
        if e.state is SegmentState.ERROR:
            errors.append(
                {
                    "segment": e.name,
                    "partition": e.partition,
                    "last_error": e.last_error,
                    "claimed_by": e.claimed_by,  # the sealer whose attempt failed, if known
                }
            )
    reported = {
        w.id: w.info.get("sealing", {})
        for w in list_workers(ctx.catalog.store)
        if w.alive(now, ctx.worker_ttl) and w.info.get("sealing")
    }
    return {
        "table": table,
        "manifest_version": manifest.version,
        "committing_segments": committing,
        "segments_in_error": errors,
        "sealer_queue": [{"partition": p, "segments": n} for p, n in sorted(queue.items())],
        "delete_vectors": [
            {"partition": p, "vectors": n, "rows": rows}
            for p, (n, rows) in sorted(manifest.delete_vector_totals().items())
        ],
        "workers": reported,
        "repair": repair_info(ctx, manifest),
        "writer_health": _writer_health(ctx, table),
        "iceberg": _iceberg_view(ctx, table, now),
        # writer failures on source offsets and the offsets an on_data_loss: accept source
        # skipped, as each worker reports them
        "source_offsets": [
            {**s, "worker": w.id}
            for w in list_workers(ctx.catalog.store)
            for s in w.info.get("source_offsets") or []
            if s.get("table") == table
        ],
    }


def _writer_health(ctx: ApiContext, table: str) -> dict[str, Any] | None:
    """The health of the writer of ``table`` (running, retrying, stalled: see
    :func:`millstream.api.status.writer_health`), None unless its datastream is READY."""
    rec = datastream_for_table(ctx, table)
    if rec is None or rec.spec.table_name != table:
        return None
    health = writer_health(ctx, [rec]).get(rec.name)
    return None if health is None else {"datastream": rec.name, **health.model_dump()}


def _iceberg_view(ctx: ApiContext, table: str, now: float) -> dict[str, Any]:
    """The table's Iceberg view: the snapshot its pointer names, how far it lags (see
    :func:`millstream.metastore.iceberg.publish_lag`), each live worker's publisher (its
    last publish, what it reused) and its loops: per table (``publisher``) and the worker's
    publishing loop, whose errors are its publisher process's exits and crashes; and each
    live worker's garbage collection of the view (``garbage_collection``)."""
    pointer = ctx.catalog.store.read_pointer(table)
    return {
        "publish_interval": ctx.control.iceberg_publish_interval,
        "manifest_version": None if pointer is None else pointer.manifest_version,
        "published_at": None if pointer is None else pointer.published_at,
        "metadata_location": None if pointer is None else pointer.metadata_location,
        "lag_seconds": ctx.catalog.store.publish_lag(table, now),
        "publishers": {
            w.id: view
            for w in list_workers(ctx.catalog.store)
            if w.alive(now, ctx.worker_ttl)
            and (view := ((w.info.get("maintenance") or {}).get(table) or {}).get("iceberg"))
        },
        # Each live worker's collection of the view's garbage (in its maintenance): this
        # table's last one, and the worker's last pass and view references (all its tables)
        "garbage_collection": {
            w.id: {
                "table": (
                    ((w.info.get("maintenance") or {}).get(table) or {}).get("last") or {}
                ).get("view_gc"),
                **w.info["view_gc"],
            }
            for w in list_workers(ctx.catalog.store)
            if w.alive(now, ctx.worker_ttl) and w.info.get("view_gc")
        },
        "publisher_loops": [
            {**loop, "worker": w.id}
            for w in list_workers(ctx.catalog.store)
            if w.alive(now, ctx.worker_ttl)
            for loop in w.info.get("loops") or []
            if (loop.get("loop") == "publisher" and loop.get("table") == table)
            or (loop.get("loop") == "publishing" and table in (w.info.get("maintenance") or {}))
        ],
    }
