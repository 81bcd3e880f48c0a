"""API keys on every request: ``Authorization: Bearer <key>`` names the tenant, or the request is
answered 401 before it reaches any route. ``/healthz`` and discovery under ``/.well-known/`` need
no key: MCP clients probe ``/.well-known/oauth-*`` before connecting, and a 404 tells them there is
no OAuth here (a 401 made them report a failed discovery).

The 401 body is JSON with ``error_type: unauthenticated``; at ``/mcp`` it is also a JSON-RPC
error, which the MCP SDK's client raises as it is (``MCPError``, its message and ``data``) where
any other body becomes a generic "Server returned an error response".

The tenant travels three ways, for three readers: ``scope["sbx.tenant"]`` for the REST routes,
``current_tenant()`` (a context variable, set for the duration of the request) for the MCP
server's tenant callable, and ``scope["user"]`` as the MCP SDK's ``AuthenticatedUser`` whose
``client_id`` is the tenant, so that the SDK binds each MCP session to the tenant that opened it.
"""

from __future__ import annotations

import json
from contextvars import ContextVar
from typing import Any, Final

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp_types import INVALID_REQUEST
from starlette.authentication import AuthCredentials
from starlette.types import ASGIApp, Receive, Scope, Send

from orchestrator.tenants import TenantKeys, hash_key

TENANT_SCOPE_KEY: Final = "sbx.tenant"
PUBLIC_PATHS: Final = frozenset({"/healthz"})
# Discovery documents (RFC 8615): none exists here, and saying so needs no key.
PUBLIC_PREFIX: Final = "/.well-known/"
MCP_PATH: Final = "/mcp"
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
        if scope["type"] == "lifespan" or (scope["type"] == "http" and is_public(scope["path"])):
            await self.app(scope, receive, send)
            return
        key = bearer_key(scope)
        tenant = self.keys.tenant_for(key) if key is not None else None
        if tenant is None or key is None:
            await _refuse(scope, send, key_given=key is not None)
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
    if scope["type"] != "http":
        await send({"type": "websocket.close", "code": 1008})
        return
    message = "a valid API key is required: Authorization: Bearer <key>"
    # RFC 6750: a key that was given and is not valid is an "invalid_token".
    challenge = b'Bearer realm="sbx", error="invalid_token"' if key_given else b'Bearer realm="sbx"'
    body = refusal_body(scope["path"], UNAUTHENTICATED, message)
    await send_json(send, 401, body, [(b"www-authenticate", challenge)])
