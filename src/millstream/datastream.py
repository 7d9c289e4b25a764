"""The datastream spec file: one pipeline from a source into a table. Every field is listed in
docs/spec-reference.md, generated from these models (``python -m millstream.cli.spec_reference``).

Loaded and validated once at the edge; every problem is an InvalidSpecError naming the field
(``source.topic``, ``table.mode``, ``max_records_per_batch`` ...).
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Iterable
from dataclasses import dataclass
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
    dead_letter_name,
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
    topic: str | None = Field(
        default=None, min_length=1, description="The topic to read, every partition of it."
    )
    topics: list[str] | None = Field(
        default=None,
        min_length=1,
        description="Several topics, a table each (named by table.name, a template); "
        "instead of topic.",
    )
    topic_pattern: str | None = Field(
        default=None,
        min_length=1,
        description="A regular expression the whole topic name matches: every such topic, "
        "those created later too, gets a table; instead of topic.",
    )
    topic_poll_interval: str = Field(
        default="30s",
        description="topic_pattern: how often the broker's topics are listed for new matches.",
    )
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
    schema_evolution: Literal["none", "auto"] | None = Field(
        default=None,
        description="auto (avro or protobuf with a schema_registry): a writer schema with fields "
        "the table lacks grows the table (added at the end, nullable; lossless widenings "
        "too) at the batch that first carries it; none: such fields are ignored. Unset: none, "
        "or auto for tables made from the registry (no schema).",
    )
    on_data_loss: Literal["fail", "accept"] = Field(
        default="fail",
        description="Records the broker deleted before they were read (retention): fail stops "
        "the datastream naming the partition and offsets; accept skips them, goes on from the "
        "first offset still held and records the loss (millstream_source_records_lost).",
    )

    @model_validator(mode="after")
    def _check_topics(self) -> KafkaSource:
        given = [f for f in ("topic", "topics", "topic_pattern") if getattr(self, f) is not None]
        if len(given) != 1:
            raise InvalidSpecError(
                f"source.{given[1] if len(given) > 1 else 'topic'}",
                "give exactly one of topic, topics or topic_pattern"
                + (f" (the spec gives {', '.join(given)})" if given else ""),
            )
        if self.topics is not None:
            seen: set[str] = set()
            for i, t in enumerate(self.topics):
                if not t:
                    raise InvalidSpecError(f"source.topics.{i}", "must not be empty")
                if t in seen:
                    raise InvalidSpecError(f"source.topics.{i}", f"lists topic {t!r} twice")
                seen.add(t)
        if self.topic_pattern is not None:
            try:
                re.compile(self.topic_pattern)
            except re.error as exc:
                raise InvalidSpecError(
                    "source.topic_pattern",
                    f"{self.topic_pattern!r} is not a regular expression: {exc}",
                ) from None
        d = parse_duration(self.topic_poll_interval, field="source.topic_poll_interval")
        assert d is not None
        if d.total_seconds() <= 0:
            raise InvalidSpecError("source.topic_poll_interval", "must be positive")
        return self

    @property
    def multi_table(self) -> bool:
        """Several topics (``topics`` or ``topic_pattern``), a table each."""
        return self.topic is None

    def matches(self, topic: str) -> bool:
        """Whether ``topic`` is one of this source's: listed, or matching the pattern whole."""
        if self.topics is not None:
            return topic in self.topics
        if self.topic_pattern is not None:
            return re.fullmatch(self.topic_pattern, topic) is not None
        return topic == self.topic


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
        default=None,
        description="The table's name; default: the datastream's name. With source.topics or "
        "topic_pattern a template of {datastream}, {topic}, {topic_last} (after the last '.') "
        "and {topic_safe} (other characters than letters, digits, '_', '-' as '_'); default "
        "{topic_last}.",
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


class TopicOverride(_Frozen):
    """What one topic's table changes from the datastream's ``table`` section and ``schema``
    (``overrides``, with ``source.topics`` or ``source.topic_pattern``)."""

    name: str | None = Field(
        default=None, description="The table's name instead of the template's."
    )
    mode: MergeMode | None = Field(
        default=None, description="Its merge engine (append drops the primary_key too)."
    )
    primary_key: list[str] | None = Field(default=None, description="Its key columns.")
    comparison_column: str | None = Field(default=None, description="Its comparison column.")
    delete_column: str | None = Field(default=None, description="Its delete column.")
    retention: Retention | None = Field(default=None, description="Its history kept.")
    columns: dict[str, ColumnType] | None = Field(
        default=None, alias="schema", min_length=1, description="Its columns, in order."
    )


