"""The Prometheus alert rules and Grafana dashboard under deploy/ against a real Prometheus
(Debian's ``prometheus``) scraping a real controller API: ``promtool`` accepts the rules, every
Millstream series they and the dashboard use is scraped, and an alert whose condition holds
becomes pending or firing."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.api_support import TestClient, beat, serve, spec_body, write_lines
from millstream.api import create_app
from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.control.controller import Controller
from millstream.control.workers import heartbeat
from millstream.errors import SegmentUnavailableError
from millstream.metastore.models import ShardAppend
from millstream.sealing.sealer import Sealer

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
RULES = DEPLOY / "prometheus" / "millstream-alerts.yml"
DASHBOARD = DEPLOY / "grafana" / "millstream-dashboard.json"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _referenced_series() -> set[str]:
    """Millstream series named by the rules and the dashboard (counters by their _total)."""
    text = RULES.read_text() + json.dumps(json.loads(DASHBOARD.read_text()))
    return set(re.findall(r"millstream_[a-z_]+", text))


def _wait(what: str, check: Any, seconds: float = 60) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.25)


def test_promtool_accepts_the_rules_and_the_example_config() -> None:
    for args in (
        ["check", "rules", str(RULES)],
        ["check", "config", str(RULES.parent / "prometheus.yml")],
    ):
        done = subprocess.run(["promtool", *args], capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
    assert (
        "SUCCESS: 10 rules found"
        in subprocess.run(
            ["promtool", "check", "rules", str(RULES)], capture_output=True, text=True, check=True
        ).stdout
    )


@pytest.fixture
def prometheus_for(tmp_path: Path) -> Iterator[Callable[[str], str]]:
    """Start a Prometheus scraping ``target`` every second with the rules loaded; yields its URL."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(target: str) -> str:
        port = _free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"rule_files: [{json.dumps(str(RULES))}]\n"
            "scrape_configs:\n"
            "  - job_name: millstream\n"
            f"    static_configs: [{{targets: [{json.dumps(target)}]}}]\n"
        )
        log = (tmp_path / "prometheus.log").open("wb")
        procs.append(
            subprocess.Popen(
                [
                    "prometheus",
                    f"--config.file={config}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        url = f"http://127.0.0.1:{port}"
        _wait("prometheus ready", lambda: _ok(f"{url}/-/ready"), 30)
        return url

    yield start
    for proc in procs:  # stopped by its own PID
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_prometheus_scrapes_every_series_the_rules_and_dashboard_use_and_alerts_fire(
    api: TestClient,
    catalog: Catalog,
    controller: Controller,
    clock: ManualClock,
    source_dir: Path,
    prometheus_for: Any,
) -> None:
    write_lines(source_dir, 0, 12)
    assert api.post("/datastreams", json=spec_body("orders", source_dir)).status_code == 201
    controller.tick()
    for lo, hi in ((0, 5), (5, 10)):
        path = f"data/orders/{lo}.parquet"
        stamp = round(clock.now() * 1000)  # the last record's timestamp (the ingestion delay)
        catalog.store.compare_and_append(
            "orders", [ShardAppend(0, lo, hi, 0, path, hi - lo, 10, last_record_ms=stamp)]
        )
    # Hand-made entries without files: two failed seals put a segment in ERROR.
    sealer = Sealer(catalog, "orders", max_failures=2)
    for _ in range(2):
        with pytest.raises(SegmentUnavailableError):
            sealer.seal_partition(0, force=True)
    # What a worker reports: a running writer, its last seal, its loops and its maintenance
    # (last run two hours ago, by the wall clock Prometheus evaluates time() with).
    beat(catalog, clock, "worker-a", "orders")
    heartbeat(
        catalog.store,
        "worker-a",
        status="RUNNING",
        info={
            "writers": [{"datastream": "orders", "role": "active", "running": True}],
            "sealing": {"orders": {"last_seal_seconds": 0.4}},
            "loops": [{"loop": "maintainer", "table": "orders", "errors": 1}],
            "rows": [
                {
                    "datastream": "orders",
                    "table": "orders",
                    "partition": 0,
                    "consumed": 10,
                    "dead_lettered": 1,
                    "superseded": 3,
                }
            ],
            "maintenance": {
                "orders": {
                    "files_removed": 3,
                    "bytes_removed": 300,
                    "versions_expired": 2,
                    "last_run_at": time.time() - 8000,
                }
            },
        },
        clock=clock,
    )
    app = create_app(catalog, controller=controller, clock=clock, upstream_timeout=5)
    with serve(app) as api_url:
        prom = prometheus_for(api_url.removeprefix("http://"))

        def query(expr: str) -> list[dict[str, Any]]:
            body = httpx.get(f"{prom}/api/v1/query", params={"query": expr}, timeout=5).json()
            assert body["status"] == "success", body
            return list(body["data"]["result"])

        up = _wait("a successful scrape", lambda: query('up{job="millstream"} == 1'))
        assert up[0]["metric"]["job"] == "millstream"
        names = set(httpx.get(f"{prom}/api/v1/label/__name__/values", timeout=5).json()["data"])
        missing = _referenced_series() - names
        assert not missing, f"series the rules or the dashboard use that are not scraped: {missing}"
        assert query('millstream_segments_in_error{table="orders"}')[0]["value"][1] == "1"
        assert query("millstream_workers_alive")[0]["value"][1] == "1"

        def alerts() -> dict[str, str]:
            body = httpx.get(f"{prom}/api/v1/alerts", timeout=5).json()
            return {a["labels"]["alertname"]: a["state"] for a in body["data"]["alerts"]}

        found = _wait(
            "the alerts",
            lambda: (
                (a := alerts()).get("MillstreamMaintenanceNotRunning") == "firing"
                and "MillstreamSegmentsInError" in a
                and a
            ),
        )
        assert found["MillstreamSegmentsInError"] == "pending"  # for: 5m
        assert "MillstreamNoAliveWorker" not in found
        rules = httpx.get(f"{prom}/api/v1/rules", timeout=5).json()["data"]["groups"]
        assert all(r["health"] in ("ok", "unknown") for g in rules for r in g["rules"]), rules
