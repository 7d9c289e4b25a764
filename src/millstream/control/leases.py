"""Leases with a TTL and a fencing token (controller leadership), on the metadata store.

The rows, the compare-and-sets and the fence (and why it holds under concurrency) live in
:mod:`millstream.metastore.leases`; this module runs them in the store's transactions.
"""

from __future__ import annotations

from millstream.clock import Clock
from millstream.metastore import leases
from millstream.metastore.leases import Lease, check_fence, read_lease
from millstream.metastore.store import MetadataStore


def acquire_or_renew(
    store: MetadataStore, name: str, holder: str, ttl: float, clock: Clock
) -> Lease | None:
    """Renew the lease if ``holder`` has it, take it if it is free or expired; else None."""
    lease, _ = store.retrying(leases.acquire_or_renew, clock, name, holder, ttl)
    return lease


def release(store: MetadataStore, name: str, holder: str, clock: Clock) -> None:
    store.retrying(leases.release, clock, name, holder)


__all__ = ["Lease", "acquire_or_renew", "check_fence", "read_lease", "release"]
