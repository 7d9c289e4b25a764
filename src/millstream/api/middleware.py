"""ASGI middleware that rejects a request before any route sees it: bearer auth (an API token
on mutating calls, an optional read token on the others), and a request-body size limit (checked on Content-Length and again while reading)."""

from __future__ import annotations

import hmac

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from millstream.errors import MillstreamError, RequestTooLargeError, UnauthorizedError, http_status

MAX_BODY_BYTES = 1024 * 1024
MUTATING_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


async def _reject(err: MillstreamError, scope: Scope, receive: Receive, send: Send) -> None:
    headers = {"WWW-Authenticate": "Bearer"} if isinstance(err, UnauthorizedError) else None
    response = JSONResponse(err.to_dict(), status_code=http_status(err), headers=headers)
    await response(scope, receive, send)


#: Paths that stay open with a read token: the liveness probe, and the pages and API
#: description that hold no data (the console's pages ask for the token themselves).
OPEN_READ_PATHS = frozenset({"/health", "/docs", "/docs/oauth2-redirect", "/openapi.json", "/"})
OPEN_READ_PREFIXES = ("/ui",)


def is_open_read(path: str) -> bool:
    return path in OPEN_READ_PATHS or any(
        path == p or path.startswith(p + "/") for p in OPEN_READ_PREFIXES
    )


class BearerAuthMiddleware:
    """Bearer tokens on the REST API.

    ``token`` (the API token): every POST/PUT/PATCH/DELETE needs it. ``read_token``
    (optional): every other request needs it or the API token, except the paths of
    :data:`OPEN_READ_PATHS` and the console's static pages; without one, reads stay open. With a
    read token and no API token, a mutating call needs the read token: whoever may not read
    may not write either."""

    def __init__(self, app: ASGIApp, *, token: str | None, read_token: str | None = None) -> None:
        self.app = app
        self._token = token.encode() if token else None
        self._read_token = read_token.encode() if read_token else None

    def _needed(self, method: str, path: str) -> tuple[bytes, ...]:
        """The tokens any one of which admits the request; () when it is open."""
        if method in MUTATING_METHODS:
            if self._token is not None:
                return (self._token,)
            return (self._read_token,) if self._read_token is not None else ()
        if self._read_token is None or is_open_read(path):
            return ()
        return tuple(t for t in (self._read_token, self._token) if t is not None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        needed = self._needed(scope["method"], scope["path"])
        if needed:
            header = Headers(scope=scope).get("authorization")
            what = f"{scope['method']} {scope['path']}"
            kind = "" if scope["method"] in MUTATING_METHODS else "read "
            if header is None:
                err = UnauthorizedError(
                    f"{what} needs a bearer token: send 'Authorization: Bearer <token>' "
                    f"with the controller's {kind}token (the CLI: --token or "
                    "MILLSTREAM_API_TOKEN)"
                )
                return await _reject(err, scope, receive, send)
            scheme, _, given = header.partition(" ")
            presented = given.strip().encode()
            # compare with every admitted token (no early exit: the time says nothing)
            matches = [hmac.compare_digest(presented, t) for t in needed]
            if scheme.lower() != "bearer" or not any(matches):
                err = UnauthorizedError(f"{what}: the bearer token is not valid")
                return await _reject(err, scope, receive, send)
        await self.app(scope, receive, send)


class BodyLimitMiddleware:
    """Refuse a body over ``max_bytes`` with 413 before parsing: by its Content-Length if it
    declares one, otherwise (chunked) as soon as the bytes read pass the limit. The body is
    buffered (at most ``max_bytes``) and replayed to the app."""

    def __init__(self, app: ASGIApp, *, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        too_large = RequestTooLargeError(self.max_bytes)
        declared = Headers(scope=scope).get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await _reject(too_large, scope, receive, send)
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            body: bytes = message.get("body", b"")
            size += len(body)
            if size > self.max_bytes:
                return await _reject(too_large, scope, receive, send)
            chunks.append(body)
            if not message.get("more_body", False):
                break
        buffered: Message | None = {"type": "http.request", "body": b"".join(chunks)}

        async def replay() -> Message:
            nonlocal buffered
            if buffered is not None:
                message, buffered = buffered, None
                return message
            return await receive()

        await self.app(scope, replay, send)
