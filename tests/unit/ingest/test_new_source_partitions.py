"""A partition the source gains while a datastream runs (partitions added to a Kafka topic, a
new partition directory of the files source) is read from its start position: every record
of it is planned into exactly one batch. The stream source's planner is driven as Spark's
micro-batch loop drives it (``latestOffset`` from the previous end, then ``partitions`` of
the range between the two), without a SparkSession.

Spark plans a batch's ranges from the previous batch's end, which lacks the new partition; a
first end that already moved the new partition past its start made that range unread, and
the next batch began after it: its first records were lost without a gap (the partition's
shard is created at its first commit)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from millstream.spark.options import SourceOptions
from millstream.spark.sources import RangeTask, StreamReader


def _write(root: Path, partition: int, name: str, lines: int) -> None:
    d = root / str(partition)
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(b'{"v":1}\n' * lines)


class Driver:
    """Spark's micro-batch loop over a :class:`StreamReader`: the ranges it planned."""

    def __init__(self, reader: StreamReader) -> None:
        self.reader = reader
        self.start: dict[str, Any] = reader.initialOffset()
        self.planned: list[tuple[int, int, int]] = []

    def batch(self) -> None:
        end = self.reader.latestOffset(self.start, self.reader.getDefaultReadLimit())
        for task in self.reader.partitions(self.start, end):
            assert isinstance(task, RangeTask)
            self.planned += task.ranges
        self.start = end

    def offsets(self, partition: int) -> list[int]:
        return sorted(o for p, lo, hi in self.planned if p == partition for o in range(lo, hi))


@pytest.mark.parametrize("max_records_per_batch", [None, 50])
def test_a_partition_added_while_running_is_read_from_its_first_record(
    tmp_path: Path, max_records_per_batch: int | None
) -> None:
    root = tmp_path / "src"
    for p in (0, 1):
        _write(root, p, "a.json", 40)
    driver = Driver(
        StreamReader(
            SourceOptions(
                "files",
                {"path": str(root)},
                tasks=2,
                starting_offsets="earliest",
                max_records_per_batch=max_records_per_batch,
            )
        )
    )
    driver.batch()
    _write(root, 2, "a.json", 30)  # a new partition, with records already in it
    _write(root, 0, "b.json", 10)
    for _ in range(6):
        driver.batch()
    _write(root, 2, "b.json", 5)
    for _ in range(3):
        driver.batch()

    assert driver.offsets(2) == list(range(35)), "every record of the new partition, once"
    assert driver.offsets(0) == list(range(50))
    assert driver.offsets(1) == list(range(40))


def test_with_latest_a_new_partition_starts_where_it_was_found_and_loses_nothing_after(
    tmp_path: Path,
) -> None:
    root = tmp_path / "src"
    _write(root, 0, "a.json", 10)
    driver = Driver(
        StreamReader(
            SourceOptions("files", {"path": str(root)}, tasks=2, starting_offsets="latest")
        )
    )
    driver.batch()
    _write(root, 1, "a.json", 20)  # found at 20: "latest" skips what was there
    driver.batch()
    _write(root, 1, "b.json", 7)  # produced after it was found: read
    driver.batch()
    driver.batch()
    assert driver.offsets(1) == list(range(20, 27))
