"""Who a request is from, and what a wrong credential costs: the key of a request
(E2B's ``X-API-Key``, else ``Authorization: Bearer <key>``), and ``FailedKeys``, the budget of
wrong or missing keys per client address. The front door (``_front``) uses both for every
surface; nothing else reads a key.

A wrong or missing key costs its client address one of ``auth_failures_per_minute`` (a token
bucket): past them the answer is 429 ``rate_limited`` with ``Retry-After``, and the refusal is
counted rather than audited one by one. A valid key is always served, from any address: keys
are 256-bit random, so the budget is about what failures cost, and one stale client on a shared
address (every local client is 127.0.0.1) must not lock out the others.

The tenant travels three ways, for three readers: ``scope["sandhold.tenant"]`` for the routes,
``current_tenant()`` (a context variable, set for the duration of the request) for the MCP
server's tenant callable and the log, and ``scope["user"]`` as the MCP SDK's
``AuthenticatedUser`` whose ``client_id`` is the tenant, so that the SDK binds each MCP session
to the tenant that opened it.
"""

from __future__ import annotations

import json
import logging
import math
from collections import OrderedDict
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, Final

from starlette.types import Scope, Send

from orchestrator._core import Metrics
from orchestrator.audit import AuditLog
from orchestrator.errors import OrchestratorError
from orchestrator.http._limits import MAX_TRACKED_CLIENTS, Budgets
from orchestrator.http._statuses import RATE_LIMITED, UNAUTHENTICATED

log = logging.getLogger(__name__)

TENANT_SCOPE_KEY: Final = "sandhold.tenant"
# Who a refused request's audit record names: no tenant name can be spelled so.
NO_TENANT: Final = "(unauthenticated)"

_current_tenant: ContextVar[str | None] = ContextVar("sandhold_http_tenant", default=None)


def current_tenant() -> str | None:
    """The tenant of the HTTP request being served (None outside one)."""
    return _current_tenant.get()


def presented_key(scope: Scope) -> str | None:
    """The key the request presents: ``Authorization: Bearer``, else ``X-API-Key`` (E2B's
    SDK sends that one); None when neither is there."""
    bearer = api_key = None
    for name, value in scope.get("headers", ()):
        if name == b"authorization" and bearer is None:
            scheme, _, key = value.decode("latin-1").partition(" ")
            bearer = key.strip() if scheme.lower() == "bearer" and key.strip() else ""
        elif name == b"x-api-key" and api_key is None:
            api_key = value.decode("latin-1").strip()
    return api_key or bearer or None


def tenant_context(tenant: str | None) -> Callable[[], None]:
    """``current_tenant()`` set to ``tenant`` until the returned function is called."""
    token = _current_tenant.set(tenant)
    return lambda: _current_tenant.reset(token)


class FailedKeys:
    """What wrong keys cost their address: counted, audited within the budget, 429 past it.

    Audit records (tool ``http``, operation ``authenticate``, tenant ``NO_TENANT``): one per
    failure within the budget (``unauthenticated``) and one when an address goes past it
    (``rate_limited``); each one's ``details`` name the address and path and how many refusals
    past a budget came (from any address) since the record before, so the log counts them all.
    """

    def __init__(
        self,
        per_minute: int,
        audit: Callable[[], AuditLog | None] = lambda: None,
        metrics: Metrics | None = None,
    ) -> None:
        self.budgets: Budgets[str] = Budgets(per_minute, per_minute / 60)
        self.audit = audit
        self.metrics = metrics
        self.unauthenticated = 0
        self.rate_limited = 0
        self._unaudited = 0
        # Addresses past their budget, so that only the first refusal of a spell is audited.
        self._limited: OrderedDict[str, None] = OrderedDict()

    def statistics(self) -> dict[str, int]:
        return {"unauthenticated": self.unauthenticated, "rate_limited": self.rate_limited}

    async def refuse(
        self,
        scope: Scope,
        send: Send,
        surface: Any,
        answer: tuple[int, dict[str, Any], list[tuple[bytes, bytes]]],
    ) -> None:
        """``answer`` (the surface's own to a missing or wrong credential) within the budget
        of the client's address; past it, 429 in the surface's shape."""
        client = client_address(scope)
        if self.budgets.spend(client):
            self._limited.pop(client, None)
            self.unauthenticated += 1
            if self.metrics is not None:
                self.metrics.auth_failures.labels(UNAUTHENTICATED).inc()
            await self._record(scope, client, UNAUTHENTICATED)
            await send_json(send, *answer)
            return
        self.rate_limited += 1
        if self.metrics is not None:
            self.metrics.auth_failures.labels(RATE_LIMITED).inc()
        if client in self._limited:
            self._unaudited += 1
        else:
            self._limited[client] = None
            while len(self._limited) > MAX_TRACKED_CLIENTS:
                self._limited.popitem(last=False)
            await self._record(scope, client, RATE_LIMITED)
        await _refuse_rate_limited(scope, send, surface, self.budgets.retry_after(client))

    async def _record(self, scope: Scope, client: str, error_type: str) -> None:
        audit = self.audit()
        if audit is None:
            return
        refused, self._unaudited = self._unaudited, 0
        details = {
            "client": client,
            "method": str(scope.get("method")),
            "path": str(scope.get("path"))[:200],
            "rate_limited_since_last": refused,
        }
        try:
            await audit.record(
                tenant=NO_TENANT, task=None, tool="http", operation="authenticate",
                session_id=None, arguments={}, success=False, error_type=error_type,
                duration_ms=0.0, details=details,
            )  # fmt: skip
        except OrchestratorError as exc:
            log.error("audit log could not record a refused key: %s", exc)


def client_address(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "local"


async def send_json(
    send: Send,
    status: int,
    body: dict[str, Any],
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    raw = json.dumps(body).encode()
    fixed = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    start = {"type": "http.response.start", "status": status, "headers": fixed + (headers or [])}
    await send(start)
    await send({"type": "http.response.body", "body": raw})


async def _refuse_rate_limited(scope: Scope, send: Send, surface: Any, retry_after: float) -> None:
    message = "too many requests with a wrong or missing key from this address"
    body, headers = surface.refusal(
        scope, 429, {"error_type": RATE_LIMITED, "error_message": message}
    )
    wait = str(max(1, math.ceil(retry_after))).encode()
    await send_json(send, 429, body, [*headers, (b"retry-after", wait)])
