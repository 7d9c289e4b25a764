"""The datastream spec file: one pipeline from a source into a table. Every field is listed in
docs/spec-reference.md, generated from these models (``python -m millstream.cli.spec_reference``).

Loaded and validated once at the edge; every problem is an InvalidSpecError naming the field
(``source.topic``, ``table.mode``, ``max_records_per_batch`` ...).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from millstream.errors import InvalidSpecError
from millstream.spec import (
    ColumnType,
    MergeMode,
    PartialStrategy,
    Retention,
    TableSpec,
    _first_error,
    normalize_columns,
    parse_duration,
)
from millstream.types import is_nested

DATASTREAM_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
_SIZE_RE = re.compile(r"^(\d+)\s*(B|KiB|MiB|GiB|KB|MB|GB)?$")
_SIZES = {
    None: 1,
    "B": 1,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
}


def parse_size(value: str | int) -> int:
    if isinstance(value, int):
        return value
    m = _SIZE_RE.match(value.strip())
    if not m:
        raise ValueError(f"{value!r} is not a size like 256MiB")
    return int(m.group(1)) * _SIZES[m.group(2)]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SchemaRegistry(_Frozen):
    """A Confluent-compatible schema registry (schemas fetched by id, cached by id)."""

    url: str = Field(pattern=r"^https?://", description="http(s)://host:port")
    basic_auth_user_info: str | None = Field(default=None, description="user:password")
    max_wait_seconds: float = Field(
        default=300, gt=0, description="How long a batch waits for a registry that is down."
    )


class _SchemaFormat(_Frozen):
    """The fields of a schema'd format (avro, protobuf) shared by the sources that carry it."""

    schema_registry: SchemaRegistry | None = Field(
        default=None,
        description="avro or protobuf: values in the Confluent wire format, schemas fetched "
        "by id (GET /schemas/ids/{id}) and cached.",
    )
    schema_file: str | None = Field(
        default=None, description="A fixed schema: .avsc, or a .desc FileDescriptorSet."
    )
    message_type: str | None = Field(
        default=None, description="Protobuf with schema_file: the message's full name."
    )
    framing: Literal["confluent", "none"] | None = Field(
        default=None,
        description="Values carry the wire header (default with a registry) or not (default "
        "with a schema_file).",
    )

    @model_validator(mode="after")
    def _check_format(self) -> Any:
        fmt = getattr(self, "format", "json")
        if fmt in ("json", "csv"):
            for name in ("schema_registry", "schema_file", "message_type", "framing"):
                if getattr(self, name) is not None:
                    raise InvalidSpecError(f"source.{name}", f"is for avro or protobuf, not {fmt}")
            return self
        if (self.schema_registry is None) == (self.schema_file is None):
            raise InvalidSpecError(
                "source.schema_registry", f"format {fmt} needs a schema_registry or a schema_file"
            )
        if self.schema_registry is not None and self.framing == "none":
            raise InvalidSpecError(
                "source.framing", "values read through a schema_registry carry its wire header"
            )
        if fmt == "protobuf" and self.schema_file is not None and not self.message_type:
            raise InvalidSpecError(
                "source.message_type", "is required for protobuf with a schema_file"
            )
        return self


#: Kafka record fields ``source.metadata_columns`` can put in a column, with the column types
#: each may fill (``headers`` is a JSON object as a string: the table has no nested types).
KAFKA_METADATA: dict[str, tuple[str, ...]] = {
    "timestamp": ("timestamp", "long"),
    "key": ("binary", "string"),
    "headers": ("string",),
    "topic": ("string",),
    "partition": ("int", "long"),
    "offset": ("long",),
}
#: Debezium envelope fields (``source.envelope: debezium``) likewise: ``source_ts_ms`` is the
#: envelope's ``source.ts_ms`` (when the change happened in the database).
DEBEZIUM_METADATA: dict[str, tuple[str, ...]] = {
    "op": ("string",),
    "ts_ms": ("long", "timestamp"),
    "source_ts_ms": ("long", "timestamp"),
}


