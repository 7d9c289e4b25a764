"""One error tree for Millstream.

Every error Millstream raises on purpose is a class of this module, under
:class:`MillstreamError`. Each carries structured fields and a message that says what
happened, with the ids involved, and its docstring says what the operator can do.
``HTTP_STATUS`` and ``EXIT_CODES`` map every class of the tree (by itself or by an ancestor)
to a REST status code and a CLI exit code, and ``EXIT_FAMILIES`` names each exit code; nothing
else in the code base decides those (``tests/unit/test_error_tree.py`` keeps it so).

An error raised inside a Spark Python worker reaches the driver as Spark's text only;
:func:`from_spark_failure` recovers which class of the tree it was.
"""

from __future__ import annotations

import re
from typing import Any


class MillstreamError(Exception):
    """Root of every error Millstream raises on purpose."""

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fields: dict[str, Any] = fields

    def to_dict(self) -> dict[str, Any]:
        return {"error": type(self).__name__, "message": self.message, **self.fields}


class InvalidSpecError(MillstreamError, ValueError):
    """A spec, option or argument is invalid. ``field`` names the offending field.

    Fix the named field and retry; nothing was written.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"invalid {field}: {message}", field=field)
        self.field = field


class NotFoundError(MillstreamError, LookupError):
    """A named object (table, shard, datastream, segment) does not exist.

    Check the name (``millstream datastream list``, ``GET /tables``); nothing was changed.
    """

    def __init__(self, kind: str, name: str) -> None:
        super().__init__(f"{kind} {name!r} does not exist", kind=kind, name=name)
        self.kind = kind
        self.name = name


class TableNotFoundError(NotFoundError):
    """A table that does not exist. Check the name; a datastream's table (and its dead-letter
    table) is created when the controller first handles the datastream."""

    def __init__(self, name: str) -> None:
        super().__init__("table", name)


class HomeNotFoundError(NotFoundError):
    """A command that reads found no Millstream deployment where it looked (it creates none).
    Pass ``--home DIR`` or set ``MILLSTREAM_HOME`` (or ``MILLSTREAM_METADATA_URL``)."""

    def __init__(self, home: str, looked_for: str) -> None:
        MillstreamError.__init__(
            self,
            f"no Millstream home at {home} ({looked_for} does not exist): pass --home DIR or "
            "set MILLSTREAM_HOME (or MILLSTREAM_METADATA_URL) to the deployment to read",
            kind="Millstream home",
            name=home,
        )
        self.kind = "Millstream home"
        self.name = home


class VersionExpiredError(MillstreamError):
    """A manifest version (or a point in time) older than the table's retention keeps: its
    manifest rows were expired and its files may be gone.

    Read a newer version (the error names the oldest kept one), or keep more history
    (``retention.time`` / ``retention.min_versions`` in the table spec). A read whose version
    expires while it runs gets this error instead of a partial result.
    """

    def __init__(self, table: str, version: int | str, oldest: int) -> None:
        super().__init__(
            f"version {version} of table {table!r} has expired; the oldest kept is {oldest}",
            table=table,
            version=str(version),
            oldest=oldest,
        )
        self.table = table
        self.oldest = oldest


class AlreadyExistsError(MillstreamError):
    """Creating an object whose name is taken (with a different definition).

    Pick another name, or delete the existing object first; nothing was changed.
    """

    def __init__(self, kind: str, name: str) -> None:
        super().__init__(f"{kind} {name!r} already exists", kind=kind, name=name)


class TableOwnedError(AlreadyExistsError):
    """A datastream would write a table (or its dead-letter table) that belongs to another
    datastream: two writers of one table share its shards by partition number, and one's
    commits would be dropped as already covered by the other's.

    Name another table (``table.name``), or delete the other datastream first (its table
    names are free once it is removed); nothing was changed.
    """

    def __init__(self, table: str, owner: str, datastream: str) -> None:
        MillstreamError.__init__(
            self,
            f"table {table!r} belongs to datastream {owner!r}; datastream {datastream!r} "
            "cannot write it (name another table, or delete that datastream first)",
            kind="table",
            name=table,
            owner=owner,
            datastream=datastream,
        )
        self.table = table
        self.owner = owner


class IncompatibleChangeError(MillstreamError):
    """An update of a datastream or table spec that rows already written could not follow:
    a column removed, renamed or reordered, a type narrowed or changed lossily, a key or merge
    setting changed, or a part of a datastream other than its schema and retention.

    Nothing was changed (the table's spec and schema version are as before). ``field`` names
    the offending field, ``column`` the column (if any) and ``rule`` the rule it breaks. Make
    a compatible change instead (add a column at the end, widen int -> long), or create a new
    datastream and table for the new definition.
    """

    def __init__(self, table: str, field: str, column: str | None, rule: str, change: str) -> None:
        where = f"column {column!r}" if column is not None else field
        super().__init__(
            f"incompatible change to table {table!r}, {where} ({change}): {rule}; nothing "
            "was changed",
            table=table,
            field=field,
            column=column,
            rule=rule,
            change=change,
        )
        self.table = table
        self.field = field
        self.column = column
        self.rule = rule


class CommitConflictError(MillstreamError):
    """A compare-and-set lost: the row changed since it was read.

    Refresh the object and retry; nothing was written by the failed attempt.
    """


class CommitStateUnknownError(MillstreamError):
    """The outcome of a commit is unknown (for example the connection dropped during COMMIT).

    Do not retry blindly: re-read the authoritative state (shard uppers, record versions)
    and reconcile.
    """


class SegmentChangedError(MillstreamError):
    """The segments an operation was built from changed before it could swap its result in
    (rolled back, re-ingested, or sealed by another sealer after this one was presumed dead).

    Nothing was swapped; the operation's output is discarded and it is retried from the current
    manifest. Deliberately not a :class:`CommitConflictError`: re-running the same transaction
    cannot succeed, only rebuilding from the new state can.
    """


class StagedFileExpiredError(MillstreamError):
    """A staged data file is older than the commit may accept: garbage collection may already
    have deleted it (it deletes unreferenced files older than its grace period).

    Nothing was committed. The writer restarts from the shard upper and stages the range again.
    """

    def __init__(self, path: str, age_seconds: float, limit_seconds: float) -> None:
        super().__init__(
            f"staged file {path} is {age_seconds:.0f}s old, past the {limit_seconds:.0f}s a "
            "commit may accept (garbage collection may have deleted it); nothing was "
            "committed: restart the writer from the shard upper to stage the range again",
            path=path,
            age_seconds=round(age_seconds, 3),
            limit_seconds=limit_seconds,
        )


class PublishExpiredError(MillstreamError):
    """A publish of a table's Iceberg view began writing its snapshot's files longer ago than
    a publish may move the pointer to them: the view's garbage collection deletes unreferenced
    files older than its grace period, and until the pointer names them they are unreferenced
    (the publisher stalled between its writes and the pointer's compare-and-set).

    Nothing moved: the view still shows its previous snapshot, and the snapshot's files are
    left for garbage collection. The publisher's next turn publishes the version again.
    """

    def __init__(self, table: str, age_seconds: float, limit_seconds: float) -> None:
        super().__init__(
            f"the Iceberg view of table {table!r} was not published: its snapshot's files were "
            f"written {age_seconds:.0f}s before its pointer's swap, past the {limit_seconds:.0f}s "
            "a publish may take (garbage collection may have deleted them); nothing moved, the "
            "next publish writes them again",
            table=table,
            age_seconds=round(age_seconds, 3),
            limit_seconds=limit_seconds,
        )
        self.table = table


class WriterFencedError(MillstreamError):
    """A writer bootstrapped at an older shard epoch tried to commit.

    The shard was rolled back since the writer started. The writer must re-bootstrap from
    the shard's current upper; nothing was committed.
    """

    def __init__(self, table: str, partition: int, writer_epoch: int, shard_epoch: int) -> None:
        super().__init__(
            f"writer fenced on table {table!r} partition {partition}: it bootstrapped at epoch "
            f"{writer_epoch} but the shard is at epoch {shard_epoch}; restart from the shard upper",
            table=table,
            partition=partition,
            writer_epoch=writer_epoch,
            shard_epoch=shard_epoch,
        )


class ShardGapError(MillstreamError):
    """A batch started above the shard's upper; committing it would leave a hole.

    The writer must restart from the shard upper (its local position is ahead of the truth).
    """

    def __init__(self, table: str, gaps: dict[int, tuple[int, int]]) -> None:
        desc = ", ".join(
            f"partition {p}: upper {u}, batch starts at {lo}" for p, (u, lo) in gaps.items()
        )
        super().__init__(
            f"batch for table {table!r} starts above the shard upper ({desc}); "
            "restart the writer from the shard upper",
            table=table,
            gaps={str(p): {"upper": u, "batch_start": lo} for p, (u, lo) in gaps.items()},
        )
        self.gaps = gaps


class SegmentUnavailableError(MillstreamError):
    """A segment's data file is missing or unreadable; reads refuse to return partial rows.

    Re-ingest the segment (``millstream reingest SEGMENT``) or roll the partition back.
    """

    def __init__(self, table: str, segment: str, path: str, reason: str) -> None:
        super().__init__(
            f"segment {segment} of table {table!r} is unavailable ({path}): {reason}; "
            f"re-ingest it with `millstream reingest {segment}`",
            table=table,
            segment=segment,
            path=path,
        )


class InvalidTransitionError(MillstreamError):
    """A lifecycle transition that the transition table does not allow.

    The message lists the states the datastream may go to from its current one; take one of
    those first (or wait for a transition in progress to finish). Nothing was changed.
    """

    def __init__(self, name: str, from_state: str, to_state: str, allowed: list[str]) -> None:
        super().__init__(
            f"datastream {name!r} cannot go from {from_state} to {to_state}; "
            f"from {from_state} it may go to: {', '.join(allowed) or 'nothing'}",
            name=name,
            from_state=from_state,
            to_state=to_state,
        )


class PreconditionFailedError(MillstreamError):
    """An operation's precondition does not hold (e.g. a rollback while the datastream runs).

    The message says what to do first (pause the datastream) or how to override (force).
    """


class MetadataSchemaError(MillstreamError):
    """The metadata store's schema is newer than this code understands.

    A newer Millstream migrated the store: run that version (or newer) against it. Nothing
    was read or written.
    """


class MetadataStoreUnavailableError(MillstreamError):
    """The metadata store did not answer: a connection was refused, reset or timed out.

    The failing transaction did not reach its COMMIT (one cut during COMMIT raises
    CommitStateUnknownError instead), so a one-transaction request such as a lifecycle command
    changed nothing. Retry once the store is reachable; services retry on their own.
    """


class UnauthorizedError(MillstreamError):
    """A mutating REST call without the bearer token the controller was started with.

    Pass ``--token`` (or set ``MILLSTREAM_API_TOKEN``) with the controller's token.
    """


class RequestTooLargeError(MillstreamError):
    """A REST request body over the size limit; nothing was read past the limit or written.

    Send a smaller body (a datastream spec is far below the limit the message names).
    """

    def __init__(self, limit: int) -> None:
        super().__init__(f"request body is larger than {limit} bytes", limit=limit)


class ControllerUnreachableError(MillstreamError):
    """The CLI could not connect to the controller's REST API.

    Start it (``millstream controller`` or ``millstream up``) or pass ``--controller URL``.
    """

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"cannot reach the controller at {url}: {reason}", url=url)


class RemoteError(MillstreamError):
    """The controller refused a request. ``status`` is the HTTP status and ``remote`` the name
    of the error it raised (a class of this tree), so the CLI exits as if it raised it.

    Act on the controller's message as on the error it names; its own entry in the tables is
    only the fallback for a name this version does not know.
    """

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        message = str(body.get("message") or f"the controller answered HTTP {status}")
        fields = {k: v for k, v in body.items() if k not in ("message", "error", "status")}
        super().__init__(message, status=status, **fields)
        self.status = status
        self.remote = str(body.get("error") or "")

    def to_dict(self) -> dict[str, Any]:
        """The controller's error body as it sent it, plus the HTTP status."""
        return {"error": self.remote or type(self).__name__, "message": self.message, **self.fields}


class LeaseLostError(MillstreamError):
    """This process no longer holds the lease it acted under: another process took it over
    (this one was paused, or cut off from the metadata store, past the lease's TTL). The fenced
    write was refused, so nothing was written.

    The process steps down on its own (a controller stops assigning and competes for the
    lease again). If it keeps happening, raise the lease TTL or find what pauses the process.
    """

    def __init__(
        self,
        lease: str,
        holder: str,
        token: int,
        *,
        now_held_by: str | None = None,
        now_token: int | None = None,
    ) -> None:
        super().__init__(
            f"lease {lease!r} is no longer held by {holder!r} with token {token} "
            f"(now: holder {now_held_by!r}, token {now_token}); nothing was written, "
            "this process steps down",
            lease=lease,
            holder=holder,
            token=token,
        )


class StateDirLockedError(MillstreamError):
    """Another writer (thread or process) holds this state directory's lock.

    Nothing was read or written. A worker retries on its next tick (a writer of its own may be
    shutting down); for ``millstream run``, stop the other writer or pass another
    ``--writer-id``.
    """

    def __init__(self, path: str) -> None:
        super().__init__(
            f"state directory {path} is locked by another writer; stop it (or use another "
            "writer id) and retry",
            path=path,
        )


class StateLockNotHeldError(MillstreamError):
    """A checkpoint read or write without holding the state directory's lock: refused.

    The writer lost (or never took) the lock, so its checkpoint may be stale; nothing was read
    or written. It must take the lock again (and then re-verify its checkpoint against the
    shards) before it continues.
    """

    def __init__(self, action: str, path: str) -> None:
        super().__init__(
            f"refusing to {action} {path}: the state directory lock is not held",
            action=action,
            path=path,
        )


class BadRecordError(MillstreamError):
    """A record failed to decode and the datastream says ``bad_records: fail``.

    Nothing of the batch was committed; the datastream stops at the record (partition and
    offset are named). Fix the record at the source, or set ``bad_records: dead_letter`` to
    route bad records to the dead-letter table and keep going, then resume.
    """

    def __init__(self, table: str, partition: int, offset: int, error: str) -> None:
        super().__init__(
            f"bad record in table {table!r} at partition {partition} offset {offset}: {error} "
            "(bad_records: fail stops here; use bad_records: dead_letter to keep going)",
            table=table,
            partition=partition,
            offset=offset,
        )


class SourceReadError(MillstreamError):
    """Reading the source failed: a Kafka topic that does not exist or answers with an error, a
    read that made no progress, a source file that changed while it was read.

    Nothing was committed for the range; the shard uppers did not move. Fix the source (broker
    up, topic created, files appended to rather than rewritten) and the writer continues from
    the shard uppers (a worker restarts it after a backoff; rerun ``millstream run``).
    """

    def __init__(
        self, source: str, reason: str, *, partition: int | None = None, **ids: str
    ) -> None:
        """``source`` describes the source in words; ``ids`` name it (``topic="orders"``)."""
        where = source if partition is None else f"{source} partition {partition}"
        fields: dict[str, Any] = {"source": source, **ids}
        if partition is not None:
            fields["partition"] = partition
        super().__init__(
            f"cannot read {where}: {reason}; nothing was committed for it, the writer "
            "continues from the shard upper once the source can be read",
            **fields,
        )


class SourceRangeGoneError(SourceReadError):
    """The source no longer holds a segment's offset range, so the segment cannot be re-read:
    retention expired it at the broker (the earliest offset is past the segment's start), or
    the source was truncated or its files deleted (it ends before the segment's end).

    Re-ingestion refused, nothing changed: re-reading would rebuild the segment with rows
    missing. Restore the source (a backup of the topic or the files) and re-ingest, or roll the
    partition back to the segment (``DELETE /deleteSegmentsFromSequenceNum``) to accept the loss.
    """

    def __init__(self, table: str, segment: str, reason: str, detail: str) -> None:
        MillstreamError.__init__(
            self,
            f"segment {segment} of table {table!r} cannot be re-ingested: {detail} "
            f"({reason}); restore the source or roll the partition back to it",
            table=table,
            segment=segment,
            reason=reason,
        )
        self.table = table
        self.segment = segment
        self.reason = reason


class SourceGapError(MillstreamError):
    """A datastream's source no longer holds offsets it has not read yet: the broker deleted
    them (retention expired while the writer lagged, or the records were deleted), so the read
    of a planned range found its start gone.

    Nothing was committed for the range; the datastream stops (ERROR) rather than skip the
    records. Restore them at the source and resume, or accept the loss: set the kafka source's
    ``on_data_loss: accept`` (``millstream datastream update``) and resume; the writer then
    goes on from the first offset still held, and records the offsets lost
    (``millstream_source_records_lost``, ``debugInfo``).
    """

    def __init__(
        self, datastream: str, topic: str, partition: int, first: int, end: int, held: int
    ) -> None:
        super().__init__(
            f"datastream {datastream!r}: kafka topic {topic!r} partition {partition} no longer "
            f"holds offsets {first}..{end - 1} ({end - first} records, deleted before they were "
            f"read; its first offset is now {held}); nothing was committed for them. Restore "
            "them, or set source.on_data_loss: accept to skip them and record the loss",
            datastream=datastream,
            topic=topic,
            partition=partition,
            first_missing=first,
            last_missing=end - 1,
        )


class SourceOffsetsRewoundError(MillstreamError):
    """A datastream's source partition ends below the offset the table already holds: the
    offsets went backwards (the topic was deleted and created again, or a broker that keeps
    topics in memory restarted), so the records it holds now would be taken as consumed.

    Nothing was committed; the datastream stops (ERROR) naming both offsets. Either roll the
    table's partition back to a segment at or below the source's end (``millstream segments
    rollback``) so it is read again from there, or re-create the datastream on a new table;
    see docs/operations.md, "Source offsets" (``SourceOffsetsRewoundError``).
    """

    def __init__(self, datastream: str, source: str, partition: int, latest: int, upper: int):
        super().__init__(
            f"datastream {datastream!r}: {source} partition {partition} ends at offset {latest}, "
            f"below the offset {upper} the table already holds: the source's offsets went "
            "backwards (the topic was re-created or the broker restarted empty); nothing was "
            "committed. Roll the partition back, or re-create the datastream on a new table",
            datastream=datastream,
            source=source,
            partition=partition,
            latest=latest,
            upper=upper,
        )


class InjectedFault(MillstreamError):
    """A fault injected at a named fault point (tests and drills: :mod:`millstream.faults`).

    Nothing to fix: the work failed as asked (a seal is retried like any failed seal). Seen
    in production, unset ``MILLSTREAM_FAULTS`` in the process's environment.
    """

    def __init__(self, point: str, key: object = None) -> None:
        where = "" if key is None else f" ({key})"
        super().__init__(f"fault injected at {point}{where}", point=point, key=key)


class PublisherProcessError(MillstreamError):
    """The Iceberg publisher process (a child of a worker or of ``millstream run``) exited,
    crashed or did not answer in time.

    Ingestion goes on: the tables' Iceberg views lag until the next step, after a backoff,
    starts a new publisher process. The error names the owner, the child's pid and its exit
    code; a repeated one shows in ``GET /workers`` and the publishing loop's error count.
    """


class ServiceStartError(MillstreamError):
    """A control-plane service could not start (its REST API could not listen).

    Nothing was started. Stop whatever holds the address, or pass another ``--host`` /
    ``--port``, and start the service again.
    """

    def __init__(self, service: str, host: str, port: int) -> None:
        super().__init__(
            f"the {service} could not listen on {host}:{port} (is the port in use?); pass "
            "another --port or stop the process that holds it",
            service=service,
            host=host,
            port=port,
        )


class SparkQueryError(MillstreamError):
    """A Spark query failed because of one of our errors, raised inside a Spark Python worker
    (or the sink's commit process): the driver saw only Spark's text, from which
    :func:`from_spark_failure` recovered ``kind``, the class of the original error.

    Act on the message as on ``kind`` (its docstring says what to do).
    """

    def __init__(self, kind: type[MillstreamError], message: str, **fields: Any) -> None:
        super().__init__(message, **fields)
        self.kind = kind

    def to_dict(self) -> dict[str, Any]:
        return {"error": self.kind.__name__, "message": self.message, **self.fields}


class SparkTransientError(MillstreamError):
    """Spark's own machinery failed for a moment, not the data or Millstream: a Python process
    Spark started did not connect back to its JVM in time (``Python worker failed to connect
    back``: the JVM waits a fixed 10 s for a fresh Python process, which a machine at load
    25 and more on two cores can exceed), or a Python process could not open its socket to
    the JVM (``[CANNOT_OPEN_SOCKET]``). :func:`transient_spark_failure` recognises them by
    Spark's error class and message; ``condition`` names which.

    The failed batch committed nothing. A writer (and a worker's shared query) restarts from
    the shard uppers after a backoff, doubling to a minute; raised only when it failed
    :data:`~millstream.spark.runner.TRANSIENT_MAX_IN_A_ROW` times in a row with no commit in
    between. Then the machine is too loaded for Spark's Python processes to start (lower its
    load, or give the worker more cores), or the Python Spark runs cannot start at all
    (check ``spark.pyspark.python`` / ``PYSPARK_PYTHON``: it must import pyspark).
    """

    def __init__(self, condition: str, message: str, **fields: Any) -> None:
        super().__init__(message, condition=condition, **fields)
        self.condition = condition


#: Spark's transient failures of its own machinery (see :class:`SparkTransientError`): the
#: error class Spark gives it, or for one raised without a class the name used here, and
#: what its text says. The JVM raises ``SparkException("Python worker failed to connect
#: back.", SocketTimeoutException("Timed out while waiting for the Python worker to connect
#: back"))`` (``PythonWorkerFactory.createSimpleWorker``, no error class); PySpark raises
#: ``PySparkRuntimeError`` of class ``CANNOT_OPEN_SOCKET`` (``pyspark.util.
#: local_connect_and_auth``), in the driver (a job's results) or in a Python worker.
TRANSIENT_SPARK_FAILURES: dict[str, re.Pattern[str]] = {
    "CANNOT_OPEN_SOCKET": re.compile(r"\[CANNOT_OPEN_SOCKET\] Can not open socket"),
    "PYTHON_WORKER_CONNECT_BACK": re.compile(
        r"Python worker failed to connect back|"
        r"Timed out while waiting for the Python worker to connect back"
    ),
}


def transient_spark_failure(exc: BaseException) -> SparkTransientError | None:
    """``exc`` as a :class:`SparkTransientError` if it is one of Spark's transient failures
    (:data:`TRANSIENT_SPARK_FAILURES`), else None. An error of ours is never one, nor is a
    Spark failure whose text names an error of ours (:func:`from_spark_failure`: a fenced
    commit, a bad record): that error decides what happens. A PySpark error raised in this
    process is known by its error class; one from the JVM or a Python worker by its text."""
    if isinstance(exc, SparkTransientError):
        return exc
    if isinstance(exc, MillstreamError):
        return None
    ours = from_spark_failure(exc)
    if ours is not None and not issubclass(ours.kind, SparkTransientError):
        return None
    text = str(exc)
    condition = getattr(exc, "getCondition", None)
    named = condition() if callable(condition) else None
    for name, pattern in TRANSIENT_SPARK_FAILURES.items():
        if named == name or pattern.search(text):
            first = next((line for line in text.splitlines() if pattern.search(line)), None)
            return SparkTransientError(name, (first or text.strip().splitlines()[0]).strip())
    return None


#: The REST status of every class of the tree (by itself or by its nearest listed ancestor).
#: Errors only the CLI raises (unreachable controller, a refused call, a service that cannot
#: start) are listed too, so the table stays total.
HTTP_STATUS: dict[type[MillstreamError], int] = {
    InvalidSpecError: 422,
    NotFoundError: 404,
    VersionExpiredError: 410,
    AlreadyExistsError: 409,
    InvalidTransitionError: 409,
    IncompatibleChangeError: 409,
    CommitConflictError: 409,
    WriterFencedError: 409,
    ShardGapError: 409,
    SegmentChangedError: 409,
    StagedFileExpiredError: 409,
    PublishExpiredError: 409,
    CommitStateUnknownError: 503,
    SegmentUnavailableError: 503,
    MetadataSchemaError: 500,
    MetadataStoreUnavailableError: 503,
    PreconditionFailedError: 409,
    UnauthorizedError: 401,
    RequestTooLargeError: 413,
    LeaseLostError: 409,
    StateDirLockedError: 409,
    StateLockNotHeldError: 409,
    BadRecordError: 422,
    SourceReadError: 502,
    SourceRangeGoneError: 410,
    SourceGapError: 410,
    SourceOffsetsRewoundError: 409,
    InjectedFault: 500,
    ServiceStartError: 500,
    PublisherProcessError: 500,
    SparkQueryError: 500,
    SparkTransientError: 503,
    ControllerUnreachableError: 503,
    RemoteError: 502,
}

#: The CLI exit code of every class of the tree (by itself or by its nearest listed ancestor);
#: each code is named in :data:`EXIT_FAMILIES`.
EXIT_CODES: dict[type[MillstreamError], int] = {
    InvalidSpecError: 2,
    NotFoundError: 3,
    VersionExpiredError: 3,
    AlreadyExistsError: 4,
    InvalidTransitionError: 4,
    IncompatibleChangeError: 4,
    CommitConflictError: 5,
    WriterFencedError: 5,
    ShardGapError: 5,
    SegmentChangedError: 5,
    StagedFileExpiredError: 5,
    PublishExpiredError: 5,
    CommitStateUnknownError: 6,
    SegmentUnavailableError: 7,
    MetadataSchemaError: 8,
    MetadataStoreUnavailableError: 12,
    PreconditionFailedError: 4,
    UnauthorizedError: 2,
    RequestTooLargeError: 2,
    LeaseLostError: 5,
    StateDirLockedError: 4,
    StateLockNotHeldError: 5,
    BadRecordError: 10,
    SourceReadError: 11,
    SourceRangeGoneError: 11,
    SourceGapError: 11,
    SourceOffsetsRewoundError: 11,
    InjectedFault: 1,
    ServiceStartError: 1,
    PublisherProcessError: 1,
    SparkQueryError: 9,
    SparkTransientError: 1,
    ControllerUnreachableError: 1,
    # Only for a name this version does not know: :func:`exit_code` exits a RemoteError as the
    # error the controller names, or by its HTTP status.
    RemoteError: 1,
}

#: Every exit code of the CLI with the few words that name its family, for the CLI help
#: (``millstream --help``) and docs/cli.md (checked against this). 0 and 130 are no errors.
EXIT_FAMILIES: dict[int, str] = {
    0: "ok",
    1: "unexpected error or service failure",
    2: "invalid spec or argument",
    3: "not found",
    4: "conflict with existing state",
    5: "lost compare-and-set or fenced",
    6: "commit outcome unknown",
    7: "segment unavailable",
    8: "metadata schema too new",
    9: "the Spark query failed with one of these errors",
    10: "bad record",
    11: "source unreadable",
    12: "metadata store unreachable",
    130: "interrupted",
}

#: A remote error whose name is not in the tree exits by its HTTP status.
HTTP_EXIT_CODES: dict[int, int] = {401: 2, 404: 3, 409: 4, 410: 3, 413: 2, 422: 2, 503: 6}


def _subclasses(cls: type[MillstreamError]) -> list[type[MillstreamError]]:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


def _depth(cls: type[MillstreamError]) -> int:
    return sum(1 for c in cls.__mro__ if isinstance(c, type) and issubclass(c, MillstreamError))


#: The tree, most specific class first (deepest first, then in the order of this module);
#: the root last.
ERROR_CLASSES: tuple[type[MillstreamError], ...] = tuple(
    sorted([MillstreamError, *_subclasses(MillstreamError)], key=_depth, reverse=True)
)


def error_class(name: str) -> type[MillstreamError] | None:
    """The class of the tree called ``name`` (as in ``to_dict()["error"]``), if any."""
    return next((cls for cls in ERROR_CLASSES if cls.__name__ == name), None)


def _lookup(
    table: dict[type[MillstreamError], int], cls: type[MillstreamError], default: int
) -> int:
    for c in cls.__mro__:
        if c in table:
            return table[c]
    return default


def http_status(err: MillstreamError) -> int:
    return _lookup(HTTP_STATUS, type(err), 500)


def exit_code(err: MillstreamError) -> int:
    if isinstance(err, RemoteError):
        named = error_class(err.remote)
        if named is None or named in (MillstreamError, RemoteError):
            # Not a name of this tree (an older or newer controller): the status says which
            # family it belongs to.
            return HTTP_EXIT_CODES.get(err.status, EXIT_CODES[RemoteError])
        return _lookup(EXIT_CODES, named, 1)
    return _lookup(EXIT_CODES, type(err), 1)


def from_spark_failure(exc: BaseException) -> SparkQueryError | None:
    """The error of this tree that made a Spark query fail, recovered from Spark's text (an
    error raised in a Python worker reaches the driver as text only); None if it names none.

    A raised error (``...ShardGapError: message``, as a traceback ends) is looked for first,
    then a bare mention of a class name. The most specific class wins, and between unrelated
    ones the one raised last (a traceback ends with the error that propagated). For a bad
    record the partition and offset are kept as fields.
    """
    text = str(exc)
    candidates = [cls for cls in ERROR_CLASSES if cls is not SparkQueryError]
    raised = {
        cls: found
        for cls in candidates
        if (found := list(re.finditer(rf"\b{cls.__name__}: (.*)", text)))
    }
    if raised:
        cls = max(raised, key=lambda c: (_depth(c), raised[c][-1].start()))
        return _spark_query_error(cls, raised[cls][0].group(1))
    for cls in candidates:
        if re.search(rf"\b{cls.__name__}\b", text):
            return _spark_query_error(cls, text.strip().splitlines()[0])
    return None


def _spark_query_error(cls: type[MillstreamError], message: str) -> SparkQueryError:
    fields: dict[str, Any] = {}
    m = re.search(r"partition (\d+) offset (\d+)", message)
    if m:
        fields = {"partition": int(m.group(1)), "offset": int(m.group(2))}
    return SparkQueryError(cls, message, **fields)
