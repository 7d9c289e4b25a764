"""The typed options between the runner, the stream source and the sink.

Spark hands a data source nothing but string options, with lower-cased keys. Every option
Millstream passes is a field of one of the frozen dataclasses here, written by ``to_options``
and read back by ``from_options``; no other module reads or writes a Millstream option key.

* :class:`SourceOptions`: which source (kind + config), where to start, the batch budget.
* :class:`SinkOptions`: the table, the epochs the writer was started at, what to do with bad
  records, the source the sink reads ranges of.
* :class:`CommitGate`: in both when a worker runs a writer as one replica of several: a
  standby commits (and plans past the shard uppers) only when the active is gone.
* :class:`GroupSourceOptions` / :class:`GroupSinkOptions`: several datastreams in one query
  (a worker's shared query), one member's source or sink options per datastream.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from millstream.errors import InvalidSpecError
from millstream.ingest.sources import PartitionReader, reader_for
from millstream.ingest.sources.base import decode_offsets, encode_offsets
from millstream.table.limits import MAX_STAGED_AGE_SECONDS

if TYPE_CHECKING:  # the source process (every query start) does without pydantic
    from millstream.config import Settings
    from millstream.spec import TableSpec


class Options(dict[str, str]):
    """Options looked up case-insensitively (Spark lower-cases the keys it hands over)."""

    def __init__(self, raw: Mapping[Any, Any] | None = None) -> None:
        super().__init__({str(k).lower(): str(v) for k, v in dict(raw or {}).items()})

    def get(self, key: str, default: Any = None) -> Any:
        return super().get(key.lower(), default)

    def __getitem__(self, key: str) -> str:
        return super().__getitem__(key.lower())

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and super().__contains__(key.lower())


def _json(options: Options, key: str, default: Any) -> Any:
    raw = options.get(key)
    if raw in (None, ""):
        return default
    try:
        return json.loads(raw)
    except ValueError:
        raise InvalidSpecError(key, f"is not valid JSON: {raw[:80]!r}") from None


def _int(options: Options, key: str, default: int) -> int:
    raw = options.get(key)
    try:
        return default if raw in (None, "") else int(raw)
    except ValueError:
        raise InvalidSpecError(key, f"{raw!r} is not an integer") from None


def _float(options: Options, key: str, default: float) -> float:
    raw = options.get(key)
    try:
        return default if raw in (None, "") else float(raw)
    except ValueError:
        raise InvalidSpecError(key, f"{raw!r} is not a number") from None


@dataclass(frozen=True, slots=True)
class CommitGate:
    """A writer that is one replica of several (standby mode): it may commit only while it is
    the active or the active's worker has not heartbeaten for ``takeover_ttl`` seconds. ``table`` is the writer's
    table, whose shard uppers a standby's source follows."""

    datastream: str
    worker: str
    table: str
    #: seconds without a heartbeat of the active's worker after which this replica commits
    takeover_ttl: float = 1.5

    def to_options(self) -> dict[str, str]:
        return {
            "gateDatastream": self.datastream,
            "gateWorker": self.worker,
            "gateTable": self.table,
            "gateTakeoverTtl": repr(self.takeover_ttl),
        }

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> CommitGate | None:
        o = Options(options)
        if not o.get("gateDatastream"):
            return None
        if not o.get("gateWorker") or not o.get("gateTable"):
            raise InvalidSpecError("gateWorker", "a commit gate names its worker and table")
        return cls(
            o["gateDatastream"],
            o["gateWorker"],
            o["gateTable"],
            float(o.get("gateTakeoverTtl") or 1.5),
        )