class KafkaSource(_SchemaFormat):
    kind: Literal["kafka"] = Field(description="A Kafka-protocol topic.")
    bootstrap_servers: str = Field(min_length=1, description="host:port[,host:port]")
    topic: str = Field(min_length=1, description="The topic to read, every partition of it.")
    format: Literal["json", "avro", "protobuf"] = Field(
        default="json",
        description="How values are decoded; avro and protobuf need a schema_registry or a "
        "schema_file.",
    )
    key_field: str | None = Field(
        default=None, description="Accepted and not read: keys are the primary_key columns."
    )
    starting_offsets: Literal["earliest", "latest"] = Field(
        default="earliest",
        description="Where a new datastream starts in each partition; afterwards it resumes "
        "at the shard uppers.",
    )
    options: dict[str, str] = Field(default_factory=dict, description="Passed to the client.")
    envelope: Literal["debezium"] | None = Field(
        default=None,
        description="debezium: values are Debezium change events (op c/r/u upserts after, "
        "d deletes before's key); keyed tables only.",
    )
    metadata_columns: dict[str, str] = Field(
        default_factory=dict,
        description="Record fields into columns the schema declares: {timestamp, key, headers, "
        "topic, partition, offset; with the debezium envelope op, ts_ms, source_ts_ms: column}.",
    )
    schema_evolution: Literal["none", "auto"] = Field(
        default="none",
        description="auto (avro or protobuf with a schema_registry): a writer schema with fields "
        "the table lacks grows the table (added at the end, nullable; lossless widenings "
        "too) at the batch that first carries it; none: such fields are ignored.",
    )
    on_data_loss: Literal["fail", "accept"] = Field(
        default="fail",
        description="Records the broker deleted before they were read (retention): fail stops "
        "the datastream naming the partition and offsets; accept skips them, goes on from the "
        "first offset still held and records the loss (millstream_source_records_lost).",
    )


class FilesSource(_Frozen):
    kind: Literal["files"] = Field(
        description="A directory of JSON-lines or CSV files, one subdirectory per partition."
    )
    path: str = Field(min_length=1, description="Directory with one subdirectory per partition.")
    format: Literal["json", "csv"] = Field(
        default="json", description="json: JSON lines; csv: a header row per file."
    )
    key_field: str | None = Field(
        default=None, description="Accepted and not read: keys are the primary_key columns."
    )
    starting_offsets: Literal["earliest", "latest"] = Field(
        default="earliest",
        description="Where a new datastream starts in each partition; afterwards it resumes "
        "at the shard uppers.",
    )


class GeneratorSource(_Frozen):
    kind: Literal["generator"] = Field(
        description="Deterministic generated records (demo, benchmarks)."
    )
    seed: int = Field(default=0, description="The same seed generates the same records.")
    partitions: int = Field(default=4, ge=1, le=1024, description="Source partitions.")
    rate: float = Field(default=0, ge=0, description="Rows/s over all partitions; 0 = unthrottled.")
    total: int | None = Field(default=None, ge=0, description="Stop after this many rows in all.")
    key_cardinality: int = Field(default=10_000, ge=1, description="Distinct keys generated.")
    update_fraction: float = Field(
        default=0.3, ge=0, le=1, description="Share of records that update an earlier key."
    )
    delete_fraction: float = Field(
        default=0.02, ge=0, le=1, description="Share of records that delete a key."
    )
    duplicate_fraction: float = Field(
        default=0.02, ge=0, le=1, description="Share of records that repeat an earlier record."
    )
    malformed_fraction: float = Field(
        default=0.0, ge=0, le=1, description="Share of records that cannot be decoded."
    )
    format: Literal["json"] = Field(default="json", description="Always JSON.")
    key_field: str | None = Field(
        default=None, description="Accepted and not read: keys are the primary_key columns."
    )
    starting_offsets: Literal["earliest", "latest"] = Field(
        default="earliest",
        description="Where a new datastream starts in each partition; afterwards it resumes "
        "at the shard uppers.",
    )


SourceSpec = Annotated[KafkaSource | FilesSource | GeneratorSource, Field(discriminator="kind")]


class TableSection(_Frozen):
    name: str | None = Field(
        default=None, description="The table's name; default: the datastream's name."
    )
    primary_key: list[str] = Field(
        default_factory=list, description="Key columns (dedup, upsert, partial; not append)."
    )
    mode: MergeMode = Field(
        default="append",
        description="Merge engine: append keeps every row; dedup the first row of a key; "
        "upsert the last; partial merges a key's rows column by column.",
    )
    comparison_column: str | None = Field(
        default=None,
        description="Orders rows of one key (ties: the later offset wins). A delete without a "
        "value takes its key's highest earlier value in its partition; any other record must "
        "carry it (else dead-lettered).",
    )
    delete_column: str | None = Field(
        default=None, description="Boolean column; true deletes the key (keyed modes)."
    )
    dedup_ttl: str | None = Field(
        default=None, description="dedup only: a duplicate within this window of time_column."
    )
    time_column: str | None = Field(
        default=None, description="Event-time column (timestamp, long or date) for dedup_ttl."
    )
    partial: dict[str, PartialStrategy] = Field(
        default_factory=dict,
        description="partial only: column -> strategy; unlisted columns use ignore_null.",
    )
    retention: Retention | None = Field(
        default=None,
        description="History kept for time travel, for the table and its dead-letter table "
        "(may change with datastream update).",
    )
    partitioned_by_key: bool = Field(
        default=False,
        description="Keyed modes: every record of a key arrives on one source partition, so "
        "reads merge each partition alone and a sealed upsert partition needs no merge.",
    )


