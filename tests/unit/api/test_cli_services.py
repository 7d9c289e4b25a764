"""``millstream controller`` as a real process: it serves the API, leads, and stops cleanly on
SIGTERM or Ctrl-C (exit 0, leadership released). ``millstream worker`` refuses to start when
the controller cannot be reached."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from millstream.catalog import Catalog
from millstream.cli.app import app as cli
from millstream.control.leases import read_lease
from millstream.control.workers import CONTROLLER_LEASE
from millstream.local.process import free_port

START = "from millstream.cli.app import main; main()"


def _wait_until_leader(url: str, proc: subprocess.Popen[bytes]) -> dict[str, object]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        try:
            health: dict[str, object] = httpx.get(f"{url}/health", timeout=2).json()
            if health["leader"]:
                return health
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"the controller at {url} did not become leader")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_the_controller_serves_the_api_and_stops_cleanly_on_a_signal(
    tmp_path: Path, sig: signal.Signals
) -> None:
    home = tmp_path / "home"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-c", START, "controller", "--port", str(port), "--home", str(home)]
    cmd += ["--controller-id", "controller-x"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        health = _wait_until_leader(url, proc)
        console = httpx.get(f"{url}/ui", follow_redirects=True, timeout=5)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    assert health == {"status": "ok", "leader": True, "controller_id": "controller-x"}
    assert proc.returncode == 0, err.decode()
    assert f"REST API on {url}" in out.decode()
    assert f"console: {url}/ui" in out.decode()
    assert console.status_code == 200 and "Millstream console" in console.text
    assert "stopped" in err.decode()
    with Catalog.open(home=home) as cat, cat.store.read() as conn:
        lease = read_lease(conn, CONTROLLER_LEASE)
    assert lease is not None
    assert lease.holder == "controller-x"
    assert lease.expires_at < time.time()  # released, so a successor need not wait the TTL


def test_a_worker_whose_controller_cannot_be_reached_exits_1(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"

    result = CliRunner().invoke(cli, ["worker", "--controller", dead, "--home", str(tmp_path)])

    assert result.exit_code == 1
    assert f"cannot reach the controller at {dead}" in result.stderr