#: The variables of a multi-table datastream's table name template (``table.name``).
TEMPLATE_VARIABLES = ("datastream", "topic", "topic_last", "topic_safe")
#: A multi-table datastream's table name template when ``table.name`` is not given.
DEFAULT_TABLE_TEMPLATE = "{topic_last}"
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def check_template(template: str) -> None:
    """``template`` uses only :data:`TEMPLATE_VARIABLES`, plainly (``{topic_last}``)."""
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise InvalidSpecError(
            "table.name", f"{template!r} is not a name template: {exc}"
        ) from None
    used = [f for _, f, _, _ in parts if f is not None]
    for _, f, spec, conv in parts:
        if f is not None and (f not in TEMPLATE_VARIABLES or spec or conv):
            raise InvalidSpecError(
                "table.name",
                f"{{{f}}} is not a variable of a table name template; the variables are "
                + ", ".join(f"{{{v}}}" for v in TEMPLATE_VARIABLES),
            )
    if not used:
        raise InvalidSpecError(
            "table.name",
            f"{template!r} names every topic's table alike; use a variable such as {{topic_last}}",
        )


def table_name_for(template: str, datastream: str, topic: str) -> str:
    """The table name ``template`` gives ``topic`` (see :data:`TEMPLATE_VARIABLES`)."""
    return template.format(
        datastream=datastream,
        topic=topic,
        topic_last=topic.rsplit(".", 1)[-1],
        topic_safe=_UNSAFE.sub("_", topic),
    )


