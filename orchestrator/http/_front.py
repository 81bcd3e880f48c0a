"""The front door every HTTP surface of ``sandhold serve`` goes through: REST ``/v1``, ``/mcp``,
``/ui``, ``/metrics`` and the ops routes on the main port, E2B's control API, envd and code
interpreter on the E2B port. A surface (``Surface``) says only what is its own: which routes need
which role, how its callers prove who they are, which requests are streams or JSON, and the
shape of its refusals and its status table (``_statuses``). Everything else is here, once:

- **who**: the key (``Authorization: Bearer`` or ``X-API-Key``) names a tenant or an operator
  (``Caller``); a route of the other role answers 403 ``policy``. A wrong or missing credential
  costs its client address one of ``auth_failures_per_minute`` (``FailedKeys``, shared by every
  surface of the server), audited; past the budget, 429 ``rate_limited``.
- **bodies**: read through ``BoundedBody`` (``_bodies``): raw and decoded size (413), encodings
  (415), JSON nesting (400), before the surface's app sees a byte.
- **streams**: held-open answers of one tenant, every surface's together, are bounded by
  ``max_streams_per_tenant`` (429 ``quota_exceeded``, quota ``streams``).
- **refusals**: counted in the metrics and recorded in the audit log for the caller's tenant.

Invariants: a request reaches a surface's app only with ``scope["sandhold.caller"]`` set by this
door (public routes: None); ``FrontDoor`` is the outermost app of each server (``sandhold serve``
refuses to serve any other), so a surface added later cannot skip it.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, Final

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from starlette.authentication import AuthCredentials
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orchestrator._core import Metrics, TenantKeys, hash_key
from orchestrator.audit import AuditLog
from orchestrator.errors import OrchestratorError, PolicyViolationError, QuotaExceededError
from orchestrator.http._auth import (
    TENANT_SCOPE_KEY,
    FailedKeys,
    presented_key,
    send_json,
    tenant_context,
)
from orchestrator.http._bodies import (
    DEFAULT_BODY_LIMITS,
    BodyLimits,
    BoundedBody,
    JsonDepth,
    body_scope,
    check_head,
)
from orchestrator.http._limits import HttpLimitsConfig
from orchestrator.http._statuses import UNAUTHENTICATED, status_for

__all__ = [
    "BODY_SCOPE_KEY",
    "CALLER_SCOPE_KEY",
    "STREAM_QUOTA",
    "Caller",
    "Front",
    "FrontDoor",
    "JsonBody",
    "Role",
    "Surface",
]

log = logging.getLogger(__name__)

CALLER_SCOPE_KEY: Final = "sandhold.caller"
# The request's ``BoundedBody``: an app's error handler tells the door's refusals by it.
BODY_SCOPE_KEY: Final = "sandhold.body"
STREAM_QUOTA: Final = "streams"


class Role(enum.Enum):
    """Who may call a route."""

    PUBLIC = "public"  # no key: probes, the /ui page's files, discovery
    TENANT = "tenant"  # a tenant's key: tool calls, MCP, E2B
    OPERATOR = "operator"  # an operator's key: /metrics, server-wide figures
    EITHER = "either"  # either key: what each sees is its own (the ops routes)


class JsonBody(enum.Enum):
    """How a request's body is checked for JSON nesting."""

    NO = "no"
    PLAIN = "plain"
    ENVELOPED = "enveloped"  # Connect streaming: 5-byte prefixed messages


@dataclasses.dataclass(frozen=True)
class Caller:
    """Who a request is from: a tenant, an operator of the whole server, or (the one key of a
    server without a tenants file) both."""

    name: str
    tenant: str | None
    operator: bool = False

    @classmethod
    def of(cls, keys: TenantKeys, key: str) -> Caller | None:
        found = keys.role_for(key)
        if found is None:
            return None
        name, tenant, operator = found
        return cls(name, tenant, operator)


