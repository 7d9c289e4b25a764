"""Worker membership (register, heartbeat) and writing the stored assignments, on the metadata
store (the rows and statements live in :mod:`millstream.metastore.workers` and
:mod:`millstream.metastore.assignments`; reading the assignments and the standby commit gate
are :meth:`MetadataStore.read_assignments` and :meth:`MetadataStore.may_commit`)."""

from __future__ import annotations

from typing import Any

from millstream.clock import Clock
from millstream.core.assignment import Placement
from millstream.metastore import assignments, workers
from millstream.metastore.store import MetadataStore
from millstream.metastore.workers import WorkerInfo

CONTROLLER_LEASE = "controller"


def heartbeat(
    store: MetadataStore,
    worker_id: str,
    *,
    status: str,
    info: dict[str, Any],
    clock: Clock,
    url: str | None = None,
) -> None:
    """Register or refresh a worker (status STARTING, RUNNING or STOPPED)."""
    store.retrying(workers.heartbeat, clock, worker_id, status=status, info=info, url=url)


def list_workers(store: MetadataStore) -> list[WorkerInfo]:
    with store.read() as conn:
        return workers.list_workers(conn)


def write_assignments(
    store: MetadataStore, target: dict[str, Placement], *, holder: str, token: int, clock: Clock
) -> bool:
    """Replace the stored assignments with ``target``, fenced by the leader's lease token.
    Returns whether anything changed. Raises LeaseLostError if the lease moved on."""
    changed, _ = store.retrying(
        assignments.write_assignments, clock, CONTROLLER_LEASE, target, holder=holder, token=token
    )
    return bool(changed)


__all__ = [
    "CONTROLLER_LEASE",
    "WorkerInfo",
    "heartbeat",
    "list_workers",
    "write_assignments",
]
