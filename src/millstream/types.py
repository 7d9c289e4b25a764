"""Column types: the grammar of a table's ``schema`` values, and their Arrow types.

A column type is a string, Spark/Hive-like, case-insensitive and whitespace tolerant::

    string | long | int | double | boolean | timestamp | date | binary
    decimal(p,s)          1 <= p <= 38, 0 <= s <= p   (decimal(p) is decimal(p,0))
    list<T>               also spelled array<T>
    struct<name:T,...>    at least one field; names are identifiers, unique, case kept
    map<string,T>         keys are always strings

Types nest (``list<struct<a:long,b:string>>``). :func:`parse_type` gives a :class:`Type`,
:func:`normalize` its canonical text (``Decimal(10, 2)`` -> ``decimal(10,2)``, ``array<int>``
-> ``list<int>``), which is what a spec stores: the eight scalar names are their own canonical
text, so the stored JSON of an existing spec does not change. :func:`arrow_type` is the Arrow
type of a column. Errors are :class:`~millstream.errors.InvalidSpecError` naming ``field``.

Schema evolution (which type may become which) is not decided here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from millstream.errors import InvalidSpecError

SCALARS: dict[str, pa.DataType] = {
    "string": pa.string(),
    "long": pa.int64(),
    "int": pa.int32(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "date": pa.date32(),
    "binary": pa.binary(),
}
MAX_PRECISION = 38


@dataclass(frozen=True, slots=True)
class Scalar:
    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class DecimalType:
    precision: int
    scale: int

    def __str__(self) -> str:
        return f"decimal({self.precision},{self.scale})"


@dataclass(frozen=True, slots=True)
class ListType:
    element: Type

    def __str__(self) -> str:
        return f"list<{self.element}>"


@dataclass(frozen=True, slots=True)
class StructType:
    fields: tuple[tuple[str, Type], ...]

    def __str__(self) -> str:
        return "struct<" + ",".join(f"{n}:{t}" for n, t in self.fields) + ">"


@dataclass(frozen=True, slots=True)
class MapType:
    """``map<string,T>``: the key type is always string."""

    value: Type

    def __str__(self) -> str:
        return f"map<string,{self.value}>"


Type = Scalar | DecimalType | ListType | StructType | MapType

_TOKEN = re.compile(r"\s*(?:([A-Za-z_][A-Za-z0-9_]*)|(\d+)|([<>(),:]))")


class _Parser:
    def __init__(self, text: str, field: str) -> None:
        self.text = text
        self.field = field
        self.tokens: list[tuple[str, str, int]] = []  # (kind, text, position)
        pos = 0
        while pos < len(text):
            if text[pos:].strip() == "":
                break
            m = _TOKEN.match(text, pos)
            if m is None:
                bad = text[pos:].lstrip()[0]
                self.fail(f"unexpected {bad!r} at position {len(text) - len(text[pos:].lstrip())}")
            assert m is not None
            kind = "name" if m.group(1) else "number" if m.group(2) else "punct"
            self.tokens.append((kind, m.group(m.lastindex or 0), m.start(m.lastindex or 0)))
            pos = m.end()
        self.i = 0

    def fail(self, message: str) -> None:
        raise InvalidSpecError(self.field, f"{message} in type {self.text!r}")

    def peek(self) -> tuple[str, str, int] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, what: str) -> tuple[str, str, int]:
        tok = self.peek()
        if tok is None:
            self.fail(f"expected {what} but the type ends")
        assert tok is not None
        self.i += 1
        return tok

    def expect(self, punct: str) -> None:
        kind, text, pos = self.take(f"{punct!r}")
        if kind != "punct" or text != punct:
            self.fail(f"expected {punct!r} at position {pos}, got {text!r}")

    def number(self, what: str) -> int:
        kind, text, pos = self.take(what)
        if kind != "number":
            self.fail(f"expected {what} at position {pos}, got {text!r}")
        return int(text)

    def parse(self) -> Type:
        if not self.tokens:
            raise InvalidSpecError(self.field, "the type is empty")
        t = self.type()
        tok = self.peek()
        if tok is not None:
            self.fail(f"unexpected {tok[1]!r} at position {tok[2]}")
        return t

    def type(self) -> Type:
        kind, text, pos = self.take("a type")
        if kind != "name":
            self.fail(f"expected a type at position {pos}, got {text!r}")
        name = text.lower()
        if name in SCALARS:
            return Scalar(name)
        if name == "decimal":
            return self.decimal()
        if name in ("list", "array"):
            self.expect("<")
            element = self.type()
            self.expect(">")
            return ListType(element)
        if name == "struct":
            return self.struct()
        if name == "map":
            self.expect("<")
            key = self.type()
            if key != Scalar("string"):
                raise InvalidSpecError(self.field, f"map keys must be string, not {key}")
            self.expect(",")
            value = self.type()
            self.expect(">")
            return MapType(value)
        known = ", ".join([*SCALARS, "decimal(p,s)", "list<T>", "struct<name:T,...>"])
        raise InvalidSpecError(self.field, f"{text!r} is not a type; one of {known}, map<string,T>")

    def decimal(self) -> DecimalType:
        tok = self.peek()
        if tok is None or tok[1] != "(":
            raise InvalidSpecError(self.field, "decimal needs a precision: decimal(p,s)")
        self.expect("(")
        precision = self.number("a precision")
        scale = 0
        if (tok := self.peek()) is not None and tok[1] == ",":
            self.expect(",")
            scale = self.number("a scale")
        self.expect(")")
        if precision < 1:
            raise InvalidSpecError(self.field, f"decimal precision {precision} is below 1")
        if precision > MAX_PRECISION:
            raise InvalidSpecError(
                self.field, f"decimal precision {precision} is above {MAX_PRECISION}"
            )
        if scale > precision:
            raise InvalidSpecError(
                self.field, f"decimal scale {scale} is above its precision {precision}"
            )
        return DecimalType(precision, scale)

    def struct(self) -> StructType:
        self.expect("<")
        fields: list[tuple[str, Type]] = []
        while True:
            kind, text, pos = self.take("a field name")
            if kind != "name":
                self.fail(f"expected a field name at position {pos}, got {text!r}")
            if any(n == text for n, _ in fields):
                raise InvalidSpecError(self.field, f"struct field {text!r} appears twice")
            self.expect(":")
            fields.append((text, self.type()))
            kind, sep, pos = self.take("',' or '>'")
            if sep == ">":
                return StructType(tuple(fields))
            if sep != ",":
                self.fail(f"expected ',' or '>' at position {pos}, got {sep!r}")


@lru_cache(maxsize=4096)
def _parse_cached(text: str) -> Type:
    return _Parser(text, "type").parse()


def parse_type(text: str, *, field: str = "type") -> Type:
    """The type ``text`` names; an InvalidSpecError naming ``field`` if it names none."""
    if not isinstance(text, str):
        raise InvalidSpecError(field, f"{text!r} is not a type name (a string)")
    try:
        return _parse_cached(text)
    except InvalidSpecError:
        return _Parser(text, field).parse()  # raises again, naming ``field``


def normalize(text: str, *, field: str = "type") -> str:
    """The canonical text of ``text`` (what a spec stores)."""
    return str(parse_type(text, field=field))


def to_arrow(t: Type) -> pa.DataType:
    if isinstance(t, Scalar):
        return SCALARS[t.name]
    if isinstance(t, DecimalType):
        return pa.decimal128(t.precision, t.scale)
    if isinstance(t, ListType):
        return pa.list_(to_arrow(t.element))
    if isinstance(t, StructType):
        return pa.struct([pa.field(n, to_arrow(ft)) for n, ft in t.fields])
    return pa.map_(pa.string(), to_arrow(t.value))


@lru_cache(maxsize=4096)
def arrow_type(text: str) -> pa.DataType:
    """The Arrow type of column type ``text``."""
    return to_arrow(parse_type(text))


def from_arrow(t: pa.DataType) -> str:
    """The column type text of Arrow type ``t`` (for messages)."""
    for name, arrow in SCALARS.items():
        if t == arrow:
            return name
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    if pa.types.is_map(t):
        return f"map<string,{from_arrow(t.item_type)}>"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return f"list<{from_arrow(t.value_type)}>"
    if pa.types.is_struct(t):
        return "struct<" + ",".join(f"{f.name}:{from_arrow(f.type)}" for f in t) + ">"
    return str(t)


def is_nested(text: str) -> bool:
    """A list, struct or map."""
    return isinstance(parse_type(text), ListType | StructType | MapType)


def is_decimal(text: str) -> bool:
    return isinstance(parse_type(text), DecimalType)


@lru_cache(maxsize=4096)
def has_decimal(t: pa.DataType) -> bool:
    """Whether Arrow type ``t`` holds a decimal anywhere (itself or nested)."""
    if pa.types.is_decimal(t):
        return True
    return any(has_decimal(t.field(i).type) for i in range(t.num_fields))


def overflowing_decimal_text(value: pa.Scalar) -> str:
    """The text of a decimal scalar that may not fit its own type (one
    :func:`decimal_overflow` found): read through a type wide enough to hold it."""
    return str(value.cast(pa.decimal256(2 * MAX_PRECISION, value.type.scale)).as_py())


def decimal_overflow(arr: pa.Array) -> np.ndarray:
    """Which values of ``arr`` hold a decimal (anywhere inside) with more integer digits
    than its type's precision allows. Arrow does not check this everywhere (its JSON reader
    takes ``"1234.5"`` for a ``decimal(5,2)``, and Parquet stores it), so every path into a
    table checks it, and such a value is refused rather than stored."""
    n = len(arr)
    t = arr.type
    if not has_decimal(t) or n == 0:
        return np.zeros(n, dtype=bool)
    if pa.types.is_decimal(t):
        wide = pa.decimal256(2 * MAX_PRECISION, t.scale)
        bound = pa.scalar(Decimal(10 ** (t.precision - t.scale)), wide)
        values = arr.cast(wide)
        over = pc.or_(pc.greater_equal(values, bound), pc.less_equal(values, pc.negate(bound)))
        return np.asarray(pc.fill_null(over, False).to_numpy(zero_copy_only=False), dtype=bool)
    out = np.zeros(n, dtype=bool)
    if pa.types.is_struct(t):
        for i in range(t.num_fields):
            out |= decimal_overflow(pc.struct_field(arr, [i]))
    if pa.types.is_map(t) or pa.types.is_list(t) or pa.types.is_large_list(t):
        # child values of the whole (unsliced) array, mapped to their parents by the offsets
        offsets = np.asarray(arr.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
        child = arr.items if pa.types.is_map(t) else arr.values
        lo, hi = int(offsets[0]), int(offsets[-1])
        inner = decimal_overflow(child.slice(lo, hi - lo))
        parents = np.repeat(np.arange(n, dtype=np.int64), np.diff(offsets))
        out[parents[inner]] = True
    valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    result: np.ndarray = out & valid
    return result
