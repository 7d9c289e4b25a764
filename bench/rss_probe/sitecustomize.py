"""What a worker's own process and its publisher process hold, sampled from inside them.

Not part of CI. Put this directory first on ``PYTHONPATH`` and name a directory in
``RSSPROBE_DIR``; every Python process started so whose command line is a worker's
(``millstream worker``) or its publisher's (``-m millstream.sealing.publishing``) then starts
a daemon thread that appends a JSON line every ``RSSPROBE_EVERY`` (30) seconds to
``RSSPROBE_DIR/<kind>-<pid>.jsonl``; other processes are untouched::

    PYTHONPATH=bench/rss_probe:src RSSPROBE_DIR=/tmp/probe .venv/bin/python bench/scale.py \\
        --skip a,b --topics 100 --topic-rate 10 --seconds 360 --c-variants one --no-wait
    .venv/bin/python bench/rss_probe/show.py /tmp/probe

(``bench/scale.py``'s services inherit its environment; with ``--c-src`` they do not.)

A sample: the process's RSS (anonymous and file-backed), its threads, glibc's ``mallinfo2``
(``arena``: bytes of the heap and the threads' arenas, ``uordblks`` in use, ``fordblks``
free, ``hblkhd`` mapped on their own), Arrow's default pool (its backend, bytes allocated and
the peak), Python's small-object allocator (pymalloc: arenas mapped and bytes in use, from
``sys._debugmallocstats``), SQLite's own allocations (``sqlite3_memory_used``, its page
caches, outstanding allocations) and the RSS of the process's mappings by kind (a mapping of
1 GiB is mimalloc's arena). ``RSSPROBE_RELEASE_AT=S``: once, at the first sample at or past
``S`` seconds of the process, RSS after ``gc.collect()``, the Arrow pool's
``release_unused()`` and ``malloc_trim(0)``, each called from the probe's thread (mimalloc's
collect then reaches only that thread's heap). ``RSSPROBE_OBJECTS=N``: each sample also
counts the gc-tracked objects by type (the N most numerous) and lists the N largest
containers (dict, list, set, deque, OrderedDict: their length, and the type of a key or
item), so that two samples' difference names what grows (a walk of every object: ~0.1-0.5 s
with the GIL held, a sample). Every sample also names the process's threads (Python's by name,
the others by their ``comm``) and counts them by name.
``RSSPROBE_TRACEMALLOC=F``: ``tracemalloc`` runs from the interpreter's start with ``F``
frames; each sample records the bytes it traces and its own overhead, and at each of
``RSSPROBE_SNAPSHOT_AT=S1,S2,...`` seconds (the first sample at or past each) a snapshot is
taken and its difference from the first snapshot written: the 30 allocation sites whose
bytes grew most, by line and by traceback.
``RSSPROBE_TRIM_FROM=S``: from the first sample at or past ``S`` seconds, every sample calls
``malloc_trim(0)`` (every glibc arena) and records the RSS before and after it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any


def _cmdline() -> str:
    try:
        return (
            Path("/proc/self/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        )
    except OSError:
        return ""


def _kind() -> str | None:
    if not os.environ.get("RSSPROBE_DIR"):
        return None
    cmd = _cmdline()
    if "millstream.sealing.publishing" in cmd:
        return "publisher"
    if "millstream worker" in cmd:
        return "worker"
    return None


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def mallinfo2() -> dict[str, int]:
    fn = ctypes.CDLL("libc.so.6").mallinfo2
    fn.restype = _MallInfo2
    info = fn()
    return {name: getattr(info, name) for name, _ in _MallInfo2._fields_}


def pymalloc_mb() -> tuple[int, int]:
    """pymalloc's arenas mapped and bytes in use, MB (``sys._debugmallocstats`` writes to the C
    stderr, redirected to a file for the call)."""
    with tempfile.TemporaryFile() as out:
        saved = os.dup(2)
        sys.stderr.flush()
        os.dup2(out.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read().decode()
    mapped = re.search(r"^\d+ arenas \* \d+ bytes/arena\s+=\s+([\d,]+)", text, re.M)
    used = re.search(r"^# bytes in allocated blocks\s+=\s+([\d,]+)", text, re.M)
    return (
        int(mapped.group(1).replace(",", "")) >> 20 if mapped else -1,
        int(used.group(1).replace(",", "")) >> 20 if used else -1,
    )


def sqlite_status() -> dict[str, Any]:
    lib = ctypes.CDLL("libsqlite3.so.0")
    lib.sqlite3_memory_used.restype = ctypes.c_int64
    cur, high = ctypes.c_int64(), ctypes.c_int64()
    out: dict[str, Any] = {"used_kb": lib.sqlite3_memory_used() >> 10}
    for name, op in (("pagecache_kb", 2), ("allocations", 9)):  # SQLITE_STATUS_*
        lib.sqlite3_status64(op, ctypes.byref(cur), ctypes.byref(high), 0)
        out[name] = cur.value >> 10 if name.endswith("_kb") else cur.value
    return out


def mappings_kb() -> dict[str, int]:
    """RSS (KB) of the process's mappings by kind."""
    kinds: dict[str, int] = {}
    kind = ""
    with open("/proc/self/smaps") as fh:
        for line in fh:
            parts = line.split()
            if "-" in parts[0] and not parts[0].endswith(":"):
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                name = parts[5] if len(parts) > 5 else ""
                size = hi - lo
                if name.startswith("/"):
                    kind = "shared libraries" if ".so" in name else "other files"
                elif name:
                    kind = name
                elif size >= 2**30:
                    kind = "anon 1 GiB (mimalloc)"
                elif size >= 8 * 2**20:
                    kind = "anon >= 8 MiB"
                else:
                    kind = "anon < 8 MiB"
            elif parts[0] == "Rss:":
                kinds[kind] = kinds.get(kind, 0) + int(parts[1])
    return kinds


