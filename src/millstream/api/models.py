"""Response bodies of the REST API (the OpenAPI document is generated from these)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from millstream.control.registry import DatastreamRecord
from millstream.core.evolution import Change
from millstream.core.lifecycle import State
from millstream.metastore.models import Entry


class _Out(BaseModel):
    model_config = ConfigDict(frozen=True)


class ErrorOut(_Out):
    """Every error: ``error`` is the class in Millstream's error tree; other fields name ids."""

    model_config = ConfigDict(extra="allow")
    error: str = Field(examples=["NotFoundError"])
    message: str = Field(examples=["datastream 'orders' does not exist"])


class WriterHealthOut(_Out):
    """How the datastream's writer is doing, as the worker running it reports it (a READY
    datastream's state says what it should do; this says whether it does)."""

    status: Literal["running", "retrying", "stalled", "starting", "not running"] = Field(
        description="running; retrying: it failed and is restarted after a backoff (until it "
        "is seen advancing again); stalled: its shard upper has not moved for the stall time "
        "while its source holds newer records (restarted with backoff); starting: waiting for "
        "its state directory; not running: no live worker runs it."
    )
    error: str | None = Field(default=None, description="The writer's last error.")
    since: float | None = Field(
        default=None, description="Since when it has been failing or stalled (epoch seconds)."
    )
    retry_at: float | None = Field(
        default=None, description="When its backoff ends and it is started again."
    )
    failures: int = 0
    worker: str | None = Field(default=None, description="The worker reporting it.")
    stalled: dict[str, Any] | None = Field(
        default=None,
        description="{since, partitions: {p: {upper, latest}}} of the stall that restarted it.",
    )
    stall_restarts: int = Field(default=0, description="Restarts the stall watchdog made.")
    transient_restarts: int = Field(
        default=0,
        description="Restarts of its query after Spark's transient failures (a Python process "
        "that did not connect back in time): from the shard uppers after a backoff, the writer "
        "not failed.",
    )
    transient_error: str | None = Field(
        default=None, description="The last of those failures, as Spark said it."
    )
    restarts: int = Field(
        default=0,
        description="Restarts of its query from the shard uppers after a fenced, gapped or "
        "expired commit (a rollback, another writer), over the running query's life.",
    )
    restarts_in_a_row: int = Field(
        default=0,
        description="The last of those restarts in a row with no commit in between, 0 once it "
        "committed past where it started after the last one; the writer fails when they pass "
        "10.",
    )


class DatastreamOut(_Out):
    name: str
    state: State
    version: int = Field(description="Bumped by every transition (compare-and-set).")
    table: str | None = Field(
        description="The table the datastream writes (None for one that writes a table per "
        "topic: see tables)."
    )
    tables: list[str] = Field(
        default_factory=list,
        description="Every table it writes (a table per topic with source.topics or "
        "topic_pattern, those made so far), dead-letter tables left out.",
    )
    paused_tables: list[str] = Field(
        default_factory=list,
        description="Tables of a multi-table datastream paused on their own (POST "
        "/datastreams/{name}/tables/{table}/pause): their writers stop at their shard uppers "
        "while the other tables run on.",
    )
    last_error: str | None
    created_at: float
    updated_at: float
    spec: dict[str, Any] = Field(description="The datastream spec, as accepted.")
    health: WriterHealthOut | None = Field(
        default=None,
        description="Its writer's health while it is READY (None in other states, and where "
        "the response does not compute it: after a command).",
    )
    warnings: list[str] = Field(
        default_factory=list,
        description="Things to look at that did not stop the request (create: the source "
        "could not be reached).",
    )

    @classmethod
    def of(
        cls,
        rec: DatastreamRecord,
        *,
        health: WriterHealthOut | None = None,
        warnings: list[str] | None = None,
        tables: list[str] | None = None,
    ) -> DatastreamOut:
        multi = rec.spec.multi_table
        table = None if multi else rec.spec.table_name
        return cls(
            table=table,
            tables=tables if tables is not None else ([] if table is None else [table]),
            health=health,
            warnings=warnings or [],
            **rec.to_dict(),
        )


