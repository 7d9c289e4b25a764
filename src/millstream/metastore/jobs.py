"""Controller jobs kept in the metadata store, so they outlive the request, the controller
that took it and any restart, and every controller sees them (Pinot keeps them in ZooKeeper).

A **force commit** (Pinot's ``forceCommit``) names the segments of a table that were not yet
sealed when it was asked for; every worker's sealer reads the requests of its table on each
pass and seals those partitions at once instead of waiting for their thresholds. A job's
progress is computed from the current manifest, never written back: a named segment still
CONSUMING or COMMITTING is yet to be committed; one that was sealed (or rolled back) is not.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, insert, select

from millstream.errors import NotFoundError
from millstream.metastore import schema as s
from millstream.metastore.models import Manifest, SegmentState

if TYPE_CHECKING:
    from millstream.metastore.store import MetadataStore

FORCE_COMMIT = "FORCE_COMMIT"
#: Jobs kept per table and kind (Pinot's DEFAULT_MAXIMUM_CONTROLLER_JOBS_IN_ZK).
KEEP_JOBS = 100


@dataclass(frozen=True)
class Job:
    id: str
    kind: str
    table: str
    created_at: float
    payload: dict[str, Any]


def submit_force_commit(store: MetadataStore, manifest: Manifest, *, now: float) -> Job:
    """Record a force commit of every segment of ``manifest`` not sealed yet (its seal may be
    in progress: COMMITTING), and drop the table's oldest force commits beyond
    :data:`KEEP_JOBS`."""
    segments = sorted(
        (e.partition, e.seq)
        for e in manifest.entries
        if e.state in (SegmentState.CONSUMING, SegmentState.COMMITTING)
    )
    job = Job(
        uuid.uuid4().hex,
        FORCE_COMMIT,
        manifest.table.name,
        now,
        {"segments": [[p, seq] for p, seq in segments]},
    )
    j = s.controller_jobs
    with store.write() as conn:
        conn.execute(
            insert(j).values(
                id=job.id,
                kind=job.kind,
                table_name=job.table,
                created_at=job.created_at,
                payload=job.payload,
            )
        )
        keep = (
            select(j.c.id)
            .where(j.c.table_name == job.table, j.c.kind == FORCE_COMMIT)
            .order_by(j.c.created_at.desc(), j.c.id)
            .limit(KEEP_JOBS)
        )
        conn.execute(
            delete(j).where(
                j.c.table_name == job.table,
                j.c.kind == FORCE_COMMIT,
                j.c.id.not_in(keep.scalar_subquery()),
            )
        )
    return job


def get_job(store: MetadataStore, job_id: str) -> Job:
    j = s.controller_jobs
    with store.read() as conn:
        row = conn.execute(select(j).where(j.c.id == job_id)).mappings().first()
    if row is None:
        raise NotFoundError("job", job_id)
    return Job(row["id"], row["kind"], row["table_name"], row["created_at"], row["payload"])


def force_commit_targets(store: MetadataStore, table: str) -> dict[int, int]:
    """Per partition, the highest segment sequence some force commit of ``table`` named: a
    sealer seals the partition now while it has an unsealed segment at or below it."""
    j = s.controller_jobs
    with store.read() as conn:
        rows = conn.execute(
            select(j.c.payload).where(j.c.table_name == table, j.c.kind == FORCE_COMMIT)
        ).all()
    out: dict[int, int] = {}
    for (payload,) in rows:
        for p, seq in payload.get("segments", []):
            out[int(p)] = max(out.get(int(p), -1), int(seq))
    return out


def pending_segments(job: Job, manifest: Manifest) -> list[tuple[int, int]]:
    """The (partition, seq) of ``job``'s segments still unsealed in ``manifest``."""
    unsealed = {
        (e.partition, e.seq)
        for e in manifest.entries
        if e.state in (SegmentState.CONSUMING, SegmentState.COMMITTING)
    }
    return [(int(p), int(q)) for p, q in job.payload.get("segments", []) if (p, q) in unsealed]
