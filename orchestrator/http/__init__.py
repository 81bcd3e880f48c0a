"""The HTTP API: REST over the tool layer, an OpenAPI document, API keys, terminal output as
server-sent events, an operations page, and the one front door (``_front``) every HTTP surface
of ``sandhold serve`` goes through, the E2B port's included. No logic of its own: every ``/v1``
route is one ``Orchestrator.call``, but for the operations routes, which read the orchestrator's
state.

Routes (all need a key, ``Authorization: Bearer <key>`` or ``X-API-Key``, except ``/healthz``,
``/readyz``, the ``/ui`` page's files, and ``/.well-known/*``, which answers 404: there is no
OAuth discovery to find):

    GET    /healthz                              liveness
    GET    /readyz                               readiness: engine, image, registry (no key)
    GET    /openapi.json                         OpenAPI 3.1, made from the tool schemas
    GET    /metrics                              Prometheus text format (an operator's key)
    POST   /v1/{tool}                            any tool call: the MCP tool's arguments
    GET    /v1/sessions                          python_repl list_sessions
    POST   /v1/sessions                          python_repl execute in a new session
    DELETE /v1/sessions/{session_id}             python_repl destroy
    POST   /v1/sessions/{session_id}/execute     python_repl execute
    POST   /v1/sessions/{session_id}/shell       terminal run
    GET    /v1/sessions/{session_id}/history     python_repl history
    GET    /v1/processes?session_id=             process list
    GET    /v1/terminals/{terminal_id}?since_offset=   terminal read
    GET    /v1/terminals/{terminal_id}/events?since_offset=   terminal wait, as SSE
    GET    /v1/ops/sessions                      sessions with CPU and memory (tenant: its own;
                                                 operator: every tenant's)
    GET    /v1/ops/pools                         warm pools, sessions held (an operator's key)
    GET    /v1/ops/audit?limit=                  latest audit records (as for sessions)
    GET    /ui                                   the operations page (``_ui``; no key to load)
    *      /mcp                                  MCP streamable HTTP (when mcp_server is there)

The front door (``Front``, ``FrontDoor``, one ``Surface`` per port): keys to tenants or
operators, wrong keys past a per-address budget answered 429 ``rate_limited``, every body read
through one bounded reader (``_bodies``: 413 past the raw or decoded cap, 415 for an encoding
not taken, 400 past the JSON depth), held-open streams per tenant past
``max_streams_per_tenant`` answered 429 ``quota_exceeded``, and each surface's status table
(``_statuses``). The server (``HttpServer``) holds connections within ``HttpLimitsConfig``.
``limit_log_rate`` bounds logs.

Every answer's body is the structured result (``success`` first). The status: 200 for a tool's
answer, including a failure of the work itself (the user's ZeroDivisionError, a timeout); for a
failed request, by ``error_type`` (``REST_STATUS``): invalid_argument 400, policy 403 (a key of
the wrong role too), session_not_found and path_not_found 404 (an unknown id and another
tenant's alike), busy 409, quota_exceeded 429, internal 500, backend_unavailable 503; and 401
(``unauthenticated``; at ``/mcp`` also a JSON-RPC error, so MCP clients raise it as such), 413
and 415 for a body refused by the reader, 404/405 (``invalid_argument``) for an unknown route or
method; 429 ``rate_limited`` past a budget of the client address.
"""

from typing import TYPE_CHECKING

from orchestrator._lazy import lazy_exports

# Each public name and the module it comes from, imported on first use (PEP 562): the app pulls
# in starlette and the MCP SDK, which ``sandhold serve --help`` (reading ``HttpLimitsConfig``'s
# defaults from ``_limits``) has no use for.
_EXPORTS = {
    "CALLER_SCOPE_KEY": "orchestrator.http._front",
    "CONNECT_CODES": "orchestrator.http._statuses",
    "E2B_STATUS": "orchestrator.http._statuses",
    "MAX_BODY_BYTES": "orchestrator.http._bodies",
    "RATE_LIMITED": "orchestrator.http._statuses",
    "REST_STATUS": "orchestrator.http._statuses",
    "STATUS_BY_ERROR_TYPE": "orchestrator.http._app",
    "BodyLimits": "orchestrator.http._bodies",
    "Caller": "orchestrator.http._front",
    "ConnectionReset": "orchestrator.http._server",
    "Front": "orchestrator.http._front",
    "FrontDoor": "orchestrator.http._front",
    "HttpLimitsConfig": "orchestrator.http._limits",
    "HttpProtocol": "orchestrator.http._server",
    "HttpServer": "orchestrator.http._server",
    "JsonBody": "orchestrator.http._front",
    "RateLimitedLog": "orchestrator.http._logs",
    "Role": "orchestrator.http._front",
    "Surface": "orchestrator.http._front",
    "build_app": "orchestrator.http._app",
    "current_tenant": "orchestrator.http._auth",
    "limit_log_rate": "orchestrator.http._logs",
    "openapi_document": "orchestrator.http._openapi",
    "status_for": "orchestrator.http._statuses",
    "status_of": "orchestrator.http._app",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())


if TYPE_CHECKING:
    from orchestrator.http._app import STATUS_BY_ERROR_TYPE, build_app, status_of
    from orchestrator.http._auth import current_tenant
    from orchestrator.http._bodies import MAX_BODY_BYTES, BodyLimits
    from orchestrator.http._front import (
        CALLER_SCOPE_KEY,
        Caller,
        Front,
        FrontDoor,
        JsonBody,
        Role,
        Surface,
    )
    from orchestrator.http._limits import HttpLimitsConfig
    from orchestrator.http._logs import RateLimitedLog, limit_log_rate
    from orchestrator.http._openapi import openapi_document
    from orchestrator.http._server import ConnectionReset, HttpProtocol, HttpServer
    from orchestrator.http._statuses import (
        CONNECT_CODES,
        E2B_STATUS,
        RATE_LIMITED,
        REST_STATUS,
        status_for,
    )

__all__ = [
    "CALLER_SCOPE_KEY",
    "CONNECT_CODES",
    "E2B_STATUS",
    "MAX_BODY_BYTES",
    "RATE_LIMITED",
    "REST_STATUS",
    "STATUS_BY_ERROR_TYPE",
    "BodyLimits",
    "Caller",
    "ConnectionReset",
    "Front",
    "FrontDoor",
    "HttpLimitsConfig",
    "HttpProtocol",
    "HttpServer",
    "JsonBody",
    "RateLimitedLog",
    "Role",
    "Surface",
    "build_app",
    "current_tenant",
    "limit_log_rate",
    "openapi_document",
    "status_for",
    "status_of",
]
