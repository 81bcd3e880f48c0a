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
from starlette.types import Scope

from orchestrator._api import Orchestrator
from orchestrator._core import TenantKeys, new_call_id
from orchestrator.errors import InvalidArgumentError, OrchestratorError
from orchestrator.http._auth import TENANT_SCOPE_KEY, current_tenant
from orchestrator.http._bodies import MAX_BODY_BYTES, BodyLimits
from orchestrator.http._disconnect import CancelOnDisconnect
from orchestrator.http._events import first_read, terminal_events
from orchestrator.http._execute_stream import BuildEvents, ExecuteEvents, wants_events
from orchestrator.http._front import BODY_SCOPE_KEY, Front, FrontDoor
from orchestrator.http._limits import HttpLimitsConfig
from orchestrator.http._openapi import openapi_document
from orchestrator.http._ops import OPS_AUDIT_PATH, OPS_POOLS_PATH, OPS_SESSIONS_PATH, OpsRoutes
from orchestrator.http._rest_surface import METRICS_PATH, RestSurface
from orchestrator.http._routes import EVENTS_PATH, REST_ROUTES, TASK_HEADER, RestRoute
from orchestrator.http._statuses import REST_STATUS, status_for
from orchestrator.http._ui import ui_routes
from orchestrator.images.progress import watching_builds
from orchestrator.mcp_server.server import current_http_request, streamable_http_app

log = logging.getLogger(__name__)

# REST's table (``_statuses``): failures of the request itself. Any other error_type (an
# exception raised by the user's code, timeout, validation...) is the tool's answer about the
# work, and comes with 200 like a success.
STATUS_BY_ERROR_TYPE: Final[Mapping[str, int]] = REST_STATUS


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


# The id of the call a REST answer is for: the one in its audit record and the server's log.
CALL_ID_HEADER = "x-sandhold-call-id"


class _Api:
    def __init__(self, orchestrator: Orchestrator) -> None:
        self.orchestrator = orchestrator
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
        # Bounded, decoded and depth-checked by the front door as it was read.
        return parse_json(await request.body())

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

        async def run(
            on_stdout: Callable[[str], None], on_stderr: Callable[[str], None], build: BuildEvents
        ) -> Any:
            # A template built on the session's first use says so as it goes (``build`` events).
            with watching_builds(build):
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
    """Requests refused by a route before a tool runs (a body not JSON, an unknown route):
    answered by the front door, counted and audited like its own refusals (a call that reached
    a tool is recorded by ``call()``)."""

    def __init__(self, front: Front, surface: RestSurface) -> None:
        self._front = front
        self._surface = surface

    async def orchestrator_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, OrchestratorError)
        body = request.scope.get(BODY_SCOPE_KEY)
        if body is not None and exc is body.refused:
            raise exc  # the door's own refusal: it answers it
        return await self._refuse(request, exc)

    async def http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        message = f"{exc.detail}: {request.method} {request.url.path}"
        error = {"error_type": "invalid_argument", "error_message": message}
        return await self._answer(request, exc.status_code, error)

    async def _refuse(self, request: Request, exc: OrchestratorError) -> Response:
        return await self._answer(request, status_for(exc, REST_STATUS), exc.to_dict())

    async def _answer(self, request: Request, status: int, error: dict[str, Any]) -> Response:
        await self._front.note_refusal(request.scope, status, str(error.get("error_type")))
        body, headers = self._surface.refusal(request.scope, status, error)
        extra = {k.decode("latin-1"): v.decode("latin-1") for k, v in headers}
        return JSONResponse(body, status_code=status, headers=extra)


async def _unexpected(request: Request, exc: Exception) -> Response:
    body = request.scope.get(BODY_SCOPE_KEY)
    if body is not None and exc is body.refused:
        raise exc  # the front door's refusal, raised through the app: it answers it
    log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return answer({"success": False, "error_type": "internal", "error_message": "internal error"})


def _is_rest_call(scope: Scope) -> bool:
    """A REST request, which a dropped connection cancels (MCP's SDK and the event stream watch
    their own connections)."""
    return str(scope["path"]).startswith("/v1/") and not RestSurface().is_stream(scope)


def _mcp_tenant() -> str | None:
    """The MCP server's tenant callable: the tenant the front door put on the request."""
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
    front: Front | None = None,
) -> FrontDoor:
    """The HTTP API, and MCP at ``/mcp``, over ``orchestrator`` (which the caller starts and
    closes). ``host`` is where it listens: on loopback, MCP refuses requests naming other hosts
    (DNS rebinding). The app's lifespan must run (uvicorn runs it) for ``/mcp`` to answer.
    ``limits``: the wrong keys an address may present, the streams a tenant may hold (the
    connection limits are the server's, ``HttpServer``). ``front``: the front door this app
    shares with the server's other surfaces (by default its own)."""
    if front is None:
        front = Front(
            keys,
            limits=limits,
            metrics=orchestrator.metrics,
            audit=lambda: orchestrator.audit_log,
        )
    api = _Api(orchestrator)
    ops = OpsRoutes(orchestrator, keys)
    routes: list[BaseRoute] = [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/openapi.json", api.openapi, methods=["GET"]),
        Route(METRICS_PATH, ops.metrics, methods=["GET"]),
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

    surface = RestSurface(
        BodyLimits(max_raw_bytes=max_body_bytes, max_decoded_bytes=max_body_bytes)
    )
    refusals = _Refusals(front, surface)
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={
            OrchestratorError: refusals.orchestrator_error,
            HTTPException: refusals.http_error,
            Exception: _unexpected,
        },
    )
    return front.door(surface, CancelOnDisconnect(app, _is_rest_call))
