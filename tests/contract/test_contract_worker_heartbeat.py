"""A worker's heartbeat row on every metadata store: a liveness beat (no status) moves its
status and heartbeat time by the row's compare-and-set and keeps the status last written; the
whole status replaces it. A worker of 100 tables beats twice a second and writes its ~170 KB
status every few seconds (issue 38)."""

from __future__ import annotations

from millstream.catalog import Catalog
from millstream.clock import ManualClock
from millstream.control.workers import heartbeat, list_workers


def test_a_liveness_beat_moves_the_heartbeat_and_keeps_the_stored_status(
    catalog: Catalog,
) -> None:
    store = catalog.store
    clock = ManualClock()
    heartbeat(store, "w1", status="STARTING", info=None, clock=clock, url="http://w1")
    (w,) = list_workers(store)
    assert (w.status, w.info, w.heartbeat_at, w.url) == ("STARTING", {}, clock.now(), "http://w1")

    status = {
        "writers": [{"datastream": "orders", "role": "active", "running": True}],
        "sealing": {"orders": {"seals": 3, "loop": {"loop": "sealer", "table": "orders"}}},
        "loops": [{"loop": "heartbeat", "table": None}, {"loop": "sealer", "table": None}],
    }
    clock.advance(0.5)
    heartbeat(store, "w1", status="RUNNING", info=status, clock=clock)
    clock.advance(0.5)
    heartbeat(store, "w1", status="RUNNING", info=None, clock=clock)
    (w,) = list_workers(store)
    assert (w.status, w.heartbeat_at, w.url, w.version) == ("RUNNING", clock.now(), "http://w1", 3)
    assert w.info["writers"] == status["writers"] and w.info["sealing"] == status["sealing"]
    # the table's sealer loop, stored once, is listed after the sealing thread's for readers
    assert [(lp["loop"], lp["table"]) for lp in w.info["loops"]] == [
        ("heartbeat", None),
        ("sealer", None),
        ("sealer", "orders"),
    ]

    clock.advance(0.5)
    heartbeat(store, "w1", status="STOPPED", info={"writers": []}, clock=clock)
    (w,) = list_workers(store)
    assert (w.status, w.info, w.alive(clock.now(), 6.0)) == ("STOPPED", {"writers": []}, False)