#: A partition's range is split over several write tasks (when a batch has fewer partitions
#: than tasks) only into pieces of at least this many records: a task costs its Python
#: workers ~0.1-0.2 CPU-s whatever it holds, which a smaller piece would not repay, and a
#: caught-up datastream's small batches stay one piece per partition.
SPLIT_MIN_RECORDS = 50_000


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """The stream source: ``kind`` and ``config`` (see :mod:`millstream.ingest.sources`),
    ``start_offsets`` (the shard uppers), ``starting_offsets`` (earliest|latest, for a
    partition with no start), ``max_records_per_batch`` (None: the adaptive budget,
    :func:`~millstream.ingest.sources.base.adaptive_budget` of ``task_memory_mb``), ``tasks``
    (Spark tasks per batch), ``split_min_records`` (a partition's range is split over
    several tasks only into pieces of at least this many records). The source sends range
    markers only; the sink reads the records itself (:mod:`millstream.spark.sources`)."""

    kind: str
    config: dict[str, Any]
    max_records_per_batch: int | None = None
    task_memory_mb: int = 512
    starting_offsets: str = "earliest"
    start_offsets: dict[int, int] = field(default_factory=dict)
    tasks: int = 2
    split_min_records: int = SPLIT_MIN_RECORDS
    gate: CommitGate | None = None
    #: where the gate's metadata store is (with a gate only)
    settings: Settings | None = None
    #: Plan this source at most once per this many seconds while records flow (its trigger
    #: interval; its query triggers at a shorter tick, :func:`~millstream.spark.sources.
    #: tick_seconds`, and an idle source is planned at every tick). 0: at every trigger.
    trigger_seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.trigger_seconds < 0:
            raise InvalidSpecError("triggerSeconds", "must not be negative")
        if self.max_records_per_batch is not None and self.max_records_per_batch < 1:
            raise InvalidSpecError("max_records_per_batch", "must be at least 1")
        if self.task_memory_mb < 1:
            raise InvalidSpecError("task_memory_mb", "must be at least 1")
        if self.split_min_records < 1:
            raise InvalidSpecError("splitMinRecords", "must be at least 1")
        if self.starting_offsets not in ("earliest", "latest"):
            raise InvalidSpecError(
                "startingOffsets", f"{self.starting_offsets!r} is not earliest or latest"
            )
        if self.gate is not None and self.settings is None:
            raise InvalidSpecError("metadataUrl", "a source with a commit gate needs settings")

    def reader(self) -> PartitionReader:
        return reader_for(self.kind, self.config, start_offsets=self.start_offsets)

    def to_options(self) -> dict[str, str]:
        out = {
            "sourceKind": self.kind,
            "sourceConfig": json.dumps(self.config),
            "maxRecordsPerBatch": str(self.max_records_per_batch or ""),
            "taskMemoryMb": str(self.task_memory_mb),
            "startingOffsets": self.starting_offsets,
            "startOffsets": json.dumps(encode_offsets(self.start_offsets)),
            "tasks": str(self.tasks),
            "splitMinRecords": str(self.split_min_records),
        }
        if self.trigger_seconds:
            out["triggerSeconds"] = repr(self.trigger_seconds)
        if self.gate is not None:
            assert self.settings is not None
            out.update(self.gate.to_options(), **self.settings.as_options())
        return out

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> SourceOptions:
        o = Options(options)
        if not o.get("sourceKind"):
            raise InvalidSpecError("sourceKind", "name the source kind (kafka, files, generator)")
        gate = CommitGate.from_options(o)
        settings = None
        if gate is not None:  # a standby's source follows the shards in the metadata store
            # lazy: pydantic (0.1-0.2 s) only for a gated source, not every query's start
            from millstream.config import Settings

            settings = Settings.from_options(o)
        return cls(
            kind=o["sourceKind"],
            config=_json(o, "sourceConfig", {}),
            max_records_per_batch=_int(o, "maxRecordsPerBatch", 0) or None,
            task_memory_mb=_int(o, "taskMemoryMb", 512),
            starting_offsets=o.get("startingOffsets", "earliest"),
            start_offsets=decode_offsets(_json(o, "startOffsets", {})),
            tasks=_int(o, "tasks", 2),
            split_min_records=_int(o, "splitMinRecords", SPLIT_MIN_RECORDS),
            gate=gate,
            settings=settings,
            trigger_seconds=_float(o, "triggerSeconds", 0.0),
        )