class Surface:
    """One HTTP surface's own facts; the base answers as REST does (subclasses change them)."""

    name = "http"
    statuses: Mapping[str, int] = {}

    def __init__(self, limits: BodyLimits = DEFAULT_BODY_LIMITS) -> None:
        self.limits = limits

    def role(self, scope: Scope) -> Role:
        return Role.TENANT

    def limits_for(self, scope: Scope) -> BodyLimits:
        """The caps of this request's body (a route may have tighter ones)."""
        return self.limits

    def credential(self, scope: Scope, keys: TenantKeys) -> tuple[Caller | None, bool]:
        """The caller the request's credential names (None: none or a wrong one), and whether
        one was given at all."""
        key = presented_key(scope)
        if key is None:
            return None, False
        return Caller.of(keys, key), True

    def is_stream(self, scope: Scope) -> bool:
        return False

    def json_body(self, scope: Scope) -> JsonBody:
        return JsonBody.PLAIN

    def refusal(
        self, scope: Scope, status: int, error: dict[str, Any]
    ) -> tuple[dict[str, Any], list[tuple[bytes, bytes]]]:
        """The body and extra headers of a refusal (``error``: ``error_type``,
        ``error_message`` and any fields of the error, such as ``quota``)."""
        return {"success": False, **error}, []

    def unauthenticated(
        self, scope: Scope, *, key_given: bool
    ) -> tuple[int, dict[str, Any], list[tuple[bytes, bytes]]]:
        """The whole answer to a request without a valid credential, within the budget."""
        error = {"error_type": UNAUTHENTICATED, "error_message": "a valid API key is required"}
        body, headers = self.refusal(scope, 401, error)
        return 401, body, headers


class StreamCounter:
    """Held-open streams per tenant, every surface's together."""

    def __init__(self, max_per_tenant: int) -> None:
        self.max_per_tenant = max_per_tenant
        self._open: Counter[str] = Counter()

    def statistics(self) -> dict[str, int]:
        return dict(self._open)

    def acquire(self, tenant: str) -> bool:
        if self._open[tenant] >= self.max_per_tenant:
            return False
        self._open[tenant] += 1
        return True

    def release(self, tenant: str) -> None:
        self._open[tenant] -= 1
        if not self._open[tenant]:
            del self._open[tenant]


class Front:
    """What every surface of one server shares: keys, the wrong-key budget, the stream count,
    the metrics and the audit log."""

    def __init__(
        self,
        keys: TenantKeys,
        *,
        limits: HttpLimitsConfig | None = None,
        metrics: Metrics | None = None,
        audit: Callable[[], AuditLog | None] = lambda: None,
    ) -> None:
        limits = limits or HttpLimitsConfig()
        self.keys = keys
        self.metrics = metrics
        self.audit = audit
        self.failed = FailedKeys(limits.auth_failures_per_minute, audit, metrics)
        self.streams = StreamCounter(limits.max_streams_per_tenant)

    def door(self, surface: Surface, app: ASGIApp) -> FrontDoor:
        return FrontDoor(self, surface, app)

    async def refuse(
        self, surface: Surface, scope: Scope, send: Send, error: OrchestratorError
    ) -> None:
        """Answer ``error`` in ``surface``'s shape and status; counted, and audited for the
        caller's tenant."""
        status = status_for(error, surface.statuses)
        await self.answer(surface, scope, send, status, error.to_dict())

    async def answer(
        self, surface: Surface, scope: Scope, send: Send, status: int, error: dict[str, Any]
    ) -> None:
        await self.note_refusal(scope, status, str(error.get("error_type")))
        body, headers = surface.refusal(scope, status, error)
        await send_json(send, status, body, headers)

    async def note_refusal(self, scope: Scope, status: int, error_type: str) -> None:
        """Count a refused request, and record it for the caller's tenant."""
        if self.metrics is not None:
            self.metrics.http_refusals.labels(str(status)).inc()
        audit, caller = self.audit(), scope.get(CALLER_SCOPE_KEY)
        if audit is None or not isinstance(caller, Caller):
            return
        path = str(scope.get("path"))[:200]
        details = {"method": scope.get("method"), "path": path, "status": status}
        if caller.tenant is None:
            details["operator"] = caller.name
        try:
            await audit.record(
                tenant=caller.tenant or "(operator)", task=None, tool="http",
                operation="refuse", session_id=None, arguments={}, success=False,
                error_type=error_type, duration_ms=0.0, details=details,
            )  # fmt: skip
        except OrchestratorError as exc:
            log.error("audit log could not record a refused request: %s", exc)


