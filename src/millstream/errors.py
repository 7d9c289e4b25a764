"""One error tree for Millstream.

Every error carries structured fields and a message that says what happened, with the ids
involved, and what the operator can do. ``HTTP_STATUS`` and ``EXIT_CODES`` map the tree to
REST status codes and CLI exit codes; nothing else in the code base decides those.
"""

from __future__ import annotations

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
    """A named object (table, shard, datastream, segment) does not exist."""

    def __init__(self, kind: str, name: str) -> None:
        super().__init__(f"{kind} {name!r} does not exist", kind=kind, name=name)
        self.kind = kind
        self.name = name


class TableNotFoundError(NotFoundError):
    def __init__(self, name: str) -> None:
        super().__init__("table", name)


class AlreadyExistsError(MillstreamError):
    """Creating an object whose name is taken (with a different definition)."""

    def __init__(self, kind: str, name: str) -> None:
        super().__init__(f"{kind} {name!r} already exists", kind=kind, name=name)


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
    """A lifecycle transition that the transition table does not allow."""

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
    """The metadata store's schema is newer than this code understands."""


class UnauthorizedError(MillstreamError):
    """A mutating REST call without the bearer token the controller was started with.

    Pass ``--token`` (or set ``MILLSTREAM_API_TOKEN``) with the controller's token.
    """


class RequestTooLargeError(MillstreamError):
    """A REST request body over the size limit; nothing was read past the limit or written."""

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
    of the error it raised (a class of this tree), so the CLI exits as if it raised it."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        message = str(body.get("message") or f"the controller answered HTTP {status}")
        fields = {k: v for k, v in body.items() if k not in ("message", "error", "status")}
        super().__init__(message, status=status, **fields)
        self.status = status
        self.remote = str(body.get("error") or "")

    def to_dict(self) -> dict[str, Any]:
        """The controller's error body as it sent it, plus the HTTP status."""
        return {"error": self.remote or type(self).__name__, "message": self.message, **self.fields}


HTTP_STATUS: dict[type[MillstreamError], int] = {
    InvalidSpecError: 422,
    NotFoundError: 404,
    AlreadyExistsError: 409,
    InvalidTransitionError: 409,
    CommitConflictError: 409,
    WriterFencedError: 409,
    ShardGapError: 409,
    SegmentChangedError: 409,
    StagedFileExpiredError: 409,
    CommitStateUnknownError: 503,
    SegmentUnavailableError: 503,
    MetadataSchemaError: 500,
    PreconditionFailedError: 409,
    UnauthorizedError: 401,
    RequestTooLargeError: 413,
}

EXIT_CODES: dict[type[MillstreamError], int] = {
    InvalidSpecError: 2,
    NotFoundError: 3,
    AlreadyExistsError: 4,
    InvalidTransitionError: 4,
    CommitConflictError: 5,
    WriterFencedError: 5,
    ShardGapError: 5,
    SegmentChangedError: 5,
    StagedFileExpiredError: 5,
    CommitStateUnknownError: 6,
    SegmentUnavailableError: 7,
    MetadataSchemaError: 8,
    PreconditionFailedError: 4,
    UnauthorizedError: 2,
    RequestTooLargeError: 2,
}

#: A remote error whose name is not in the tree exits by its HTTP status.
HTTP_EXIT_CODES: dict[int, int] = {401: 2, 404: 3, 409: 4, 413: 2, 422: 2, 503: 6}


def _lookup(table: dict[type[MillstreamError], int], err: MillstreamError, default: int) -> int:
    for cls in type(err).__mro__:
        if cls in table:
            return table[cls]
    return default


def http_status(err: MillstreamError) -> int:
    return _lookup(HTTP_STATUS, err, 500)


def exit_code(err: MillstreamError) -> int:
    if isinstance(err, RemoteError):
        by_name = {cls.__name__: code for cls, code in EXIT_CODES.items()}
        known = by_name.get(err.remote)
        if known is None:
            # A subclass (TableNotFoundError): its status says which family it belongs to.
            return HTTP_EXIT_CODES.get(err.status, 1)
        return known
    return _lookup(EXIT_CODES, err, 1)
