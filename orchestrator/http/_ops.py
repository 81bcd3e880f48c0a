"""The routes for the people who run the server: ``/metrics`` (Prometheus text format, any valid
API key, like every route but ``/healthz``) and ``/readyz``.

``/metrics`` renders the orchestrator's own registry (``orchestrator._core.metrics``).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from orchestrator._api import Orchestrator
from orchestrator._core.metrics import CONTENT_TYPE


class OpsRoutes:
    def __init__(self, orchestrator: Orchestrator) -> None:
        self.orchestrator = orchestrator

    async def metrics(self, request: Request) -> Response:
        return Response(self.orchestrator.metrics.exposition(), media_type=CONTENT_TYPE)
