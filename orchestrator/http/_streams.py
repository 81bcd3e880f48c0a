"""Held-open streams per tenant: a terminal's server-sent events and MCP's ``GET /mcp`` hold a
connection and a task for as long as they last (up to ``STREAM_MAX_SECONDS``), which the idle
deadlines of connections do not bound. Past ``max_streams_per_tenant`` open at once, a tenant's
next one is answered 429 ``quota_exceeded`` naming the ``streams`` quota."""

from __future__ import annotations

import re
from collections import Counter
from typing import Final

from starlette.types import ASGIApp, Receive, Scope, Send

from orchestrator._core.metrics import Metrics
from orchestrator.errors import QuotaExceededError
from orchestrator.http._auth import MCP_PATH, TENANT_SCOPE_KEY, refusal_body, send_json
from orchestrator.http._routes import EVENTS_PATH

STREAM_QUOTA: Final = "streams"
_EVENTS = re.compile("^" + re.sub(r"{\w+}", "[^/]+", EVENTS_PATH) + "$")


def is_stream(scope: Scope) -> bool:
    if scope["type"] != "http" or scope["method"] != "GET":
        return False
    path = scope["path"]
    return path == MCP_PATH or _EVENTS.fullmatch(path) is not None


class StreamLimit:
    """ASGI middleware, inside ``BearerAuth`` (it reads the tenant that put on the scope)."""

    def __init__(
        self, app: ASGIApp, max_per_tenant: int, *, metrics: Metrics | None = None
    ) -> None:
        self.app = app
        self.max_per_tenant = max_per_tenant
        self.metrics = metrics
        self._open: Counter[str] = Counter()

    def statistics(self) -> dict[str, int]:
        return dict(self._open)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not is_stream(scope):
            await self.app(scope, receive, send)
            return
        tenant = scope[TENANT_SCOPE_KEY]
        if self._open[tenant] >= self.max_per_tenant:
            error = QuotaExceededError(
                f"{STREAM_QUOTA}: this tenant holds {self._open[tenant]} streams open, its "
                f"limit; close one first",
                quota=STREAM_QUOTA,
            )
            if self.metrics is not None:
                self.metrics.refused_for_quota(tenant, STREAM_QUOTA)
            body = refusal_body(scope["path"], error.code, str(error))
            await send_json(send, 429, {**body, "quota": STREAM_QUOTA})
            return
        self._open[tenant] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self._open[tenant] -= 1
            if not self._open[tenant]:
                del self._open[tenant]
