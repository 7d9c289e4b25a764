"""The README's quick start, run as a user runs it: ``millstream up`` in a process of its own,
the spec and the producer taken from README.md ("A five-minute tour"), the CLI for
``datastream create`` / ``pause`` / ``resume`` / ``query``, and Ctrl-C at the end.

It checks what a user would: every produced record arrived (the shard uppers reach the ends a
consumer reads, not the broker's watermark), the table equals the sequential model of what was
produced (updates, tombstones, a re-insert), every command exits 0, ``up`` stops on Ctrl-C
with exit 0, and no output holds a traceback or a librdkafka log line. Every failed check is
reported at the end, together.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer, TopicPartition

from harness.cluster import MILLSTREAM_BIN
from millstream.local.process import free_port

pytestmark = pytest.mark.e2e

README = Path(__file__).resolve().parents[2] / "README.md"
README_BOOTSTRAP = "127.0.0.1:9092"
TRACEBACK = re.compile(
    r"Traceback \(most recent call last\)|Exception in thread|^\s+at org\.apache", re.M
)
LIBRDKAFKA = re.compile(r"^%\d+\|\d+\.\d+\||rdkafka#", re.M)
#: generous for a loaded machine (`up`'s first Spark start, a new datastream's first rows); on
#: an idle one each wait takes seconds
WAIT = 120.0


def _block(text: str, after: str, lang: str) -> str:
    start = text.index(after)
    m = re.compile(rf"```{lang}\n(.*?)```", re.S).search(text, start)
    assert m is not None, f"README.md: no ```{lang} block after {after!r}"
    return m.group(1)


def _model(produced: list[tuple[str, dict[str, Any] | None]]) -> dict[int, dict[str, Any]]:
    """Upsert by key in produce order (the producer's updated_at only grows per key)."""
    table: dict[int, dict[str, Any]] = {}
    for key, value in produced:
        if value is None:
            table.pop(int(key), None)
        else:
            table[int(key)] = value
    return table


#: The test's own consumer keeps its librdkafka lines to itself.
_QUIET = logging.getLogger("tests.quick_start.consumer")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False


def _topic_ends(bootstrap: str, topic: str) -> dict[int, int]:
    """Per partition, one past the last offset a consumer reads (not the watermark)."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "quick-start-check", "logger": _QUIET}
    )
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        consumer.assign([TopicPartition(topic, p, 0) for p in meta.partitions])
        ends: dict[int, int] = {}
        idle = 0
        while idle < 6:
            msg = consumer.poll(0.5)
            if msg is None:
                idle += 1
            elif msg.error() is None:
                idle = 0
                ends[msg.partition()] = max(ends.get(msg.partition(), 0), msg.offset() + 1)
        return ends
    finally:
        consumer.close()


class QuickStart:
    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self.api_port = free_port()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("MILLSTREAM_")}
        self.env.update(
            MILLSTREAM_CONTROLLER=f"http://127.0.0.1:{self.api_port}",
            PYTHONUNBUFFERED="1",
            NO_COLOR="1",
            COLUMNS="200",
        )
        self.outputs: dict[str, str] = {}
        self.problems: list[str] = []
        self.up: subprocess.Popen[bytes] | None = None
        self.up_log = cwd / "up.log"

    def check(self, ok: bool, problem: str) -> bool:
        if not ok:
            self.problems.append(problem)
        return ok

    def run(self, label: str, *args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            list(args),
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        self.outputs[label] = done.stdout + done.stderr
        self.check(
            done.returncode == 0, f"{label} exited {done.returncode}:\n{self.outputs[label]}"
        )
        return done

    def millstream(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run("millstream " + " ".join(args), str(MILLSTREAM_BIN), *args)

    def start_up(self) -> str:
        """``millstream up``; returns the broker's bootstrap address it printed."""
        with self.up_log.open("wb") as log:
            self.up = subprocess.Popen(
                [str(MILLSTREAM_BIN), "up", "--port", str(self.api_port)],
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, as in a terminal
            )
        deadline = time.monotonic() + WAIT
        while "Ctrl-C stops" not in (text := self.up_log.read_text(errors="replace")):
            assert self.up.poll() is None, f"up exited {self.up.returncode}:\n{text}"
            assert time.monotonic() < deadline, f"up did not start in {WAIT:.0f}s:\n{text}"
            time.sleep(0.2)
        m = re.search(r"^broker\s+(\S+)", text, re.M)
        assert m is not None, f"up printed no broker address:\n{text}"
        return m.group(1)

    def ctrl_c(self) -> None:
        assert self.up is not None
        os.killpg(self.up.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        try:
            code = self.up.wait(90)
        except subprocess.TimeoutExpired:
            os.killpg(self.up.pid, signal.SIGKILL)
            self.up.wait(10)
            code = None
        self.check(code == 0, f"up exited {code} on Ctrl-C")
        self.outputs["millstream up"] = self.up_log.read_text(errors="replace")

    def kill(self) -> None:
        if self.up is not None and self.up.poll() is None:
            os.killpg(self.up.pid, signal.SIGKILL)
            self.up.wait(10)

    def wait_until(self, what: str, ok: Callable[[], bool]) -> bool:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            if ok():
                return True
            time.sleep(0.25)
        return self.check(False, f"{what}: not within {WAIT:.0f}s")


def test_readme_quick_start(tmp_path: Path) -> None:
    readme = README.read_text()
    spec_yaml = _block(readme, "## A five-minute tour", "yaml")
    producer_py = _block(readme, "## A five-minute tour", "python")
    assert README_BOOTSTRAP in spec_yaml and README_BOOTSTRAP in producer_py

    qs = QuickStart(tmp_path)
    api = httpx.Client(base_url=qs.env["MILLSTREAM_CONTROLLER"], timeout=15)
    try:
        bootstrap = qs.start_up()
        (tmp_path / "orders.yaml").write_text(spec_yaml.replace(README_BOOTSTRAP, bootstrap))
        (tmp_path / "produce.py").write_text(producer_py.replace(README_BOOTSTRAP, bootstrap))

        def uppers_reach(ends: dict[int, int]) -> Callable[[], bool]:
            def ok() -> bool:
                r = api.get("/tables/orders/consumingSegmentsInfo")
                if r.status_code != 200:
                    return False
                uppers = {p["partition"]: p["current_offset"] or 0 for p in r.json()["partitions"]}
                return all(uppers.get(p, 0) >= end for p, end in ends.items())

            return ok

        def state_is(state: str) -> Callable[[], bool]:
            return lambda: api.get("/datastreams/orders").json().get("state") == state

        qs.run("python produce.py", sys.executable, "produce.py")
        qs.millstream("datastream", "create", "-f", "orders.yaml")
        qs.wait_until("orders READY", state_is("READY"))
        ends = _topic_ends(bootstrap, "orders")
        qs.check(sum(ends.values()) == 8, f"the topic holds {ends}, not 8 records")
        qs.wait_until(f"every record arrived (shard uppers reach {ends})", uppers_reach(ends))

        qs.millstream("datastream", "pause", "orders")
        qs.wait_until("orders PAUSED", state_is("PAUSED"))
        qs.run("python produce.py more", sys.executable, "produce.py", "more")
        qs.millstream("datastream", "resume", "orders")
        qs.wait_until("orders READY again", state_is("READY"))
        ends = _topic_ends(bootstrap, "orders")
        qs.wait_until(f"the record produced while paused arrived ({ends})", uppers_reach(ends))

        done = qs.millstream(
            "query",
            "SELECT order_id, customer, amount, status FROM orders ORDER BY order_id",
            "--output",
            "json",
        )
        try:
            table = {row["order_id"]: row for row in json.loads(done.stdout)}
        except (ValueError, KeyError, TypeError) as exc:
            table = {}
            qs.check(False, f"query printed no JSON rows ({exc!r}):\n{done.stdout[-2000:]}")

        def order(i: int, status: str) -> dict[str, Any]:
            return {"order_id": i, "customer": f"c{i}", "amount": 10.0 * i, "status": status}

        produced: list[tuple[str, dict[str, Any] | None]] = [
            *((str(i), order(i, "new")) for i in range(1, 6)),
            ("2", order(2, "paid")),
            ("3", None),
            ("5", None),
            ("3", order(3, "new")),
        ]
        model = _model(produced)
        qs.check(table == model, f"the table differs from the model:\n{table}\n!=\n{model}")
    finally:
        api.close()
        if qs.up is not None and qs.up.poll() is None:
            qs.ctrl_c()
        qs.kill()

    for label, text in qs.outputs.items():
        if m := TRACEBACK.search(text):
            qs.problems.append(f"{label}: a traceback: {text[max(0, m.start() - 300) :][:1500]}")
        if m := LIBRDKAFKA.search(text):
            line = text[m.start() :].splitlines()[0]
            n = len(LIBRDKAFKA.findall(text))
            qs.problems.append(f"{label}: {n} librdkafka lines, the first: {line}")
    if qs.problems:
        up_tail = "\n".join(
            line
            for line in qs.outputs.get("millstream up", "").splitlines()
            if not LIBRDKAFKA.search(line)
        )[-4000:]
        qs.problems.append(f"up's output without librdkafka lines (tail):\n{up_tail}")
    assert not qs.problems, "\n\n".join(qs.problems)