def rss_mb() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) >> 10
    return -1


def release() -> list[tuple[str, int]]:
    import gc

    out = [("as it is", rss_mb())]
    gc.collect()
    out.append(("gc.collect()", rss_mb()))
    pa = sys.modules.get("pyarrow")
    if pa is not None:
        pa.default_memory_pool().release_unused()
        out.append(("Arrow pool release_unused()", rss_mb()))
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    out.append(("malloc_trim(0)", rss_mb()))
    return out


def objects(n: int) -> dict[str, Any]:
    """The ``n`` most numerous gc-tracked types and the ``n`` largest containers."""
    import collections
    import gc

    counts: collections.Counter[str] = collections.Counter()
    big: list[tuple[int, str]] = []
    kinds = (dict, list, set, collections.deque, collections.OrderedDict)
    for o in gc.get_objects():
        t = type(o)
        counts[t.__qualname__] += 1
        if isinstance(o, kinds):
            length = len(o)
            if length >= 1000:
                first = next(iter(o), None)
                item = type(first).__qualname__
                if isinstance(o, dict) and first is not None:
                    item += " -> " + type(o[first]).__qualname__
                big.append((length, f"{t.__qualname__}[{item}]"))
    big.sort(reverse=True)
    return {"types": dict(counts.most_common(n)), "largest": big[:n]}


def threads() -> dict[str, int]:
    """The process's threads counted by name: Python's by their ``threading`` name with digits
    folded to ``N``, the others (the JVM gateway's, Arrow's, native pools) by ``comm``."""
    import collections

    py = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    counts: collections.Counter[str] = collections.Counter()
    for task in Path("/proc/self/task").iterdir():
        tid = int(task.name)
        if tid in py:
            name = "py:" + re.sub(r"\d+", "N", py[tid])
        else:
            try:
                name = "native:" + re.sub(r"\d+", "N", (task / "comm").read_text().strip())
            except OSError:
                continue
        counts[name] += 1
    return dict(counts.most_common())


#: Snapshots taken so far; the first is kept on disk, not in memory (a snapshot of a worker
#: holds ~200 MB of Python objects: kept, each was a step in the RSS the probe measures).
_SNAPSHOTS: list[float] = []


