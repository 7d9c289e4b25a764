"""``millstream run -f SPEC --available-now`` as a user runs it: the console entry point
(``main()``, with its exit path) in a process of its own, JSON output, Spark on one core."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path


def run_available_now(
    spec: Path, home: Path, *extra: str, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the datastream ``spec`` to its end under ``home``; ``extra`` CLI options after the
    others; ``env`` the process's whole environment (None: this one's)."""
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "from millstream.cli.app import main; main()",
            "run",
            "-f",
            str(spec),
            "--available-now",
            "--home",
            str(home),
            "--output",
            "json",
            "--master",
            "local[1]",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=None if env is None else dict(env),
    )
