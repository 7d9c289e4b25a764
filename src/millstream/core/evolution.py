"""Schema evolution rules: which changes of a table's spec keep every row already written
readable under the new spec, as pure functions (no I/O).

A change is **compatible** when every data file written under the old spec can be read under
the new one without losing a value:

* a column added **at the end** (every non-key column is nullable, so rows written before it
  read it as null);
* a type **widened** losslessly: ``int -> long``, ``int -> double`` (every 32-bit integer is
  exact in a double), ``decimal(p,s) -> decimal(p',s)`` with ``p' >= p`` (same scale);
* ``retention`` (as before evolution existed).

Everything else is refused with :class:`~millstream.errors.IncompatibleChangeError` naming the
field (``schema.qty``, ``table.mode``), the column if any, and the rule:

* removing a column, renaming one (seen as a removal), or **reordering** columns (column order
  is what readers see, Spark's schema included; new columns go at the end so a reader's
  columns only ever grow at the end);
* narrowing (``long -> int``), a lossy widening (``long -> double``: a long above 2**53 would
  change), changing the type family (``string -> long``), changing a decimal's scale, and any
  change to a type this module does not know (a type added later is incompatible until a rule
  says otherwise);
* changing the type of a key column or of the comparison column (the key index and the
  sealed segments hold their values as written), even a widening;
* changing ``name``, ``primary_key``, ``mode``, ``comparison_column``, ``delete_column``,
  ``time_column``, ``dedup_ttl``, ``partitioned_by_key``, or the ``partial`` strategy of an
  existing column (a new column may come with one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from millstream.errors import IncompatibleChangeError, InvalidSpecError
from millstream.spec import TableSpec
from millstream.types import DecimalType, parse_type

ChangeKind = Literal["add", "widen", "retention", "topic", "setting"]


#: Lossless widenings between the plain types: old -> the types it may become.
WIDENINGS: dict[str, frozenset[str]] = {
    "int": frozenset({"long", "double"}),
}

#: Table settings that never change after creation (field name in the spec).
FIXED_SETTINGS = (
    "primary_key",
    "mode",
    "comparison_column",
    "delete_column",
    "time_column",
    "dedup_ttl",
    "partitioned_by_key",
)


@dataclass(frozen=True, slots=True)
class Change:
    """One compatible change: a column added, a type widened, or retention changed."""

    kind: ChangeKind
    #: the column (add, widen); the topic (topic: a topic added to a datastream of many
    #: topics, ``new`` its table); the spec field (setting)
    column: str | None
    old: str | None
    new: str | None
    #: the table changed, where a datastream writes several (a datastream of many topics)
    table: str | None = None

    def describe(self) -> str:
        """One line for the CLI: ``+ column discount double``, ``~ column qty int -> long``."""
        at = f"table {self.table}: " if self.table is not None else ""
        if self.kind == "add":
            return f"{at}+ column {self.column} {self.new}"
        if self.kind == "widen":
            return f"{at}~ column {self.column} {self.old} -> {self.new}"
        if self.kind == "topic":
            return f"+ topic {self.column} (table {self.new})"
        if self.kind == "setting":
            return f"~ {self.column} {self.old} -> {self.new}"
        return f"{at}~ retention {self.old} -> {self.new}"

    def to_dict(self) -> dict[str, str | None]:
        return {
            "kind": self.kind,
            "column": self.column,
            "old": self.old,
            "new": self.new,
            "table": self.table,
            "description": self.describe(),
        }


def parse_decimal(type_name: str) -> tuple[int, int] | None:
    """``(precision, scale)`` of a ``decimal(p,s)`` column type (as :mod:`millstream.types`
    reads it), else None."""
    try:
        t = parse_type(type_name)
    except InvalidSpecError:
        return None
    return (t.precision, t.scale) if isinstance(t, DecimalType) else None


def widening_refusal(old: str, new: str) -> str | None:
    """Why changing a column's type from ``old`` to ``new`` is refused, or None when it is a
    lossless widening (``old == new`` is no change and also None)."""
    if old == new:
        return None
    if new in WIDENINGS.get(old, ()):
        return None
    old_dec, new_dec = parse_decimal(old), parse_decimal(new)
    if old_dec is not None and new_dec is not None:
        (p, s), (p2, s2) = old_dec, new_dec
        if s2 != s:
            return f"a decimal's scale cannot change ({old} -> {new})"
        if p2 < p:
            return f"narrowing {old} -> {new} could lose values"
        return None
    if old in WIDENINGS.get(new, ()):
        return f"narrowing {old} -> {new} could lose values"
    if (old, new) == ("long", "double"):
        return "long -> double is lossy (longs above 2**53 are not exact in a double)"
    return f"changing the type {old} -> {new} is not a lossless widening"


def check_evolution(old: TableSpec, new: TableSpec) -> list[Change]:
    """The changes taking ``old`` to ``new``, in column order (added columns last, then
    retention); an empty list when nothing changed. Raises
    :class:`~millstream.errors.IncompatibleChangeError` at the first change that could lose or
    reinterpret rows already written (see the module docstring for the rules)."""
    table = old.name
    if new.name != old.name:
        raise IncompatibleChangeError(
            table, "table.name", None, "a table cannot be renamed", f"{old.name} -> {new.name}"
        )
    for fname in FIXED_SETTINGS:
        before, after = getattr(old, fname), getattr(new, fname)
        if before != after:
            raise IncompatibleChangeError(
                table,
                f"table.{fname}",
                None,
                f"{fname} cannot change after the table is created",
                f"{before!r} -> {after!r}",
            )
    old_cols, new_cols = list(old.columns), list(new.columns)
    for col in old_cols:
        if col not in new.columns:
            raise IncompatibleChangeError(
                table,
                f"schema.{col}",
                col,
                "columns cannot be removed or renamed (rows already written hold them)",
                "removed",
            )
    kept = [c for c in new_cols if c in old.columns]
    if kept != old_cols:
        moved = next(c for c, o in zip(kept, old_cols, strict=True) if c != o)
        raise IncompatibleChangeError(
            table, f"schema.{moved}", moved, "existing columns cannot be reordered", "moved"
        )
    if new_cols[: len(old_cols)] != old_cols:
        first_new = next(c for c in new_cols if c not in old.columns)
        raise IncompatibleChangeError(
            table,
            f"schema.{first_new}",
            first_new,
            "a new column must be added after every existing column",
            "inserted before an existing column",
        )
    changes: list[Change] = []
    fixed_type = {*old.primary_key, *([old.comparison_column] if old.comparison_column else [])}
    for col in old_cols:
        before, after = old.columns[col], new.columns[col]
        if before == after:
            continue
        if col in fixed_type:
            role = "key" if col in old.primary_key else "comparison"
            raise IncompatibleChangeError(
                table,
                f"schema.{col}",
                col,
                f"the type of a {role} column cannot change (sealed segments and the key "
                "index hold its values as written)",
                f"{before} -> {after}",
            )
        why = widening_refusal(before, after)
        if why is not None:
            raise IncompatibleChangeError(table, f"schema.{col}", col, why, f"{before} -> {after}")
        changes.append(Change("widen", col, before, after))
    for col in old_cols:
        if old.strategy(col) != new.strategy(col):
            raise IncompatibleChangeError(
                table,
                f"table.partial.{col}",
                col,
                "the partial strategy of an existing column cannot change",
                f"{old.strategy(col)} -> {new.strategy(col)}",
            )
    changes += [Change("add", c, None, new.columns[c]) for c in new_cols[len(old_cols) :]]
    if new.retention != old.retention:
        changes.append(
            Change("retention", None, _retention(old), _retention(new)),
        )
    return changes


def _retention(spec: TableSpec) -> str:
    r = spec.retention
    snapshots = r.iceberg_snapshots
    default = type(r).model_fields["iceberg_snapshots"].default
    extra = f"/{snapshots} Iceberg snapshots" if snapshots != default else ""
    return f"{r.time}/{r.min_versions} versions{extra}"
