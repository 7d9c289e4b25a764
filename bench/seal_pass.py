"""What a worker's sealing pass costs over N busy tables whose runs are not due yet: with the
skip of an unchanged table's manifest read, and with every pass reading it (as before).

Run from the repository root (not part of CI; about a minute)::

    .venv/bin/python bench/seal_pass.py                 # 50 tables of 2 partitions
    # options: --tables N --entries E --passes P --rounds R

A SQLite metadata store with a local deep store; N upsert tables, each with E committed
batches per partition (a busy table's unsealed run, below every threshold). One
:class:`~millstream.sealing.sealer.Sealer` a table, as a worker has; a pass is ``seal_due``
over every table, as the worker's sealing loop runs it. Per pass: CPU seconds
(``time.process_time``) and manifest reads, with the skip and with the skip defeated (the
sealer's last read forgotten before each pass: every pass reads, as before the skip), the two
alternating in each round so both see the same load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from millstream.catalog import Catalog
from millstream.sealing.sealer import Sealer
from millstream.sealing.thresholds import Thresholds
from millstream.spec import TableSpec
from millstream.table.writer import commit_staged, stage_rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tables", type=int, default=50)
    ap.add_argument("--entries", type=int, default=20)
    ap.add_argument("--passes", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="seal-pass-"))
    cat = Catalog.open(home=home)
    reads = [0]
    real = cat.manifest

    def counted(table: str, **kw: Any) -> Any:
        reads[0] += 1
        return real(table, **kw)

    sealers = []
    for i in range(args.tables):
        spec = TableSpec.parse(
            {
                "name": f"t{i}",
                "schema": {"k": "long", "v": "long"},
                "mode": "upsert",
                "primary_key": ["k"],
            }
        )
        cat.create_table(spec)
        for p in range(2):
            for b in range(args.entries):
                rows = pa.Table.from_pylist(
                    [
                        {
                            "k": k,
                            "v": b,
                            "_ms_partition": p,
                            "_ms_offset": b * 5 + k,
                            "_ms_tombstone": False,
                        }
                        for k in range(5)
                    ],
                    schema=spec.arrow_schema(system_columns=True),
                )
                staged = stage_rows(cat.deep, spec, rows)
                commit_staged(
                    cat.store, cat.deep, spec.name, staged, {p: (b * 5, b * 5 + 5)}, {p: 0}
                )
        sealers.append(Sealer(cat, spec.name, thresholds=Thresholds(flush_seconds=3600)))
    setattr(cat, "manifest", counted)  # noqa: B010 (count the reads every Sealer makes)
    for s in sealers:
        s.seal_due()  # the first pass reads every table (and compaction finds nothing to do)

    def one_pass(skip: bool) -> tuple[float, int]:
        before, cpu = reads[0], time.process_time()
        for s in sealers:
            if not skip:
                s._last_read = None  # as before the skip: every pass reads the manifest
            s.seal_due()
        return time.process_time() - cpu, reads[0] - before

    got: dict[bool, list[tuple[float, int]]] = {True: [], False: []}
    for _ in range(args.rounds):
        for skip in (False, True):
            got[skip] += [one_pass(skip) for _ in range(args.passes)]
    load = os.getloadavg()
    for skip in (False, True):
        cpu = statistics.median(c for c, _ in got[skip])
        n = statistics.median(r for _, r in got[skip])
        print(
            f"{'skip' if skip else 'read every pass'}: {cpu * 1000:.0f} ms CPU a pass over "
            f"{args.tables} tables, {n:.0f} manifest reads a pass"
        )
    ratio = statistics.median(c for c, _ in got[False]) / statistics.median(c for c, _ in got[True])
    print(f"ratio {ratio:.1f}x; load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")


if __name__ == "__main__":
    main()