class SegmentsSection(_Frozen):
    flush_rows: int = Field(
        default=500_000,
        ge=1,
        description="Seal a partition's consuming segments at this many rows.",
    )
    flush_seconds: float = Field(
        default=300, gt=0, description="... or this old (seconds, or a duration like 5m)."
    )
    flush_bytes: int = Field(
        default=256 * 1024**2, ge=1, description="... or this large (bytes, or a size like 256MiB)."
    )
    pauseless: bool = Field(
        default=True,
        description="Deprecated, true only: segments are always sealed in the background while "
        "ingestion commits. false (sealing inside the micro-batch's commit) was removed and is "
        "refused; leave the field out.",
    )

    @field_validator("pauseless")
    @classmethod
    def _pauseless_only(cls, value: bool) -> bool:
        if not value:
            raise InvalidSpecError(
                "segments.pauseless",
                "false is no longer supported: segments are always sealed in the background "
                "while ingestion commits (a micro-batch never waits for a seal); remove the field",
            )
        return value

    #: Merge a partition's sealed segments in the background (:mod:`millstream.sealing.compaction`):
    #: ``compaction_min_segments`` of similar size at a time; segments with
    #: ``compaction_max_rows`` live rows are not merged again.
    compaction: bool = Field(
        default=True, description="Merge a partition's sealed segments in the background."
    )
    compaction_min_segments: int = Field(
        default=4, ge=2, le=64, description="Sealed segments of similar size merged at a time."
    )
    compaction_max_rows: int = Field(
        default=4_000_000,
        ge=1,
        description="A segment with this many live rows is not merged again.",
    )

    @model_validator(mode="before")
    @classmethod
    def _units(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            if "flush_bytes" in data:
                data["flush_bytes"] = parse_size(data["flush_bytes"])
            if isinstance(data.get("flush_seconds"), str):
                d = parse_duration(data["flush_seconds"], field="segments.flush_seconds")
                assert d is not None
                data["flush_seconds"] = d.total_seconds()
        return data


class DatastreamSpec(_Frozen):
    name: str = Field(description="[a-z0-9][a-z0-9_-]{0,63}")
    source: SourceSpec = Field(description="Where records come from, by kind.")
    table: TableSection = Field(
        default_factory=TableSection, description="The table written and its merge engine."
    )
    columns: dict[str, ColumnType] = Field(
        alias="schema", min_length=1, description="Column name -> type, in order."
    )
    segments: SegmentsSection = Field(
        default_factory=SegmentsSection, description="When segments are sealed and compacted."
    )
    #: records per micro-batch at most; unset, the batch budget adapts (what the write tasks
    #: hold in ``task_memory_mb`` each: large batches while behind, small ones once caught up)
    max_records_per_batch: int | None = Field(
        default=None, ge=1, le=50_000_000, description="Records per micro-batch at most."
    )
    #: memory a write task may fill with its decoded rows, for the adaptive batch budget
    task_memory_mb: int = Field(
        default=512,
        ge=16,
        le=65_536,
        description="Memory a write task fills with decoded rows (sizes batches while behind).",
    )
    trigger_interval: str = Field(
        default="500ms", description="Time between micro-batches, like 500ms or 5s."
    )
    replicas: int = Field(
        default=1, ge=1, le=16, description="Writers per datastream under a controller."
    )
    replica_mode: Literal["standby", "active-active"] = Field(
        default="standby",
        description="standby: one replica commits, the others take over when its worker stops "
        "heartbeating; active-active: every replica commits (compare-and-append decides).",
    )
    bad_records: Literal["dead_letter", "fail"] = Field(
        default="dead_letter",
        description="dead_letter: a record that cannot be decoded goes to <table>__dead_letter "
        "and the frontier moves on; fail: the batch stops, naming partition and offset.",
    )

    @field_validator("columns")
    @classmethod
    def _types(cls, v: dict[str, str]) -> dict[str, str]:
        return normalize_columns(v)

    @model_validator(mode="after")
    def _check(self) -> DatastreamSpec:
        if not DATASTREAM_NAME_RE.match(self.name):
            raise InvalidSpecError("name", f"{self.name!r} must match [a-z0-9][a-z0-9_-]{{0,63}}")
        parse_duration(self.trigger_interval, field="trigger_interval")
        table = self.table_spec()  # validates the table section against the schema
        if isinstance(self.source, KafkaSource):
            _check_envelope(self.source, table)
        if self.source.format == "csv":
            for c, t in self.columns.items():
                if is_nested(t):
                    raise InvalidSpecError(
                        f"schema.{c}",
                        f"{t} cannot be read from csv (a CSV field is flat text); "
                        "use format json, avro or protobuf for nested columns",
                    )
        return self

    @property
    def table_name(self) -> str:
        return self.table.name or self.name

    @property
    def dead_letter_table(self) -> str:
        return f"{self.table_name}__dead_letter"

    @property
    def trigger_seconds(self) -> float:
        d = parse_duration(self.trigger_interval, field="trigger_interval")
        assert d is not None
        return d.total_seconds()

    def table_spec(self) -> TableSpec:
        data = self.table.model_dump(exclude_none=True)
        data["name"] = self.table_name
        data["schema"] = dict(self.columns)
        return TableSpec.parse(data)

    @classmethod
    def parse(cls, data: Any) -> DatastreamSpec:
        if not isinstance(data, dict):
            raise InvalidSpecError("spec", "must be a mapping (YAML object)")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise _first_error(exc, prefix="", model=cls) from None

    @classmethod
    def from_yaml(cls, text: str) -> DatastreamSpec:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise InvalidSpecError("spec", f"is not valid YAML: {exc}") from None
        return cls.parse(data)

    @classmethod
    def from_file(cls, path: str | Path) -> DatastreamSpec:
        p = Path(path)
        if not p.is_file():
            raise InvalidSpecError("file", f"{str(p)!r} does not exist")
        return cls.from_yaml(p.read_text())


def _check_envelope(source: KafkaSource, table: TableSpec) -> None:
    """``source.envelope`` and ``source.metadata_columns`` against the table."""
    if source.schema_evolution == "auto" and (
        source.format not in ("avro", "protobuf") or source.schema_registry is None
    ):
        raise InvalidSpecError(
            "source.schema_evolution",
            "auto needs format avro or protobuf with a schema_registry (the writer schema of "
            f"each record is what the table grows to); not format {source.format}"
            + ("" if source.format == "json" else " with a schema_file"),
        )
    if source.envelope == "debezium":
        if source.schema_evolution == "auto":
            raise InvalidSpecError(
                "source.schema_evolution",
                "auto is not supported with the debezium envelope yet (the writer schema is "
                "the envelope's, whose row record is nested in before/after); update the "
                "table's schema with millstream datastream update",
            )
        if not table.keyed:
            raise InvalidSpecError(
                "source.envelope",
                f"debezium needs a keyed table (table.mode upsert, partial or dedup with a "
                f"primary_key), not {table.mode}: an append table cannot apply a delete",
            )
        if source.format not in ("json", "avro"):
            raise InvalidSpecError(
                "source.envelope",
                f"debezium is supported with format json or avro only, not {source.format}",
            )
    allowed = {**KAFKA_METADATA, **(DEBEZIUM_METADATA if source.envelope else {})}
    seen: dict[str, str] = {}
    for name, column in source.metadata_columns.items():
        where = f"source.metadata_columns.{name}"
        if name not in allowed:
            extra = " (with source.envelope: debezium)" if name in DEBEZIUM_METADATA else ""
            raise InvalidSpecError(
                where, f"is not a record field{extra}; one of {', '.join(sorted(allowed))}"
            )
        types = allowed[name]
        if column not in table.columns:
            raise InvalidSpecError(
                where, f"column {column!r} is not in the schema: declare it as {' or '.join(types)}"
            )
        if table.columns[column] not in types:
            raise InvalidSpecError(
                where,
                f"column {column!r} is {table.columns[column]}; {name} fits {' or '.join(types)}",
            )
        if column in table.primary_key:
            raise InvalidSpecError(
                where, f"column {column!r} is a primary key column; a key comes from the record"
            )
        if column in seen:
            raise InvalidSpecError(where, f"column {column!r} is also {seen[column]}'s column")
        seen[column] = name


def dead_letter_spec(table: str | TableSpec) -> TableSpec:
    """The dead-letter table of ``table``: every record that could not be decoded or validated.

    Given the table's spec, it keeps the same history (``retention``): it gets a version per
    micro-batch like its table, so the default 24 hours would keep a day of versions and their
    manifest rows however short the table's own window is."""
    name = table if isinstance(table, str) else table.name
    retention = {} if isinstance(table, str) else {"retention": table.retention.model_dump()}
    return TableSpec.parse(
        {
            "name": f"{name}__dead_letter",
            **retention,
            "mode": "append",
            "schema": {
                "partition": "int",
                "offset": "long",
                "raw": "binary",
                "key": "binary",
                "error": "string",
                "failed_at": "timestamp",
            },
        }
    )
