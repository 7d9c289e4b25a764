"""librdkafka's log lines go to Python logging, rate limited, never to stderr.

A datastream whose topic was missing made 793 of 889 lines of ``millstream up``'s log in two
minutes (``%3|...|FAIL|rdkafka#consumer-N| ... Connection refused``, every few hundred ms per
consumer), and pooled consumers kept logging after their broker stopped. Every consumer the
pool creates now passes confluent-kafka's ``logger``: the lines reach the process's logging
handlers, each message at most once per ``CLIENT_LOG_EVERY_S`` per client, and the next one that
gets through counts those dropped. A process runs in a subprocess here so its real stderr (file
descriptor 2, which librdkafka's own threads write to) is what is checked.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from millstream.ingest.sources.kafka import RateLimit
from millstream.local.tansu import TansuBroker

SCRIPT = textwrap.dedent(
    """
    import json, logging, socket, sys, time

    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append({"logger": record.name, "message": record.getMessage()})

    logging.basicConfig(level=logging.DEBUG, handlers=[Keep()])
    from millstream.errors import SourceReadError
    from millstream.ingest.sources import kafka
    from millstream.ingest.sources.kafka import CONSUMERS, KafkaConfig, KafkaReader

    (limit,) = [f for f in kafka.CLIENT_LOG.filters if isinstance(f, kafka.RateLimit)]
    limit.every = 1.0  # a second, not a minute: the test sees drops counted
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    dead = s.getsockname()[1]
    s.close()
    # a broker nobody listens on: the production pool's consumer, polled for 3.5 s
    reader = KafkaReader(KafkaConfig(f"127.0.0.1:{dead}", "orders"))
    with CONSUMERS.lease(reader.conf, "orders") as c:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 3.5:
            c.poll(0.1)
    # a topic that does not exist on a live broker: the reader's own error, no noise
    try:
        KafkaReader(KafkaConfig(sys.argv[1], "no-such-topic")).latest_offsets()
        missing = None
    except SourceReadError as exc:
        missing = str(exc)
    print(json.dumps({"records": records, "missing": missing}))
    """
)


def test_a_consumer_of_a_dead_broker_and_a_missing_topic_writes_nothing_to_stderr(
    kafka_broker: TansuBroker, tmp_path: Path
) -> None:
    script = tmp_path / "client_log.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), kafka_broker.bootstrap],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr == "", f"librdkafka wrote to stderr: {done.stderr[:1000]}"
    out = json.loads(done.stdout)
    assert out["missing"] is not None and "not found" in out["missing"]
    client = [r["message"] for r in out["records"] if r["logger"] == "millstream.kafka.client"]
    refused = [m for m in client if "Connection refused" in m]
    # librdkafka retries the connection every 100 ms-1 s: a dozen or more lines in 3.5 s,
    # of which at most one a second gets through, the later ones counting what was dropped
    assert 2 <= len(refused) <= 5, refused
    assert "more like it in the last" not in refused[0]
    assert all("more like it in the last" in m for m in refused[1:]), refused


def test_the_rate_limit_lets_a_message_through_once_per_window_per_client() -> None:
    import logging

    now = [0.0]
    limit = RateLimit(60.0, clock=lambda: now[0])

    def record(client: str, text: str) -> logging.LogRecord:
        return logging.LogRecord(
            "millstream.kafka.client",
            logging.ERROR,
            "",
            0,
            "%s [%s] %s",
            ("FAIL", client, text),
            None,
        )

    first = record("rdkafka#consumer-1", "Connect failed (after 0ms in state CONNECT)")
    assert limit.filter(first)
    for ms in (12, 250, 1003):  # the same message, other numbers: dropped
        assert not limit.filter(
            record("rdkafka#consumer-1", f"Connect failed (after {ms}ms in state CONNECT)")
        )
    assert limit.filter(record("rdkafka#consumer-2", "Connect failed (after 0ms in state CONNECT)"))
    assert limit.filter(record("rdkafka#consumer-1", "Disconnected"))  # another message
    now[0] = 61.0
    again = record("rdkafka#consumer-1", "Connect failed (after 7ms in state CONNECT)")
    assert limit.filter(again)
    assert again.getMessage().endswith("(3 more like it in the last 61s)")


def test_the_rate_limit_remembers_a_bounded_number_of_messages() -> None:
    import logging

    kept = 3
    limit = RateLimit(60.0, clock=lambda: 0.0)
    limit.KEEP = kept
    for word in ("alpha", "beta", "gamma", "delta"):
        rec = logging.LogRecord("x", logging.ERROR, "", 0, "%s [%s] %s", ("F", "c", word), None)
        assert limit.filter(rec)
    assert len(limit._seen) == kept
