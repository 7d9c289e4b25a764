"""A schema-registry client for decoding: ``GET /schemas/ids/{id}`` of the Confluent REST API,
cached by id (an id never changes its schema), with basic auth.

An unknown id (HTTP 404) is the record's fault: it goes to the dead-letter table. A registry
that does not answer (refused, timed out, HTTP 5xx or 429) is nobody's record's fault: the
lookup waits and retries with backoff for up to ``max_wait`` seconds, then fails the batch
(a :class:`~millstream.errors.SourceReadError`: nothing is committed, the writer resumes at
the shard uppers). Other answers (401, 403 ...) fail the batch at once: a wrong URL or
credentials must not dead-letter a topic.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from millstream.errors import SourceReadError

BACKOFF_FIRST_S = 0.1
BACKOFF_MAX_S = 5.0


class SchemaNotFound(Exception):
    """The registry does not know the schema id."""


@dataclass(frozen=True, slots=True)
class RegisteredSchema:
    schema_id: int
    schema_type: str  # AVRO | PROTOBUF | JSON
    schema: str
    references: tuple[dict[str, Any], ...] = ()


class RegistryClient:
    """Schemas by id from one registry; ``fmt`` is the ``format`` query parameter
    (``serialized`` for Protobuf: a base64 FileDescriptorProto instead of .proto text)."""

    def __init__(
        self,
        url: str,
        *,
        user_info: str | None = None,
        fmt: str | None = None,
        max_wait: float = 300.0,
        timeout: float = 10.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.url = url.rstrip("/")
        self.fmt = fmt
        self.max_wait = max_wait
        self.timeout = timeout
        self.sleep = sleep
        self._auth = "Basic " + base64.b64encode(user_info.encode()).decode() if user_info else None
        self._lock = threading.Lock()
        self._by_id: dict[int, RegisteredSchema] = {}
        #: lookups that went to the registry (for tests: the cache works)
        self.fetches = 0

    def _get(self, path: str) -> dict[str, Any]:
        query = f"?format={self.fmt}" if self.fmt else ""
        req = urllib.request.Request(f"{self.url}{path}{query}")
        req.add_header("Accept", "application/vnd.schemaregistry.v1+json, application/json")
        if self._auth:
            req.add_header("Authorization", self._auth)
        with urllib.request.urlopen(req, timeout=self.timeout) as resp:
            body: dict[str, Any] = json.loads(resp.read())
            return body

    def _get_retrying(self, path: str) -> dict[str, Any]:
        deadline = time.monotonic() + self.max_wait
        delay = BACKOFF_FIRST_S
        while True:
            self.fetches += 1
            try:
                return self._get(path)
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    raise SchemaNotFound() from None
                if exc.code < 500 and exc.code != 429:
                    raise SourceReadError(
                        f"schema registry {self.url}", f"GET {path} answered HTTP {exc.code}"
                    ) from None
                why = f"HTTP {exc.code}"
            except (urllib.error.URLError, OSError, ValueError) as exc:
                why = str(getattr(exc, "reason", exc))
            if time.monotonic() + delay > deadline:
                raise SourceReadError(
                    f"schema registry {self.url}",
                    f"GET {path} failed for {self.max_wait:.0f}s (last: {why})",
                )
            self.sleep(delay)
            delay = min(BACKOFF_MAX_S, delay * 2)

    def schema(self, schema_id: int) -> RegisteredSchema:
        """The schema of ``schema_id`` (:class:`SchemaNotFound` if the registry has none)."""
        with self._lock:
            hit = self._by_id.get(schema_id)
        if hit is not None:
            return hit
        body = self._get_retrying(f"/schemas/ids/{schema_id}")
        found = RegisteredSchema(
            schema_id,
            str(body.get("schemaType") or "AVRO"),
            str(body["schema"]),
            tuple(body.get("references") or ()),
        )
        with self._lock:
            self._by_id[schema_id] = found
        return found

    def latest(self, subject: str) -> RegisteredSchema | None:
        """A subject's latest version (None when the registry has no such subject)."""
        try:
            body = self._get_retrying(
                f"/subjects/{urllib.parse.quote(subject, safe='')}/versions/latest"
            )
        except SchemaNotFound:
            return None
        return RegisteredSchema(
            int(body.get("id", -1)),
            str(body.get("schemaType") or "AVRO"),
            str(body["schema"]),
            tuple(body.get("references") or ()),
        )

    def version(self, subject: str, version: int) -> RegisteredSchema:
        """A subject's version (a Protobuf schema's references name them)."""
        body = self._get_retrying(
            f"/subjects/{urllib.parse.quote(subject, safe='')}/versions/{version}"
        )
        return RegisteredSchema(
            int(body.get("id", -1)),
            str(body.get("schemaType") or "AVRO"),
            str(body["schema"]),
            tuple(body.get("references") or ()),
        )
