"""Merge engines: what a table's ``mode`` means, one module per engine behind one interface
(:class:`~millstream.core.engines.base.MergeEngine`), reached from the table spec with
:func:`engine_for`.

* :mod:`~millstream.core.engines.append`   every row.
* :mod:`~millstream.core.engines.dedup`    the first row of a key wins.
* :mod:`~millstream.core.engines.upsert`   the last row of a key wins.
* :mod:`~millstream.core.engines.partial`  a key's rows fold column by column.

An engine answers how rows resolve (reads), what a run compacts to (seals and compactions),
whether seals write delete vectors and what the key index keeps of a sealed row, which sealed
rows a run supersedes, and whether a sealed partition is already merged. The order key,
deletes and effective comparison values they share are in :mod:`millstream.core.merge`. Every
other module asks the engine: none compares ``table.mode`` itself (a unit test,
``tests/unit/core/test_engines_home.py``, fails on one). The table spec
(:mod:`millstream.spec`) still declares the modes and validates which options each accepts.
"""

from __future__ import annotations

from millstream.core.engines.append import Append
from millstream.core.engines.base import MergeEngine
from millstream.core.engines.dedup import Dedup
from millstream.core.engines.partial import Partial
from millstream.core.engines.upsert import Upsert
from millstream.spec import TableSpec

#: The engine class of each ``table.mode``.
ENGINES: dict[str, type[MergeEngine]] = {e.mode: e for e in (Append, Dedup, Upsert, Partial)}


def engine_for(spec: TableSpec) -> MergeEngine:
    """The merge engine of the table ``spec`` describes."""
    return ENGINES[spec.mode](spec)


__all__ = ["ENGINES", "Append", "Dedup", "MergeEngine", "Partial", "Upsert", "engine_for"]
