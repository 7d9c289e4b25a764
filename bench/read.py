"""Read benchmark: what reading a current upsert table costs, against plain Parquet, before
and after sealing.

Run from the repository root::

    .venv/bin/python bench/read.py            # 200k keys x 5 updates (1M rows), ~1 minute
    .venv/bin/python bench/read.py --quick    # 40k keys x 5 updates, a few seconds

The table is ``bench/commit.py``'s read table: N keys x 5 updates written as 20 commits over 4
partitions, keys partition-affine, every key's last update in the last round. It is read:

1. **Unsealed** (20 files of consuming segments, every version of every key): through
   ``Catalog.read_table`` (manifest, file reads, merge), and broken down by stage.
2. **Sealed** (each partition's run sealed into one file of each key's last row, by the
   production ``Sealer.seal_partition``): the same.
3. **Sealed, by key**: the same table declared ``partitioned_by_key`` (its keys are
   partition-affine), sealed: each partition is read alone, in parallel, and needs no merge
   (its sealed rows are final).
4. **Sealed, string key**: the same rows with the key a string (``order-<id>``), not
   partitioned by key, sealed: against plain Parquet of its own live rows.

Baselines, measured in the same run, each the median of the repetitions, page cache warm:

* ``plain, same files``: ``pyarrow.parquet.read_table`` of the table's data files (every row
  they hold: 1M unsealed, N sealed);
* ``plain, live rows``: ``pyarrow.parquet.read_table`` of one Parquet file (zstd, as segments
  are written) holding just the table's current rows: what the answer costs to read when
  someone else already did the merge.

It prints one row per measurement and the ratios; ``--json PATH`` saves them.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import common
import pyarrow.compute as pc
import pyarrow.parquet as pq
from commit import READ_TABLE, Settings, _timed, build_read_table
from rich.console import Console
from rich.table import Table

from millstream.catalog import Catalog
from millstream.core.engines import engine_for
from millstream.sealing.compaction import CompactionPolicy
from millstream.sealing.sealer import Sealer
from millstream.spec import SYSTEM_COLUMNS
from millstream.table.read import read_entries


def measure(cat: Catalog, live_file: Path, repeats: int) -> dict[str, float]:
    """Median milliseconds of the end-to-end read, its stages and the two baselines."""
    manifest = cat.manifest(READ_TABLE)
    spec = manifest.table.spec
    files = sorted({f"{cat.deep.root}/{e.file_path}" for e in manifest.entries if e.file_path})
    times: dict[str, list[float]] = {}

    def rec(name: str, ms: float) -> None:
        times.setdefault(name, []).append(ms)

    for _ in range(repeats):
        rec("Catalog.read_table", _timed(cat.read_table, READ_TABLE)[0])
        rec("plain, same files", _timed(pq.read_table, files)[0])
        rec("plain, live rows", _timed(pq.read_table, live_file)[0])
        ms, man = _timed(cat.manifest, READ_TABLE)
        rec("  manifest (metadata query)", ms)
        ms, raw = _timed(read_entries, cat.deep, spec, man.entries)
        rec("  file read (read_entries)", ms)
        ms, rows = _timed(engine_for(spec).resolve, raw)
        rec("  merge (MergeEngine.resolve)", ms)
        rec("  drop system columns", _timed(rows.drop_columns, list(SYSTEM_COLUMNS))[0])
    out = {name: statistics.median(v) for name, v in times.items()}
    out["files"] = float(len(files))
    out["rows in files"] = float(sum(pq.ParquetFile(f).metadata.num_rows for f in files))
    return out


def seal_all(sealer: Sealer, partitions: int, *, compact: bool = False) -> None:
    """Seal every partition's segments (and compact each partition's sealed ones)."""
    for p in range(partitions):
        while sealer.seal_partition(p, force=True) is not None:
            pass
        while compact and sealer.compact_partition(p) is not None:
            pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="40k keys, 2 repetitions")
    parser.add_argument("--repeats", type=int, default=None, help="repetitions (default 7)")
    parser.add_argument("--json", type=Path, default=None, help="save the figures here")
    args = parser.parse_args(argv)
    s = Settings.for_mode(args.quick)
    repeats = args.repeats or s.read_repeats
    console = Console(soft_wrap=True)
    console.print(f"$ {common.command_line('read.py')}")
    console.print(f"load {common.load_text()}; {common.cpu_model()}")

    phases: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="millstream-bench-read-") as tmp:
        home = Path(tmp) / "home"
        with Catalog.open(home=home) as cat:
            write_s, total = build_read_table(cat, s)
            console.print(f"wrote {total:,} rows in {write_s:.1f} s")
            current = cat.read_table(READ_TABLE)
            keys = s.read_keys // s.read_partitions * s.read_partitions
            assert current.num_rows == keys, (current.num_rows, keys)
            last_round = float(s.read_updates - 1)
            assert pc.all(pc.equal(current.column("amount"), last_round)).as_py(), "stale rows"
            live_file = Path(tmp) / "live.parquet"
            pq.write_table(current, live_file, compression="zstd")
            phases["unsealed"] = measure(cat, live_file, repeats)

            seal_all(Sealer(cat, READ_TABLE), s.read_partitions)
            after = cat.read_table(READ_TABLE)
            assert after.sort_by("id").equals(current.sort_by("id")), "sealing changed the table"
            phases["sealed"] = measure(cat, live_file, repeats)

        # The same table declared partitioned_by_key (its keys are partition-affine), sealed
        # (and compacted: nothing to merge after one seal per partition).
        with Catalog.open(home=Path(tmp) / "home-by-key") as cat:
            build_read_table(cat, s, partitioned_by_key=True)
            policy = CompactionPolicy(min_segments=2)
            seal_all(Sealer(cat, READ_TABLE, compaction=policy), s.read_partitions, compact=True)
            after = cat.read_table(READ_TABLE)
            assert after.sort_by("id").equals(current.sort_by("id")), "by key: another table"
            phases["sealed, by key"] = measure(cat, live_file, repeats)

        # The same rows keyed by a string (order-<id>), not partitioned by key, sealed: its
        # own plain live rows (the key column is a string there too).
        with Catalog.open(home=Path(tmp) / "home-string") as cat:
            build_read_table(cat, s, string_key=True)
            string_rows = cat.read_table(READ_TABLE)
            seal_all(Sealer(cat, READ_TABLE), s.read_partitions)
            after = cat.read_table(READ_TABLE)
            assert after.sort_by("id").equals(string_rows.sort_by("id")), "string key: changed"
            assert after.num_rows == keys, (after.num_rows, keys)
            string_live = Path(tmp) / "live-string.parquet"
            pq.write_table(string_rows, string_live, compression="zstd")
            phases["sealed, string key"] = measure(cat, string_live, repeats)

    table = Table(
        title=f"reading {keys:,} live rows of {total:,} written (ms, median of {repeats})"
    )
    table.add_column("measure")
    for phase in phases:
        table.add_column(phase, justify="right")
    names = [n for n in phases["unsealed"] if n not in ("files", "rows in files")]
    for name in ("files", "rows in files", *names):
        table.add_row(name, *(f"{phases[p][name]:,.0f}" for p in phases))
    console.print(table)
    result: dict[str, Any] = {"settings": vars(s), "phases": phases, "ratios": {}}
    for phase, m in phases.items():
        read = m["Catalog.read_table"]
        same, live = read / m["plain, same files"], read / m["plain, live rows"]
        result["ratios"][phase] = {"vs same files": same, "vs live rows": live}
        console.print(
            f"{phase}: Catalog.read_table {read:.0f} ms = {same:.2f}x plain Parquet of the "
            f"same files ({m['plain, same files']:.0f} ms), {live:.2f}x plain Parquet of the "
            f"live rows ({m['plain, live rows']:.0f} ms)"
        )
    if args.json is not None:
        common.write_json(args.json, {"machine": common.machine("pyarrow"), **result})
    return 0


if __name__ == "__main__":
    sys.exit(main())