class ChangeOut(_Out):
    """One compatible change an update makes (or would make, with ``dry_run``)."""

    kind: Literal["add", "widen", "retention", "topic", "setting"]
    column: str | None = Field(
        description="The column (add, widen), the topic added (topic) or the field (setting)."
    )
    old: str | None
    new: str | None
    table: str | None = Field(
        default=None, description="The table changed, of a datastream that writes several."
    )
    description: str = Field(examples=["+ column discount double", "~ column qty int -> long"])

    @classmethod
    def of(cls, change: Change) -> ChangeOut:
        return cls.model_validate(change.to_dict())


class DatastreamUpdateOut(_Out):
    datastream: DatastreamOut = Field(description="The record after the update.")
    changes: list[ChangeOut] = Field(description="Empty: the spec was already this one.")
    dry_run: bool = Field(description="True: checked only, nothing was written.")
    schema_version: int | None = Field(
        description="The table's schema version (None before the leader created the table)."
    )


class SegmentOut(_Out):
    name: str = Field(description="table__partition__seq", examples=["orders__0__12"])
    partition: int
    seq: int
    start_offset: int
    end_offset: int = Field(description="Exclusive.")
    state: str
    rows: int
    size_bytes: int
    file: str | None
    created_at: float

    @classmethod
    def of(cls, e: Entry) -> SegmentOut:
        return cls(
            name=e.name,
            partition=e.partition,
            seq=e.seq,
            start_offset=e.start,
            end_offset=e.end,
            state=e.state.value,
            rows=e.row_count,
            size_bytes=e.size_bytes,
            file=e.file_path,
            created_at=e.created_at,
        )


class PartitionSegmentsOut(_Out):
    partition: int
    segments: list[SegmentOut]
    delete_vectors: int = Field(
        0, description="Delete vectors of the partition's sealed segments in this version."
    )
    deleted_rows: int = Field(
        0, description="Sealed rows the delete vectors mark as superseded (readers skip them)."
    )


class TableSegmentsOut(_Out):
    table: str
    manifest_version: int
    segment_count: int
    row_count: int = Field(
        description="Row versions stored in the segments, minus the rows delete vectors mark "
        "superseded; a keyed table's unsealed segments hold every version of a key (see "
        "live_rows)."
    )
    live_rows: int | None = Field(
        default=None,
        description="Rows a read of the table returns (each key's versions merged, deleted "
        "keys dropped): millstream_table_rows' figure. None while its first count runs.",
    )
    deleted_rows: int = Field(0, description="Rows marked superseded by delete vectors.")
    partitions: list[PartitionSegmentsOut]


class ServingWorkerOut(_Out):
    worker_id: str
    role: str = Field(examples=["active", "standby"])
    alive: bool = Field(description="Heartbeating within the worker TTL.")
    running: bool = Field(description="The worker reports the writer running.")


class PartitionConsumingOut(_Out):
    partition: int
    current_offset: int | None = Field(description="The shard upper: first offset not committed.")
    latest_upstream_offset: int | None = Field(description="null if the source did not answer.")
    records_lag: int | None
    availability_lag_ms: int | None = Field(
        description="0 when caught up; else now minus the last commit that advanced the shard."
    )
    ingestion_delay_ms: int | None = Field(
        None,
        description="Pinot's realtimeIngestionDelayMs: 0 when caught up (the source's latest "
        "offset is the shard upper); else now minus last_record_timestamp_ms. null if that "
        "is unknown.",
    )
    last_record_timestamp_ms: int | None = Field(
        None,
        description="Epoch ms of the last committed record: Kafka's record timestamp, or the "
        "time the writer read it for a source without one (files, generator).",
    )
    last_commit_at: float | None
    latest_segment: str | None
    consuming_segments: int = Field(description="Segments still CONSUMING (not sealed).")
    serving_workers: list[ServingWorkerOut]
    error: str | None = Field(description="Why the upstream offset is unknown.")


class PartitionOffsetInfoOut(_Out):
    """Pinot's ``partitionOffsetInfo`` maps, keyed by partition."""

    current_offsets_map: dict[str, int | None]
    latest_upstream_offset_map: dict[str, int | None]
    records_lag_map: dict[str, int | None]
    availability_lag_ms_map: dict[str, int | None]