def traced(snapshot_at: list[float], t: float, out_dir: Path, kind: str) -> dict[str, Any]:
    import tracemalloc

    current = tracemalloc.get_traced_memory()[0]
    out: dict[str, Any] = {
        "traced_kb": current >> 10,
        "overhead_kb": tracemalloc.get_tracemalloc_memory() >> 10,
    }
    due = [s for s in snapshot_at if s <= t]
    if len(due) > len(_SNAPSHOTS):
        snap = tracemalloc.take_snapshot().filter_traces(
            (tracemalloc.Filter(False, tracemalloc.__file__),)
        )
        _SNAPSHOTS.append(t)
        out["snapshot"] = len(_SNAPSHOTS)
        first_path = out_dir / f"{kind}-{os.getpid()}-first.tracemalloc"
        if len(_SNAPSHOTS) == 1:
            snap.dump(str(first_path))
        else:
            first = tracemalloc.Snapshot.load(str(first_path))
            diff: dict[str, Any] = {"t": t, "snapshot": len(_SNAPSHOTS)}
            for key in ("lineno", "traceback"):
                stats = snap.compare_to(first, key)
                stats.sort(key=lambda st: st.size_diff, reverse=True)
                diff[key] = [
                    {
                        "size_diff_kb": round(st.size_diff / 1024, 1),
                        "count_diff": st.count_diff,
                        "size_kb": round(st.size / 1024, 1),
                        "where": [f"{f.filename}:{f.lineno}" for f in st.traceback],
                    }
                    for st in stats[:30]
                ]
            path = out_dir / f"{kind}-{os.getpid()}-tracemalloc.jsonl"
            with path.open("a") as fh:
                fh.write(json.dumps(diff) + "\n")
            del first
        del snap
    return out


def sample(t0: float) -> dict[str, Any]:
    with open("/proc/self/status") as fh:
        status = dict(line.split(":", 1) for line in fh if ":" in line)
    out: dict[str, Any] = {
        "t": round(time.time() - t0, 1),
        "rss_kb": int(status["VmRSS"].split()[0]),
        "anon_kb": int(status["RssAnon"].split()[0]),
        "file_kb": int(status["RssFile"].split()[0]),
        "threads": int(status["Threads"]),
    }
    probes: dict[str, Any] = {
        "mallinfo2": mallinfo2,
        "pymalloc_mb": pymalloc_mb,
        "mappings_kb": mappings_kb,
        "thread_names": threads,
    }
    if int(os.environ.get("RSSPROBE_OBJECTS", "0")) > 0:
        probes["objects"] = lambda: objects(int(os.environ["RSSPROBE_OBJECTS"]))
    if "sqlite3" in sys.modules:
        probes["sqlite"] = sqlite_status
    for name, fn in probes.items():
        try:
            out[name] = fn()
        except Exception as exc:  # a probe that cannot read says so, the others go on
            out[name] = repr(exc)
    pa = sys.modules.get("pyarrow")
    if pa is not None:
        pool = pa.default_memory_pool()
        out["arrow"] = {
            "backend": pool.backend_name,
            "allocated": pool.bytes_allocated(),
            "max": pool.max_memory(),
        }
    return out


def _run(kind: str) -> None:
    t0 = time.time()
    every = float(os.environ.get("RSSPROBE_EVERY", "30"))
    release_at = float(os.environ.get("RSSPROBE_RELEASE_AT", "0"))
    trim_from = float(os.environ.get("RSSPROBE_TRIM_FROM", "0"))
    snapshot_at = [
        float(x) for x in os.environ.get("RSSPROBE_SNAPSHOT_AT", "").split(",") if x.strip()
    ]
    path = Path(os.environ["RSSPROBE_DIR"]) / f"{kind}-{os.getpid()}.jsonl"
    released = False
    while True:
        with contextlib.suppress(Exception), path.open("a") as fh:
            d = sample(t0)
            if release_at and d["t"] >= release_at and not released:
                released = True
                d["released"] = release()
            if trim_from and d["t"] >= trim_from:
                before = rss_mb()
                ctypes.CDLL("libc.so.6").malloc_trim(0)
                d["trimmed"] = [before, rss_mb()]
            if os.environ.get("RSSPROBE_TRACEMALLOC"):
                try:
                    d["tracemalloc"] = traced(snapshot_at, d["t"], path.parent, kind)
                except Exception as exc:
                    d["tracemalloc"] = repr(exc)
            fh.write(json.dumps(d) + "\n")
        time.sleep(every)


_KIND = _kind()
if _KIND is not None:
    if os.environ.get("RSSPROBE_TRACEMALLOC"):
        import tracemalloc

        tracemalloc.start(int(os.environ["RSSPROBE_TRACEMALLOC"]))
    threading.Thread(target=_run, args=(_KIND,), name="rssprobe", daemon=True).start()
