"""Live status of tables and their sources, computed on request from the metadata store and
the sources' latest offsets (the consumingSegmentsInfo endpoint and the metrics share it).

Availability lag is how long the partition has had unconsumed records without a commit:
0 when the shard upper equals the source's latest offset, otherwise now minus the time of the
last commit that advanced the shard (the ``created_at`` of its furthest segment).

Ingestion delay is Pinot's ``realtimeIngestionDelayMs``: now minus the timestamp of the last
committed record of the partition (the shard's ``last_record_ms``: Kafka's record timestamp,
or when the writer read the record for a source without one), and 0 when the partition is
caught up. Caught up needs the source's latest offset: when the source does not answer, the
delay is reported from the timestamp all the same (it grows while nothing is committed, as
Pinot's does); with no committed record yet it is unknown (None).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from millstream.api.context import ApiContext
from millstream.api.models import (
    ConsumingInfoOut,
    ConsumingSegmentsInfoOut,
    PartitionConsumingOut,
    PartitionOffsetInfoOut,
    PinotPartitionOffsetInfoOut,
    ServingWorkerOut,
    WriterHealthOut,
)
from millstream.control.registry import DatastreamRecord
from millstream.control.topics import current_tables
from millstream.control.workers import list_workers
from millstream.core.lifecycle import State
from millstream.datastream import DatastreamSpec, FilesSource, KafkaSource
from millstream.errors import PreconditionFailedError, TableNotFoundError
from millstream.ingest.sources import spec_reader
from millstream.metastore import reads
from millstream.metastore.models import SegmentState
from millstream.metastore.store import MetadataStore
from millstream.spec import DEAD_LETTER_SUFFIX, TableSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Upstream:
    """A source's latest offsets, or why they are unknown."""

    offsets: dict[int, int] | None
    error: str | None = None


def describe_source(spec: DatastreamSpec) -> str:
    src = spec.source
    if isinstance(src, KafkaSource):
        if src.topics is not None:
            return f"kafka topics {', '.join(src.topics)} on {src.bootstrap_servers}"
        if src.topic_pattern is not None:
            return f"kafka topics matching {src.topic_pattern!r} on {src.bootstrap_servers}"
        return f"kafka topic {src.topic!r} on {src.bootstrap_servers}"
    if isinstance(src, FilesSource):
        return f"files under {src.path}"
    return "the generator"


def upstream_offsets(
    specs: Iterable[DatastreamSpec], timeout: float, *, by_table: bool = False
) -> dict[str, Upstream]:
    """Latest offsets of each datastream's source, asked concurrently, by datastream name (or
    by table name with ``by_table``: the single-topic specs of a multi-table datastream's
    tables share its name). A source that fails or does not answer within ``timeout`` seconds
    (a broker that is down) gets an error instead."""
    answers: dict[str, Upstream] = {}
    threads: dict[str, threading.Thread] = {}

    def key(spec: DatastreamSpec) -> str:
        return spec.table_name if by_table else spec.name

    def ask(spec: DatastreamSpec) -> None:
        try:
            offsets = spec_reader(spec.source).latest_offsets()
            answers[key(spec)] = Upstream({int(p): int(o) for p, o in offsets.items()})
        except Exception as exc:  # any source failure is reported, never raised
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            answers[key(spec)] = Upstream(
                None, f"cannot read the latest offsets of {describe_source(spec)}: {reason}"
            )

    specs = list(specs)
    for spec in specs:
        t = threading.Thread(target=ask, args=(spec,), name=f"upstream-{key(spec)}", daemon=True)
        threads[key(spec)] = t
        t.start()
    deadline = time.monotonic() + timeout
    for spec in specs:
        threads[key(spec)].join(max(0.0, deadline - time.monotonic()))
        if key(spec) not in answers:
            answers[key(spec)] = Upstream(
                None,
                f"{describe_source(spec)} did not answer within {timeout:g}s (is the broker down?)",
            )
    return {name: answers[name] for name in threads}


def datastream_for_table(ctx: ApiContext, table: str) -> DatastreamRecord | None:
    """The datastream writing ``table`` (or whose dead-letter table it is). For a table of a
    multi-table datastream, the record carries that table's single-topic spec
    (:meth:`DatastreamSpec.table_for`), so what is asked of a datastream's table (its source's
    offsets, a re-ingestion) is asked of its own topic; None if its topic is not found."""
    records = ctx.registry.list()
    for rec in records:
        if not rec.spec.multi_table and table in (rec.spec.table_name, rec.spec.dead_letter_table):
            return rec
    owner = ctx.registry.owner_of(table)
    found = next((r for r in records if r.name == owner and r.spec.multi_table), None)
    if found is None:
        return None
    base = table.removesuffix(DEAD_LETTER_SUFFIX)
    try:
        members = current_tables(found.spec, stored=lambda n: _stored(ctx, n))
    except Exception as exc:  # the broker did not answer: the table's topic is unknown
        log.warning("the topic of table %s of datastream %s is unknown: %s", table, owner, exc)
        return None
    member = members.get(base)
    return None if member is None else replace(found, spec=member)


