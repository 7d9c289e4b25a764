"""Controller jobs kept in the metadata store, so they outlive the request, the controller
that took it and any restart, and every controller sees them (Pinot keeps them in ZooKeeper).

A **force commit** (Pinot's ``forceCommit``) names the segments of a table that were not yet
sealed when it was asked for; every worker's sealer reads the requests of its table on each
pass and seals those partitions at once instead of waiting for their thresholds. A job's
progress is computed from the current manifest, never written back: a named segment still
CONSUMING or COMMITTING is yet to be committed; one that was sealed (or rolled back) is not.

A **re-ingest** job (``POST /segments/{name}/reingest``, or the controller's automatic repair)
rebuilds one segment from its source. Unlike a force commit its status is written back while
it runs, each time by a compare-and-set on the row's ``version``; the row's ``active_key``
holds the segment's name while the job runs and is unique, so at most one job per segment
runs at a time, across every controller (a second start raises :class:`AlreadyExistsError`).
The controller running it renews a lease on the job (``lease_expires_at``); a job still
RUNNING past its lease belongs to a controller that died: it reads as ABANDONED, and the next
start for the segment (a POST, or the leader's repair scan) takes the same job over
(``attempts`` + 1). A failed job may carry ``next_attempt_at`` (the repair backoff); a start
before then by the repair scan is skipped, an operator's start retries at once.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, delete, insert, select

from millstream.errors import AlreadyExistsError, NotFoundError
from millstream.metastore import schema as s
from millstream.metastore.cas import cas_update
from millstream.metastore.models import Manifest, SegmentState

FORCE_COMMIT = "FORCE_COMMIT"
REINGEST = "REINGEST"
RUNNING, SUCCEEDED, FAILED, ABANDONED = "RUNNING", "SUCCEEDED", "FAILED", "ABANDONED"
#: Jobs kept per table and kind (Pinot's DEFAULT_MAXIMUM_CONTROLLER_JOBS_IN_ZK).
KEEP_JOBS = 100


@dataclass(frozen=True)
class Job:
    id: str
    kind: str
    table: str
    created_at: float
    payload: dict[str, Any]


def submit_force_commit(conn: Connection, manifest: Manifest, *, now: float) -> Job:
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


def get_job(conn: Connection, job_id: str) -> Job:
    j = s.controller_jobs
    row = conn.execute(select(j).where(j.c.id == job_id)).mappings().first()
    if row is None:
        raise NotFoundError("job", job_id)
    return Job(row["id"], row["kind"], row["table_name"], row["created_at"], row["payload"])


def force_commit_targets(conn: Connection, table: str) -> dict[int, int]:
    """Per partition, the highest segment sequence some force commit of ``table`` named: a
    sealer seals the partition now while it has an unsealed segment at or below it."""
    return force_commit_targets_of(conn, [table]).get(table, {})


def force_commit_targets_of(conn: Connection, tables: Sequence[str]) -> dict[str, dict[int, int]]:
    """:func:`force_commit_targets` of each of ``tables`` (those with none left out), in ONE
    query: a worker's sealing pass asks it of all its tables at once."""
    j = s.controller_jobs
    rows = conn.execute(
        select(j.c.table_name, j.c.payload).where(
            j.c.table_name.in_(s.in_list(tables)), j.c.kind == FORCE_COMMIT
        )
    ).all()
    out: dict[str, dict[int, int]] = {}
    for table, payload in rows:
        targets = out.setdefault(table, {})
        for p, seq in payload.get("segments", []):
            targets[int(p)] = max(targets.get(int(p), -1), int(seq))
    return out


def pending_segments(job: Job, manifest: Manifest) -> list[tuple[int, int]]:
    """The (partition, seq) of ``job``'s segments still unsealed in ``manifest``."""
    unsealed = {
        (e.partition, e.seq)
        for e in manifest.entries
        if e.state in (SegmentState.CONSUMING, SegmentState.COMMITTING)
    }
    return [(int(p), int(q)) for p, q in job.payload.get("segments", []) if (p, q) in unsealed]