class SegmentsSection(_Frozen):
    flush_rows: int = Field(
        default=500_000,
        ge=1,
        description="Seal a partition's consuming segments at this many rows.",
    )
    flush_seconds: float = Field(
        default=300,
        gt=0,
        description="... or this old, at the latest (seconds, or a duration like 5m); a run a "
        "tenth this old may seal earlier, at its table's own point of the period, so that "
        "tables started together do not all seal at once.",
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
        alias="schema",
        default_factory=dict,
        description="Column name -> type, in order. Required, except for a multi-table "
        "source with a schema_registry, Debezium Avro or Protobuf: each topic's table is then "
        "made from its writer schemas.",
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
        default="500ms",
        description=(
            "At most one micro-batch per this interval while records flow, like 500ms or 5s. "
            "An idle datastream starts its batch within a tick of records arriving (a fifth "
            "of the interval, at least 100 ms: 100 ms for 500ms)."
        ),
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
    overrides: dict[str, TopicOverride] = Field(
        default_factory=dict,
        description="source.topics or topic_pattern: per topic (its full name), what its table "
        "changes from table and schema.",
    )

    @field_validator("columns")
    @classmethod
    def _types(cls, v: dict[str, str]) -> dict[str, str]:
        return normalize_columns(v)

    @model_validator(mode="before")
    @classmethod
    def _evolution_default(cls, data: Any) -> Any:
        """``source.schema_evolution`` unset is ``none`` wherever a ``schema`` is given (as it
        always was), so a spec stored before and one sent now compare equal; it stays unset
        only for tables made from the registry (:attr:`schema_from_registry`: auto)."""
        if not isinstance(data, dict) or not data.get("schema"):
            return data
        source = data.get("source")
        if (
            isinstance(source, dict)
            and source.get("kind") == "kafka"
            and source.get("schema_evolution") is None
        ):
            data = {**data, "source": {**source, "schema_evolution": "none"}}
        return data

    @model_validator(mode="after")
    def _check(self) -> DatastreamSpec:
        if not DATASTREAM_NAME_RE.match(self.name):
            raise InvalidSpecError("name", f"{self.name!r} must match [a-z0-9][a-z0-9_-]{{0,63}}")
        parse_duration(self.trigger_interval, field="trigger_interval")
        if not self.columns and not self._schema_from_registry():
            raise InvalidSpecError(
                "schema",
                "is required (column name -> type); only a source with topics or "
                "topic_pattern and a schema_registry, with format avro and envelope debezium "
                "or format protobuf, may leave it out (each table then takes its topic's "
                "writer schema)",
            )
        if self.multi_table:
            self._check_tables()
            return self
        if self.overrides:
            raise InvalidSpecError(
                "overrides", "applies to a source with topics or topic_pattern (a table each)"
            )
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

    def _schema_from_registry(self) -> bool:
        src = self.source
        return (
            isinstance(src, KafkaSource)
            and src.multi_table
            and src.schema_registry is not None
            and (
                (src.envelope == "debezium" and src.format == "avro")
                or (src.envelope is None and src.format == "protobuf")
            )
        )

    @property
    def schema_from_registry(self) -> bool:
        """Each topic's table is made from its writer schemas (no ``schema`` given): the
        columns from the Debezium envelope's row record (Avro) or the value's message
        (plain Protobuf), the key from the record key's schema (unless the table section or
        the topic's override names one), the comparison column from the envelope's
        ``source.ts_ms`` (:data:`SOURCE_TS_COLUMN`, Debezium only, unless the table section
        names one), and later writer schemas grow it (``schema_evolution: auto`` unless the
        source says ``none``)."""
        return not self.columns and self._schema_from_registry()

    def table_name_of(self, topic: str) -> str:
        """The name of ``topic``'s table (its override's, or the template's)."""
        ov = self.overrides.get(topic)
        if ov is not None and ov.name:
            return ov.name
        return table_name_for(self.table.name or DEFAULT_TABLE_TEMPLATE, self.name, topic)

    def _check_tables(self) -> None:
        """A multi-table spec: its template, its overrides, and (``topics``) every topic's
        table, with no two topics mapping to one table."""
        src = self.source
        assert isinstance(src, KafkaSource)
        check_template(self.table.name or DEFAULT_TABLE_TEMPLATE)
        for topic in self.overrides:
            if not src.matches(topic):
                raise InvalidSpecError(
                    f"overrides.{topic}",
                    "is not a topic of source.topics"
                    if src.topics is not None
                    else f"does not match source.topic_pattern {src.topic_pattern!r}",
                )
        if self.schema_from_registry:
            return  # each table's columns and key come from its topic's writer schemas
        tables = self.tables(src.topics or list(self.overrides))
        if tables.refused:
            topic, error = next(iter(tables.refused.items()))
            raise error
        if src.topic_pattern is not None and not self.overrides:
            # the table section and the schema, checked on a topic of the pattern's shape
            self.table_for("topic")

    @property
    def multi_table(self) -> bool:
        """A table per topic (``source.topics`` or ``source.topic_pattern``): the tables are
        those of :meth:`tables`, each written as its single-topic spec (:meth:`table_for`)."""
        return isinstance(self.source, KafkaSource) and self.source.multi_table

    def table_for(self, topic: str, derived: DerivedTable | None = None) -> DatastreamSpec:
        """The spec of ``topic``'s table in a multi-table datastream: this spec with
        ``source.topic`` set, the table named by the template (or the override) and the
        topic's override applied. Same datastream name: the datastream owns the table. An
        error names the topic (and ``overrides.<topic>.<field>`` for an override's field).
        With :attr:`schema_from_registry`, ``derived`` is the table's columns and key (from
        its writer schemas, or the table as it is stored)."""
        src = self.source
        assert isinstance(src, KafkaSource)
        data = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        data.pop("overrides", None)
        source = data["source"]
        source.pop("topics", None)
        source.pop("topic_pattern", None)
        source["topic"] = topic
        table = data.get("table") or {}
        ov = self.overrides.get(topic)
        given = ov.model_dump(mode="json", by_alias=True, exclude_none=True) if ov else {}
        given.pop("name", None)
        table["name"] = self.table_name_of(topic)
        if self.schema_from_registry:
            if derived is None:
                raise InvalidSpecError(
                    "schema", f"topic {topic!r}: the registry holds no writer schema for it yet"
                )
            data["schema"] = dict(derived.columns)
            mode = given.get("mode") or table.get("mode") or "append"
            if not table.get("primary_key") and mode != "append":
                if not derived.key and not given.get("primary_key"):
                    raise InvalidSpecError(
                        "table.primary_key",
                        f"topic {topic!r}: the registry holds no record key schema "
                        f"({topic}-key) to take the key from; give table.primary_key or "
                        f"overrides.{topic}.primary_key",
                    )
                table["primary_key"] = list(derived.key)
            if src.envelope == "debezium" and not table.get("comparison_column"):
                # the change's time in the database orders a key's versions
                data["schema"][SOURCE_TS_COLUMN] = "long"
                table["comparison_column"] = SOURCE_TS_COLUMN
                source["metadata_columns"] = {
                    **source.get("metadata_columns", {}),
                    "source_ts_ms": SOURCE_TS_COLUMN,
                }
            if src.schema_evolution is None:
                source["schema_evolution"] = "auto"
        if "schema" in given:
            data["schema"] = given.pop("schema")
        if given.get("mode") == "append" and "primary_key" not in given:
            table["primary_key"] = []
        table.update(given)
        data["table"] = table
        try:
            return DatastreamSpec.parse(data)
        except InvalidSpecError as exc:
            field = exc.field
            leaf = field.split(".", 1)[-1] if field.startswith("table.") else field
            if ov is not None and (
                leaf.split(".")[0] in (ov.model_dump(by_alias=True, exclude_none=True))
            ):
                field = f"overrides.{topic}.{leaf}"
            raise InvalidSpecError(
                field, f"topic {topic!r}: {exc.message.split(': ', 1)[-1]}"
            ) from None

    def tables(
        self,
        topics: Iterable[str],
        derive: Callable[[str, str], DerivedTable | None] | None = None,
    ) -> TopicTables:
        """The tables of ``topics`` (those of the source among them): table name -> its spec
        (:meth:`table_for`). A topic whose table cannot be made (an invalid name, a bad
        override) or whose table name another topic maps to already (the earlier topic in
        name order keeps it) is refused, with the error naming it (and the other topic).
        With :attr:`schema_from_registry`, ``derive(topic, table)`` gives each table's columns
        and key; a topic it has none for yet (None) is left out until it has."""
        src = self.source
        assert isinstance(src, KafkaSource)
        out: dict[str, DatastreamSpec] = {}
        topic_of: dict[str, str] = {}
        refused: dict[str, InvalidSpecError] = {}
        for topic in sorted(set(topics)):
            if not src.matches(topic):
                continue
            try:
                derived = None
                if self.schema_from_registry:
                    derived = derive(topic, self.table_name_of(topic)) if derive else None
                    if derived is None:
                        continue
                member = self.table_for(topic, derived)
            except InvalidSpecError as exc:
                refused[topic] = exc
                continue
            name = member.table_name
            # a table's name, or its dead-letter table's, taken by another topic's table
            taken = [n for n in (name, member.dead_letter_table) if n in topic_of]
            if name.endswith("__dead_letter") and name.removesuffix("__dead_letter") in topic_of:
                taken.append(name.removesuffix("__dead_letter"))
            if taken:
                both = f"topics {topic_of[taken[0]]!r} and {topic!r}"
                refused[topic] = InvalidSpecError(
                    "table.name",
                    (
                        f"{both} both map to table {name!r}"
                        if taken[0] == name
                        else f"{both} map to tables {taken[0]!r} and {name!r}, one the other's "
                        "dead-letter table"
                    )
                    + "; change the template or give one of them a name in overrides",
                )
                continue
            out[name] = member
            topic_of[name] = topic
        return TopicTables(out, refused)

    def declared_tables(self) -> dict[str, DatastreamSpec]:
        """The tables known from the spec alone, name -> the single-topic spec that writes it:
        its one table, or every listed topic's (``source.topics``); none for a
        ``topic_pattern``, whose tables come as the worker finds its topics."""
        if not self.multi_table:
            return {self.table_name: self}
        assert isinstance(self.source, KafkaSource)
        if self.schema_from_registry:
            return {}  # made as the worker finds each topic's writer schemas
        return self.tables(self.source.topics or []).members

    @property
    def table_name(self) -> str:
        if self.multi_table:
            raise InvalidSpecError(
                "table.name",
                f"datastream {self.name!r} writes a table per topic: ask for a topic's table "
                "(DatastreamSpec.tables)",
            )
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
        self.table_name  # noqa: B018  (a multi-table spec has a table per topic)
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
    def parse_stored(cls, data: Any) -> DatastreamSpec:
        """A spec read back from the metadata store. One stored before ``segments.pauseless:
        false`` was removed loads with the field dropped (its segments are now sealed in the
        background, as every table's are) instead of failing every read of the store's
        datastreams; a spec sent by a user is still refused naming the field (:meth:`parse`)."""
        segments = data.get("segments") if isinstance(data, dict) else None
        if isinstance(segments, dict) and segments.get("pauseless") is False:
            data = {**data, "segments": {k: v for k, v in segments.items() if k != "pauseless"}}
        return cls.parse(data)

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


#: The column a table made from Debezium writer schemas orders a key's changes by: the
#: envelope's ``source.ts_ms`` (when the change happened in the database).
SOURCE_TS_COLUMN = "_source_ts_ms"


@dataclass(frozen=True)
class DerivedTable:
    """A multi-table datastream's table as its topic's writer schemas make it: the Debezium
    row record's (or the Protobuf message's) fields as columns, in order, and the record
    key's fields as the key (none: the registry holds no key schema)."""

    columns: dict[str, str]
    key: tuple[str, ...]


@dataclass(frozen=True)
class TopicTables:
    """A multi-table datastream's tables for some topics (:meth:`DatastreamSpec.tables`)."""

    #: table name -> the single-topic spec that writes it
    members: dict[str, DatastreamSpec]
    #: topic -> why it has no table (a collision, an invalid name or override)
    refused: dict[str, InvalidSpecError]

    def topics(self) -> dict[str, str]:
        """table name -> its topic."""
        out: dict[str, str] = {}
        for name, m in self.members.items():
            assert isinstance(m.source, KafkaSource) and m.source.topic is not None
            out[name] = m.source.topic
        return out


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
            "name": dead_letter_name(name),
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
