"""API keys on every request: ``Authorization: Bearer <key>`` names the tenant, or the request is
answered 401 before it reaches any route.

The tenant travels three ways, for three readers: ``scope["sbx.tenant"]`` for the REST routes,
``current_tenant()`` (a context variable, set for the duration of the request) for the MCP
server's tenant callable, and ``scope["user"]`` as the MCP SDK's ``AuthenticatedUser`` whose
``client_id`` is the tenant, so that the SDK binds each MCP session to the tenant that opened it.
"""

from __future__ import annotations

import json
from contextvars import ContextVar
from typing import Final

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from starlette.authentication import AuthCredentials
from starlette.types import ASGIApp, Receive, Scope, Send

from orchestrator.tenants import TenantKeys, hash_key

TENANT_SCOPE_KEY: Final = "sbx.tenant"
PUBLIC_PATHS: Final = frozenset({"/healthz"})
# Not one of the tool layer's error types: the request never reached a tool.
UNAUTHENTICATED: Final = "unauthenticated"

_current_tenant: ContextVar[str | None] = ContextVar("sbx_http_tenant", default=None)


def current_tenant() -> str | None:
    """The tenant of the HTTP request being served (None outside one)."""
    return _current_tenant.get()


def bearer_key(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, key = value.decode("latin-1").partition(" ")
            return key.strip() if scheme.lower() == "bearer" and key.strip() else None
    return None


class BearerAuth:
    """ASGI middleware: resolves the API key to a tenant, or answers 401."""

    def __init__(self, app: ASGIApp, keys: TenantKeys) -> None:
        self.app = app
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan" or (
            scope["type"] == "http" and scope["path"] in PUBLIC_PATHS
        ):
            await self.app(scope, receive, send)
            return
        key = bearer_key(scope)
        tenant = self.keys.tenant_for(key) if key is not None else None
        if tenant is None or key is None:
            await _refuse(scope, send)
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


async def _refuse(scope: Scope, send: Send) -> None:
    if scope["type"] != "http":
        await send({"type": "websocket.close", "code": 1008})
        return
    body = json.dumps(
        {
            "success": False,
            "error_type": UNAUTHENTICATED,
            "error_message": "a valid API key is required: Authorization: Bearer <key>",
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"www-authenticate", b'Bearer realm="sbx"'),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
