"""The caches that sources and sealers share within a process are objects with a lock, owned by
their users and injectable (no test reaches into a private module attribute)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from millstream.errors import InvalidSpecError
from millstream.ingest.sources import SOURCES, reader_for
from millstream.ingest.sources.files import FilesConfig, FilesReader, LineIndexCache
from millstream.ingest.sources.kafka import ConsumerPool


def _conf() -> dict[str, object]:
    # No broker listens here; creating a consumer does not connect.
    return {"bootstrap.servers": "127.0.0.1:9", "group.id": "t", "log_level": 0}


def test_a_pooled_consumer_is_lent_to_one_caller_at_a_time_and_reused_after() -> None:
    pool = ConsumerPool()
    with pool.lease(_conf()) as a, pool.lease(_conf()) as b:
        assert a is not b  # two threads never assign() the same consumer
    assert len(pool) == 2
    with pool.lease(_conf()) as c:
        assert c in (a, b)
    pool.close()
    assert len(pool) == 0


def test_a_consumer_is_lent_again_for_the_topic_it_read_last() -> None:
    """librdkafka starts fetching a topic it has no metadata for up to a second late: a
    read must get a consumer that already knows its topic when the pool has one."""
    pool = ConsumerPool()
    with pool.lease(_conf(), "orders") as a:
        pass
    with pool.lease(_conf(), "payments") as b:
        assert b is not a  # the idle consumer knows another topic
    for _ in range(3):
        with pool.lease(_conf(), "payments") as again_b, pool.lease(_conf(), "orders") as again_a:
            assert (again_a, again_b) == (a, b)
    with pool.lease(_conf()) as c:  # requests about several topics: a consumer of their own
        assert c not in (a, b)
    assert len(pool) == 3
    pool.close()


def test_a_consumer_idle_past_the_limit_is_closed() -> None:
    """A topic no longer read (its datastream removed) does not keep a consumer open."""
    now = [0.0]
    pool = ConsumerPool(idle_close_s=300.0, clock=lambda: now[0])
    with pool.lease(_conf(), "gone") as old:
        pass
    now[0] = 200.0
    with pool.lease(_conf(), "kept") as kept:
        pass
    assert len(pool) == 2
    now[0] = 301.0
    with pool.lease(_conf(), "kept") as again:
        assert again is kept
    assert len(pool) == 1  # "gone" was idle 301 s: closed at this return
    with pytest.raises(RuntimeError, match="closed"):
        old.assignment()
    assert kept.assignment() == []  # still open
    pool.close()


def test_a_consumer_whose_use_failed_is_closed_not_returned() -> None:
    pool = ConsumerPool()
    with pytest.raises(RuntimeError), pool.lease(_conf()):
        raise RuntimeError("broker down")
    assert len(pool) == 0


def test_threads_leasing_concurrently_never_share_a_consumer() -> None:
    pool = ConsumerPool()
    holders: dict[int, int] = {}  # id(consumer) -> how many threads hold it now
    lock = threading.Lock()
    shared: list[int] = []

    def work() -> None:
        for _ in range(25):
            with pool.lease(_conf()) as c:
                with lock:
                    holders[id(c)] = holders.get(id(c), 0) + 1
                    if holders[id(c)] > 1:
                        shared.append(id(c))
                time.sleep(0.001)
                with lock:
                    holders[id(c)] -= 1

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert shared == []
    assert 1 <= len(pool) <= 4  # reused, at most one per concurrent caller
    pool.close()


def test_a_files_reader_uses_the_line_index_cache_it_is_given(tmp_path: Path) -> None:
    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "a.jsonl").write_text('{"x": 1}\n{"x": 2}\n')
    cache = LineIndexCache(capacity=4)
    reader = FilesReader(FilesConfig(str(tmp_path)), line_indexes=cache)
    assert reader.latest_offsets() == {0: 2}
    assert len(cache) == 1
    cache.clear()
    assert len(cache) == 0


def test_the_registry_builds_every_source_kind_and_names_an_unknown_one(tmp_path: Path) -> None:
    assert set(SOURCES) == {"kafka", "files", "generator"}
    reader = reader_for("generator", {"partitions": 2, "total": 10})
    assert reader.latest_offsets() == {0: 5, 1: 5}
    with pytest.raises(InvalidSpecError, match=r"source.kind.*'nope'.*files, generator, kafka"):
        reader_for("nope", {})
