"""The Starlette app: routes that turn a request into ``Orchestrator.call`` and its structured
result into a response; the body is always that result, the status says what kind of answer it
is (``STATUS_BY_ERROR_TYPE``)."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Final

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Scope

from orchestrator._api import Orchestrator
from orchestrator._core.call_context import new_call_id
from orchestrator._core.tenants import TenantKeys
from orchestrator.errors import BodyTooLargeError, InvalidArgumentError, OrchestratorError
from orchestrator.http._auth import TENANT_SCOPE_KEY, BearerAuth, current_tenant
from orchestrator.http._disconnect import CancelOnDisconnect
from orchestrator.http._events import first_read, terminal_events
from orchestrator.http._execute_stream import ExecuteEvents, wants_events
from orchestrator.http._limits import HttpLimitsConfig
from orchestrator.http._openapi import openapi_document
from orchestrator.http._ops import OPS_AUDIT_PATH, OPS_POOLS_PATH, OPS_SESSIONS_PATH, OpsRoutes
from orchestrator.http._routes import EVENTS_PATH, REST_ROUTES, TASK_HEADER, RestRoute
from orchestrator.http._streams import StreamLimit, is_stream
from orchestrator.http._ui import ui_routes
from orchestrator.mcp_server.server import current_http_request, streamable_http_app

log = logging.getLogger(__name__)

# A file of the largest size a policy allows by default (10 MiB) is ~14 MiB as base64.
MAX_BODY_BYTES: Final = 32 * 1024 * 1024

# Failures of the request itself. Any other error_type (an exception raised by the user's code,
# timeout, validation, import_blocked, process_crashed, output_limit) is the tool's answer
# about the work, and comes with 200 like a success.
STATUS_BY_ERROR_TYPE: Final[Mapping[str, int]] = {
    "invalid_argument": 400,
    "unknown_template": 400,
    "policy": 403,
    "session_not_found": 404,
    # Gone: the session existed and ended without being asked to (its container died).
    "session_lost": 410,
    "busy": 409,
    "quota_exceeded": 429,
    "internal": 500,
    "backend_unavailable": 503,
    "template_not_built": 503,
    # Insufficient Storage: the server's own data directory is full.
    "storage_full": 507,
}


def status_of(structured: Mapping[str, Any]) -> int:
    if structured.get("success"):
        return 200
    return STATUS_BY_ERROR_TYPE.get(str(structured.get("error_type")), 200)


def answer(structured: Mapping[str, Any], status: int | None = None) -> Response:
    return JSONResponse(dict(structured), status_code=status or status_of(structured))


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_json(raw: bytes) -> Any:
    try:
        value = json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant)
        # A lone surrogate ("\\ud800") parses, but is no text that could go anywhere.
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeError:
        raise InvalidArgumentError("the request body is not UTF-8 text") from None
    except RecursionError:
        raise InvalidArgumentError("the request body is nested too deeply") from None
    except ValueError as exc:  # json.JSONDecodeError included
        raise InvalidArgumentError(f"the request body is not valid JSON: {exc}") from None
    return value


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLargeError(f"the request body is larger than {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLargeError(f"the request body is larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


# The id of the call a REST answer is for: the one in its audit record and the server's log.
CALL_ID_HEADER = "x-sandhold-call-id"


class _Api:
    def __init__(self, orchestrator: Orchestrator, max_body_bytes: int) -> None:
        self.orchestrator = orchestrator
        self.max_body_bytes = max_body_bytes
        self.document = openapi_document()

    async def _call(self, request: Request, tool: str, arguments: Any) -> Response:
        tenant = request.scope[TENANT_SCOPE_KEY]
        task = request.headers.get(TASK_HEADER)
        call_id = new_call_id()
        result = await self.orchestrator.call(
            tool, arguments, tenant=tenant, task=task, call_id=call_id
        )
        response = answer(result.structured)
        response.headers[CALL_ID_HEADER] = call_id
        return response

    async def _json_body(self, request: Request) -> Any:
        return parse_json(await read_body(request, self.max_body_bytes))

    async def tool(self, request: Request) -> Response:
        body = await self._json_body(request)
        return await self._call(request, request.path_params["tool"], body)

    def rest(self, route: RestRoute) -> Callable[[Request], Awaitable[Response]]:
        streams = route.tool == "python_repl" and route.operation == "execute"

        async def endpoint(request: Request) -> Response:
            body = await self._json_body(request) if route.body else None
            query = dict(request.query_params)
            arguments = route.arguments(request.path_params, query, body)
            if streams and wants_events(request.headers.get("accept")):
                return self._streamed_call(request, route.tool, arguments)
            return await self._call(request, route.tool, arguments)

        return endpoint

    def _streamed_call(self, request: Request, tool: str, arguments: Any) -> Response:
        """The call answered as server-sent events: its output as it comes, then its result."""
        tenant = request.scope[TENANT_SCOPE_KEY]
        task = request.headers.get(TASK_HEADER)
        call_id = new_call_id()

        async def run(on_stdout: Callable[[str], None], on_stderr: Callable[[str], None]) -> Any:
            return await self.orchestrator.call(
                tool,
                arguments,
                tenant=tenant,
                task=task,
                call_id=call_id,
                on_stdout=on_stdout,
                on_stderr=on_stderr,
            )

        return ExecuteEvents(run, {CALL_ID_HEADER: call_id})

    async def events(self, request: Request) -> Response:
        tenant = request.scope[TENANT_SCOPE_KEY]
        terminal_id = request.path_params["terminal_id"]
        since = request.query_params.get("since_offset") or request.headers.get("last-event-id")
        task = request.headers.get(TASK_HEADER)
        first = await first_read(self.orchestrator, tenant, task, terminal_id, since)
        if first.is_error:
            return answer(first.structured)
        stream = terminal_events(self.orchestrator, tenant, task, terminal_id, first.structured)
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(stream, media_type="text/event-stream", headers=headers)

    async def openapi(self, request: Request) -> Response:
        return JSONResponse(self.document)


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


class _Refusals:
    """Requests refused before a tool runs (a body too large or not JSON, an unknown route):
    answered with their error, counted in the metrics, and recorded in the audit log for the
    tenant whose key made them (a call that reached a tool is recorded by ``call()``)."""

    def __init__(self, orchestrator: Orchestrator) -> None:
        self._orchestrator = orchestrator

    async def orchestrator_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, OrchestratorError)
        status = 413 if isinstance(exc, BodyTooLargeError) else STATUS_BY_ERROR_TYPE.get(exc.code)
        return await self._refuse(request, {"success": False, **exc.to_dict()}, status or 500)

    async def http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        message = f"{exc.detail}: {request.method} {request.url.path}"
        body = {"success": False, "error_type": "invalid_argument", "error_message": message}
        return await self._refuse(request, body, exc.status_code)

    async def _refuse(self, request: Request, body: dict[str, Any], status: int) -> Response:
        self._orchestrator.metrics.http_refusals.labels(str(status)).inc()
        audit, tenant = self._orchestrator.audit_log, request.scope.get(TENANT_SCOPE_KEY)
        if audit is not None and isinstance(tenant, str):
            details = {"method": request.method, "path": request.url.path[:200], "status": status}
            try:
                await audit.record(
                    tenant=tenant, task=None, tool="http",
                    operation="refuse", session_id=None, arguments={}, success=False,
                    error_type=str(body.get("error_type")), duration_ms=0.0, details=details,
                )  # fmt: skip
            except OrchestratorError as error:
                log.error("audit log could not record a refused request: %s", error)
        return answer(body, status)


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return answer({"success": False, "error_type": "internal", "error_message": "internal error"})


def _is_rest_call(scope: Scope) -> bool:
    """A REST request, which a dropped connection cancels (MCP's SDK and the event stream watch
    their own connections)."""
    return str(scope["path"]).startswith("/v1/") and not is_stream(scope)


def _mcp_tenant() -> str | None:
    """The MCP server's tenant callable: the tenant ``BearerAuth`` put on the request."""
    request = current_http_request()
    if request is None:
        return current_tenant()
    tenant = request.scope.get(TENANT_SCOPE_KEY)
    return tenant if isinstance(tenant, str) else None


