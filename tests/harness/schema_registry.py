"""A small in-process schema registry for tests and benchmarks: the subset of the Confluent
Schema Registry REST API that confluent-kafka's serializers and Millstream's decoder use.

It is a TEST server (memory only, no compatibility checks, no auth): no real schema registry
ships on PyPI or in Debian, so the tests start this one on 127.0.0.1.

* ``POST /subjects/{subject}/versions``: register (an identical schema keeps its id).
* ``POST /subjects/{subject}``: look a schema up.
* ``GET /schemas/ids/{id}`` (``?format=`` is accepted and ignored: schemas are returned as
  registered, which for confluent-kafka's Protobuf serializer is the base64
  FileDescriptorProto that ``format=serialized`` asks for).
* ``GET /subjects``, ``GET /subjects/{subject}/versions``,
  ``GET /subjects/{subject}/versions/{version|latest}``, ``GET /config``.

``available = False`` makes every request answer HTTP 503 (a registry that is down);
``requests`` counts the requests per path.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlparse

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _route(self, method: str) -> None:
        reg = self.server.registry
        path = urlparse(self.path).path.rstrip("/")
        parts = [unquote(p) for p in path.split("/") if p]
        with reg.lock:
            reg.requests[f"{method} {path}"] += 1
            if not reg.available:
                self._send(503, {"error_code": 50301, "message": "registry unavailable"})
                return
            body: dict[str, Any] = {}
            if method == "POST":
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}")
            code, answer = reg.handle(method, parts, body)
        self._send(code, answer)

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    registry: TestSchemaRegistry


_NOT_FOUND = {"error_code": 40403, "message": "Schema not found"}


class TestSchemaRegistry:
    """Start with :meth:`start` (or as a context manager); :attr:`url` is where it listens."""

    __test__ = False  # not a pytest test class

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self.port = port
        self.lock = threading.Lock()
        self.available = True
        self.requests: Counter[str] = Counter()
        #: id -> (schemaType, schema, references)
        self.schemas: dict[int, tuple[str, str, list[dict[str, Any]]]] = {}
        #: subject -> ids of its versions, oldest first
        self.subjects: dict[str, list[int]] = {}
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> TestSchemaRegistry:
        server = _Server((self.host, self.port), _Handler)
        server.registry = self
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> TestSchemaRegistry:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the API ------------------------------------------------------------------------

    def register(
        self, subject: str, schema: str, schema_type: str = "AVRO", refs: list[Any] | None = None
    ) -> int:
        """Register ``schema`` under ``subject`` (an identical one keeps its id)."""
        key = (schema_type, schema, json.dumps(refs or [], sort_keys=True))
        same = [
            i
            for i, (t, s, r) in self.schemas.items()
            if (t, s, json.dumps(r, sort_keys=True)) == key
        ]
        sid = same[0] if same else max(self.schemas, default=0) + 1
        self.schemas[sid] = (schema_type, schema, list(refs or []))
        versions = self.subjects.setdefault(subject, [])
        if sid not in versions:
            versions.append(sid)
        return sid

    def _version_body(self, subject: str, version: int) -> dict[str, Any]:
        sid = self.subjects[subject][version - 1]
        t, s, r = self.schemas[sid]
        return {
            "subject": subject,
            "id": sid,
            "version": version,
            "schema": s,
            "schemaType": t,
            "references": r,
        }

    def handle(self, method: str, parts: list[str], body: dict[str, Any]) -> tuple[int, Any]:
        if method == "GET" and parts == ["config"]:
            return 200, {"compatibilityLevel": "BACKWARD"}
        if method == "GET" and len(parts) == 3 and parts[:2] == ["schemas", "ids"]:
            found = self.schemas.get(int(parts[2])) if parts[2].isdigit() else None
            if found is None:
                return 404, _NOT_FOUND
            t, s, r = found
            return 200, {"schema": s, "schemaType": t, "references": r}
        if parts[:1] != ["subjects"]:
            return 404, {"error_code": 404, "message": "not found"}
        if method == "GET" and len(parts) == 1:
            return 200, sorted(self.subjects)
        subject = parts[1] if len(parts) > 1 else ""
        schema_type = str(body.get("schemaType") or "AVRO")
        if method == "POST" and len(parts) == 3 and parts[2] == "versions":
            sid = self.register(subject, str(body["schema"]), schema_type, body.get("references"))
            return 200, {"id": sid}
        if method == "POST" and len(parts) == 2:
            refs = json.dumps(body.get("references") or [], sort_keys=True)
            for v, sid in enumerate(self.subjects.get(subject, []), 1):
                t, s, r = self.schemas[sid]
                if (t, s, json.dumps(r, sort_keys=True)) == (schema_type, body["schema"], refs):
                    return 200, self._version_body(subject, v)
            return 404, _NOT_FOUND
        if subject not in self.subjects:
            return 404, {"error_code": 40401, "message": "Subject not found"}
        versions = self.subjects[subject]
        if method == "GET" and len(parts) == 3 and parts[2] == "versions":
            return 200, list(range(1, len(versions) + 1))
        if method == "GET" and len(parts) == 4 and parts[2] == "versions":
            v = len(versions) if parts[3] == "latest" else int(parts[3])
            if not 1 <= v <= len(versions):
                return 404, {"error_code": 40402, "message": "Version not found"}
            return 200, self._version_body(subject, v)
        return 404, {"error_code": 404, "message": "not found"}
