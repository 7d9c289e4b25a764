"""What the Iceberg publisher costs a worker with many tables: CPU seconds per publish round.

Run from the repository root::

    .venv/bin/python bench/iceberg_many_tables.py                      # this checkout alone
    .venv/bin/python bench/iceberg_many_tables.py --baseline main      # and main's code, same run

What runs is the production publisher (:class:`~millstream.sealing.maintenance.Publisher`,
``run_due``, the step a worker's publisher process runs), in process, over ``--tables`` small
upsert tables (each with its dead-letter table, as a worker hands them over: a datastream per
table, the table and its dead-letter table; the dead-letter tables get no records), on the
embedded metadata store and deep store. After a first round (every table's first publish), it
plays ``--rounds`` rounds of each kind and reports the median CPU seconds (``process_time``)
of a round and per table:

* ``all changed``: every table got one 10-row commit since the last round (the scale bench's
  multi-table datastream between two publishes);
* ``one changed``: one table of them did;
* ``none changed``: nothing new anywhere.

With ``--baseline REV`` the same measurement runs on the code of git revision ``REV`` too (its
``src/`` exported to a temporary directory, each side in a fresh process, alternating
``--repeat`` times, the machine's load drifts), and the summary prints this checkout's median
over the baseline's for each kind.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
KINDS = ("all changed", "one changed", "none changed")


def measure(tables: int, rounds: int) -> dict[str, float]:
    """One side's medians: CPU seconds per round of each kind."""
    import numpy as np
    import pyarrow as pa

    from millstream.catalog import Catalog
    from millstream.clock import ManualClock
    from millstream.datastream import dead_letter_spec
    from millstream.sealing.maintenance import Publisher
    from millstream.table.writer import commit_staged, stage_rows

    home = Path(tempfile.mkdtemp(prefix="ms-iceberg-many-"))
    cat = Catalog.open(home=home)
    names = [f"t{i:03d}" for i in range(tables)]
    upper = dict.fromkeys(names, 0)
    specs = {}
    for n in names:
        specs[n] = cat.create_table(
            {
                "name": n,
                "schema": {"k": "long", "v": "double"},
                "mode": "upsert",
                "primary_key": ["k"],
            }
        ).spec
        cat.create_table(dead_letter_spec(specs[n]))
    rng = np.random.default_rng(0)

    def commit(n: str, rows: int = 10) -> None:
        lo = upper[n]
        batch = pa.table(
            {
                "k": pa.array(rng.integers(0, 50, rows), pa.int64()),
                "v": pa.array(rng.random(rows)),
                "_ms_partition": pa.array(np.zeros(rows, np.int32)),
                "_ms_offset": pa.array(np.arange(lo, lo + rows, dtype=np.int64)),
                "_ms_tombstone": pa.array(np.zeros(rows, bool)),
            }
        )
        staged = stage_rows(cat.deep, specs[n], batch)
        commit_staged(cat.store, cat.deep, n, staged, {0: (lo, lo + rows)}, {})
        upper[n] = lo + rows

    clock = ManualClock(time.time())
    publisher = Publisher(cat, interval=15.0, clock=clock)
    handed = {n: [n, dead_letter_spec(n).name] for n in names}

    def round_cpu() -> float:
        clock.advance(20)
        c0 = time.process_time()
        publisher.run_due(handed)
        return time.process_time() - c0

    for n in names:
        commit(n)
    round_cpu()  # every table's first publish
    seconds: dict[str, list[float]] = {k: [] for k in KINDS}
    for r in range(rounds):
        for n in names:
            commit(n)
        seconds["all changed"].append(round_cpu())
        commit(names[r % len(names)])
        seconds["one changed"].append(round_cpu())
        seconds["none changed"].append(round_cpu())
    cat.close()
    return {k: statistics.median(v) for k, v in seconds.items()}


def run_side(src: Path, tables: int, rounds: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run(
        [sys.executable, __file__, "--child", "--tables", str(tables), "--rounds", str(rounds)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tables", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline", metavar="REV", help="also measure git revision REV's code")
    parser.add_argument("--repeat", type=int, default=2, help="alternations with --baseline")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.tables, args.rounds)))
        return
    sides = {"this": REPO / "src"}
    tmp = None
    if args.baseline:
        tmp = tempfile.TemporaryDirectory(prefix="ms-baseline-")
        archive = subprocess.run(
            ["git", "archive", args.baseline, "src"], cwd=REPO, check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", tmp.name], input=archive, check=True)
        sides["baseline"] = Path(tmp.name) / "src"
    print(
        f"{args.tables} tables (+ {args.tables} dead-letter tables), {args.rounds} rounds of "
        f"each kind; load average {os.getloadavg()[0]:.1f}"
    )
    results: dict[str, list[dict[str, float]]] = {s: [] for s in sides}
    for i in range(args.repeat if args.baseline else 1):
        order = list(sides) if i % 2 == 0 else list(reversed(sides))
        for side in order:
            r = run_side(sides[side], args.tables, args.rounds)
            results[side].append(r)
            cells = ", ".join(
                f"{k} {r[k]:.3f} CPU-s ({r[k] / args.tables * 1000:.1f} ms a table)" for k in KINDS
            )
            print(f"  {side:8} {cells}; load {os.getloadavg()[0]:.1f}", flush=True)
    med = {s: {k: statistics.median(r[k] for r in rs) for k in KINDS} for s, rs in results.items()}
    print("median CPU-s per round:")
    for k in KINDS:
        line = f"  {k:13} this {med['this'][k]:.3f}"
        if "baseline" in med:
            b = med["baseline"][k]
            line += f", baseline {b:.3f}: {med['this'][k] / b:.2f}x"
        print(line)
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
