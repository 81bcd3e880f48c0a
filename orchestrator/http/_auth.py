"""API keys on every request: ``Authorization: Bearer <key>`` names the tenant, or the request is
answered 401 before it reaches any route. ``/healthz``, ``/readyz``, the files of the ``/ui``
page (it asks for a key itself) and discovery under ``/.well-known/`` need no key: a load
balancer's probe carries none, a browser opening a page sends no header, and MCP clients probe
``/.well-known/oauth-*`` before connecting, where a 404 tells them there is no OAuth here (a 401
made them report a failed discovery).

The 401 body is JSON with ``error_type: unauthenticated``; at ``/mcp`` it is also a JSON-RPC
error, which the MCP SDK's client raises as it is (``MCPError``, its message and ``data``) where
any other body becomes a generic "Server returned an error response".

A wrong or missing key costs its client address one of ``auth_failures_per_minute`` (a token
bucket): past them the answer is 429 ``rate_limited`` with ``Retry-After``, and the refusal is
counted rather than audited one by one (see ``FailedKeys``). A valid key is always served, from
any address: keys are 256-bit random, so the budget is about what failures cost, and one stale
client on a shared address (every local client is 127.0.0.1) must not lock out the others.

The tenant travels three ways, for three readers: ``scope["sandhold.tenant"]`` for the REST routes,
``current_tenant()`` (a context variable, set for the duration of the request) for the MCP
server's tenant callable, and ``scope["user"]`` as the MCP SDK's ``AuthenticatedUser`` whose
``client_id`` is the tenant, so that the SDK binds each MCP session to the tenant that opened it.
"""

from __future__ import annotations

import json
import logging
import math
from collections import OrderedDict
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, Final

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp_types import INVALID_REQUEST
from starlette.authentication import AuthCredentials
from starlette.types import ASGIApp, Receive, Scope, Send

from orchestrator._core.metrics import Metrics
from orchestrator._core.tenants import TenantKeys, hash_key
from orchestrator.audit._log import AuditLog
from orchestrator.errors import OrchestratorError
from orchestrator.http._limits import AUTH_FAILURES_PER_MINUTE, MAX_TRACKED_CLIENTS, Budgets
from orchestrator.http._ui import UI_PATHS

log = logging.getLogger(__name__)

TENANT_SCOPE_KEY: Final = "sandhold.tenant"
# The operations page's files are public too: they hold no data and no key (``_ui``).
PUBLIC_PATHS: Final = frozenset({"/healthz", "/readyz", *UI_PATHS})
# Discovery documents (RFC 8615): none exists here, and saying so needs no key.
PUBLIC_PREFIX: Final = "/.well-known/"
MCP_PATH: Final = "/mcp"
# Not tool layer error types: the request never reached a tool.
UNAUTHENTICATED: Final = "unauthenticated"
RATE_LIMITED: Final = "rate_limited"
# Who a refused request's audit record names: no tenant name can be spelled so.
NO_TENANT: Final = "(unauthenticated)"

_current_tenant: ContextVar[str | None] = ContextVar("sandhold_http_tenant", default=None)


def current_tenant() -> str | None:
    """The tenant of the HTTP request being served (None outside one)."""
    return _current_tenant.get()


def bearer_key(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, key = value.decode("latin-1").partition(" ")
            return key.strip() if scheme.lower() == "bearer" and key.strip() else None
    return None


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

    async def refuse(self, scope: Scope, send: Send, *, key_given: bool) -> None:
        if scope["type"] != "http":
            await send({"type": "websocket.close", "code": 1008})
            return
        client = client_address(scope)
        if self.budgets.spend(client):
            self._limited.pop(client, None)
            self.unauthenticated += 1
            if self.metrics is not None:
                self.metrics.auth_failures.labels(UNAUTHENTICATED).inc()
            await self._record(scope, client, UNAUTHENTICATED)
            await _refuse(scope, send, key_given=key_given)
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
        await _refuse_rate_limited(scope, send, self.budgets.retry_after(client))

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


class BearerAuth:
    """ASGI middleware: resolves the API key to a tenant, or answers 401 (429 past the budget)."""

    def __init__(
        self,
        app: ASGIApp,
        keys: TenantKeys,
        *,
        failures_per_minute: int = AUTH_FAILURES_PER_MINUTE,
        audit: Callable[[], AuditLog | None] = lambda: None,
        metrics: Metrics | None = None,
    ) -> None:
        self.app = app
        self.keys = keys
        self.failed = FailedKeys(failures_per_minute, audit, metrics)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan" or (scope["type"] == "http" and is_public(scope["path"])):
            await self.app(scope, receive, send)
            return
        key = bearer_key(scope)
        tenant = self.keys.tenant_for(key) if key is not None else None
        if tenant is None or key is None:
            await self.failed.refuse(scope, send, key_given=key is not None)
            return
        token = AccessToken(token=hash_key(key), client_id=tenant, scopes=[])
        scope = {
            **scope,
            TENANT_SCOPE_KEY: tenant,
            "user": AuthenticatedUser(token),
            "auth": AuthCredentials([]),
        }
        reset = _current_tenant.set(tenant)
        try:
            await self.app(scope, receive, send)
        finally:
            _current_tenant.reset(reset)


def is_public(path: str) -> bool:
    return path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIX)


def refusal_body(path: str, error_type: str, message: str) -> dict[str, Any]:
    """The body of a request refused before any route: the result shape every answer has, and at
    ``/mcp`` a JSON-RPC error too (``id`` null: the request was not read), whose message starts
    with the error type and whose ``data`` carries it."""
    body: dict[str, Any] = {"success": False, "error_type": error_type, "error_message": message}
    if path == MCP_PATH:
        error = {"code": INVALID_REQUEST, "message": f"{error_type}: {message}", "data": body}
        body = {"jsonrpc": "2.0", "id": None, "error": error, **body}
    return body


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


async def _refuse(scope: Scope, send: Send, *, key_given: bool) -> None:
    message = "a valid API key is required: Authorization: Bearer <key>"
    # RFC 6750: a key that was given and is not valid is an "invalid_token".
    challenge = (
        b'Bearer realm="sandhold", error="invalid_token"'
        if key_given
        else b'Bearer realm="sandhold"'
    )
    body = refusal_body(scope["path"], UNAUTHENTICATED, message)
    await send_json(send, 401, body, [(b"www-authenticate", challenge)])


async def _refuse_rate_limited(scope: Scope, send: Send, retry_after: float) -> None:
    message = "too many requests with a wrong or missing API key from this address"
    body = refusal_body(scope["path"], RATE_LIMITED, message)
    wait = str(max(1, math.ceil(retry_after))).encode()
    await send_json(send, 429, body, [(b"retry-after", wait)])
