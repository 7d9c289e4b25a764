"""The RSS of a process tree by kind of process, every second: which process of a
``millstream run`` (or worker) holds what, and when.

Run beside a benchmark, from the repository root::

    .venv/bin/python bench/tree_rss.py sample --match /tmp/work --out /tmp/rss.jsonl &
    .venv/bin/python bench/peers.py stream --keys 2000000 --work /tmp/work ...
    .venv/bin/python bench/tree_rss.py show /tmp/rss.jsonl

``sample`` finds every ``millstream run -f`` process whose command line holds ``--match``
(not one started by another such process), and appends a JSON line a second with the MB of
RSS of its tree by kind: ``run`` (the writer's own process), ``jvm``, ``pyworker`` (Spark's
Python task workers, ``millstream.spark.daemon``), ``pydaemon`` (PySpark's daemons and its
streaming source and sink runners), ``publisher`` (the Iceberg publisher child) and
``total``. It stops when killed. ``show`` prints each kind's peak, the sample at the total's
peak, and the samples every ``--every`` seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any


def kind(cmd: str) -> str:
    if "/java" in cmd.split(" ", 1)[0]:
        return "jvm"
    if "millstream.sealing.publishing" in cmd:
        return "publisher"
    if "millstream.spark.daemon" in cmd:
        return "pyworker"
    if "pyspark" in cmd:
        return "pydaemon"
    if " run " in cmd:
        return "run"
    return "other"


def sample(match: str, out: Path) -> None:
    page = os.sysconf("SC_PAGE_SIZE")
    with out.open("a") as f:
        while True:
            procs: dict[int, tuple[int, int, str]] = {}
            kids: dict[int, list[int]] = {}
            for d in Path("/proc").iterdir():
                if not d.name.isdigit():
                    continue
                try:
                    st = (d / "stat").read_text()
                    fields = st[st.rindex(")") + 2 :].split()
                    cmd = (
                        (d / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
                    )
                except (OSError, ValueError):
                    continue
                procs[int(d.name)] = (int(fields[1]), int(fields[21]) * page, cmd)
                kids.setdefault(int(fields[1]), []).append(int(d.name))
            roots = [
                p
                for p, (parent, _, cmd) in procs.items()
                if "run -f" in cmd
                and match in cmd
                and "run -f" not in procs.get(parent, (0, 0, ""))[2]
            ]
            rec: dict[str, Any] = {"t": round(time.time(), 1)}
            todo, total = list(roots), 0
            while todo:
                p = todo.pop()
                todo.extend(kids.get(p, []))
                _, rss, cmd = procs.get(p, (0, 0, ""))
                k = kind(cmd)
                rec[k] = rec.get(k, 0) + (rss >> 20)
                total += rss >> 20
            if roots:
                rec["total"] = total
                f.write(json.dumps(rec) + "\n")
                f.flush()
            time.sleep(1)


def show(path: Path, every: int) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    if not rows:
        print("no samples")
        return
    t0 = rows[0]["t"]
    peak: dict[str, int] = {}
    for r in rows:
        for k, v in r.items():
            if k != "t":
                peak[k] = max(peak.get(k, 0), v)
    top = max(rows, key=lambda r: r.get("total", 0))
    print(f"{len(rows)} samples; peak MB by kind: {dict(sorted(peak.items()))}")
    print(
        f"at the total's peak ({top['t'] - t0:.0f} s): { {k: v for k, v in top.items() if k != 't'} }"
    )
    for r in rows[::every]:
        print(f"{r['t'] - t0:6.0f} s  " + "  ".join(f"{k} {v}" for k, v in r.items() if k != "t"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sample")
    s.add_argument("--match", required=True)
    s.add_argument("--out", type=Path, required=True)
    w = sub.add_parser("show")
    w.add_argument("path", type=Path)
    w.add_argument("--every", type=int, default=10)
    args = ap.parse_args()
    if args.cmd == "sample":
        sample(args.match, args.out)
    else:
        show(args.path, args.every)


if __name__ == "__main__":
    main()
