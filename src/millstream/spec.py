"""Table specs: what a table is (columns, key, merge engine), validated once at the edge.

Validation errors are raised as :class:`~millstream.errors.InvalidSpecError` naming the field
(``table.name``, ``table.mode``, ``table.primary_key`` ...), never as a bare pydantic error.
"""

from __future__ import annotations

import difflib
import re
from datetime import timedelta
from functools import lru_cache
from typing import Any, Literal, get_args

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from millstream.errors import InvalidSpecError
from millstream.types import SCALARS, arrow_type, is_decimal, is_nested, normalize

#: A column type's canonical text (:mod:`millstream.types`): one of the eight scalar names,
#: ``decimal(p,s)``, ``list<T>``, ``struct<name:T,...>`` or ``map<string,T>``.
ColumnType = str
MergeMode = Literal["append", "dedup", "upsert", "partial"]
PartialStrategy = Literal["overwrite", "ignore_null", "max", "min", "sum", "append"]

#: The scalar column types' Arrow types; :func:`millstream.types.arrow_type` covers every type.
ARROW_TYPES: dict[str, pa.DataType] = dict(SCALARS)


def normalize_columns(columns: dict[str, str]) -> dict[str, str]:
    """Every column type checked and in its canonical text; an error names ``schema.<col>``
    (one error naming every bad column)."""
    out: dict[str, str] = {}
    bad: list[InvalidSpecError] = []
    for c, t in columns.items():
        try:
            out[c] = normalize(t, field=f"schema.{c}")
        except InvalidSpecError as exc:
            bad.append(exc)
    if bad:
        raise combined(bad)
    return out


def combined(errors: list[InvalidSpecError]) -> InvalidSpecError:
    """One error for several: it names the first field (``field``) and says every problem,
    ``invalid a: ...; invalid b: ...``."""
    if len(errors) == 1:
        return errors[0]
    first = errors[0]
    rest = "; ".join(e.message for e in errors[1:])
    return InvalidSpecError(first.field, f"{first.message.split(': ', 1)[-1]}; {rest}")


def _scalar_only(t: str) -> bool:
    return not is_nested(t) and not is_decimal(t)


#: System columns stored in every data file. Row identity is (partition, offset).
PARTITION_COL = "_ms_partition"
OFFSET_COL = "_ms_offset"
TOMBSTONE_COL = "_ms_tombstone"
SYSTEM_COLUMNS = (PARTITION_COL, OFFSET_COL, TOMBSTONE_COL)

