"""The main port's surface for the front door (``_front``): REST ``/v1``, ``/mcp``, the ops
routes, ``/metrics`` and ``/ui``.

Roles: ``/healthz``, ``/readyz``, the ``/ui`` page's files (it asks for a key itself) and
discovery under ``/.well-known/`` need no key: a load balancer's probe carries none, a browser
opening a page sends no header, and MCP clients probe ``/.well-known/oauth-*`` before
connecting, where a 404 tells them there is no OAuth here. ``/metrics`` and ``/v1/ops/pools``
(figures of the whole server) need an operator's key; ``/openapi.json``, ``/v1/ops/sessions``
and ``/v1/ops/audit`` take either key (a tenant sees its own, an operator every tenant's);
everything else is a tenant's.

Refusals are the result shape every answer has; at ``/mcp`` also a JSON-RPC error (``id``
null: the request was not read), whose message starts with the error type and whose ``data``
carries it, which the MCP SDK's client raises as it is (a 401 with any other body became a
generic "Server returned an error response"). A 401 carries RFC 6750's challenge, naming a key
that was given ``invalid_token``.
"""

from __future__ import annotations

import re
from typing import Any, Final

from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE
from mcp_types import INVALID_REQUEST
from starlette.types import Scope

from orchestrator.http._bodies import BodyLimits
from orchestrator.http._front import JsonBody, Role, Surface
from orchestrator.http._ops import OPS_AUDIT_PATH, OPS_POOLS_PATH, OPS_SESSIONS_PATH
from orchestrator.http._routes import EVENTS_PATH
from orchestrator.http._statuses import REST_STATUS, UNAUTHENTICATED
from orchestrator.http._ui import UI_PATHS

__all__ = ["MCP_PATH", "METRICS_PATH", "RestSurface", "refusal_body"]

MCP_PATH: Final = "/mcp"
METRICS_PATH: Final = "/metrics"
# The operations page's files are public too: they hold no data and no key (``_ui``).
PUBLIC_PATHS: Final = frozenset({"/healthz", "/readyz", *UI_PATHS})
# Discovery documents (RFC 8615): none exists here, and saying so needs no key.
PUBLIC_PREFIX: Final = "/.well-known/"
OPERATOR_PATHS: Final = frozenset({METRICS_PATH, OPS_POOLS_PATH})
# The API's description is anyone's with a key; the ops views are each key's own.
EITHER_PATHS: Final = frozenset({"/openapi.json", OPS_SESSIONS_PATH, OPS_AUDIT_PATH})
# The MCP SDK refuses a message over its own cap with a bare 413 of its own; the door's is the
# same, so that it answers first, in the shape every refusal has.
MCP_LIMITS: Final = BodyLimits(
    max_raw_bytes=DEFAULT_MAX_REQUEST_BODY_SIZE, max_decoded_bytes=DEFAULT_MAX_REQUEST_BODY_SIZE
)
_EVENTS = re.compile("^" + re.sub(r"{\w+}", "[^/]+", EVENTS_PATH) + "$")


def refusal_body(path: str, error: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {"success": False, **error}
    if path == MCP_PATH:
        error_type, message = body.get("error_type"), body.get("error_message")
        rpc = {"code": INVALID_REQUEST, "message": f"{error_type}: {message}", "data": body}
        body = {"jsonrpc": "2.0", "id": None, "error": rpc, **body}
    return body


class RestSurface(Surface):
    name = "rest"
    statuses = REST_STATUS

    def role(self, scope: Scope) -> Role:
        path = scope["path"]
        if path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIX):
            return Role.PUBLIC
        if path in OPERATOR_PATHS:
            return Role.OPERATOR
        if path in EITHER_PATHS:
            return Role.EITHER
        return Role.TENANT

    def limits_for(self, scope: Scope) -> BodyLimits:
        if scope["path"] != MCP_PATH:
            return self.limits
        return BodyLimits(
            max_raw_bytes=min(self.limits.max_raw_bytes, MCP_LIMITS.max_raw_bytes),
            max_decoded_bytes=min(self.limits.max_decoded_bytes, MCP_LIMITS.max_decoded_bytes),
            max_json_depth=self.limits.max_json_depth,
        )

    def is_stream(self, scope: Scope) -> bool:
        """Held-open answers: a terminal's events and MCP's ``GET /mcp``."""
        if scope["method"] != "GET":
            return False
        path = scope["path"]
        return path == MCP_PATH or _EVENTS.fullmatch(path) is not None

    def json_body(self, scope: Scope) -> JsonBody:
        return JsonBody.PLAIN

    def refusal(
        self, scope: Scope, status: int, error: dict[str, Any]
    ) -> tuple[dict[str, Any], list[tuple[bytes, bytes]]]:
        return refusal_body(scope["path"], error), []

    def unauthenticated(
        self, scope: Scope, *, key_given: bool
    ) -> tuple[int, dict[str, Any], list[tuple[bytes, bytes]]]:
        message = "a valid API key is required: Authorization: Bearer <key>"
        body = refusal_body(
            scope["path"], {"error_type": UNAUTHENTICATED, "error_message": message}
        )
        # RFC 6750: a key that was given and is not valid is an "invalid_token".
        challenge = (
            b'Bearer realm="sandhold", error="invalid_token"'
            if key_given
            else b'Bearer realm="sandhold"'
        )
        return 401, body, [(b"www-authenticate", challenge)]
