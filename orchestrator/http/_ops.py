"""The routes for the people who run the server: ``/metrics`` (Prometheus text format, any valid
API key, like every route but ``/healthz`` and ``/readyz``) and ``/readyz`` (no key: a load
balancer's probe has none), 200 when a session can be made now, else 503, the body naming each
check's answer and the ones that are not ready::

    {"ready": false, "not_ready": ["engine", "image"],
     "checks": {"engine": "backend_unavailable: ...", "image": "not checked: ...",
                "registry": "ok"}}

``/metrics`` renders the orchestrator's own registry (``orchestrator._core.metrics``).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from orchestrator._api import Orchestrator
from orchestrator._core.metrics import CONTENT_TYPE
from orchestrator._core.readiness import OK, UNCHECKED


class OpsRoutes:
    def __init__(self, orchestrator: Orchestrator) -> None:
        self.orchestrator = orchestrator

    async def metrics(self, request: Request) -> Response:
        return Response(self.orchestrator.metrics.exposition(), media_type=CONTENT_TYPE)

    async def readyz(self, request: Request) -> Response:
        ready, checks = await self.orchestrator.readiness()
        not_ready = [name for name, answer in checks.items() if answer not in (OK, UNCHECKED)]
        body = {"ready": ready, "not_ready": not_ready, "checks": checks}
        return JSONResponse(body, status_code=200 if ready else 503)