def tables_written(
    ctx: ApiContext, records: Iterable[DatastreamRecord]
) -> list[tuple[DatastreamRecord, str, DatastreamSpec | None]]:
    """Every table the datastreams write, with its datastream and its single-topic spec: a
    datastream's one table, or each table of a multi-table one made so far (its spec None when
    the broker did not say which topic it reads: its upstream offsets are then unknown)."""
    out: list[tuple[DatastreamRecord, str, DatastreamSpec | None]] = []
    for rec in records:
        if not rec.spec.multi_table:
            out.append((rec, rec.spec.table_name, rec.spec))
            continue
        try:
            members = current_tables(rec.spec, stored=lambda n: _stored(ctx, n))
        except Exception as exc:  # the broker did not answer
            log.warning("the topics of datastream %s are unknown: %s", rec.name, exc)
            members = {}
        out += [(rec, t, members.get(t)) for t in ctx.registry.tables_of(rec.name)]
    return out


def _stored(ctx: ApiContext, table: str) -> TableSpec | None:
    try:
        return ctx.catalog.table(table).spec
    except TableNotFoundError:
        return None


def require_writer_stopped(ctx: ApiContext, table: str) -> None:
    """A rollback needs the datastream writing ``table`` PAUSED or STOPPED, or (a table of a
    multi-table datastream) that table paused on its own (409 naming it). The owner is looked
    up by the table's name: no broker is asked."""
    owner = ctx.registry.owner_of(table)
    rec = ctx.registry.find(owner) if owner is not None else None
    if rec is None or rec.state in (State.PAUSED, State.STOPPED):
        return
    base = table.removesuffix(DEAD_LETTER_SUFFIX)
    if rec.spec.multi_table and base in rec.paused_tables:
        return
    what = f"table {base!r} of datastream {rec.name!r}" if rec.spec.multi_table else None
    raise PreconditionFailedError(
        f"datastream {rec.name!r} writing table {table!r} is {rec.state.value}; pause "
        + (f"the {what} first" if what else "it first")
        + " (or pass force=true)",
        datastream=rec.name,
        state=rec.state.value,
    )


def last_commit_times(store: MetadataStore, table: str) -> dict[int, float]:
    """Per partition: when the shard last advanced through a segment
    (:func:`millstream.metastore.reads.last_commit_times`)."""
    with store.read() as conn:
        return reads.last_commit_times(conn, table)


def rows_per_table(store: MetadataStore) -> dict[str, int]:
    """Rows in each table's current manifest (:func:`millstream.metastore.reads.rows_per_table`)."""
    with store.read() as conn:
        return reads.rows_per_table(conn)


def serving_workers(
    ctx: ApiContext, datastream: str, table: str | None = None
) -> list[ServingWorkerOut]:
    """The workers assigned ``datastream``, and whether each runs its writer (of ``table``,
    for a table of a multi-table datastream: a table paused on its own has none running)."""
    now = ctx.clock.now()
    workers = {w.id: w for w in list_workers(ctx.catalog.store)}
    base = table.removesuffix(DEAD_LETTER_SUFFIX) if table is not None else None
    out = []
    for worker_id, role in ctx.catalog.store.read_assignments().get(datastream, []):
        w = workers.get(worker_id)
        running = w is not None and any(
            wr.get("datastream") == datastream
            and wr.get("running")
            and (base is None or wr.get("table") in (None, base))
            for wr in w.info.get("writers", [])
        )
        alive = w is not None and w.alive(now, ctx.worker_ttl)
        out.append(ServingWorkerOut(worker_id=worker_id, role=role, alive=alive, running=running))
    return out


#: What a writer's health is worse than: the reports of several workers (an active and its
#: standbys) show the worst.
_WORSE = {"stalled": 4, "retrying": 3, "starting": 2, "running": 1, "not running": 0}


def writer_health(
    ctx: ApiContext, records: Iterable[DatastreamRecord]
) -> dict[str, WriterHealthOut]:
    """Per READY datastream: its writer's health as the live workers running it report it
    (the worst of their reports), or ``not running`` when none does. Other states get none:
    their state says it all."""
    now = ctx.clock.now()
    reports: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for w in list_workers(ctx.catalog.store):
        if not w.alive(now, ctx.worker_ttl):
            continue
        for wr in w.info.get("writers") or []:
            reports.setdefault(str(wr.get("datastream")), []).append((w.id, wr))
    out: dict[str, WriterHealthOut] = {}
    for rec in records:
        if rec.state is not State.READY:
            continue
        best: WriterHealthOut | None = None
        for worker_id, wr in reports.get(rec.name, []):
            h = wr.get("health")
            if h is None:  # a worker of an older version: what it reports
                error = wr.get("error")
                status = "retrying" if error else "running" if wr.get("running") else "starting"
                h = {"status": status, "error": error}
            got = WriterHealthOut.model_validate({**h, "worker": worker_id})
            if best is None or _WORSE[got.status] > _WORSE[best.status]:
                best = got
        out[rec.name] = best or WriterHealthOut(status="not running")
    return out


