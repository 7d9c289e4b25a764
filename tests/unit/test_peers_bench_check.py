"""bench/peers.py's correctness checker: the model of the peers' workload (per key the row with
the highest ``seq``; a key whose newest record is a delete is absent) and the check of a table
against it, which prints PASS or FAIL per system. A checker that passed a wrong table would make
every figure of that benchmark meaningless."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import peers_workload as wl


def _reference(parts: list[wl.Records]) -> dict[int, int]:
    """The model, one record at a time with a dict."""
    live: dict[int, int] = {}
    for p in parts:
        for k, s, d in zip(p.id.tolist(), p.seq.tolist(), p.deleted.tolist(), strict=True):
            if d:
                live.pop(k, None)
            else:
                live[k] = s
    return live


def _table(rows: dict[int, int]) -> pa.Table:
    ks = sorted(rows)
    return pa.table({"id": pa.array(ks, pa.int64()), "seq": [rows[k] for k in ks]})


@given(
    seed=st.integers(0, 2**16),
    keys=st.integers(1, 50),
    n=st.integers(0, 400),
    preload=st.booleans(),
)
def test_model_is_the_newest_row_of_each_key_without_deleted_keys(
    seed: int, keys: int, n: int, preload: bool
) -> None:
    parts = [wl.preload(keys, 0, keys)] if preload else []
    parts.append(wl.records(seed, keys, 0, n, wl.STREAM_SEQ_BASE if preload else 0))
    expected = _reference(parts)
    ids, seq = wl.model(parts)
    assert dict(zip(ids.tolist(), seq.tolist(), strict=True)) == expected
    assert wl.check(_table(expected), (ids, seq))["ok"]


def test_check_fails_a_missing_key_a_stale_row_a_duplicate_and_a_resurrected_delete() -> None:
    # key 1 updated, key 2 deleted, key 3 deleted then inserted again
    parts = [
        wl.Records(
            id=np.array([1, 2, 3, 1, 2, 3, 3]),
            seq=np.arange(7),
            amount=np.zeros(7),
            status=np.zeros(7, np.int64),
            deleted=np.array([False, False, False, False, True, True, False]),
        )
    ]
    expected = wl.model(parts)
    assert dict(zip(*(a.tolist() for a in expected), strict=True)) == {1: 3, 3: 6}
    assert wl.check(_table({1: 3, 3: 6}), expected)["ok"]
    missing = wl.check(_table({1: 3}), expected)
    assert not missing["ok"] and missing["missing_keys"] == 1
    stale = wl.check(_table({1: 0, 3: 6}), expected)
    assert not stale["ok"] and stale["wrong_seq"] == 1
    resurrected = wl.check(_table({1: 3, 2: 1, 3: 6}), expected)
    assert not resurrected["ok"] and resurrected["extra_keys"] == 1
    dup = pa.table({"id": pa.array([1, 1, 3], pa.int64()), "seq": [3, 3, 6]})
    assert not wl.check(dup, expected)["ok"]


def test_records_depend_only_on_seed_keys_and_index() -> None:
    whole = wl.records(5, 1000, 0, 250_000)
    part = wl.records(5, 1000, 123_456, 100)
    assert np.array_equal(part.id, whole.id[123_456:123_556])
    assert np.array_equal(part.deleted, whole.deleted[123_456:123_556])
    assert 0.015 < whole.deleted.mean() < 0.025
    line = wl.records(5, 1000, 0, 1).json_lines()[0]
    assert 120 <= len(line) <= 180
    decoded = wl.decode(b"\n".join(wl.records(5, 1000, 0, 10).json_lines()))
    assert decoded.schema == wl.ARROW_SCHEMA
    assert decoded.column("id").to_pylist() == whole.id[:10].tolist()