TABLE_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,127}$")
_DURATION_RE = re.compile(r"^(\d+)(ms|s|m|h|d)$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(value: str | float | int | None, *, field: str) -> timedelta | None:
    """Parse ``"500ms"``, ``"30s"``, ``"1h"``, ``"7d"`` or a number of seconds."""
    if value is None:
        return None
    if isinstance(value, int | float):
        return timedelta(seconds=float(value))
    m = _DURATION_RE.match(value.strip())
    if not m:
        raise InvalidSpecError(field, f"{value!r} is not a duration like 500ms, 30s, 5m, 1h or 7d")
    return timedelta(seconds=int(m.group(1)) * _UNITS[m.group(2)])


def validate_table_name(name: str, *, field: str = "table.name") -> str:
    """Table names become directory names and SQL view names: no separators, no ``..``."""
    if not isinstance(name, str) or not name:
        raise InvalidSpecError(field, "must not be empty")
    if len(name) > 128:
        raise InvalidSpecError(field, f"{len(name)} characters is longer than the limit of 128")
    if "/" in name or "\\" in name or ".." in name or not TABLE_NAME_RE.match(name):
        raise InvalidSpecError(
            field,
            f"{name!r} may only use letters, digits, '_' and '-' (no path separators or '..')",
        )
    return name


class Retention(BaseModel):
    """How much history a table keeps for time travel. A manifest version expires when it
    stopped being current more than ``time`` ago AND at least ``min_versions`` newer versions
    exist; expiry removes its manifest rows and makes the files only it used collectable.
    Unlike the rest of a table's spec, retention may change: re-creating the table (or its
    datastream) with another retention updates it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    time: str = Field(default="24h", description="Time travel window, like 30m, 24h or 7d.")
    min_versions: int = Field(default=10, ge=1, description="Versions always kept.")
    iceberg_snapshots: int = Field(
        default=240,
        ge=1,
        description="Snapshots the table's Iceberg view lists at most: the newest ones of the "
        "versions kept (240: an hour at the publisher's 15 s interval). Older kept versions "
        "stay readable through Millstream; each publish rewrites the view's metadata, so its "
        "size is bounded by this, not by the time window.",
    )

    @field_validator("time")
    @classmethod
    def _time(cls, v: str) -> str:
        d = parse_duration(v, field="table.retention.time")
        assert d is not None
        if d.total_seconds() <= 0:
            raise InvalidSpecError("table.retention.time", "must be positive")
        return v

    @property
    def seconds(self) -> float:
        d = parse_duration(self.time, field="table.retention.time")
        assert d is not None
        return d.total_seconds()


@lru_cache(maxsize=4096)
def _arrow_schema(columns: tuple[tuple[str, str], ...], system_columns: bool) -> pa.Schema:
    """The Arrow schema of a table's columns (and the system columns): made once per process
    for each set of columns (an Arrow schema is immutable), not at every table's decode and
    staging in every write task (a write task over 100 small tables asked ~4 times a table)."""
    fields = [pa.field(c, arrow_type(t)) for c, t in columns]
    if system_columns:
        fields += [
            pa.field(PARTITION_COL, pa.int32(), nullable=False),
            pa.field(OFFSET_COL, pa.int64(), nullable=False),
            pa.field(TOMBSTONE_COL, pa.bool_(), nullable=False),
        ]
    return pa.schema(fields)


class TableSpec(BaseModel):
    """What a table is. Frozen: a table's definition never changes under a running writer."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="Table name: letters, digits, '_' and '-', at most 128 chars.")
    columns: dict[str, ColumnType] = Field(
        alias="schema", description="Column name -> type, in order.", min_length=1
    )
    primary_key: tuple[str, ...] = Field(default=(), description="Key columns (not for append).")
    mode: MergeMode = Field(default="append", description="Merge engine.")
    comparison_column: str | None = Field(
        default=None,
        description=(
            "Orders rows of one key (ties: the later offset wins). A delete without a value "
            "takes its key's highest earlier value in its partition; any other record must "
            "carry it (else dead-lettered)."
        ),
    )
    delete_column: str | None = Field(
        default=None, description="Boolean column; true removes the key (keyed modes)."
    )
    dedup_ttl: str | None = Field(default=None, description="dedup only: window on time_column.")
    time_column: str | None = Field(default=None, description="Event-time column (dedup TTL).")
    partial: dict[str, PartialStrategy] = Field(
        default_factory=dict,
        description="partial only: column -> strategy; unlisted columns use ignore_null.",
    )
    retention: Retention = Field(
        default_factory=Retention, description="History kept for time travel (may change)."
    )
    partitioned_by_key: bool = Field(
        default=False,
        description=(
            "Keyed modes: every row of a key arrives in one source partition (the producer "
            "partitions by the key, as Pinot's upsert requires). Reads then merge each "
            "partition alone, in parallel, and an upsert partition whose rows are all sealed "
            "needs no merge. A key that arrives in two partitions anyway shows up twice."
        ),
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return validate_table_name(v)

    @field_validator("columns")
    @classmethod
    def _types(cls, v: dict[str, str]) -> dict[str, str]:
        return normalize_columns(v)

    @model_validator(mode="after")
    def _consistent(self) -> TableSpec:
        cols = self.columns
        for c in cols:
            if not c or c.startswith("_ms_"):
                raise InvalidSpecError(
                    f"schema.{c}", "column names must not be empty or start with '_ms_'"
                )
        if self.mode == "append":
            if self.primary_key:
                raise InvalidSpecError("table.primary_key", "append tables have no primary key")
            if self.partitioned_by_key:
                raise InvalidSpecError(
                    "table.partitioned_by_key", "append tables have no key to partition by"
                )
        elif not self.primary_key:
            raise InvalidSpecError("table.primary_key", f"mode {self.mode!r} needs a primary key")
        for k in self.primary_key:
            if k not in cols:
                raise InvalidSpecError("table.primary_key", f"column {k!r} is not in the schema")
            if not _scalar_only(cols[k]):
                raise InvalidSpecError(
                    "table.primary_key",
                    f"column {k!r} is {cols[k]}: a key column must be one of "
                    f"{', '.join(SCALARS)} (not a decimal, list, struct or map)",
                )
        if len(set(self.primary_key)) != len(self.primary_key):
            raise InvalidSpecError("table.primary_key", "lists a column twice")
        for fname in ("comparison_column", "delete_column", "time_column"):
            c = getattr(self, fname)
            if c is not None and c not in cols:
                raise InvalidSpecError(f"table.{fname}", f"column {c!r} is not in the schema")
            if c is not None and is_nested(cols[c]):
                raise InvalidSpecError(
                    f"table.{fname}", f"column {c!r} is {cols[c]}: it must not be a nested type"
                )
        if self.delete_column is not None and cols[self.delete_column] != "boolean":
            raise InvalidSpecError("table.delete_column", "must be a boolean column")
        if self.dedup_ttl is not None:
            if self.mode != "dedup":
                raise InvalidSpecError("table.dedup_ttl", "applies to dedup tables only")
            if self.time_column is None:
                raise InvalidSpecError("table.time_column", "dedup_ttl needs a time_column")
            if cols[self.time_column] not in ("timestamp", "long", "date"):
                raise InvalidSpecError(
                    "table.time_column", "must be a timestamp, long or date column"
                )
            parse_duration(self.dedup_ttl, field="table.dedup_ttl")
        if self.partial and self.mode != "partial":
            raise InvalidSpecError("table.partial", "applies to partial tables only")
        for c, strat in self.partial.items():
            if c not in cols:
                raise InvalidSpecError(f"table.partial.{c}", "column is not in the schema")
            if c in self.primary_key:
                raise InvalidSpecError(f"table.partial.{c}", "key columns cannot have a strategy")
            if strat == "sum" and is_decimal(cols[c]):
                raise InvalidSpecError(
                    f"table.partial.{c}",
                    f"sum is not supported for {cols[c]}: a sum could outgrow the precision, "
                    "and a decimal is never rounded or truncated",
                )
            if strat in ("sum",) and cols[c] not in ("long", "int", "double"):
                raise InvalidSpecError(f"table.partial.{c}", f"{strat} needs a numeric column")
            if strat == "append" and cols[c] != "string":
                raise InvalidSpecError(f"table.partial.{c}", "append needs a string column")
            if strat in ("max", "min") and is_nested(cols[c]):
                raise InvalidSpecError(
                    f"table.partial.{c}", f"{strat} needs an ordered column, not {cols[c]}"
                )
            if strat in ("max", "min") and cols[c] in ("binary", "boolean"):
                raise InvalidSpecError(f"table.partial.{c}", f"{strat} needs an ordered column")
        return self

    # -- derived -------------------------------------------------------------------------

    @property
    def keyed(self) -> bool:
        return self.mode != "append"

    @property
    def ttl(self) -> timedelta | None:
        return parse_duration(self.dedup_ttl, field="table.dedup_ttl")

    def same_table(self, other: TableSpec) -> bool:
        """The same table definition, retention aside (the one part that may change)."""
        return self.model_copy(update={"retention": other.retention}) == other

    def strategy(self, column: str) -> PartialStrategy:
        return self.partial.get(column, "ignore_null")

    def arrow_schema(self, *, system_columns: bool = False) -> pa.Schema:
        return _arrow_schema(tuple(self.columns.items()), system_columns)

    def to_json_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)

    @classmethod
    def parse(cls, data: dict[str, Any]) -> TableSpec:
        """Validate ``data``; any problem becomes an InvalidSpecError naming the field."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise _first_error(exc, prefix="table") from None


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (``X``, ``X | None``, ``A | B | C``, ``list[X]``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


def _models_at(model: type[BaseModel], loc: list[str]) -> list[type[BaseModel]]:
    """The model(s) at ``loc`` under ``model``: one, or a tagged union's members (the source
    kinds); empty if ``loc`` leads elsewhere (a dict's key, a list's index)."""
    candidates = [model]
    for part in loc:
        if len(candidates) > 1:  # a tagged union: the loc names the tag ('kafka')
            candidates = [
                m for m in candidates if part in get_args(m.model_fields["kind"].annotation)
            ]
            continue
        if len(candidates) != 1:
            return []
        fields = candidates[0].model_fields
        found = next((f for n, f in fields.items() if part in (n, f.alias)), None)
        if found is None:
            return []
        candidates = _models_in(found.annotation)
    return candidates


def _fields_at(model: type[BaseModel], loc: list[str]) -> list[str]:
    """The field names (as a spec spells them) of the model at ``loc`` under ``model``."""
    models = _models_at(model, loc)
    if len(models) != 1:
        return []
    return [f.alias or n for n, f in models[0].model_fields.items()]


def _one_error(err: Any, model: type[BaseModel], prefix: str) -> InvalidSpecError:
    ctx = err.get("ctx") or {}
    inner = ctx.get("error")
    if isinstance(inner, InvalidSpecError):
        return inner
    raw = [str(p) for p in err["loc"]]
    parts = list(raw)
    if len(parts) > 1 and parts[0] == "source" and parts[1] in ("kafka", "files", "generator"):
        del parts[1]  # the discriminator tag is not a field the user wrote
    loc = ".".join(parts)
    if not prefix or loc == "schema" or loc.startswith("schema."):
        field = loc or "spec"
    else:
        field = f"{prefix}.{loc}" if loc else prefix
    msg = err["msg"]
    kind = err["type"]
    if kind == "literal_error" and "input" in err:
        msg = f"{err['input']!r} is not one of {ctx.get('expected', '')}"
    elif kind == "extra_forbidden":
        known = _fields_at(model, raw[:-1])
        close = difflib.get_close_matches(raw[-1], known, n=1)
        msg = "is not a field of the spec" + (f"; did you mean `{close[0]}`?" if close else "")
        if known and not close:
            msg += f" (the fields here: {', '.join(known)})"
    elif kind in ("union_tag_invalid", "union_tag_not_found"):
        tags = [
            str(tag)
            for m in _models_at(model, raw)
            if "kind" in m.model_fields
            for tag in get_args(m.model_fields["kind"].annotation)
        ]
        tag = ctx.get("tag")
        field = f"{field}.kind" if not field.endswith(".kind") else field
        if tag is None:
            msg = f"is missing; a source is one of the kinds {', '.join(tags)}"
        else:
            close = difflib.get_close_matches(str(tag), tags, n=1)
            msg = f"{tag!r} is not a source kind; the kinds are {', '.join(tags)}" + (
                f" (did you mean {close[0]!r}?)" if close else ""
            )
    return InvalidSpecError(field, msg)


def _first_error(
    exc: ValidationError, *, prefix: str, model: type[BaseModel] | None = None
) -> InvalidSpecError:
    """Every problem pydantic found, as one InvalidSpecError naming the first field (see
    :func:`combined`): an unknown field with the closest known one, an unknown source kind
    with the kinds there are."""
    base = model or TableSpec
    errors: list[InvalidSpecError] = []
    for err in exc.errors():
        one = _one_error(err, base, prefix)
        if all(one.message != e.message for e in errors):
            errors.append(one)
    return combined(errors)


#: The suffix of a table's dead-letter table (see ``millstream.datastream.dead_letter_spec``).
DEAD_LETTER_SUFFIX = "__dead_letter"


def dead_letter_name(table: str) -> str:
    """The name of ``table``'s dead-letter table."""
    return f"{table}{DEAD_LETTER_SUFFIX}"