# -- re-ingest jobs ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ReingestJob:
    """One re-ingest job as stored: ``payload`` holds ``segment``, ``status``, ``attempts``,
    ``owner`` (the controller running it), ``lease_expires_at``, ``trigger`` (``api`` or
    ``auto``), ``entry_id`` (the entry it was started for), ``error``, ``unrecoverable`` (a
    reason, when the source no longer holds the range), ``next_attempt_at``, ``result`` and
    the times ``started_at`` / ``updated_at`` / ``finished_at``."""

    id: str
    table: str
    created_at: float
    version: int
    payload: dict[str, Any]

    @property
    def segment(self) -> str:
        return str(self.payload["segment"])

    @property
    def entry_id(self) -> int | None:
        v = self.payload.get("entry_id")
        return None if v is None else int(v)

    @property
    def attempts(self) -> int:
        return int(self.payload.get("attempts", 0))

    @property
    def unrecoverable(self) -> str | None:
        v = self.payload.get("unrecoverable")
        return None if v is None else str(v)

    @property
    def next_attempt_at(self) -> float | None:
        v = self.payload.get("next_attempt_at")
        return None if v is None else float(v)

    def status(self, now: float) -> str:
        """RUNNING, SUCCEEDED, FAILED, or ABANDONED: stored as such, or RUNNING past its lease
        (the controller running it stopped renewing it: it died or lost the store)."""
        stored = str(self.payload.get("status", RUNNING))
        if stored == RUNNING and float(self.payload.get("lease_expires_at", 0.0)) <= now:
            return ABANDONED
        return stored

    def to_dict(self, now: float) -> dict[str, Any]:
        p = self.payload
        return {
            "id": self.id,
            "segment": self.segment,
            "table": self.table,
            "state": self.status(now),
            "trigger": p.get("trigger"),
            "attempts": self.attempts,
            "controller": p.get("owner"),
            "created_at": self.created_at,
            "started_at": p.get("started_at"),
            "updated_at": p.get("updated_at"),
            "finished_at": p.get("finished_at"),
            "lease_expires_at": p.get("lease_expires_at"),
            "next_attempt_at": p.get("next_attempt_at"),
            "error": p.get("error"),
            "unrecoverable": p.get("unrecoverable"),
            "result": p.get("result"),
        }


def _reingest_job(row: Any) -> ReingestJob:
    return ReingestJob(
        row["id"], row["table_name"], row["created_at"], row["version"], row["payload"]
    )


def start_reingest(
    conn: Connection,
    table: str,
    segment: str,
    *,
    entry_id: int | None,
    owner: str,
    now: float,
    lease: float,
    trigger: str,
    respect_backoff: bool = False,
    after_read: Callable[[], None] | None = None,
) -> ReingestJob | None:
    """Start (or take over) the re-ingest job of ``segment``, run by ``owner``.

    A job of the segment running under a live lease: :class:`AlreadyExistsError`. One past its
    lease (abandoned), or the segment's newest job failed for the same entry with a retry
    planned: that job is taken over (``attempts`` + 1). Otherwise a new job is recorded and the
    table's oldest finished re-ingest jobs beyond :data:`KEEP_JOBS` are dropped. With
    ``respect_backoff`` (the repair scan), a failed job whose ``next_attempt_at`` is still to
    come, or one that failed for good (no retry planned) for the same entry, is left alone and
    None returned. ``after_read`` is a test hook between the read and the write. In ``conn``'s
    transaction.
    """
    j = s.controller_jobs
    active = conn.execute(select(j).where(j.c.active_key == segment)).mappings().first()
    jobs = [
        _reingest_job(r)
        for r in conn.execute(
            select(j).where(j.c.table_name == table, j.c.kind == REINGEST)
        ).mappings()
    ]
    if after_read is not None:
        after_read()
    if active is not None:
        job = _reingest_job(active)
        if job.status(now) == RUNNING:
            raise AlreadyExistsError("running re-ingestion job for segment", segment)
        return _claim(conn, job, owner=owner, now=now, lease=lease, trigger=trigger)
    mine = [x for x in jobs if x.segment == segment]
    newest = max(mine, key=lambda x: (x.created_at, x.id), default=None)
    if newest is not None and newest.entry_id == entry_id and newest.status(now) == FAILED:
        retry_at = newest.next_attempt_at
        if respect_backoff and (retry_at is None or retry_at > now):
            return None
        return _claim(conn, newest, owner=owner, now=now, lease=lease, trigger=trigger)
    job = ReingestJob(
        uuid.uuid4().hex,
        table,
        now,
        0,
        {
            "segment": segment,
            "entry_id": entry_id,
            **_running(attempts=1, owner=owner, now=now, lease=lease, trigger=trigger),
        },
    )
    conn.execute(
        insert(j).values(
            id=job.id,
            kind=REINGEST,
            table_name=table,
            created_at=now,
            payload=job.payload,
            version=0,
            active_key=segment,
        )
    )
    finished = sorted(
        (x for x in jobs if x.payload.get("status") != RUNNING),
        key=lambda x: (x.created_at, x.id),
        reverse=True,
    )
    drop = [x.id for x in finished[KEEP_JOBS - 1 :]]
    if drop:
        conn.execute(delete(j).where(j.c.id.in_(s.in_list(drop)), j.c.active_key.is_(None)))
    return job


