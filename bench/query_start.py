"""What ``millstream query`` costs as a user runs it: the console script, a fresh process each
time, over a small table (SQLite metadata, local deep store), against a baseline of the same
run.

Run from the repository root (not part of CI; 2-5 minutes on a busy 2-core machine)::

    .venv/bin/python bench/query_start.py                        # 7 rounds
    .venv/bin/python bench/query_start.py --runs 9 --json /tmp/q.json
    .venv/bin/python bench/query_start.py --compare-src /tmp/old/src   # and another tree's CLI

The home holds ``orders``: an upsert table of 5 records (ids 1-4, id 2 updated once; 4 current
rows, one segment), written through the library (``Catalog.create_table``, ``stage_rows``,
``commit_staged``). Every round runs each command once, in a new process, one after the
other (interleaved, so a load that comes and goes hits them alike):

* ``startup``: ``python -c pass``;
* ``baseline``: ``python -c "import pyarrow, duckdb"``, the two libraries the answer needs;
* ``query``: ``millstream query "SELECT * FROM orders ORDER BY id" --home H`` (DuckDB);
* ``table list``: ``millstream table list --home H``;
* ``--help``: ``millstream --help``;
* ``query, no bytecode cache`` and ``baseline, no bytecode cache``: the same with every module
  compiled from source (``PYTHONDONTWRITEBYTECODE=1`` and an empty ``PYTHONPYCACHEPREFIX``): a
  fresh install whose ``__pycache__`` directories cannot be written;
* ``+ SQLAlchemy``, ``+ Typer, Rich, pydantic``, ``+ Millstream``: ``python -c "import ..."``
  of the baseline's modules and the query's other imports, one group added at each step:
  where the query's time goes (the last step is every module the query imports);
* with ``--compare-src DIR``: ``query (DIR)``, the same console script with ``PYTHONPATH=DIR``.

The other commands use a bytecode cache of their own (``PYTHONPYCACHEPREFIX`` in the work
directory, written by two warm-up rounds), as any install has after its first run. Prints each
command's median wall time and CPU (user + sys of the process), the median of each round's
ratios (wall and CPU) to the baseline, and the load average before and after: on a busy
machine the ratios, CPU's most, say more than the seconds. Results go to
``bench/results/query-start-<time>.json`` and ``--json PATH``.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import common
import pyarrow as pa

from millstream.catalog import Catalog
from millstream.table.writer import commit_staged, stage_rows

MILLSTREAM = Path(sys.executable).parent / "millstream"
#: The query's imports beyond the baseline, by group, each step adding one (what
#: ``python -X importtime`` shows a DuckDB query importing)
IMPORT_STEPS = (
    ("+ SQLAlchemy", ["sqlalchemy", "sqlalchemy.dialects.sqlite"]),
    ("+ Typer, Rich, pydantic", ["typer", "typer._adapters", "rich.console", "rich.table"]),
    (
        "+ Millstream (= the query's imports)",
        ["millstream.cli.app", "millstream.catalog", "millstream.cli.query"],
    ),
)
SQL = "SELECT * FROM orders ORDER BY id"


def make_home(home: Path) -> None:
    with Catalog.open(home=home) as cat:
        cat.create_table(
            {
                "name": "orders",
                "schema": {"id": "long", "status": "string", "amount": "double"},
                "primary_key": ["id"],
                "mode": "upsert",
            }
        )
        spec = cat.table("orders").spec
        n = 5
        rows = pa.table(
            {
                "id": pa.array([1, 2, 3, 4, 2], pa.int64()),
                "status": ["new", "new", "new", "new", "paid"],
                "amount": [10.0, 20.0, 30.0, 40.0, 21.0],
                "_ms_partition": pa.array([0] * n, pa.int32()),
                "_ms_offset": pa.array(range(n), pa.int64()),
                "_ms_tombstone": pa.array([False] * n),
            }
        )
        staged = stage_rows(cat.deep, spec, rows)
        commit_staged(cat.store, cat.deep, "orders", staged, {0: (0, n)}, {})


def run(argv: list[str], env: dict[str, str], expect: str | None) -> tuple[float, float]:
    """Wall and CPU seconds of one process running ``argv``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0 or (expect is not None and expect not in done.stdout):
        raise RuntimeError(f"{argv} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--compare-src", type=Path, help="another source tree's CLI, also run")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    with common.workdir("query-start-") as work:
        home = work / "home"
        make_home(home)
        cached = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        cached["PYTHONPYCACHEPREFIX"] = str(work / "pyc")
        uncached = {
            **cached,
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONPYCACHEPREFIX": str(work / "empty"),
        }
        py = sys.executable
        query = [str(MILLSTREAM), "query", SQL, "--home", str(home)]
        commands: dict[str, tuple[list[str], dict[str, str], str | None]] = {
            "startup": ([py, "-c", "pass"], cached, None),
            "baseline": ([py, "-c", "import pyarrow, duckdb"], cached, None),
            "query": (query, cached, "paid"),
            "table list": (
                [str(MILLSTREAM), "table", "list", "--home", str(home)],
                cached,
                "orders",
            ),
            "--help": ([str(MILLSTREAM), "--help"], cached, "query"),
            "baseline, no bytecode cache": ([py, "-c", "import pyarrow, duckdb"], uncached, None),
            "query, no bytecode cache": (query, uncached, "paid"),
        }
        # Where the query's time goes: its imports, added one group at a time.
        imports = ["pyarrow", "duckdb"]
        for name, group in IMPORT_STEPS:
            imports += group
            commands[name] = ([py, "-c", "import " + ", ".join(imports)], cached, None)
        if args.compare_src is not None:
            other = {**cached, "PYTHONPATH": str(args.compare_src.resolve())}
            other["PYTHONPYCACHEPREFIX"] = str(work / "pyc-other")
            commands[f"query ({args.compare_src})"] = (query, other, "paid")
        where = subprocess.run(
            [py, "-c", "import millstream; print(millstream.__file__)"],
            env=cached,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        common.log(f"millstream from {where}; {args.runs} rounds of {len(commands)} commands")
        for _ in range(2):  # the bytecode caches
            for cmd, env, expect in commands.values():
                run(cmd, env, expect)
        load_before = common.load_text()
        walls: dict[str, list[float]] = {name: [] for name in commands}
        cpus: dict[str, list[float]] = {name: [] for name in commands}
        for i in range(args.runs):
            for name, (cmd, env, expect) in commands.items():
                wall, cpu = run(cmd, env, expect)
                walls[name].append(wall)
                cpus[name].append(cpu)
            common.log(
                f"round {i + 1}: "
                + ", ".join(f"{name} {w[-1]:.2f}s" for name, w in walls.items())
                + f" (load {common.load_text()})"
            )
        load_after = common.load_text()

    def base_of(name: str) -> str:
        return "baseline, no bytecode cache" if "no bytecode" in name else "baseline"

    rows: dict[str, dict[str, float]] = {}
    for name in commands:
        base = walls[base_of(name)]
        base_cpu = cpus[base_of(name)]
        rows[name] = {
            "wall_s": statistics.median(walls[name]),
            "cpu_s": statistics.median(cpus[name]),
            "wall_ratio": statistics.median(w / b for w, b in zip(walls[name], base, strict=True)),
            "cpu_ratio": statistics.median(
                c / b for c, b in zip(cpus[name], base_cpu, strict=True) if b > 0
            ),
        }
    common.log(f"load average before {load_before}, after {load_after}; medians of {args.runs}")
    common.log("(ratios: the median of each round's ratio to the baseline of the same round)")
    common.log(f"{'command':<38} {'wall s':>7} {'CPU s':>7} {'wall/base':>10} {'CPU/base':>9}")
    for name, r in rows.items():
        common.log(
            f"{name:<38} {r['wall_s']:7.2f} {r['cpu_s']:7.2f} "
            f"{r['wall_ratio']:9.2f}x {r['cpu_ratio']:8.2f}x"
        )
    common.save_results(
        "query-start",
        {
            "command": common.command_line("query_start.py"),
            "millstream": where,
            "load_before": load_before,
            "load_after": load_after,
            "walls": walls,
            "cpus": cpus,
            "medians": rows,
            "machine": common.machine("pyarrow", "duckdb"),
        },
        args.json,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
