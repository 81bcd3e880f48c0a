"""The routes for the people who run the server: ``/metrics`` (Prometheus text format),
``/readyz`` (no key: a load balancer's probe has none), and what the operations page (``/ui``)
reads:

    GET /metrics                Prometheus text format: an operator's key only
    GET /v1/ops/pools           the warm pools and how many sessions the server holds: operator
    GET /v1/ops/sessions        sessions: owner, policy, state, age, CPU, memory
    GET /v1/ops/audit?limit=    the latest audit records, newest first

An operator's key (``[[operator]]`` in the tenants file; without one, the local key) sees every
tenant's sessions and records; a tenant's key sees its own only, and is answered 403 ``policy``
(rule ``role.operator``) on the two routes whose figures are the whole server's (the metrics
name every tenant). ``X-Sandhold-Task`` narrows a tenant's sessions and records to one task, as
for every ``/v1`` route.

None of them is a tool call: they are not audited (a page polling every 2 s would fill the log)
and touch no session (an open page must not keep sessions from their idle teardown). Kill,
pause and resume are the tool calls every client makes (``DELETE /v1/sessions/{id}``,
``POST /v1/session``) with the owning tenant's key, audited as such.

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
from orchestrator._core import CONTENT_TYPE, OK, UNCHECKED, TenantKeys, check_task, task_scope
from orchestrator.audit.recent import RECENT_PER_TENANT
from orchestrator.errors import InvalidArgumentError
from orchestrator.http._front import CALLER_SCOPE_KEY, Caller
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
    def __init__(self, orchestrator: Orchestrator, keys: TenantKeys) -> None:
        self.orchestrator = orchestrator
        self.keys = keys

    def _tenants(self, request: Request) -> tuple[Caller, list[str]]:
        """The caller, and the tenants whose figures it sees: its own, or (an operator) all."""
        caller = request.scope[CALLER_SCOPE_KEY]
        assert isinstance(caller, Caller)
        if caller.operator:
            return caller, sorted({*self.keys.tenants, self.orchestrator.config.tenant})
        assert caller.tenant is not None
        return caller, [caller.tenant]

    async def metrics(self, request: Request) -> Response:
        return Response(self.orchestrator.metrics.exposition(), media_type=CONTENT_TYPE)

    async def readyz(self, request: Request) -> Response:
        ready, checks = await self.orchestrator.readiness()
        not_ready = [name for name, answer in checks.items() if answer not in (OK, UNCHECKED)]
        body = {"ready": ready, "not_ready": not_ready, "checks": checks}
        return JSONResponse(body, status_code=200 if ready else 503)

    async def sessions(self, request: Request) -> Response:
        caller, tenants = self._tenants(request)
        task = check_task(request.headers.get(TASK_HEADER), "X-Sandhold-Task")
        rows = []
        with task_scope(task):
            for tenant in tenants:
                rows += self.orchestrator.session_overview(tenant=tenant)
        body = {
            "success": True, "tenant": caller.tenant, "operator": caller.operator,
            "task": task, "count": len(rows),
        }  # fmt: skip
        return JSONResponse({**body, "sessions": rows})

    async def pools(self, request: Request) -> Response:
        pools = [
            {"policy": policy, "size": status["size"], "ready": status["ready"]}
            for policy, status in sorted(self.orchestrator.pool_status().items())
        ]
        return JSONResponse({"success": True, **self.orchestrator.capacity(), "pools": pools})

    async def audit(self, request: Request) -> Response:
        _, tenants = self._tenants(request)
        task = check_task(request.headers.get(TASK_HEADER), "X-Sandhold-Task")
        limit = audit_limit(request.query_params.get("limit"))
        log = self.orchestrator.audit_log
        events = []
        if log is not None:
            for tenant in tenants:
                events += log.recent.latest(tenant, task=task, limit=limit)
            events.sort(key=lambda event: event.get("seq") or 0, reverse=True)
            events = events[:limit]
        body = {"success": True, "enabled": log is not None, "count": len(events)}
        return JSONResponse({**body, "events": events})