@dataclass(frozen=True, slots=True)
class SinkOptions:
    """The segment sink: where (``settings``, ``table_spec``), as which writer (``writer_id``,
    the shard ``epochs`` it was started at), ``bad_records`` (dead_letter|fail),
    ``stats_file`` (a JSON-lines commit log), the source whose ranges it reads itself
    (``source_kind`` / ``source_config``) and the standby ``gate``."""

    settings: Settings
    table_spec: TableSpec
    writer_id: str
    epochs: dict[int, int] = field(default_factory=dict)
    dead_letter_epochs: dict[int, int] = field(default_factory=dict)
    bad_records: str = "dead_letter"
    stats_file: str | None = None
    source_kind: str | None = None
    source_config: dict[str, Any] | None = None
    gate: CommitGate | None = None
    #: the oldest staged file a commit accepts; keep it at most half of GC's grace period
    max_staged_age: float = MAX_STAGED_AGE_SECONDS

    def __post_init__(self) -> None:
        if self.max_staged_age <= 0:
            raise InvalidSpecError("maxStagedAge", "must be positive")
        if self.bad_records not in ("dead_letter", "fail"):
            raise InvalidSpecError("badRecords", f"{self.bad_records!r} is not dead_letter or fail")

    def source_reader(self) -> PartitionReader:
        if self.source_kind is None:
            raise InvalidSpecError(
                "sourceKind",
                "is required: the source sent range markers for the sink to read; start the "
                "sink with the source's kind and config",
            )
        return reader_for(self.source_kind, self.source_config or {})

    def to_options(self) -> dict[str, str]:
        out = {
            **self.settings.as_options(),
            "table": self.table_spec.name,
            "tableSpec": json.dumps(self.table_spec.to_json_dict()),
            "writerId": self.writer_id,
            "epochs": json.dumps(encode_offsets(self.epochs)),
            "deadLetterEpochs": json.dumps(encode_offsets(self.dead_letter_epochs)),
            "badRecords": self.bad_records,
        }
        if self.stats_file:
            out["statsFile"] = self.stats_file
        if self.source_kind is not None:
            out["sourceKind"] = self.source_kind
            out["sourceConfig"] = json.dumps(self.source_config or {})
        if self.gate is not None:
            out.update(self.gate.to_options())
        if self.max_staged_age != MAX_STAGED_AGE_SECONDS:
            out["maxStagedAge"] = repr(self.max_staged_age)
        return out

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> SinkOptions:
        o = Options(options)
        if not o.get("tableSpec"):
            raise InvalidSpecError("tableSpec", "the sink needs the table's spec (JSON)")
        # lazy: the spec (pydantic, YAML) is the sink's, not the query's source process's
        from millstream.config import Settings
        from millstream.spec import TableSpec

        return cls(
            settings=Settings.from_options(o),
            table_spec=TableSpec.parse(_json(o, "tableSpec", {})),
            writer_id=o.get("writerId") or "writer",
            epochs=decode_offsets(_json(o, "epochs", {})),
            dead_letter_epochs=decode_offsets(_json(o, "deadLetterEpochs", {})),
            bad_records=o.get("badRecords", "dead_letter"),
            stats_file=o.get("statsFile") or None,
            source_kind=o.get("sourceKind") or None,
            source_config=_json(o, "sourceConfig", None),
            gate=CommitGate.from_options(o),
            max_staged_age=float(o.get("maxStagedAge") or MAX_STAGED_AGE_SECONDS),
        )


def _members(options: Mapping[str, str]) -> dict[str, dict[str, str]]:
    members = _json(Options(options), "members", None)
    if not isinstance(members, dict):
        members = {}
    return {str(k): v for k, v in _nonempty(members).items()}


def _nonempty(members: Mapping[str, Any]) -> Mapping[str, Any]:
    if not members:
        raise InvalidSpecError("members", "a shared query names at least one datastream")
    return members


def _members_options(members: Mapping[str, SourceOptions | SinkOptions]) -> dict[str, str]:
    return {"members": json.dumps({n: o.to_options() for n, o in _nonempty(members).items()})}


def _membership_options(group: GroupSourceOptions | GroupSinkOptions) -> dict[str, str]:
    if group.membership is None:
        return {}
    return {"membership": group.membership, "since": json.dumps(group.since)}


def _membership_of(options: Mapping[str, str]) -> dict[str, Any]:
    o = Options(options)
    if not o.get("membership"):
        return {}
    since = _json(o, "since", {})
    if not isinstance(since, dict):
        raise InvalidSpecError("since", f"{since!r} is not a map of member to generation")
    return {"membership": o["membership"], "since": {str(k): int(v) for k, v in since.items()}}


@dataclass(frozen=True, slots=True)
class GroupSourceOptions:
    """The source of a shared query: each member datastream's :class:`SourceOptions`, by name."""

    members: dict[str, SourceOptions]
    #: The running query's membership file (:mod:`millstream.spark.membership`): members
    #: join and leave without a restart. None: the members are fixed for the query's life.
    membership: str | None = None
    #: Each starting member's incarnation (the membership generation it joined at).
    since: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _nonempty(self.members)

    def to_options(self) -> dict[str, str]:
        return {**_members_options(self.members), **_membership_options(self)}

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> GroupSourceOptions:
        return cls(
            {n: SourceOptions.from_options(o) for n, o in _members(options).items()},
            **_membership_of(options),
        )


@dataclass(frozen=True, slots=True)
class GroupSinkOptions:
    """The sink of a shared query: each member datastream's :class:`SinkOptions`, by name."""

    members: dict[str, SinkOptions]
    #: As :attr:`GroupSourceOptions.membership`: the commit commits a member's part of a
    #: batch only while the member is still in the query (the same incarnation).
    membership: str | None = None
    since: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _nonempty(self.members)

    def to_options(self) -> dict[str, str]:
        return {**_members_options(self.members), **_membership_options(self)}

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> GroupSinkOptions:
        return cls(
            {n: SinkOptions.from_options(o) for n, o in _members(options).items()},
            **_membership_of(options),
        )