def build_app(
    orchestrator: Orchestrator,
    keys: TenantKeys,
    *,
    host: str = "127.0.0.1",
    max_body_bytes: int = MAX_BODY_BYTES,
    mcp: bool = True,
    limits: HttpLimitsConfig | None = None,
) -> ASGIApp:
    """The HTTP API, and MCP at ``/mcp``, over ``orchestrator`` (which the caller starts and
    closes). ``host`` is where it listens: on loopback, MCP refuses requests naming other hosts
    (DNS rebinding). The app's lifespan must run (uvicorn runs it) for ``/mcp`` to answer.
    ``limits``: the wrong keys an address may present, the streams a tenant may hold (the
    connection limits are the server's, ``HttpServer``)."""
    limits = limits or HttpLimitsConfig()
    api = _Api(orchestrator, max_body_bytes)
    ops = OpsRoutes(orchestrator)
    routes: list[BaseRoute] = [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/openapi.json", api.openapi, methods=["GET"]),
        Route("/metrics", ops.metrics, methods=["GET"]),
        Route("/readyz", ops.readyz, methods=["GET"]),
        Route(OPS_SESSIONS_PATH, ops.sessions, methods=["GET"]),
        Route(OPS_POOLS_PATH, ops.pools, methods=["GET"]),
        Route(OPS_AUDIT_PATH, ops.audit, methods=["GET"]),
        *ui_routes(),
        *(Route(r.path, api.rest(r), methods=[r.method]) for r in REST_ROUTES),
        Route(EVENTS_PATH, api.events, methods=["GET"]),
        Route("/v1/{tool}", api.tool, methods=["POST"]),
    ]
    mcp_app = streamable_http_app(orchestrator, tenant=_mcp_tenant, host=host) if mcp else None
    if mcp_app is not None:
        # A Route, not a Mount: a Mount would answer /mcp with a redirect to /mcp/.
        routes.append(Route("/mcp", mcp_app, methods=["GET", "POST", "DELETE"]))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            if mcp_app is not None:
                await stack.enter_async_context(mcp_app.run())
            yield

    refusals = _Refusals(orchestrator)
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={
            OrchestratorError: refusals.orchestrator_error,
            HTTPException: refusals.http_error,
            Exception: _unexpected,
        },
    )
    return BearerAuth(
        StreamLimit(
            CancelOnDisconnect(app, _is_rest_call),
            limits.max_streams_per_tenant,
            metrics=orchestrator.metrics,
        ),
        keys,
        failures_per_minute=limits.auth_failures_per_minute,
        audit=lambda: orchestrator.audit_log,
        metrics=orchestrator.metrics,
    )
