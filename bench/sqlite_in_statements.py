"""What a SQLite connection's cache of prepared statements holds when ``IN`` lists of many
lengths pass through it (each length is a statement text of its own), as the metadata store's
reads of entries by id and of tables and shards by name do.

Run from the repository root (not part of CI; a second)::

    .venv/bin/python bench/sqlite_in_statements.py            # lengths 1-128, the default cache
    .venv/bin/python bench/sqlite_in_statements.py --lengths 400 --cached 128

Prints SQLite's own allocations (``sqlite3_memory_used`` and the allocations outstanding, of
the ``libsqlite3`` Python's ``sqlite3`` uses) before and after one connection ran a select of
each length over a 7-column table, then the same with each list padded to a power of two as
the metadata store pads them (``schema.in_list``), and the ratio of the two.
"""

from __future__ import annotations

import argparse
import ctypes
import sqlite3


def sqlite_used() -> tuple[int, int]:
    lib = ctypes.CDLL("libsqlite3.so.0")
    lib.sqlite3_memory_used.restype = ctypes.c_int64
    cur, high = ctypes.c_int64(), ctypes.c_int64()
    lib.sqlite3_status64(9, ctypes.byref(cur), ctypes.byref(high), 0)  # SQLITE_STATUS_MALLOC_COUNT
    return int(lib.sqlite3_memory_used()), cur.value


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", type=int, default=128, help="IN lists of 1..N values")
    ap.add_argument("--cached", type=int, default=128, help="the connection's cached_statements")
    args = ap.parse_args()
    grown = {}
    for padded in (False, True):
        conn = sqlite3.connect(":memory:", cached_statements=args.cached)
        conn.execute(
            "create table e (id integer primary key, t text, p int, a int, b int, c int, d text)"
        )
        before = sqlite_used()
        for n in range(1, args.lengths + 1):
            values = list(range(n))
            if padded:  # what the metadata store's schema.in_list does
                values += [values[-1]] * ((1 << (n - 1).bit_length()) - n)
            marks = ",".join("?" * len(values))
            sql = f"select id, t, p, a, b, c, d from e where id in ({marks})"
            conn.execute(sql, values).fetchall()
        after = sqlite_used()
        grown[padded] = after[0] - before[0]
        print(
            f"IN lengths 1-{args.lengths}{', padded to a power of two' if padded else ''}, "
            f"cached_statements {args.cached}: SQLite's memory {before[0] / 2**20:.2f} -> "
            f"{after[0] / 2**20:.2f} MB, allocations {before[1]:,} -> {after[1]:,}"
        )
        conn.close()
    print(f"padded / not padded, SQLite's memory grown: {grown[True] / grown[False]:.2f}x")


if __name__ == "__main__":
    main()
