"""What the benchmarks under bench/ share: paths, the machine and its load, timing, percentiles
and ratios, working directories, JSON results, and shipping bench code to Spark's workers.

The benchmarks run as scripts (``.venv/bin/python bench/<name>.py``). Python puts the script's
directory first on ``sys.path``, so they import this module and their sibling modules by plain
name (``import common``). The one ``sys.path`` edit is below: importing this module puts the
repository's ``tests/`` on it too, so a benchmark imports the test harness (``harness.cluster``,
``harness.servers``: test code, not in the wheel) as the tests do.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "tests") not in sys.path:
    sys.path.append(str(REPO / "tests"))
BENCH = REPO / "bench"
#: Where a benchmark writes results it always keeps (git-ignored).
RESULTS = BENCH / "results"
#: How docs/performance.md spells the interpreter in the commands it quotes.
PYTHON = ".venv/bin/python"


def command_line(script: str) -> str:
    """The command that is running, as docs/performance.md quotes it."""
    return " ".join([PYTHON, f"bench/{script}", *sys.argv[1:]])


def log(msg: str) -> None:
    print(msg, flush=True)


def log_stamped(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)


# ---------------------------------------------------------------------------------------------
# The machine
# ---------------------------------------------------------------------------------------------


def load(digits: int = 2) -> tuple[float, float, float]:
    """The 1, 5 and 15-minute load averages, rounded."""
    one, five, fifteen = os.getloadavg()
    return round(one, digits), round(five, digits), round(fifteen, digits)


def load_text() -> str:
    """The load averages as ``"0.52 0.61 0.70"``."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def busy(per_core: float = 0.5) -> bool:
    """Whether the 1-minute load is above ``per_core`` times the cores."""
    return os.getloadavg()[0] > per_core * (os.cpu_count() or 1)


def wait_for_quiet(
    say: Callable[[str], None], limit: float = 1.5, wait_s: float = 180.0
) -> tuple[tuple[float, float, float], float]:
    """Wait (up to ``wait_s``) for the 1-minute load to drop below ``limit``. Returns the load
    then and the seconds waited."""
    t0 = time.monotonic()
    first = load()
    if first[0] > limit:
        say(f"1-minute load {first[0]} > {limit}: waiting up to {wait_s:.0f}s")
        while load()[0] > limit and time.monotonic() - t0 < wait_s:
            time.sleep(5)
    return load(), time.monotonic() - t0


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (``/proc/PID/stat``)."""
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def versions(*modules: str) -> dict[str, str]:
    """``__version__`` of each named module."""
    return {name: str(importlib.import_module(name).__version__) for name in modules}


def machine(*modules: str) -> dict[str, Any]:
    """Cores, CPU model, platform, Python and the versions of ``modules``."""
    return {
        "cores": os.cpu_count(),
        "cpu": cpu_model(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        **versions(*modules),
    }


# ---------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------


def timed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, float]:
    """``fn(*args, **kwargs)`` and the seconds it took."""
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t0


def percentile(values: Any, q: float, method: str = "linear") -> float:
    """The ``q``-th percentile (0-100) of ``values`` (numpy's ``method``); NaN when empty."""
    if len(values) == 0:
        return float("nan")
    return float(np.percentile(np.asarray(values, dtype=float), q, method=method))  # type: ignore[call-overload]


def ratio(num: float, den: float) -> float:
    """``num / den``; NaN when ``den`` is 0."""
    return num / den if den else float("nan")


def verdict(ok: bool) -> str:
    return "MET" if ok else "NOT MET"


# ---------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def workdir(
    prefix: str,
    *,
    keep: bool = False,
    parent: Path | None = None,
    say: Callable[[str], None] = log,
) -> Iterator[Path]:
    """A fresh temporary directory, removed at the end unless ``keep``."""
    base = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    try:
        yield base
    finally:
        if keep:
            say(f"kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)


def write_json(path: Path | str, payload: Any, *, indent: int | None = 2) -> Path:
    """Write ``payload`` as JSON (what JSON cannot hold as its ``str``), creating parents."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=indent, default=str))
    return path


def save_results(
    name: str, payload: Any, also: Path | None, say: Callable[[str], None] = log
) -> Path:
    """Write ``payload`` to ``bench/results/<name>-<time>.json`` and to ``also`` (a script's
    ``--json PATH``) if given, and say where."""
    out = write_json(RESULTS / f"{name}-{time.strftime('%H%M%S')}.json", payload)
    if also is not None:
        write_json(also, payload)
    say(f"results: {out}")
    return out


# ---------------------------------------------------------------------------------------------
# Spark
# ---------------------------------------------------------------------------------------------


def ship_by_value(*modules: ModuleType) -> None:
    """Make Spark pickle the functions and classes of these bench modules by value: Spark's
    Python workers cannot import bench/ (it is on this process's ``sys.path`` only)."""
    from pyspark import cloudpickle

    for module in modules:
        cloudpickle.register_pickle_by_value(module)  # type: ignore[no-untyped-call]


def run_tree_on_copy(
    script: str, tree: str | Path, db: Path, copy: Path, args: list[str]
) -> dict[str, Any]:
    """Run ``script --child COPY *args`` in a fresh process with ``tree`` (a ``src`` directory)
    first on ``PYTHONPATH``, on ``copy``, a fresh backup of the SQLite metadata store ``db``
    (each tree of an A/B starts from the same store), removed afterwards; returns the JSON of
    the child's last line."""
    import sqlite3
    import subprocess

    with sqlite3.connect(db) as src, sqlite3.connect(copy) as dst:
        src.backup(dst)
    env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve())}
    try:
        out = subprocess.run(
            [sys.executable, script, "--child", str(copy), *args],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
    finally:
        copy.unlink(missing_ok=True)
    row: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return row
