"""``source.schema_evolution: auto``: the table spec that absorbs a writer schema.

A format describes a writer schema's top-level fields as :class:`WriterField` (the column type
that holds the field's values, and whether an existing column's type already takes them);
:func:`absorbing_spec` turns the table's spec into the one that holds every field:

* a field the table lacks becomes a column added at the end (nullable, as every non-key column
  is), in the writer schema's field order;
* a field whose column is narrower than the writer's type is widened when
  :mod:`millstream.core.evolution` allows it (``int -> long``, a decimal's precision);
* a field whose column already takes its values (``long`` for an Avro ``int``) changes nothing.

Anything else (a type the rules refuse, a field no column type holds, a field name that is no
column name) refuses the WHOLE writer schema with
:class:`~millstream.errors.IncompatibleChangeError` naming the field and the rule: the table
does not change, and the records whose values do not fit are dead-lettered as without ``auto``.
The rules are the one function :func:`~millstream.core.evolution.check_evolution`; this module
only proposes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from millstream.core.evolution import check_evolution, widening_refusal
from millstream.errors import IncompatibleChangeError, InvalidSpecError
from millstream.spec import TableSpec


@dataclass(frozen=True, slots=True)
class WriterField:
    """A writer schema's top-level field."""

    name: str
    #: the column type that holds its values (None: no column type does, ``why`` says why)
    column_type: str | None
    #: whether a column of the given type takes its values as they are (values checked one
    #: by one when they are read, as without ``auto``)
    takes: Callable[[str], bool]
    why: str = ""


def absorbing_spec(spec: TableSpec, fields: Sequence[WriterField]) -> TableSpec:
    """``spec`` grown to hold ``fields`` (``spec`` itself when it already does). Raises
    :class:`IncompatibleChangeError` when it cannot, naming the field and the rule."""
    columns = dict(spec.columns)
    for f in fields:
        current = columns.get(f.name)
        if f.column_type is None:
            if current is not None and f.takes(current):
                continue
            raise IncompatibleChangeError(
                spec.name, f"schema.{f.name}", f.name, f.why or "no column type holds it", "?"
            )
        if current is None:
            columns[f.name] = f.column_type
        elif current == f.column_type or (
            widening_refusal(current, f.column_type) is not None and f.takes(current)
        ):
            continue
        else:
            # a widening (allowed, unless the column is a key) or a change the rules refuse:
            # check_evolution decides, with its rule text
            columns[f.name] = f.column_type
    if columns == spec.columns:
        return spec
    try:
        grown = TableSpec.parse({**spec.to_json_dict(), "schema": columns})
    except InvalidSpecError as exc:
        column = exc.field.removeprefix("schema.")
        raise IncompatibleChangeError(
            spec.name, exc.field, column, str(exc), "cannot be a column"
        ) from None
    check_evolution(spec, grown)
    return grown
