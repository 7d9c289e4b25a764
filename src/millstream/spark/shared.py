"""Several datastreams in one streaming query: a worker's *shared query*.

A micro-batch costs a worker about 0.6 CPU-seconds whatever it holds (Spark's planning, its
offset and commit logs, a Python worker call per task for the source and another for the
sink; docs/performance.md, "Scale"). With a query per datastream that cost is paid per
datastream and trigger, so ten quiet datastreams cost ten times one. A shared query pays it
once per trigger for all of them: its source (:class:`~millstream.spark.sources.GroupStreamReader`)
plans every member's ranges as the member would alone, its tasks read and stage each member's
ranges as that member's sink would (:class:`~millstream.spark.sink.GroupSink`), and its commit
commits each member through its own compare-and-append transaction, with its own epochs and
standby gate. Nothing about a member's correctness depends on the others:

* a member's commit is its own transaction; a member fenced or gapped does not keep the others
  from committing, and the query then restarts every member from its shard uppers (the others'
  replay is a DROP);
* the query's checkpoint is a cache like a writer's: it is discarded at every start, and every
  member starts at its shard uppers (the truth);
* a member's error carries its name (:data:`~millstream.spark.sources.MEMBER_NOTE`), so the
  worker puts that member alone in ERROR or backoff and restarts the others without it.

What it costs: the membership is fixed for a query's life. Adding, pausing or removing a
datastream restarts the shared query (a query start, ~1-2 s without new rows for the other
members), and a member's restartable error restarts them all.
"""

from __future__ import annotations

import logging
import re
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from pyspark.errors import StreamingQueryException

from millstream.errors import InvalidSpecError, from_spark_failure
from millstream.spark.options import (
    GroupSinkOptions,
    GroupSourceOptions,
    SinkOptions,
    SourceOptions,
)
from millstream.spark.runner import MAX_RESTARTS, DatastreamRunner, _restartable
from millstream.spark.sources import GROUP_FORMAT
from millstream.spark.table_source import GROUP_SINK_FORMAT, register
from millstream.storage.statedir import StateDirectory

log = logging.getLogger(__name__)

_MEMBER = re.compile(r"in the shared query's member datastream ['\"]([^'\"]+)['\"]")


def member_of(error: BaseException) -> str | None:
    """The member datastream a shared query's error names (the last named: a traceback ends
    with the error that propagated), or None for an error of the query as a whole."""
    found = _MEMBER.findall(str(error))
    return found[-1] if found else None


def member_source(
    source: SourceOptions, *, members: int, trigger: float, shortest: float
) -> SourceOptions:
    """A member's source options in a shared query of ``members`` datastreams whose shortest
    trigger is ``shortest``:

    * a task may write every member's part at once (a thread each), so each member plans with
      its share of a task's memory (``task_memory_mb``), and a task holds one budget in all;
    * a member whose own ``trigger`` is longer than the query's is planned once per its own
      trigger, not at every trigger of the query."""
    return replace(
        source,
        task_memory_mb=max(1, source.task_memory_mb // max(1, members)),
        trigger_seconds=trigger if trigger > shortest else 0.0,
    )


class SharedQueryMemberError(Exception):
    """A member's error that restarting the shared query cannot help (a bad record with
    ``bad_records: fail``, a source that does not answer, restarts exhausted): the worker
    takes ``member`` out of the query and restarts the others."""

    def __init__(self, member: str, error: BaseException) -> None:
        ours = from_spark_failure(error)  # Spark's text leads with its own words
        what = (
            f"{ours.kind.__name__}: {ours.message}"
            if ours is not None
            else (str(error).splitlines() or [repr(error)])[0]
        )
        super().__init__(f"datastream {member!r}: {what}")
        self.member = member
        self.error = error


class SharedQueryRunner:
    """Runs the writers of several datastreams (``members``, each a :class:`DatastreamRunner`
    whose state directory the caller holds) in one streaming query. The query's checkpoint is
    kept under ``state_dir``, which this runner locks while it runs."""

    def __init__(
        self, members: list[DatastreamRunner], spark: Any, state_dir: StateDirectory
    ) -> None:
        if not members:
            raise InvalidSpecError("members", "a shared query runs at least one datastream")
        self.members = {m.spec.name: m for m in sorted(members, key=lambda m: m.spec.name)}
        self.spark = spark
        self.state_dir = state_dir
        #: restarts after a restartable error, per member (``*``: the query's own)
        self.restarts: dict[str, int] = {}
        self.query: Any = None
        self._stopping = False

    @property
    def checkpoint(self) -> Path:
        return self.state_dir.checkpoint_dir  # raises unless the lock is held

    def start(self) -> Any:
        self.spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(
            self.spark._jsparkSession
        )
        register(self.spark)
        sources: dict[str, SourceOptions] = {}
        sinks: dict[str, SinkOptions] = {}
        shortest = min(m.spec.trigger_seconds for m in self.members.values())
        for name, m in self.members.items():
            try:
                m.ensure_tables()
                source, sinks[name] = m.query_options(m.bootstrap())
            except Exception as exc:
                raise SharedQueryMemberError(name, exc) from exc
            sources[name] = member_source(
                source, members=len(self.members), trigger=m.spec.trigger_seconds, shortest=shortest
            )
        # A cache like a writer's checkpoint; each member starts at its shard uppers instead.
        shutil.rmtree(self.checkpoint, ignore_errors=True)
        self.query = (
            self.spark.readStream.format(GROUP_FORMAT)
            .options(**GroupSourceOptions(sources).to_options())
            .load()
            .writeStream.format(GROUP_SINK_FORMAT)
            .options(**GroupSinkOptions(sinks).to_options())
            .option("checkpointLocation", str(self.checkpoint))
            .queryName(f"millstream-shared-{self.state_dir.path.name}")
            .trigger(processingTime=f"{int(shortest * 1000)} milliseconds")
            .start()
        )
        for m in self.members.values():
            m.query = self.query
        return self.query

    def run(self) -> None:
        """Run until :meth:`stop`. A restartable error (a member fenced, gapped, or its staged
        files too old) restarts the query from every member's shard uppers; any other error of
        a member raises :class:`SharedQueryMemberError`, and one of the query as a whole is
        raised as it is."""
        owns_lock = not self.state_dir.held
        if owns_lock:
            self.state_dir.lock()
        try:
            while not self._stopping:
                self.start()
                if self._stopping:
                    self.query.stop()  # stop() came while this query was starting
                    return
                error = self._await()
                if error is None or self._stopping:
                    return
                member = member_of(error)
                key = member or "*"
                self.restarts[key] = self.restarts.get(key, 0) + 1
                if not _restartable(error) or self.restarts[key] > MAX_RESTARTS:
                    if member is not None:
                        raise SharedQueryMemberError(member, error) from error
                    raise error
                log.warning(
                    "shared query %s restarts every member from its shard uppers (%s): %s",
                    self.state_dir.path.name,
                    f"datastream {member!r}" if member else "the query",
                    str(error).splitlines()[0],
                )
        finally:
            if owns_lock:
                self.state_dir.unlock()

    def _await(self) -> Exception | None:
        try:
            self.query.awaitTermination()
            return None
        except StreamingQueryException as exc:
            return exc

    def stop(self) -> None:
        self._stopping = True
        if self.query is not None:
            self.query.stop()
