"""The one SparkSession builder: every Millstream process (and the test suite) gets its session
here, configured for streaming ingestion."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pyspark import SparkContext
from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

DEFAULT_MASTER = "local[2]"

#: ``file://`` paths through Hadoop's raw local file system (no checksum files).
LOCAL_FILES_WITHOUT_CHECKSUMS = {
    "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
    "spark.hadoop.fs.AbstractFileSystem.file.impl": "org.apache.hadoop.fs.local.RawLocalFs",
}


#: The Spark settings of a run that ends when it has caught up (``millstream run
#: --available-now``), whose JVM lives for seconds and whose batches are a few Spark jobs:
#:
#: * the driver JVM compiles with the C1 compiler only (``TieredStopAtLevel=1``): C2's
#:   compiler threads spend CPU on code a short run would not run long enough to win back
#:   (a fresh run of 1M upserts used about a third less CPU in all, docs/performance.md,
#:   "Batch"), and the serial collector in a 512 MiB heap: the JVM holds no data (the Python
#:   tasks read, decode and stage the records; they send the JVM a few bytes a task), so
#:   parallel GC threads buy nothing (the serial collector alone, in the default 1 GiB heap,
#:   let the JVM grow to ~700 MB of RSS). In ``defaultJavaOptions``, so a user's
#:   ``spark.driver.extraJavaOptions`` stays;
#: * a Python worker exits after its task instead of waiting to be reused, which gives back
#:   its memory (the decoded batch's high-water mark) before the run's final seal, instead of
#:   holding it idle beside the seal until the JVM stops;
#: * the Python workers' Arrow buffers come from the system allocator, not mimalloc: a write
#:   task decodes a piece, stages it and frees it, again and again, and mimalloc kept the freed
#:   pieces' memory (a 500,000-record task peaked ~60 MB higher, in the same CPU time).
BATCH_RUN_SETTINGS = {
    "spark.driver.defaultJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xmn32m",
    "spark.driver.memory": "512m",
    "spark.python.worker.reuse": "false",
    "spark.executorEnv.ARROW_DEFAULT_MEMORY_POOL": "system",
    "spark.executorEnv.MALLOC_MMAP_THRESHOLD_": "1048576",
}


#: The driver's log4j configuration (this package's ``log4j2.properties``).
LOG4J_OPTION = (
    "-Dlog4j2.configurationFile=" + (Path(__file__).parent / "log4j2.properties").as_uri()
)


def worker_python(config: Mapping[str, str] | None = None) -> str:
    """The interpreter Spark's Python workers run: the one the user chose (``PYSPARK_PYTHON``,
    or ``spark.pyspark.python`` in ``config``), else this one. Not "python3" from PATH: a venv
    used without activation (``.venv/bin/python app.py``) has millstream, PATH's python3
    does not."""
    chosen = (config or {}).get("spark.pyspark.python") or os.environ.get("PYSPARK_PYTHON")
    return chosen or sys.executable


def spark_session(
    *,
    master: str | None = None,
    app_name: str = "millstream",
    log_level: str = "ERROR",
    config: Mapping[str, str] | None = None,
) -> Any:
    """Create (or get) the SparkSession. Master: argument, else ``MILLSTREAM_SPARK_MASTER``,
    else ``local[2]``. Spark's Python workers run this interpreter (:func:`worker_python`).
    ``config`` adds or overrides Spark settings (the tests pin a warehouse directory)."""
    python = worker_python(config)
    os.environ.setdefault("PYSPARK_PYTHON", python)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = (
        SparkSession.builder.master(
            master or os.environ.get("MILLSTREAM_SPARK_MASTER") or DEFAULT_MASTER
        )
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        # The millstream source takes key filters before its merge (table_source.PUSHDOWN_CONF)
        .config("spark.sql.python.filterPushdown.enabled", "true")
        # The workers of Python UDFs and of the Python data sources (the JVM starts those
        # from this setting, whatever the driver's environment says).
        .config("spark.pyspark.python", python)
        # How long a Python process waits to connect to its JVM and authenticate, and after
        # that, in Spark's planner processes (a Python data source's creation and planning,
        # the streaming sink's commit: ``get_sock_file_to_executor()`` keeps it as the socket's
        # timeout), for each read from the JVM; also how long the JVM waits for the driver to
        # fetch a job's results. Spark's 15 s failed writers at load 25-43 on two cores
        # (``[CANNOT_OPEN_SOCKET] ... timed out``; docs/reliability.md, "Spark's transient
        # failures"), where a fresh Python process that imports in 0.4 s on a quiet machine
        # waits its turn for a core. A longer wait costs nothing while the peer is alive; a
        # dead one refuses the connection at once. The JVM's own fixed 10 s wait for a fresh
        # Python process has no setting: the runner restarts after it (runner.TransientRestarts).
        .config("spark.python.authenticate.socketTimeout", "60s")
    )
    # A query's offset and commit logs on a local disk without Hadoop's .crc sidecar files:
    # two writes and renames less per log entry, ~55 ms less of every micro-batch
    # (docs/performance.md, "Ingest", (e)). The checkpoint is a cache Millstream checks against
    # the shards before using it (runner.checkpoint_verdict), so it needs no checksum.
    for key, value in LOCAL_FILES_WITHOUT_CHECKSUMS.items():
        builder = builder.config(key, value)
    settings = dict(config or {})
    # The JVM logs through the package's log4j2.properties: no banner, hint or native-library
    # warning on the user's terminal at each start. Beside any default Java options given.
    settings["spark.driver.defaultJavaOptions"] = " ".join(
        o for o in (LOG4J_OPTION, settings.get("spark.driver.defaultJavaOptions")) if o
    )
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    quiet_accumulator_server(spark)
    return spark


def end_jvm(spark: Any, *, timeout: float = 30.0) -> None:
    """Stop ``spark`` and end the JVM this process started for it now, not when this process
    exits. ``spark.stop()`` stops the SparkContext only: PySpark keeps its JVM (the heap, the
    loaded classes, ~0.35 GB of RSS) for a next session until the Python process ends.
    ``millstream run --available-now`` ends it once its last batch has committed, so the final
    seal pass and merged copy that follow, which need no Spark, do not run beside an idle JVM
    (docs/performance.md, "Peak RSS under 1 GB"). The JVM exits at the end of its standard input,
    as it does when this process exits (killed after ``timeout`` seconds); a later
    :func:`spark_session` starts a new one. A JVM this process did not start (a gateway it
    was given) is left running."""
    spark.stop()
    with SparkContext._lock:
        gateway = SparkContext._gateway
        proc = getattr(gateway, "proc", None)
        if gateway is None or proc is None:
            return
        SparkContext._gateway = None
        SparkContext._jvm = None
    gateway.shutdown()
    if proc.stdin is not None:
        proc.stdin.close()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        log.warning("the Spark JVM (pid %d) did not exit within %g s: killed", proc.pid, timeout)
        proc.kill()
        proc.wait()


def quiet_accumulator_server(spark: SparkSession) -> None:
    """PySpark's accumulator server prints a traceback to stderr (``socketserver``'s
    ``handle_error``) when the JVM closes its connection first: on Ctrl-C the JVM, in the
    terminal's process group, exits at once, and ``millstream run`` printed an ``EOFError``
    traceback after its clean summary. A closed connection is logged at debug level instead;
    any other error is printed as before."""
    server = getattr(spark.sparkContext, "_accumulatorServer", None)
    if server is None:
        return
    default = server.handle_error

    def handle_error(request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, (EOFError, ConnectionError)):
            log.debug("Spark's accumulator connection closed by the JVM: %r", exc)
            return
        default(request, client_address)

    server.handle_error = handle_error
