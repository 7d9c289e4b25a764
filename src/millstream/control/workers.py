"""Worker membership (register, heartbeat) and writing the stored assignments, on the metadata
store (the rows and statements live in :mod:`millstream.metastore.workers` and
:mod:`millstream.metastore.assignments`; reading the assignments and the standby commit gate
are :meth:`MetadataStore.read_assignments` and :meth:`MetadataStore.may_commit`)."""

from __future__ import annotations

import dataclasses
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
    info: dict[str, Any] | None,
    clock: Clock,
    url: str | None = None,
) -> None:
    """Register or refresh a worker (status STARTING, RUNNING or STOPPED); ``info`` None keeps
    its stored status (a liveness beat)."""
    store.retrying(workers.heartbeat, clock, worker_id, status=status, info=info, url=url)


def list_workers(store: MetadataStore) -> list[WorkerInfo]:
    """The workers as their readers see them: each table's sealer loop in ``loops`` (see
    :func:`with_table_loops`)."""
    with store.read() as conn:
        found = workers.list_workers(conn)
    return [dataclasses.replace(w, info=with_table_loops(w.info)) for w in found]


def with_table_loops(info: dict[str, Any]) -> dict[str, Any]:
    """A worker's status with each table's sealer loop in ``loops``, right after the sealing
    thread's own: the worker stores it once, under ``sealing[datastream]["loop"]`` (at 100
    tables the copy in ``loops`` was a tenth of the status written every beat, issue 38). A
    status that has them in ``loops`` already (a worker of an earlier version) is left as is."""
    loops = info.get("loops")
    tables = [
        st["loop"]
        for _, st in sorted((info.get("sealing") or {}).items())
        if isinstance(st, dict) and st.get("loop")
    ]
    if loops is None or not tables:
        return info
    if any(loop.get("loop") == "sealer" and loop.get("table") is not None for loop in loops):
        return info
    at = next((i + 1 for i, loop in enumerate(loops) if loop.get("loop") == "sealer"), len(loops))
    return {**info, "loops": [*loops[:at], *tables, *loops[at:]]}


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
    "with_table_loops",
    "write_assignments",
]
