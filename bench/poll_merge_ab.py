"""Poll merge A/B: a cached poll's merge onto the kept winners against an earlier ``table/poll.py``.

The merge a cached reader's poll of the streaming ground's 2,000,000-key table spends most of
its time in (``merge_onto``: the previous winners of the new rows' keys taken out of the kept
winners, merged with the new rows), timed in one process for the current module and an
earlier one loaded from its file, on the same winners and the same batches of stream records
(keys uniform over the table, 2% deletes, ``seq`` rising), interleaved; an A/A control times
the earlier module twice, so the machine's noise is measured in the same run. Each merge's
wall and CPU time (``time.process_time``, every thread of the process) are both printed: on a
machine shared with other work the wall is mostly the wait for a core. Each batch is
merged onto the winners the previous batch left (as polls do), and every result must equal
the earlier module's. Run from the repository root::

    git show HEAD~1:src/millstream/table/poll.py > /tmp/poll_before.py
    .venv/bin/python bench/poll_merge_ab.py /tmp/poll_before.py [--keys 2000000] [--batches 12]

``bench/poll_large.py`` times the whole poll (manifest, files, merge) in a process per tree.
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
import peers_workload as wl
import pyarrow as pa

from millstream.spec import TableSpec
from millstream.table import poll

SPEC = TableSpec.parse(
    {
        "name": "peers",
        "schema": wl.SCHEMA_SPEC,
        "primary_key": ["id"],
        "mode": "upsert",
        "comparison_column": "seq",
        "delete_column": "is_deleted",
    }
)
PARTITIONS = 4

Merge = Callable[[TableSpec, pa.Table, pa.Table, pa.Table], tuple[pa.Table, pa.Table]]


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("poll_before", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while building
    spec.loader.exec_module(module)
    return module


def _rows(recs: wl.Records, offsets: dict[int, int]) -> pa.Table:
    """The records as rows of partition ``id % 4``, each at its partition's next offset."""
    parts = (recs.id % PARTITIONS).astype(np.int32)
    offs = np.zeros(len(recs), np.int64)
    for p in range(PARTITIONS):
        mine = parts == p
        k = int(mine.sum())
        offs[mine] = np.arange(offsets[p], offsets[p] + k)
        offsets[p] += k
    rows = wl.to_arrow(recs)
    rows = rows.append_column("_ms_partition", pa.array(parts))
    rows = rows.append_column("_ms_offset", pa.array(offs))
    rows = rows.append_column("_ms_tombstone", pa.array(np.zeros(len(recs), bool)))
    return rows.cast(SPEC.arrow_schema(system_columns=True))


def _same(a: tuple[pa.Table, pa.Table], b: tuple[pa.Table, pa.Table]) -> bool:
    return all(x.sort_by("id").equals(y.sort_by("id")) for x, y in zip(a, b, strict=True))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path, help="the earlier table/poll.py")
    parser.add_argument("--keys", type=int, default=2_000_000)
    parser.add_argument("--batches", type=int, default=12, help="polls, one batch each")
    parser.add_argument("--batch-rows", type=int, default=5_000)
    args = parser.parse_args(argv)
    print(f"$ {common.command_line('poll_merge_ab.py')}")
    print(f"load {common.load_text()}; {common.cpu_model()}")
    before = _load(args.before)
    offsets = {p: 0 for p in range(PARTITIONS)}
    live, dead = poll.merge_all(SPEC, _rows(wl.preload(args.keys, 0, args.keys), offsets))
    live = pa.Table.from_batches(live.combine_chunks().to_batches(max_chunksize=poll.CHUNK_ROWS))
    dead = dead.cast(live.schema)
    trees: dict[str, Merge] = {"this tree": poll.merge_onto, "before": before.merge_onto}
    trees["before (A/A)"] = before.merge_onto
    state = {name: (live, dead) for name in trees}
    times: dict[str, list[float]] = {name: [] for name in trees}
    cpu: dict[str, list[float]] = {name: [] for name in trees}
    sent, same = 0, True
    for i in range(args.batches):
        recs = wl.records(7, args.keys, sent, args.batch_rows, wl.STREAM_SEQ_BASE)
        sent += len(recs)
        new = _rows(recs, offsets)
        order = list(trees) if i % 2 == 0 else list(reversed(trees))
        for name in order:
            t0, c0 = time.perf_counter(), time.process_time()
            state[name] = trees[name](SPEC, *state[name], new)
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
        same = same and _same(state["this tree"], state["before"])
    base = statistics.median(times["before"])
    cpu_base = statistics.median(cpu["before"])
    for name, xs in times.items():
        med = statistics.median(xs)
        cpu_med = statistics.median(cpu[name])
        print(
            f"{name}: merge onto {live.num_rows:,} winners of a {args.batch_rows:,}-row batch "
            f"{med * 1000:,.0f} ms (p90 {common.percentile(xs, 90) * 1000:,.0f}), "
            f"{med / base:.2f}x before; CPU {cpu_med * 1000:,.0f} ms "
            f"(p90 {common.percentile(cpu[name], 90) * 1000:,.0f}), {cpu_med / cpu_base:.2f}x before"
        )
    print(f"load {common.load_text()}; every result equals the earlier module's: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