class FrontDoor:
    """ASGI app: one surface's app behind the front (see the module's docstring)."""

    def __init__(self, front: Front, surface: Surface, app: ASGIApp) -> None:
        self.front = front
        self.surface = surface
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":
            await send({"type": "websocket.close", "code": 1008})
            return
        role = self.surface.role(scope)
        caller = None
        if role is not Role.PUBLIC:
            caller, given = self.surface.credential(scope, self.front.keys)
            if caller is None:
                answer = self.surface.unauthenticated(scope, key_given=given)
                await self.front.failed.refuse(scope, send, self.surface, answer)
                return
        scope = _with_caller(scope, caller)
        if caller is not None and _wrong_role(role, caller):
            await self.front.refuse(self.surface, scope, send, _role_error(role))
            return
        try:
            codings = check_head(scope, self.surface.limits_for(scope))
        except OrchestratorError as exc:
            await self.front.refuse(self.surface, scope, send, exc)
            return
        tenant = caller.tenant if caller is not None else None
        if tenant is not None and self.surface.is_stream(scope):
            if not self.front.streams.acquire(tenant):
                await self._refuse_stream(scope, send, tenant)
                return
            try:
                await self._serve(scope, receive, send, codings, tenant)
            finally:
                self.front.streams.release(tenant)
            return
        await self._serve(scope, receive, send, codings, tenant)

    async def _serve(
        self, scope: Scope, receive: Receive, send: Send, codings: list[str], tenant: str | None
    ) -> None:
        mode, limits = self.surface.json_body(scope), self.surface.limits_for(scope)
        depth = None
        if mode is not JsonBody.NO:
            depth = JsonDepth(limits.max_json_depth, enveloped=mode is JsonBody.ENVELOPED)
        body = BoundedBody(receive, limits, codings, json=depth)
        scope = {**body_scope(scope, codings), BODY_SCOPE_KEY: body}
        started = False

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if body.refused is not None and not started:
                return  # the app's answer to a refused body: the door answers instead
            started = True
            await send(message)

        reset = tenant_context(tenant)
        try:
            await self.app(scope, body.receive, guarded_send)
        except OrchestratorError as exc:
            if exc is not body.refused:
                raise
        except Exception:
            if body.refused is None:
                raise
        finally:
            reset()
        if body.refused is not None and not started:
            await self.front.refuse(self.surface, scope, send, body.refused)

    async def _refuse_stream(self, scope: Scope, send: Send, tenant: str) -> None:
        held = self.front.streams.max_per_tenant
        error = QuotaExceededError(
            f"{STREAM_QUOTA}: this tenant holds {held} streams open, its limit; close one first",
            quota=STREAM_QUOTA,
        )
        if self.front.metrics is not None:
            self.front.metrics.refused_for_quota(tenant, STREAM_QUOTA)
        await self.front.refuse(self.surface, scope, send, error)


def _with_caller(scope: Scope, caller: Caller | None) -> Scope:
    if caller is None:
        return {**scope, CALLER_SCOPE_KEY: None}
    extra: dict[str, Any] = {CALLER_SCOPE_KEY: caller}
    if caller.tenant is not None:
        # The MCP SDK binds each MCP session to the client id that opened it: the tenant.
        token = AccessToken(token=hash_key(caller.name), client_id=caller.tenant, scopes=[])
        extra |= {
            TENANT_SCOPE_KEY: caller.tenant,
            "user": AuthenticatedUser(token),
            "auth": AuthCredentials([]),
        }
    return {**scope, **extra}


def _wrong_role(role: Role, caller: Caller) -> bool:
    return (role is Role.TENANT and caller.tenant is None) or (
        role is Role.OPERATOR and not caller.operator
    )


def _role_error(role: Role) -> PolicyViolationError:
    if role is Role.OPERATOR:
        return PolicyViolationError(
            "this route needs an operator's key (tenants file [[operator]]; `sandhold tenant "
            "add NAME --operator`)",
            rule="role.operator",
        )
    return PolicyViolationError(
        "an operator's key makes no tool calls: use a tenant's key", rule="role.tenant"
    )
