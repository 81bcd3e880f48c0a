"""The routes for the people who run the server: ``/metrics`` (Prometheus text format, any valid
API key, like every route but ``/healthz``, ``/readyz`` and the ``/ui`` page's files),
``/readyz`` (no key: a load balancer's probe has none), and what the operations page (``/ui``)
reads, each for the key's tenant like every ``/v1`` route:

    GET /v1/ops/sessions        the tenant's sessions: owner, policy, state, age, CPU, memory
    GET /v1/ops/pools           the warm pools and how many sessions the server holds
    GET /v1/ops/audit?limit=    the tenant's latest audit records, newest first

None of them is a tool call: they are not audited (a page polling every 2 s would fill the log)
and touch no session (an open page must not keep sessions from their idle teardown). Kill,
pause and resume are the tool calls every client makes (``DELETE /v1/sessions/{id}``,
``POST /v1/session``), audited as such. ``X-Sandhold-Task`` narrows sessions and records to one
task, as for every ``/v1`` route.

``/readyz`` answers 200 when a session can be made now, else 503, the body naming each check's
answer and the ones that are not ready::

    {"ready": false, "not_ready": ["engine", "image"],
     "checks": {"engine": "backend_unavailable: ...", "image": "not checked: ...",
                "registry": "ok"}}

``/metrics`` renders the orchestrator's own registry (``orchestrator._core.metrics``).
"""

from __future__ import annotations

from typing import Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from orchestrator._api import Orchestrator
from orchestrator._core.metrics import CONTENT_TYPE
from orchestrator._core.owners import check_task, task_scope
from orchestrator._core.readiness import OK, UNCHECKED
from orchestrator.audit.recent import RECENT_PER_TENANT
from orchestrator.errors import InvalidArgumentError
from orchestrator.http._auth import TENANT_SCOPE_KEY
from orchestrator.http._routes import TASK_HEADER, query_integer

OPS_SESSIONS_PATH: Final = "/v1/ops/sessions"
OPS_POOLS_PATH: Final = "/v1/ops/pools"
OPS_AUDIT_PATH: Final = "/v1/ops/audit"
# Records ``/v1/ops/audit`` gives when no ``limit`` is asked for.
DEFAULT_AUDIT_LIMIT: Final = 50
MAX_AUDIT_LIMIT: Final = RECENT_PER_TENANT


def audit_limit(given: str | None) -> int:
    if given is None:
        return DEFAULT_AUDIT_LIMIT
    limit = query_integer(given)
    if limit is None or not 1 <= limit <= MAX_AUDIT_LIMIT:
        raise InvalidArgumentError(f"limit must be an integer in [1, {MAX_AUDIT_LIMIT}]")
    return limit


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

    async def sessions(self, request: Request) -> Response:
        tenant = request.scope[TENANT_SCOPE_KEY]
        task = check_task(request.headers.get(TASK_HEADER), "X-Sandhold-Task")
        with task_scope(task):
            rows = self.orchestrator.session_overview(tenant=tenant)
        body = {"success": True, "tenant": tenant, "task": task, "count": len(rows)}
        return JSONResponse({**body, "sessions": rows})

    async def pools(self, request: Request) -> Response:
        pools = [
            {"policy": policy, "size": status["size"], "ready": status["ready"]}
            for policy, status in sorted(self.orchestrator.pool_status().items())
        ]
        return JSONResponse({"success": True, **self.orchestrator.capacity(), "pools": pools})

    async def audit(self, request: Request) -> Response:
        tenant = request.scope[TENANT_SCOPE_KEY]
        task = check_task(request.headers.get(TASK_HEADER), "X-Sandhold-Task")
        limit = audit_limit(request.query_params.get("limit"))
        log = self.orchestrator.audit_log
        events = [] if log is None else log.recent.latest(tenant, task=task, limit=limit)
        body = {"success": True, "enabled": log is not None, "count": len(events)}
        return JSONResponse({**body, "events": events})
