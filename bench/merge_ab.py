"""Merge A/B: each engine's ``resolve`` and ``compact`` against an earlier ``core/merge.py``.

The earlier module is loaded from its file beside the current engines, in one process, and both
run on the same seeded rows, interleaved, with a control that times the earlier code twice
(A/A) so the machine's noise is measured in the same run. Every output must equal the earlier
one. Run from the repository root::

    git show 9d52408:src/millstream/core/merge.py > /tmp/merge_before.py
    .venv/bin/python bench/merge_ab.py /tmp/merge_before.py [--rows 200000] [--repeats 15]

(9d52408 is the last commit with ``resolve`` and ``compact`` in ``core/merge.py``.)
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import common
import numpy as np
import pyarrow as pa

from millstream.core.engines import engine_for
from millstream.spec import OFFSET_COL, PARTITION_COL, TOMBSTONE_COL, TableSpec


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cases(n: int) -> dict[str, tuple[TableSpec, pa.Table]]:
    rng = np.random.default_rng(7)
    cols = {
        "id": pa.array(rng.integers(0, max(1, n // 5), n)),
        "qty": pa.array(rng.integers(0, 100, n)),
        "ts": pa.array(rng.integers(0, 10_000, n)),
        "note": pa.array([None] * n, pa.string()),
        PARTITION_COL: pa.array(rng.integers(0, 4, n).astype(np.int32)),
        OFFSET_COL: pa.array(np.arange(n, dtype=np.int64)),
    }
    tombstones = rng.random(n) < 0.01

    def spec(mode: str, **options: object) -> TableSpec:
        d: dict[str, object] = {
            "name": "t",
            "schema": {"id": "long", "qty": "long", "ts": "long", "note": "string"},
            "mode": mode,
            **options,
        }
        if mode != "append":
            d["primary_key"] = ["id"]
        return TableSpec.model_validate(d)

    def rows(deletes: bool) -> pa.Table:
        flags = tombstones if deletes else np.zeros(n, dtype=bool)
        return pa.table({**cols, TOMBSTONE_COL: pa.array(flags)})

    return {
        "append": (spec("append"), rows(False)),
        "upsert (by position)": (spec("upsert"), rows(True)),
        "upsert (comparison column)": (spec("upsert", comparison_column="ts"), rows(True)),
        "dedup (by position, no deletes)": (spec("dedup"), rows(False)),
        "dedup (deletes)": (spec("dedup"), rows(True)),
        "partial (sum)": (spec("partial", partial={"qty": "sum"}), rows(True)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path, help="an earlier core/merge.py")
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    before, again = _load(args.before, "merge_before"), _load(args.before, "merge_before_again")
    print(f"$ {common.command_line('merge_ab.py')}; load {common.load_text()}")
    print("case | before | before again | engines | again/before | engines/before (median ms)")
    for name, (spec, rows) in _cases(args.rows).items():
        for fn in ("resolve", "compact"):
            runs: list[Callable[[], pa.Table]] = [
                lambda m=before, f=fn, s=spec, r=rows: getattr(m, f)(s, r),
                lambda m=again, f=fn, s=spec, r=rows: getattr(m, f)(s, r),
                lambda f=fn, s=spec, r=rows: getattr(engine_for(s), f)(r),
            ]
            if not runs[0]().equals(runs[2]()):
                print(f"{fn} {name}: the engines' output differs", file=sys.stderr)
                return 1
            times: list[list[float]] = [[], [], []]
            for i in range(args.repeats):
                for k in ((i + j) % 3 for j in range(3)):  # rotate who runs first
                    t0 = time.perf_counter()
                    runs[k]()
                    times[k].append((time.perf_counter() - t0) * 1000)
            b, a, e = (statistics.median(t) for t in times)
            print(f"{fn} {name} | {b:.1f} | {a:.1f} | {e:.1f} | {a / b:.2f} | {e / b:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