def _running(
    *, attempts: int, owner: str, now: float, lease: float, trigger: str
) -> dict[str, Any]:
    """The payload fields of a job (re)started now by ``owner``: RUNNING under a lease, with
    the outcome of any earlier attempt cleared."""
    return {
        "status": RUNNING,
        "attempts": attempts,
        "owner": owner,
        "trigger": trigger,
        "started_at": now,
        "updated_at": now,
        "finished_at": None,
        "lease_expires_at": now + lease,
        "next_attempt_at": None,
        "error": None,
        "unrecoverable": None,
        "result": None,
    }


def _claim(
    conn: Connection, job: ReingestJob, *, owner: str, now: float, lease: float, trigger: str
) -> ReingestJob:
    payload = {
        **job.payload,
        **_running(attempts=job.attempts + 1, owner=owner, now=now, lease=lease, trigger=trigger),
        "previous_owner": job.payload.get("owner"),
    }
    version = cas_update(
        conn,
        s.controller_jobs,
        {"id": job.id},
        job.version,
        {"payload": payload, "active_key": job.segment},
    )
    return ReingestJob(job.id, job.table, job.created_at, version, payload)


def _update(
    conn: Connection, job: ReingestJob, payload: dict[str, Any], *, active: bool
) -> ReingestJob:
    """One compare-and-set of ``job``'s row; :class:`CommitConflictError` if it changed since
    ``job`` was read (taken over, or abandoned by the next controller): the caller no longer
    owns the job."""
    version = cas_update(
        conn,
        s.controller_jobs,
        {"id": job.id},
        job.version,
        {"payload": payload, "active_key": job.segment if active else None},
    )
    return ReingestJob(job.id, job.table, job.created_at, version, payload)


def renew_reingest(conn: Connection, job: ReingestJob, *, now: float, lease: float) -> ReingestJob:
    """Extend the lease of a job ``job``'s owner runs; :class:`CommitConflictError` if it is
    no longer its own."""
    payload = {**job.payload, "updated_at": now, "lease_expires_at": now + lease}
    return _update(conn, job, payload, active=True)


def finish_reingest(
    conn: Connection,
    job: ReingestJob,
    *,
    now: float,
    status: str,
    error: str | None = None,
    result: dict[str, Any] | None = None,
    next_attempt_at: float | None = None,
    unrecoverable: str | None = None,
) -> ReingestJob:
    """Record the outcome (SUCCEEDED, FAILED or ABANDONED) and free the segment for the next
    job; :class:`CommitConflictError` if the job changed since ``job`` was read (another
    controller took it over)."""
    payload = {
        **job.payload,
        "status": status,
        "updated_at": now,
        "finished_at": now,
        "error": error,
        "result": result,
        "next_attempt_at": next_attempt_at,
        "unrecoverable": unrecoverable,
    }
    return _update(conn, job, payload, active=False)


def reingest_jobs(conn: Connection, table: str | None = None) -> list[ReingestJob]:
    """Every stored re-ingest job (of ``table``), oldest first."""
    j = s.controller_jobs
    q = select(j).where(j.c.kind == REINGEST)
    if table is not None:
        q = q.where(j.c.table_name == table)
    rows = [_reingest_job(r) for r in conn.execute(q).mappings()]
    return sorted(rows, key=lambda x: (x.created_at, x.id))


def newest_per_segment(jobs: list[ReingestJob]) -> dict[str, ReingestJob]:
    out: dict[str, ReingestJob] = {}
    for job in sorted(jobs, key=lambda x: (x.created_at, x.id)):
        out[job.segment] = job
    return out


def unrecoverable_segments(
    jobs: list[ReingestJob], manifest: Manifest, now: float
) -> list[ReingestJob]:
    """The newest jobs of the table's live segments that failed because the source no longer
    holds the segment's range (for the very entry that is still live)."""
    live = {e.name: e.id for e in manifest.entries}
    return [
        job
        for name, job in sorted(newest_per_segment(jobs).items())
        if job.unrecoverable is not None
        and job.status(now) == FAILED
        and live.get(name) == job.entry_id
    ]
