"""Fixtures of the end-to-end tests: a :class:`Cluster` of real service processes whose logs
are printed (and whose processes are all killed) when the test ends, pass or fail."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.cluster import Cluster


@pytest.fixture
def cluster(tmp_path: Path, metadata_url: str) -> Iterator[Cluster]:
    """Services sharing one home (``tmp_path/home``) and metadata store; each test module
    provides ``metadata_url``."""
    home = tmp_path / "home"
    home.mkdir()
    c = Cluster(home=home, metadata_url=metadata_url)
    try:
        yield c
    finally:
        c.close()
        print(f"service logs under {c.logs}:\n{c.diagnostics()}")