def consuming_info(
    ctx: ApiContext, table: str, rec: DatastreamRecord | None, upstream: Upstream | None
) -> ConsumingSegmentsInfoOut:
    """Per partition of ``table``: shard upper, source latest offset, lags and who serves it."""
    store = ctx.catalog.store
    manifest = store.manifest(table)  # raises TableNotFoundError (404)
    shards = {sh.partition: sh for sh in store.covered_shards(table)}
    commits = last_commit_times(store, table)
    latest = upstream.offsets if upstream is not None and upstream.offsets is not None else None
    if rec is None:
        error: str | None = f"no datastream writes table {table!r}"
    else:
        error = upstream.error if upstream is not None else None
    workers = serving_workers(ctx, rec.name, table) if rec is not None else []
    consuming: dict[int, int] = {}
    for entry in manifest.entries:
        if entry.state is SegmentState.CONSUMING:
            consuming[entry.partition] = consuming.get(entry.partition, 0) + 1
    now = ctx.clock.now()
    parts: list[PartitionConsumingOut] = []
    for p in sorted(set(shards) | set(latest or {})):
        sh = shards.get(p)
        current = sh.upper if sh is not None else None
        upstream_p = latest.get(p) if latest is not None else None
        lag = (
            max(0, upstream_p - current) if upstream_p is not None and current is not None else None
        )
        last = commits.get(p)
        if lag == 0:
            avail: int | None = 0
        elif last is not None:
            avail = max(0, round((now - last) * 1000))
        else:
            avail = None
        stamp = sh.last_record_ms if sh is not None else None
        if lag == 0:
            delay: int | None = 0
        elif stamp is not None:
            delay = max(0, round(now * 1000) - stamp)
        else:
            delay = None
        parts.append(
            PartitionConsumingOut(
                partition=p,
                current_offset=current,
                latest_upstream_offset=upstream_p,
                records_lag=lag,
                availability_lag_ms=avail,
                ingestion_delay_ms=delay,
                last_record_timestamp_ms=stamp,
                last_commit_at=last,
                latest_segment=(
                    f"{table}__{p}__{sh.next_seq - 1}" if sh is not None and sh.next_seq else None
                ),
                consuming_segments=consuming.get(p, 0),
                serving_workers=workers,
                error=error if upstream_p is None else None,
            )
        )
    # Pinot's map: the segment each partition consumes into, under every worker whose writer
    # runs (whatever the datastream's state: after a pause it empties once writers stopped).
    pinot: dict[str, list[ConsumingInfoOut]] = {}
    for x in parts:
        sh = shards.get(x.partition)
        consumers = [w for w in workers if w.alive and w.running]
        if sh is None or not consumers:
            continue
        key = str(x.partition)
        offsets = PinotPartitionOffsetInfoOut(
            currentOffsetsMap={key: str(sh.upper)},
            latestUpstreamOffsetMap={key: _text(x.latest_upstream_offset)},
            recordsLagMap={key: _text(x.records_lag)},
            availabilityLagMsMap={key: _text(x.availability_lag_ms)},
        )
        last = x.last_commit_at
        pinot[f"{table}__{x.partition}__{sh.next_seq}"] = [
            ConsumingInfoOut(
                serverName=w.worker_id,
                consumerState="CONSUMING" if w.role == "active" else "NOT_CONSUMING",
                lastConsumedTimestamp=None if last is None else round(last * 1000),
                partitionToOffsetMap={key: str(sh.upper)},
                partitionOffsetInfo=offsets,
            )
            for w in consumers
        ]
    return ConsumingSegmentsInfoOut(
        table=table,
        segment_to_consuming_info_map=pinot,
        datastream=rec.name if rec is not None else None,
        state=rec.state if rec is not None else None,
        manifest_version=manifest.version,
        upstream_error=error,
        partitions=parts,
        partition_offset_info=PartitionOffsetInfoOut(
            current_offsets_map={str(x.partition): x.current_offset for x in parts},
            latest_upstream_offset_map={str(x.partition): x.latest_upstream_offset for x in parts},
            records_lag_map={str(x.partition): x.records_lag for x in parts},
            availability_lag_ms_map={str(x.partition): x.availability_lag_ms for x in parts},
        ),
    )


def _text(value: int | None) -> str | None:
    return None if value is None else str(value)
