"""ASGI middleware that rejects a request before any route sees it: bearer auth on mutating
calls, and a request-body size limit (checked on Content-Length and again while reading)."""

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


class BearerAuthMiddleware:
    """Every POST/PUT/PATCH/DELETE needs ``Authorization: Bearer <token>``; reads stay open."""

    def __init__(self, app: ASGIApp, *, token: str) -> None:
        self.app = app
        self._token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in MUTATING_METHODS:
            header = Headers(scope=scope).get("authorization")
            what = f"{scope['method']} {scope['path']}"
            if header is None:
                err = UnauthorizedError(
                    f"{what} needs a bearer token: send 'Authorization: Bearer <token>' "
                    "(the CLI: --token or MILLSTREAM_API_TOKEN)"
                )
                return await _reject(err, scope, receive, send)
            scheme, _, given = header.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                given.strip().encode(), self._token
            ):
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