class PinotPartitionOffsetInfoOut(_Out):
    """Pinot's ``partitionOffsetInfo`` of one consumer: maps keyed by partition, values as
    strings (as Pinot sends them)."""

    currentOffsetsMap: dict[str, str]
    latestUpstreamOffsetMap: dict[str, str | None]
    recordsLagMap: dict[str, str | None]
    availabilityLagMsMap: dict[str, str | None]


class ConsumingInfoOut(_Out):
    """Pinot's ``ConsumingSegmentInfo``: one server (here a worker) consuming a segment."""

    serverName: str = Field(description="The worker id.")
    consumerState: str = Field(examples=["CONSUMING", "NOT_CONSUMING"])
    lastConsumedTimestamp: int | None = Field(
        description="Epoch ms of the last commit that advanced the partition."
    )
    partitionToOffsetMap: dict[str, str] = Field(description="Deprecated in Pinot; kept.")
    partitionOffsetInfo: PinotPartitionOffsetInfoOut


class ConsumingSegmentsInfoOut(_Out):
    """Millstream's fields (snake_case) and Pinot's (camelCase, and
    ``_segmentToConsumingInfoMap``): the segment each partition is consuming into, only while
    a worker runs its writer, so a paused table's map is empty, as Pinot's is."""

    table: str
    datastream: str | None
    state: State | None
    manifest_version: int
    upstream_error: str | None
    partitions: list[PartitionConsumingOut]
    partition_offset_info: PartitionOffsetInfoOut
    serversFailingToRespond: int = 0
    serversUnparsableRespond: int = 0
    segment_to_consuming_info_map: dict[str, list[ConsumingInfoOut]] = Field(
        default_factory=dict,
        serialization_alias="_segmentToConsumingInfoMap",
        description="Pinot's map: consuming segment name -> the workers consuming it.",
    )


class PauseStatusOut(_Out):
    """Pinot's ``PauseStatusDetails``, plus Millstream's ``datastream`` and ``state``."""

    pauseFlag: bool = Field(description="True while the datastream is PAUSED, STOPPING or STOPPED.")
    consumingSegments: list[str] = Field(
        description="Segments still being consumed into (empty once every writer stopped)."
    )
    reasonCode: str | None = Field(examples=["ADMINISTRATIVE"])
    comment: str
    timestamp: str = Field(description="When the datastream entered its state (ISO 8601).")
    datastream: str
    state: State


class WorkerOut(_Out):
    id: str
    url: str | None
    status: str
    alive: bool
    heartbeat_age_s: float
    started_at: float
    heartbeat_at: float
    writers: list[dict[str, Any]] = Field(description="What the worker reported it runs.")
    assignments: list[dict[str, str]] = Field(description="[{datastream, role}] assigned to it.")
    loops: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Its background loops (sealer, maintainer, publishing: its Iceberg "
        "publisher process) as it reported them: runs, "
        "errors, consecutive_failures, last_error, next_attempt_at.",
    )
    shared_query: dict[str, Any] | None = Field(
        default=None,
        description="Its shared query (null when none runs): query_id, run_id (the same "
        "while datastreams join and leave it; a restart changes it), members, generation, "
        "starts, joins, leaves.",
    )


class HealthOut(_Out):
    status: Literal["ok"] = "ok"
    leader: bool
    controller_id: str | None


class ControlSettingsOut(_Out):
    lease_ttl: float
    worker_ttl: float
    takeover_ttl: float
    tick_seconds: float
    stall_seconds: float = Field(
        default=300.0,
        description="A writer whose shard upper has not moved for this long while its source "
        "holds newer records is stalled (reported, restarted with backoff).",
    )
    #: Seconds between two publishes of a table's Iceberg view by its worker (None: off).
    iceberg_publish_interval: float | None = None


class SettingsOut(_Out):
    """What a worker needs to join: the stores (the metadata URL without its password; a
    worker takes it from PGPASSWORD or ~/.pgpass) and the control timings."""

    metadata_url: str
    deep_store: str
    s3_endpoint: str | None
    control: ControlSettingsOut
