"""``/metrics`` in the Prometheus text format."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response)
def metrics(request: Request) -> Response:
    data = generate_latest(request.app.state.metrics_registry)
    return Response(content=data, media_type=CONTENT_TYPE_LATEST)
