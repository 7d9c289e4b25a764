"""Print the samples ``bench/rss_probe/sitecustomize.py`` wrote, a line each (MB)::

.venv/bin/python bench/rss_probe/show.py /tmp/probe
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(directory: str) -> None:
    for path in sorted(Path(directory).glob("*.jsonl")):
        print(path.name)
        print("  s     RSS anon file thr | glibc arena used free | pymalloc map used | ", end="")
        print("Arrow alloc peak | mimalloc | SQLite used pagecache allocs")
        for line in path.read_text().splitlines():
            d = json.loads(line)
            if d["t"] < 1:
                continue  # the interpreter's start
            m = d.get("mallinfo2") or {}
            a = d.get("arrow") or {}
            p = d.get("pymalloc_mb") or [0, 0]
            s = d.get("sqlite") or {}
            maps = d.get("mappings_kb") or {}
            print(
                f"  {d['t']:5.0f} {d['rss_kb'] >> 10:4} {d['anon_kb'] >> 10:4} "
                f"{d['file_kb'] >> 10:4} {d['threads']:3} | {m.get('arena', 0) >> 20:4} "
                f"{m.get('uordblks', 0) >> 20:4} {m.get('fordblks', 0) >> 20:4} | "
                f"{p[0]:4} {p[1]:4} | {a.get('allocated', 0) >> 20:4} {a.get('max', 0) >> 20:4} "
                f"| {maps.get('anon 1 GiB (mimalloc)', 0) >> 10:4} | "
                f"{s.get('used_kb', 0) >> 10:4} {s.get('pagecache_kb', 0) >> 10:4} "
                f"{s.get('allocations', 0):6}"
                + (f" released: {d['released']}" if "released" in d else "")
            )


if __name__ == "__main__":
    main(sys.argv[1])
