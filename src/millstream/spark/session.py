"""The one SparkSession builder: every Millstream process (and the test suite) gets its session
here, configured for streaming ingestion."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyspark
from pyspark import SparkConf, SparkContext
from pyspark.errors.exceptions.captured import install_exception_handler
from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

DEFAULT_MASTER = "local[2]"

#: Spark's Python daemon, which imports Millstream's task modules before it forks a worker.
DAEMON_MODULE = "millstream.spark.daemon"
#: The Python daemon of a run that ends once it has caught up (:data:`BATCH_RUN_SETTINGS`).
BATCH_DAEMON_MODULE = "millstream.spark.batch_daemon"

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
#:   pieces' memory (a 500,000-record task peaked ~60 MB higher, in the same CPU time);
#: * Spark's own Python daemon with pandas unimportable (:data:`BATCH_DAEMON_MODULE`), not
#:   :data:`DAEMON_MODULE`: the peak RSS, at the write, would hold the daemon's imports beside
#:   the workers'.
BATCH_RUN_SETTINGS = {
    "spark.driver.defaultJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xmn32m",
    "spark.driver.memory": "512m",
    "spark.python.worker.reuse": "false",
    "spark.executorEnv.ARROW_DEFAULT_MEMORY_POOL": "system",
    "spark.executorEnv.MALLOC_MMAP_THRESHOLD_": "1048576",
    "spark.python.daemon.module": BATCH_DAEMON_MODULE,
}


#: The JVM's class archive (:class:`ClassArchive`): "off" turns it off, a path puts it there.
CLASS_ARCHIVE_ENV = "MILLSTREAM_JVM_CLASS_ARCHIVE"
#: The JVM's class-sharing messages (the classes an archive leaves out, an archive of another
#: JVM) are not the user's business: the JVM runs without an archive it cannot use.
QUIET_CLASS_SHARING = "-Xlog:cds=off -Xlog:cds+dynamic=off"
#: A half-written archive (a run killed while its JVM wrote it) is removed after this long,
#: and so is another Java's or Spark's archive (or marker) that no run used for as long: a
#: day, so that a run lasting hours keeps the archive its JVM maps (its use is marked when it
#: starts and when it ends), and its next start finds it.
STALE_ARCHIVE_SECONDS = 86400.0
#: The names :meth:`ClassArchive.default` gives its archives (what :meth:`ClassArchive.prune`
#: may remove).
ARCHIVE_GLOB = "spark-*-jvm-*.jsa"


@dataclass(frozen=True, slots=True)
class ClassArchive:
    """The driver JVM's classes as loaded by an earlier ``--available-now`` run, mapped from
    one file (the JVM's class data sharing, ``-XX:SharedArchiveFile``) instead of read from
    Spark's jars, verified and parsed again at every start: Spark's session start loads some
    ten thousand classes, and with the archive the JVM's CPU to start a session, run a job and
    stop fell by about 40% (docs/performance.md, "The batch run's fixed cost"). The first run
    of a JVM and Spark version writes the archive when its JVM exits (a few seconds once,
    ``-XX:ArchiveClassesAtExit``), to a file of its own that :meth:`settle` renames into
    place: runs that write at once never see each other's half-written file. The JVM checks
    the archive against itself and the class path, and runs without one it cannot use; the
    file's name holds the Java binary and Spark's version, so a new one of either writes its
    own. A run whose JVM wrote no archive (a class path the JVM cannot archive) leaves a
    marker, so later runs do not pay for writing one again.

    Each archive is ~116 MB, and the key changes with every new virtualenv (a CI run's fresh
    clone), Java update or Spark version: when a run puts a new one in place it removes the
    others that no run used for :data:`STALE_ARCHIVE_SECONDS` (:meth:`prune`; a run marks the
    archive, or the marker, it uses when it starts and the archive again when it ends)."""

    path: Path

    @classmethod
    def default(cls) -> ClassArchive | None:
        """The archive of this machine's Java and Spark under the user's cache directory, or
        :data:`CLASS_ARCHIVE_ENV`'s path; None if that says ``off`` or no Java is found."""
        chosen = os.environ.get(CLASS_ARCHIVE_ENV, "")
        if chosen.lower() == "off":
            return None
        if chosen:
            return cls(Path(chosen))
        java_home = os.environ.get("JAVA_HOME")
        java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
        if java is None:
            return None
        binary = Path(java).resolve()
        try:
            stat = binary.stat()
        except OSError:
            return None
        key = f"{binary}:{stat.st_size}:{stat.st_mtime_ns}:{Path(pyspark.__file__).parent}"
        digest = hashlib.sha256(key.encode()).hexdigest()[:16]
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        return cls(cache / "millstream" / f"spark-{pyspark.__version__}-jvm-{digest}.jsa")

    @property
    def pending(self) -> Path:
        """The file this process's JVM writes the archive to (renamed by :meth:`settle`)."""
        return self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")

    @property
    def failed(self) -> Path:
        """The marker of a run whose JVM wrote no archive."""
        return self.path.with_name(f"{self.path.name}.failed")

    def java_options(self) -> str:
        """Use the archive, or write it at exit if there is none yet (and no run failed to)."""
        if self.path.exists():
            with contextlib.suppress(OSError):  # its last use, which prune() keeps it by
                os.utime(self.path)
            return f"-XX:SharedArchiveFile={self.path} {QUIET_CLASS_SHARING}"
        if self.failed.exists():
            with contextlib.suppress(OSError):  # used: prune() keeps it
                os.utime(self.failed)
            return ""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            for old in self.path.parent.glob(f"{self.path.name}.*.tmp"):
                if time.time() - old.stat().st_mtime > STALE_ARCHIVE_SECONDS:
                    old.unlink(missing_ok=True)
        except OSError as exc:  # a read-only cache: run without
            log.debug("no JVM class archive at %s: %s", self.path, exc)
            return ""
        return f"-XX:ArchiveClassesAtExit={self.pending} {QUIET_CLASS_SHARING}"

    def settle(self, exit_code: int | None) -> None:
        """After the JVM that was to write the archive exited (``exit_code``): put what it
        wrote in place, or mark that it wrote none."""
        pending = self.pending
        try:
            if pending.exists():
                if exit_code == 0:
                    os.replace(pending, self.path)
                    self.prune()
                else:  # it may have died half-way through writing it
                    pending.unlink()
            elif exit_code == 0 and not self.path.exists():
                self.failed.touch()
            elif self.path.exists():  # it mapped the archive until now: its last use
                os.utime(self.path)
        except OSError as exc:
            log.debug("JVM class archive %s: %s", self.path, exc)

    def prune(self) -> list[Path]:
        """Remove the other archives in this one's directory (another Java binary, Spark
        version or pyspark install: :data:`ARCHIVE_GLOB`), and their markers, that no run
        used for :data:`STALE_ARCHIVE_SECONDS`; returns what it removed. A run maps an
        archive it found within seconds of marking it used, and a JVM that still maps one
        removed later keeps its pages (unlinking a file removes its name, not a mapping);
        a JVM given a path that is gone starts without an archive."""
        removed: list[Path] = []
        now = time.time()
        for other in [
            *self.path.parent.glob(ARCHIVE_GLOB),
            *self.path.parent.glob(f"{ARCHIVE_GLOB}.failed"),
        ]:
            if other in (self.path, self.failed):
                continue
            try:
                if now - other.stat().st_mtime > STALE_ARCHIVE_SECONDS:
                    other.unlink()
                    removed.append(other)
            except OSError as exc:  # another run removed it first, a read-only cache
                log.debug("JVM class archive %s: %s", other, exc)
        if removed:
            log.info("removed %d unused JVM class archives: %s", len(removed), removed)
        return removed


def batch_run_settings(archive: ClassArchive | None) -> dict[str, str]:
    """:data:`BATCH_RUN_SETTINGS`, with the JVM's class archive (:class:`ClassArchive`)."""
    settings = dict(BATCH_RUN_SETTINGS)
    options = archive.java_options() if archive is not None else ""
    if options:
        key = "spark.driver.defaultJavaOptions"
        settings[key] = f"{settings[key]} {options}"
    return settings


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


def quiet_jvm_log(spark: Any) -> None:
    """The JVM's log off once a process stops: a query stopped under a running batch (by a
    stop, or by Spark's stop after the wait for its writer ran out) has the JVM log the
    batch's cancellation ("Aborting task", a TaskKilledException's stack) at ERROR on the
    user's terminal; expected at a stop. What the stop itself meets is logged in Python."""
    try:
        spark.sparkContext.setLogLevel("OFF")
    except Exception as exc:  # Spark already stopped
        log.debug("the JVM's log level not set at the stop: %r", exc)


def spark_session(
    *,
    master: str | None = None,
    app_name: str = "millstream",
    log_level: str = "ERROR",
    config: Mapping[str, str] | None = None,
    jobs_only: bool = False,
) -> Any:
    """Create (or get) the SparkSession. Master: argument, else ``MILLSTREAM_SPARK_MASTER``,
    else ``local[2]``. Spark's Python workers run this interpreter (:func:`worker_python`).
    ``config`` adds or overrides Spark settings (the tests pin a warehouse directory).
    ``jobs_only``: a :class:`JobsSession`, whose JVM SparkSession starts at its first use (a
    run of plain Spark jobs, ``millstream run --available-now``, never uses it)."""
    python = worker_python(config)
    os.environ.setdefault("PYSPARK_PYTHON", python)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    options = {
        "spark.master": master or os.environ.get("MILLSTREAM_SPARK_MASTER") or DEFAULT_MASTER,
        "spark.app.name": app_name,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.streaming.noDataMicroBatches.enabled": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # The millstream source takes key filters before its merge (table_source.PUSHDOWN_CONF)
        "spark.sql.python.filterPushdown.enabled": "true",
        # The workers of Python UDFs and of the Python data sources (the JVM starts those
        # from this setting, whatever the driver's environment says).
        "spark.pyspark.python": python,
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
        "spark.python.authenticate.socketTimeout": "60s",
        # Spark's Python daemon forks task workers with Millstream's task modules imported
        # (millstream.spark.daemon): a worker's first write or read part no longer imports them.
        "spark.python.daemon.module": DAEMON_MODULE,
        # A query's offset and commit logs on a local disk without Hadoop's .crc sidecar files:
        # two writes and renames less per log entry, ~55 ms less of every micro-batch
        # (docs/performance.md, "Ingest", (e)). The checkpoint is a cache Millstream checks
        # against the shards before using it (runner.checkpoint_verdict), so it needs no
        # checksum.
        **LOCAL_FILES_WITHOUT_CHECKSUMS,
    }
    settings = dict(config or {})
    # The JVM logs through the package's log4j2.properties: no banner, hint or native-library
    # warning on the user's terminal at each start. Beside any default Java options given.
    settings["spark.driver.defaultJavaOptions"] = " ".join(
        o for o in (LOG4J_OPTION, settings.get("spark.driver.defaultJavaOptions")) if o
    )
    options.update(settings)
    spark: Any
    if jobs_only:
        spark = JobsSession(SparkContext.getOrCreate(SparkConf().setAll(list(options.items()))))
    else:
        builder = SparkSession.builder
        for key, value in options.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    quiet_accumulator_server(spark)
    return spark


class JobsSession:
    """The session of a run of plain Spark jobs (``millstream run --available-now``, whose
    batches are RDD jobs, :mod:`millstream.spark.catch_up`): its SparkContext started at
    once, the JVM's SparkSession only when something other than :attr:`sparkContext` and
    :meth:`stop` is asked of it. Creating the JVM's SparkSession (its extensions, its shared
    state and, with a session's settings, its SQL session state) took 0.9-1.4 s of the
    session start at load 6-7 after the SparkContext's 2.6-3.1 s (docs/performance.md, "The
    whole batch run: its timeline and cuts"), and the run's jobs use none of it. The settings
    go to the SparkContext's configuration, which a session created later takes its SQL
    settings from."""

    def __init__(self, sc: SparkContext) -> None:
        self.sparkContext = sc
        self._lock = threading.Lock()
        self._session: SparkSession | None = None
        # What a SparkSession's creation installs: the JVM's errors raised as PySpark's own
        # (runner.transient_spark_failure reads them)
        install_exception_handler()

    def session(self) -> SparkSession:
        """The SparkSession (created at the first call)."""
        with self._lock:
            if self._session is None:
                self._session = SparkSession(self.sparkContext)
            return self._session

    def __getattr__(self, name: str) -> Any:
        if name in ("_lock", "_session"):  # before __init__ set them (a copy, a pickle)
            raise AttributeError(name)
        return getattr(self.session(), name)

    def stop(self) -> None:
        if self._session is not None:
            self._session.stop()
        else:
            self.sparkContext.stop()


class SessionStart:
    """A SparkSession (:func:`spark_session`'s arguments) started on a thread of its own: the
    JVM's launch and the session's start are seconds of waiting on another process, and
    ``millstream run --available-now`` does meanwhile what needs no Spark (its remaining
    imports, opening the metadata store, creating the tables; docs/performance.md, "The
    batch run's fixed cost"). :meth:`result` waits for the session and returns it, or raises
    what starting it raised. On this thread PySpark installs no SIGINT handler (it does so
    only on the main thread): Ctrl-C stays the caller's."""

    def __init__(self, **kwargs: Any) -> None:
        self._session: Future[Any] = Future()
        self._thread = threading.Thread(
            target=self._start, kwargs=kwargs, name="spark-session-start", daemon=True
        )
        self._thread.start()

    def _start(self, **kwargs: Any) -> None:
        try:
            self._session.set_result(spark_session(**kwargs))
        except BaseException as exc:  # the caller's result() raises it
            self._session.set_exception(exc)

    def result(self) -> Any:
        """The started session (waits for it), or what starting it raised."""
        return self._session.result()


def end_jvm(spark: Any, *, timeout: float = 30.0, archive: ClassArchive | None = None) -> None:
    """Stop ``spark`` and end the JVM this process started for it now, not when this process
    exits. ``spark.stop()`` stops the SparkContext only: PySpark keeps its JVM (the heap, the
    loaded classes, ~0.35 GB of RSS) for a next session until the Python process ends.
    ``millstream run --available-now`` ends it once its last batch has committed, so the final
    seal pass and merged copy that follow, which need no Spark, do not run beside an idle JVM
    (docs/performance.md, "Peak RSS under 1 GB"). The JVM exits at the end of its standard input,
    as it does when this process exits (killed after ``timeout`` seconds); a later
    :func:`spark_session` starts a new one. A JVM this process did not start (a gateway it
    was given) is left running. ``archive``: the class archive this JVM was started with,
    settled once it exited (:meth:`ClassArchive.settle`)."""
    # PySpark's stop() waits for its accumulator server's loop to see the shutdown (0.88 s of
    # its ~1 s, docs/performance.md, "The batch run's fixed cost"); every job is done, so
    # nothing is left for it to receive: it stops on a thread of its own while the JVM ends.
    sc = spark.sparkContext
    server = getattr(sc, "_accumulatorServer", None)
    if server is not None:
        sc._accumulatorServer = None
        threading.Thread(
            target=server.shutdown, name="accumulator-server-stop", daemon=True
        ).start()
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
    if archive is not None:
        archive.settle(proc.returncode)


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
