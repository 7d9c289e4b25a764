"""(d) Spark's own upsert, as a Spark user would write it: ``readStream.json`` of the same
records -> ``groupBy(order_id).transformWithStateInPandas`` keeping the latest row per key in
a ``ValueState`` (RocksDB state store, availableNow, noop sink), on a bounded SUBSET of the
input, with a time box.

transformWithStateInPandas needs protobuf (pyspark's ``connect`` extra), which the project venv
does not have: :func:`ensure_protobuf` installs it once with pip into
``~/.cache/millstream-bench/site-pyXY`` (outside the venv) and puts it on PYTHONPATH, which
Spark passes on to its Python workers.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ingest_input import PARTITIONS, Input, write_files
from ingest_observe import progress

#: pyspark 4.3's StateMessage_pb2 is generated with protobuf 6.33.5.
PROTOBUF_REQ = "protobuf>=6.33.5,<7"

TWS_DDL = (
    "order_id bigint, customer string, amount double, status string, "
    "updated_at timestamp, is_deleted boolean"
)


def ensure_protobuf(log: Callable[[str], None]) -> str | None:
    """Provide protobuf from a private directory (installed there once with pip, outside the
    venv) on PYTHONPATH. Returns the directory used, or None if protobuf is already
    importable."""
    try:
        import google.protobuf  # noqa: F401

        return None
    except ImportError:
        pass
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    target = cache / "millstream-bench" / f"site-py{sys.version_info[0]}{sys.version_info[1]}"
    if not (target / "google" / "protobuf").is_dir():
        cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "-q"]
        cmd += ["--target", str(target), PROTOBUF_REQ]
        log(f"(d) needs protobuf, not in the venv: {' '.join(cmd)}")
        subprocess.run(cmd, check=True)
    # Only Spark's Python workers need it (the driver never imports it).
    os.environ["PYTHONPATH"] = os.pathsep.join(
        x for x in (str(target), os.environ.get("PYTHONPATH")) if x
    )
    return str(target)


def _tws_processor() -> Any:
    """A StatefulProcessor instance. Its class is defined here, inside a function, so that
    Spark pickles it by value: Spark's Python workers cannot import bench/."""
    from pyspark.sql.streaming import StatefulProcessor
    from pyspark.sql.types import (
        BooleanType,
        DoubleType,
        LongType,
        StringType,
        StructField,
        StructType,
    )

    state_schema = StructType(
        [
            StructField("order_id", LongType()),
            StructField("customer", StringType()),
            StructField("amount", DoubleType()),
            StructField("status", StringType()),
            StructField("updated_us", LongType()),
            StructField("is_deleted", BooleanType()),
        ]
    )

    class LatestPerKey(StatefulProcessor):
        """Keeps the latest row per key (by updated_at; a delete is kept as a tombstone so a
        late older update cannot resurrect the key) and emits the row when it changes."""

        def init(self, handle: Any) -> None:
            self.latest = handle.getValueState("latest", state_schema)

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
            import pandas as pd

            df = pd.concat(list(rows), ignore_index=True)
            df["updated_us"] = df["updated_at"].astype("int64") // 1000
            last = df.sort_values("updated_us", kind="stable").iloc[-1]
            if self.latest.exists() and self.latest.get()[4] > int(last["updated_us"]):
                return
            amount = last["amount"]
            self.latest.update(
                (
                    int(last["order_id"]),
                    last["customer"],
                    None if pd.isna(amount) else float(amount),
                    last["status"],
                    int(last["updated_us"]),
                    bool(last["is_deleted"]),
                )
            )
            yield df.iloc[[-1]].drop(columns=["updated_us"])

        def close(self) -> None:
            pass

    return LatestPerKey()


def _tws_query(spark: Any, path: Path, checkpoint: Path) -> Any:
    from pyspark.sql.types import StructType

    schema = StructType.fromDDL(TWS_DDL)
    df = (
        spark.readStream.schema(schema)
        .option("maxFilesPerTrigger", PARTITIONS)
        .option("recursiveFileLookup", "true")
        .json(str(path))
    )
    return (
        df.groupBy("order_id")
        .transformWithStateInPandas(
            statefulProcessor=_tws_processor(),
            outputStructType=schema,
            outputMode="Update",
            timeMode="None",
        )
        .writeStream.format("noop")
        .outputMode("update")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )


def tws_upsert(
    spark: Any, inp: Input, base: Path, subset_rows: int, timeout: float
) -> dict[str, Any]:
    """The same upsert as a Spark user would write it, on the first ``subset_rows`` rows
    (files of 1000 lines, 4 files per micro-batch), stopped after ``timeout`` seconds."""
    spark.conf.set(
        "spark.sql.streaming.stateStore.providerClass",
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    )
    per = subset_rows // PARTITIONS
    root = base / "tws-input"
    write_files(root, {p: ls[:per] for p, ls in inp.lines.items()}, 1000)
    warm = base / "tws-warm"
    write_files(warm, {p: ls[:50] for p, ls in inp.lines.items()}, 1000)
    t0 = time.perf_counter()
    q = _tws_query(spark, warm, base / "tws-warm-ckpt")
    q.awaitTermination()
    warm_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    q = _tws_query(spark, root, base / "tws-ckpt")
    timed_out = not q.awaitTermination(timeout)
    wall = time.perf_counter() - t0
    if timed_out:
        q.stop()
    batches = [p for p in progress(q) if p["input_rows"]]
    done_rows = sum(p["input_rows"] for p in batches)
    batch_s = sum(p["duration_ms"].get("triggerExecution", 0) for p in batches) / 1000
    spark.conf.unset("spark.sql.streaming.stateStore.providerClass")
    return {
        "subset_rows": per * PARTITIONS,
        "rows": done_rows,
        "wall_seconds": wall,
        "batch_seconds": batch_s,
        "rows_s": done_rows / wall if wall else 0.0,
        "rows_s_in_batches": done_rows / batch_s if batch_s else 0.0,
        "timed_out": timed_out,
        "batches": len(batches),
        "warm_up_seconds": warm_s,
    }
