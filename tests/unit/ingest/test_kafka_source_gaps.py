"""Records the broker deleted before they were read (retention ran while the writer lagged) are
never skipped silently. A range read used to let librdkafka reset an offset the broker no
longer held to the earliest one held (``auto.offset.reset: earliest``), so the range was
committed as covered with its first records missing, and nothing said so. Now the read fails
naming the datastream, the partition and the missing offsets (``on_data_loss: fail``, the
default), or, with ``on_data_loss: accept``, goes on from the first offset held and records
what it skipped.

The fake broker behaves as librdkafka does with the reader's client config: with
``auto.offset.reset: error`` a fetch below the first offset held yields an
``_AUTO_OFFSET_RESET`` error for the partition and fetches nothing more of it until a seek;
with ``earliest`` (the old config) it silently moves to the first offset held.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import KafkaError, TopicPartition

from millstream.errors import SourceGapError
from millstream.ingest.sources.kafka import ConsumerPool, KafkaReader

END = 10


class _Msg:
    def __init__(self, p: int, o: int, error: KafkaError | None = None) -> None:
        self.p, self.o, self.e = p, o, error

    def partition(self) -> int:
        return self.p

    def offset(self) -> int:
        return self.o

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return b'{"o": %d}' % self.o

    def error(self) -> KafkaError | None:
        return self.e

    def timestamp(self) -> tuple[int, int]:
        return 1, 1_000 + self.o

    def headers(self) -> None:
        return None


class _Broker:
    """Partitions holding offsets ``[low, END)``; a consumer with the client config ``conf``."""

    def __init__(self, low: dict[int, int], conf: dict[str, Any]) -> None:
        self.low = low
        self.reset = conf["auto.offset.reset"]
        self.at: dict[int, int | None] = {}
        self.paused: set[int] = set()

    def assign(self, tps: list[TopicPartition]) -> None:
        self.at = {tp.partition: tp.offset for tp in tps}

    def seek(self, tp: TopicPartition) -> None:
        self.at[tp.partition] = tp.offset

    def unassign(self) -> None:
        self.at = {}

    def pause(self, tps: list[TopicPartition]) -> None:
        self.paused |= {tp.partition for tp in tps}

    def resume(self, tps: list[TopicPartition]) -> None:
        self.paused -= {tp.partition for tp in tps}

    def consume(self, num_messages: int, timeout: float) -> list[_Msg]:
        out: list[_Msg] = []
        for p, pos in sorted(self.at.items()):
            if pos is None or p in self.paused:
                continue
            if pos < self.low[p]:
                if self.reset == "earliest":
                    pos = self.low[p]
                else:
                    self.at[p] = None  # stopped until a seek
                    out.append(_Msg(p, pos, KafkaError(KafkaError._AUTO_OFFSET_RESET)))
                    continue
            out += [_Msg(p, o) for o in range(pos, END)]
            self.at[p] = END
        return out

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self.at[tp.partition] or 0) for tp in tps]

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float) -> tuple[int, int]:
        return self.low[tp.partition], END


class _Pool(ConsumerPool):
    def __init__(self, low: dict[int, int]) -> None:
        super().__init__()
        self.low = low

    @contextmanager
    def lease(self, conf: dict[str, Any], topic: str | None = None) -> Iterator[Any]:
        yield _Broker(self.low, conf)


def _reader(on_data_loss: str, low: dict[int, int]) -> KafkaReader:
    config = KafkaReader.config_from_spec(
        {
            "bootstrap_servers": "127.0.0.1:1",
            "topic": "orders",
            "on_data_loss": on_data_loss,
            "datastream": "orders_ds",
        }
    )
    return KafkaReader(config, consumers=_Pool(low))


def _offsets(batches: list[pa.RecordBatch]) -> list[tuple[int, int]]:
    t = pa.Table.from_batches(batches)
    return list(zip(t.column("partition").to_pylist(), t.column("offset").to_pylist(), strict=True))


@pytest.mark.parametrize("one_range", [False, True])
def test_a_range_whose_start_the_broker_deleted_fails_naming_the_lost_offsets(
    one_range: bool,
) -> None:
    reader = _reader("fail", {0: 0, 1: 4})
    ranges = [(1, 2, END)] if one_range else [(0, 0, END), (1, 2, END)]
    with pytest.raises(SourceGapError) as failed:
        list(reader.read_records(ranges))
    message = str(failed.value)
    assert "'orders_ds'" in message and "'orders'" in message
    assert "partition 1" in message and "offsets 2..3" in message
    assert failed.value.fields["first_missing"] == 2 and failed.value.fields["last_missing"] == 3


def test_accepted_losses_are_skipped_and_recorded() -> None:
    reader = _reader("accept", {0: 0, 1: 4, 2: 20})
    got = _offsets(list(reader.read_records([(0, 0, END), (1, 2, END), (2, 5, END)])))

    assert got == [(0, o) for o in range(END)] + [(1, o) for o in range(4, END)]
    assert reader.losses == [(1, 2, 4), (2, 5, END)]


def test_on_data_loss_is_a_spec_field_that_defaults_to_fail() -> None:
    from millstream.datastream import DatastreamSpec
    from millstream.errors import InvalidSpecError

    base = {
        "name": "d",
        "source": {"kind": "kafka", "bootstrap_servers": "127.0.0.1:1", "topic": "t"},
        "table": {"name": "d", "mode": "append"},
        "schema": {"id": "long"},
    }
    assert DatastreamSpec.parse(base).source.on_data_loss == "fail"  # type: ignore[union-attr]
    base["source"]["on_data_loss"] = "accept"  # type: ignore[index]
    spec = DatastreamSpec.parse(base)
    assert spec.source.on_data_loss == "accept"  # type: ignore[union-attr]
    base["source"]["on_data_loss"] = "skip"  # type: ignore[index]
    with pytest.raises(InvalidSpecError, match="on_data_loss"):
        DatastreamSpec.parse(base)


# -- what an operator sees: the commit log, the worker's heartbeat, /metrics and debugInfo ----

SPEC = {"name": "orders", "schema": {"o": "long"}, "mode": "append"}


def _metrics(api: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(api.get("/metrics").text)
        for s in family.samples
    }


def test_accepted_losses_and_refused_gaps_are_counted_and_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The production path of a write task: the sink reads its ranges through the kafka
    reader, commits, and logs the loss with the commit; the worker reports it in its heartbeat;
    /metrics counts it and debugInfo shows the ranges. A gap refused (the default) fails the
    writer: the worker counts it by class and shows its message."""
    from fastapi.testclient import TestClient

    from millstream.api import create_app
    from millstream.catalog import Catalog
    from millstream.control.worker import Worker, _bad_record, _Writer
    from millstream.datastream import dead_letter_spec
    from millstream.ingest.sources import kafka as kafka_source
    from millstream.spark.options import SinkOptions
    from millstream.spark.sink import SegmentSink
    from millstream.spark.sources import markers_batch
    from millstream.spec import TableSpec
    from millstream.storage.statedir import StateDirectory

    monkeypatch.setattr(kafka_source, "CONSUMERS", _Pool({0: 0, 1: 4}))
    spec = TableSpec.parse(SPEC)
    stats = tmp_path / "commits.jsonl"
    with Catalog.open(home=tmp_path / "home") as cat:
        cat.create_table(spec)
        cat.create_table(dead_letter_spec(spec))
        config = KafkaReader.config_from_spec(
            {
                "bootstrap_servers": "127.0.0.1:1",
                "topic": "orders",
                "on_data_loss": "accept",
                "datastream": "orders_ds",
            }
        )
        options = SinkOptions(
            settings=cat.settings,
            table_spec=spec,
            writer_id="w",
            stats_file=str(stats),
            source_kind="kafka",
            source_config=dataclasses.asdict(config),
        )
        sink = SegmentSink(options)
        message = sink.write(iter([markers_batch([(0, 0, END), (1, 2, END)])]))
        sink.commit([message], 0)
        assert {s.partition: s.upper for s in cat.store.list_shards("orders")} == {0: END, 1: END}
        assert cat.read_table("orders").num_rows == END + END - 4  # offsets 2, 3 lost

        worker = Worker(cat, None, worker_id="wk", state_root=tmp_path / "st")
        runner = SimpleNamespace(stats_file=stats, spec=SimpleNamespace(table_name="orders"))
        sd = StateDirectory(tmp_path / "st", "orders_ds")
        worker.writers["orders_ds"] = _Writer("orders_ds", "active", sd, runner)  # type: ignore[arg-type]
        refused = RuntimeError(
            "StreamingQueryException: ... millstream.errors.SourceGapError: "
            + str(SourceGapError("orders_ds", "orders", 1, 2, 4, 4))
        )
        assert _bad_record(refused)  # the datastream goes to ERROR: no restart can help
        worker._count_source_error("orders_ds", refused, str(refused))
        worker._heartbeat()

        with TestClient(create_app(cat)) as api:
            m = _metrics(api)
            labels = (("datastream", "orders_ds"), ("partition", "1"), ("table", "orders"))
            assert (
                m[
                    "millstream_source_records_lost_total",
                    (*labels[:2], *labels[2:], ("worker", "wk")),
                ]
                == 2
            )
            err = (("datastream", "orders_ds"), ("error", "SourceGapError"), ("worker", "wk"))
            assert m["millstream_source_offset_errors_total", err] == 1
            (shown,) = api.get("/tables/orders/debugInfo").json()["source_offsets"]
        assert shown["lost_ranges"] == [[1, 2, 4]]
        assert "offsets 2..3" in shown["errors"]["SourceGapError"]["last_error"]
