"""What the sealer is doing, for ``/tables/{t}/debugInfo`` and the sealing metrics."""

from __future__ import annotations

from typing import Any

from millstream.api.context import ApiContext
from millstream.control.workers import list_workers
from millstream.metastore.models import SegmentState


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
    }
