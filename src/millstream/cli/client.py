"""The CLI's HTTP client for the controller's REST API. Failures become errors of the tree:
:class:`ControllerUnreachableError` (exit 1) when nothing answers, :class:`RemoteError` (exit
code of the error the controller raised, or of its HTTP status) when it refuses."""

from __future__ import annotations

import json
from types import TracebackType
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from millstream.errors import ControllerUnreachableError, RemoteError

if TYPE_CHECKING:
    import httpx

DEFAULT_CONTROLLER = "http://127.0.0.1:8600"


def segment(name: str) -> str:
    """``name`` as one URL path segment."""
    return quote(name, safe="")


class ControllerClient:
    def __init__(self, url: str, *, token: str | None = None, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        # lazy: only the REST client commands need httpx; `millstream query` and `--help` don't
        import httpx

        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, body)

    def patch(self, path: str, body: Any = None) -> Any:
        return self.request("PATCH", path, body)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def request(self, method: str, path: str, body: Any = None) -> Any:
        content = None if body is None else json.dumps(body, default=str).encode()
        headers = {"Content-Type": "application/json"} if content is not None else {}
        # lazy: as in __init__ (loaded by then)
        import httpx

        try:
            response = self._http.request(method, path, content=content, headers=headers)
        except httpx.TransportError as exc:
            raise ControllerUnreachableError(self.url, str(exc) or type(exc).__name__) from None
        if response.status_code >= 400:
            raise self._error(response)
        return response.json()

    def _error(self, response: httpx.Response) -> RemoteError:
        status = response.status_code
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            body = {"message": f"HTTP {status} from {self.url}: {response.text[:300]}"}
        if status == 401:
            body["message"] = (
                f"the controller at {self.url} refused the call: {body.get('message')}. "
                "Pass --token or set MILLSTREAM_API_TOKEN to the controller's token"
            )
        return RemoteError(status, body)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ControllerClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
