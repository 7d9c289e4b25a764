"""What every route needs, built once by the app factory and held on ``app.state``."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from millstream.catalog import Catalog
from millstream.clock import Clock
from millstream.control.controller import Controller, ControlSettings
from millstream.control.registry import Registry
from millstream.sealing.repair import ReingestRunner


@dataclass(frozen=True)
class ApiContext:
    catalog: Catalog
    registry: Registry
    controller: Controller | None
    control: ControlSettings
    clock: Clock
    #: How long to wait for a source's latest offsets (a broker may be down).
    upstream_timeout: float
    #: Runs the re-ingestion jobs started through this API process (the controller's runner
    #: when there is one); the jobs themselves are in the metadata store.
    reingest: ReingestRunner

    @property
    def worker_ttl(self) -> float:
        return self.control.worker_ttl


def get_context(request: Request) -> ApiContext:
    ctx = request.app.state.millstream
    assert isinstance(ctx, ApiContext)
    return ctx
