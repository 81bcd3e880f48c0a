"""MCP over the tool layer: the four tools of ``orchestrator.tools``, with their exact JSON schemas,
served with the official ``mcp`` SDK over stdio (``sandhold mcp``) or streamable HTTP (``sandhold
serve``). No logic of its own: a call goes to ``Orchestrator.call`` and its ``ToolResult`` comes
back as the structured content (``success`` first; ``error_type`` and ``error_message`` on failure),
its text rendering as text content, and ``isError`` from ``is_error``: true only when the call
itself failed (``CALL_FAILURES``), never for what user code did (docs/tool-contract.md).

Public API:

- ``build_mcp_server(orchestrator, *, tenant, tools="all")``: the SDK's low-level ``Server``,
  listing the tool set ``tools`` (``orchestrator.tools.tool_set``: ``all``, or ``agent``, the
  compact set); a call reaches the whole tool whatever the set lists.
- ``serve_stdio(orchestrator, *, tenant="local", tools="all")``: serve one client on
  stdin/stdout until EOF (``run_stdio(server)`` does it for any server).
  Stdin is read only once readable, never in a thread a cancel must wait for, so a signal
  handler can stop it while the client still holds the pipe open.
- ``streamable_http_app(orchestrator, *, tenant, host=...)``: a ``McpHttpApp``, an ASGI app that
  serves the MCP endpoint on whatever path routes to it (``?tools=agent`` lists the agent set),
  plus ``run()``, the lifespan that must be entered around serving (once per app). The HTTP
  layer mounts it at ``/mcp`` as a route, not a ``Mount`` (a Mount would answer ``/mcp`` with a
  redirect to ``/mcp/``)::

      mcp = streamable_http_app(orchestrator, tenant=tenant_of_request)

      @contextlib.asynccontextmanager
      async def lifespan(app: Starlette) -> AsyncIterator[None]:
          async with mcp.run():
              yield

      app = Starlette(routes=[Route("/mcp", mcp), ...], lifespan=lifespan)

- ``current_http_request()``: the HTTP request carrying the tool call being served, for ``tenant``.

Tenants: ``tenant`` is called once per tool call (never for listings), in the task serving that
call, with ``current_http_request()`` set to the Starlette ``Request`` that carried it (None on
stdio). It answers the caller's tenant, or None when the request carries no valid credential: the
call is then refused with a JSON-RPC error and reaches nothing below. The HTTP layer answers 401
before a request gets here; this is the second lock, not the first. An API-key lookup plugs in as::

    def tenant_of_request() -> str | None:
        request = current_http_request()
        return keys.tenant_for(request.headers.get("authorization")) if request else None

The HTTP transport is stateless (a fresh MCP connection per POST): the state that matters lives in
sandhold sessions, addressed by ``session_id`` and owned by tenants, so nothing is gained by tying
it to an MCP session, and there is no MCP session id another key holder could reuse.
"""

from __future__ import annotations

import contextlib
import os
import sys
import urllib.parse
from collections.abc import AsyncIterator, Callable, Mapping
from contextvars import ContextVar
from typing import IO, TYPE_CHECKING, Any, Protocol, Self

import anyio
import anyio.lowlevel
import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp_types import JSONRPCError, JSONRPCResponse
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from orchestrator.mcp_server.handshake import INSTRUCTIONS, SERVER_NAME, EarlyAnswer, server_version
from orchestrator.mcp_server.output_relay import OutputRelay
from orchestrator.tools import DEFAULT_TOOL_SET, TOOL_SET_NAMES, TOOLS, Tool, tool_set

if TYPE_CHECKING:
    from mcp.server.context import CallNext, HandlerResult
    from mcp.shared._stream_protocols import WriteStream

    from orchestrator.tools import ToolResult

__all__ = [
    "McpHttpApp",
    "TenantResolver",
    "ToolCaller",
    "build_mcp_server",
    "current_http_request",
    "image_content",
    "mcp_tool",
    "run_stdio",
    "serve_stdio",
    "streamable_http_app",
]

UNKNOWN_TOOL = f"unknown tool; the tools are: {', '.join(TOOLS)}"
# A stdin read asks for at most this much; a frame longer than this arrives in several reads.
STDIN_CHUNK_BYTES = 1 << 16
IMAGE_MIME_TYPES = ("image/png", "image/jpeg")
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
# The query parameter of the HTTP endpoint that picks the tool set (``/mcp?tools=agent``).
TOOLS_QUERY = "tools"


class ToolCaller(Protocol):
    """What serving needs of the orchestrator: ``Orchestrator.call``. ``sandhold mcp`` passes one
    that waits for an orchestrator still starting (it answers ``initialize`` before that)."""

    async def call(
        self,
        tool: Any,
        arguments: Any,
        *,
        tenant: str | None = None,
        task: Any = None,
        on_stdout: Callable[[str], None] | None = None,
        on_stderr: Callable[[str], None] | None = None,
    ) -> ToolResult: ...


TenantResolver = Callable[[], str | None]
"""Answers the tenant of the tool call being served, or None to refuse it (see the module doc)."""

_http_request: ContextVar[Request | None] = ContextVar("sandhold_mcp_http_request", default=None)


def current_http_request() -> Request | None:
    """The HTTP request that carried the tool call being served; None on stdio or outside one."""
    return _http_request.get()


def image_content(structured: Mapping[str, Any]) -> list[types.ImageContent]:
    """The images among a call's rich results, as MCP image content, so a client that shows a
    model content blocks shows it the chart (the structured content has them too)."""
    images = []
    for bundle in structured.get("results") or ():
        if not isinstance(bundle, dict):
            continue
        for mime in IMAGE_MIME_TYPES:
            data = bundle.get(mime)
            if isinstance(data, str):
                images.append(types.ImageContent(data=data, mime_type=mime))
                break  # one picture per result, the first kind it has
    return images


def build_mcp_server(
    orchestrator: ToolCaller, *, tenant: TenantResolver, tools: str = DEFAULT_TOOL_SET
) -> Server[Any]:
    """An MCP server exposing the tools of ``orchestrator.tools`` on ``orchestrator``, listing
    the tool set ``tools`` (``orchestrator.tools.tool_set``; every call reaches the whole tool
    whatever the set)."""
    listing = types.ListToolsResult(tools=[mcp_tool(tool) for tool in tool_set(tools).values()])
    schemas = {tool.name: tool.input_schema for tool in listing.tools}

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return listing

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        caller = _resolve_tenant(tenant, ctx.request)
        # Over HTTP, a task scope may come with the call, as for the REST API.
        task = (
            ctx.request.headers.get("x-sandhold-task") if isinstance(ctx.request, Request) else None
        )
        # Omitted arguments are an empty object: the tool layer then names the missing operation.
        arguments = params.arguments or {}
        token = (ctx.meta or {}).get("progress_token")
        # Imported with the orchestrator by now; not at the top: ``sandhold mcp`` answers the
        # handshake before the image builder is imported.
        from orchestrator.images.progress import watching_builds

        async with OutputRelay.running(ctx.session, ctx.request_id, token) as relay:
            with watching_builds(relay):  # a template built on first use says so, as it goes
                result = await orchestrator.call(
                    params.name,
                    arguments,
                    tenant=caller,
                    task=task,
                    on_stdout=relay.stdout,
                    on_stderr=relay.stderr,
                )
        if params.name not in TOOLS:  # called all the same, so the audit log records it
            raise MCPError(types.INVALID_PARAMS, UNKNOWN_TOOL)
        return types.CallToolResult(
            content=[types.TextContent(text=result.text), *image_content(result.structured)],
            structured_content=result.structured,
            is_error=result.is_error,
        )

    def input_schema(name: str) -> Mapping[str, Any] | None:
        return schemas.get(name)

    return Server(
        SERVER_NAME,
        version=server_version(),
        instructions=INSTRUCTIONS,
        get_tool_input_schema=input_schema,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


def mcp_tool(tool: Tool) -> types.Tool:
    """A tool of the contract as MCP lists it: schemas, title and hints (see ``Tool``; its read
    operations are in the tool reference). A model reads the list on every turn, so a hint is
    sent only where it differs from MCP's default (not read-only, destructive, not idempotent,
    open world), no ``annotations`` when none does, and the title once."""
    hints = types.ToolAnnotations(
        read_only_hint=tool.read_only or None,
        destructive_hint=False if tool.read_only else None,
        idempotent_hint=tool.idempotent or None,
        open_world_hint=None if tool.open_world else False,
    )
    return types.Tool(
        name=tool.name,
        title=tool.title or None,
        description=tool.description,
        input_schema=tool.input_schema(),
        output_schema=tool.output_schema(),
        annotations=hints if hints.model_dump(exclude_none=True) else None,
    )


def _resolve_tenant(tenant: TenantResolver, request: object) -> str:
    token = _http_request.set(request if isinstance(request, Request) else None)
    try:
        caller = tenant()
    finally:
        _http_request.reset(token)
    if caller is None:
        raise MCPError(types.INVALID_REQUEST, "unauthenticated: no valid credential for this call")
    return caller


# -- stdio ------------------------------------------------------------------------------------


async def serve_stdio(
    orchestrator: ToolCaller,
    *,
    tenant: str = "local",
    tools: str = DEFAULT_TOOL_SET,
    answered: anyio.Event | None = None,
    early: EarlyAnswer | None = None,
) -> None:
    """Serve one MCP client on this process's stdin/stdout until stdin ends; every call is made
    as ``tenant``. While serving, fd 1 points at stderr so nothing but MCP frames reaches stdout.
    ``answered``, if given, is set once the first request (``initialize``) has been answered;
    ``early`` is what ``mcp_handshake.answer_initialize_early`` read and answered already;
    ``tools`` the tool set listed."""
    server = build_mcp_server(orchestrator, tenant=lambda: tenant, tools=tools)
    await run_stdio(server, answered=answered, early=early)


async def run_stdio(
    server: Server[Any],
    *,
    answered: anyio.Event | None = None,
    early: EarlyAnswer | None = None,
) -> None:
    """Serve ``server`` to one MCP client on this process's stdin/stdout until stdin ends. At
    EOF the calls still running are cancelled (a cell is interrupted, its state kept) and
    nothing more is written: the client has closed its side, and an answer written now would
    reach a client that no longer reads it (mcp 1.x clients then raise BrokenResourceError
    from their close instead of the timeout that made them close)."""
    early = early or EarlyAnswer()
    if answered is not None:
        server.middleware.append(_SetWhenAnswered(answered))
    stdin = _StdinLines(sys.stdin, prefix=early.consumed)
    async with stdio_server(stdin=stdin) as (read_stream, raw_write_stream):
        write_stream: WriteStream[SessionMessage] = _UntilEof(raw_write_stream, stdin.ended)
        if early.request_id is not None:
            write_stream = _DropAnswer(write_stream, early.request_id)
        async with anyio.create_task_group() as group:
            group.start_soon(_cancel_at, stdin.ended, group.cancel_scope)
            await server.run(read_stream, write_stream, server.create_initialization_options())
            group.cancel_scope.cancel()


async def _cancel_at(event: anyio.Event, scope: anyio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


class _UntilEof:
    """The write stream until stdin has ended; every write after that is dropped."""

    def __init__(self, inner: WriteStream[SessionMessage], ended: anyio.Event) -> None:
        self._inner = inner
        self._ended = ended

    async def send(self, item: SessionMessage, /) -> None:
        if not self._ended.is_set():
            await self._inner.send(item)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class _DropAnswer:
    """The write stream, less the SDK's answer to the request ``mcp_handshake`` answered."""

    def __init__(self, inner: WriteStream[SessionMessage], request_id: int | str) -> None:
        self._inner = inner
        self._request_id: int | str | None = request_id

    async def send(self, item: SessionMessage, /) -> None:
        message = item.message
        if (
            self._request_id is not None
            and isinstance(message, JSONRPCResponse | JSONRPCError)
            and message.id == self._request_id
        ):
            self._request_id = None  # only the first: a client may reuse an id later
            return
        await self._inner.send(item)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class _SetWhenAnswered:
    """Middleware: sets ``event`` once a request has been handled (its answer is on its way)."""

    def __init__(self, event: anyio.Event) -> None:
        self._event = event

    async def __call__(self, ctx: ServerRequestContext[Any], call_next: CallNext) -> HandlerResult:
        try:
            return await call_next(ctx)
        finally:
            self._event.set()


class _StdinLines(anyio.AsyncFile[str]):
    """fd 0 as lines for ``stdio_server``, read only once readable. The SDK's default reads in a
    worker thread, and a cancelled thread read is waited for: with the client's pipe still open,
    a SIGTERM would then hang until the next frame arrived."""

    def __init__(self, stdin: IO[str], fd: int = 0, *, prefix: bytes = b"") -> None:
        super().__init__(stdin)
        self._fd = fd
        self._prefix = prefix  # read from fd 0 before serving began, to be read again first
        self.ended = anyio.Event()  # set at EOF

    async def __aiter__(self) -> AsyncIterator[str]:
        pending: list[bytes] = []
        while chunk := await self._read():
            head, *rest = chunk.split(b"\n")
            pending.append(head)
            if not rest:
                continue
            # b"\n" never occurs inside a multi-byte UTF-8 sequence: lines decode one by one.
            for line in [b"".join(pending), *rest[:-1]]:
                yield line.decode("utf-8", errors="replace") + "\n"
            pending = [rest[-1]]
        if any(pending):
            yield b"".join(pending).decode("utf-8", errors="replace")
        self.ended.set()

    async def _read(self) -> bytes:
        if self._prefix:
            chunk, self._prefix = self._prefix, b""
            return chunk
        try:
            await anyio.wait_readable(self._fd)
        except PermissionError:
            # A regular file or /dev/null cannot be polled, and never blocks a read either.
            await anyio.lowlevel.checkpoint()
        return os.read(self._fd, STDIN_CHUNK_BYTES)


# -- streamable HTTP --------------------------------------------------------------------------


class McpHttpApp:
    """The MCP streamable HTTP endpoint as an ASGI app; ``run()`` must be entered around serving.
    The query ``?tools=NAME`` picks the tool set listed (``TOOL_SET_NAMES``; default ``all``),
    so each client chooses its own; another name is answered 400 ``invalid_argument``."""

    def __init__(self, session_managers: Mapping[str, StreamableHTTPSessionManager]) -> None:
        self.session_managers = dict(session_managers)
        self._asgi = {
            name: StreamableHTTPASGIApp(manager) for name, manager in session_managers.items()
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        query = urllib.parse.parse_qs(scope.get("query_string", b"").decode("latin-1"))
        name = query.get(TOOLS_QUERY, [DEFAULT_TOOL_SET])[-1]
        app = self._asgi.get(name)
        if app is None:
            known = ", ".join(self._asgi)
            refusal = JSONResponse(
                {
                    "error_type": "invalid_argument",
                    "error_message": f"unknown tool set {name!r}; the sets are: {known}",
                },
                status_code=400,
            )
            await refusal(scope, receive, send)
            return
        await app(scope, receive, send)

    @contextlib.asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        """The lifespan: requests are served only inside it; it can be entered once."""
        async with contextlib.AsyncExitStack() as stack:
            for manager in self.session_managers.values():
                await stack.enter_async_context(manager.run())
            yield


def streamable_http_app(
    orchestrator: ToolCaller, *, tenant: TenantResolver, host: str = "127.0.0.1"
) -> McpHttpApp:
    """The MCP endpoint for ``sandhold serve``. ``host`` is the address the server listens on: on a
    loopback address, requests whose Host or Origin header names another site are refused (DNS
    rebinding); elsewhere the API key is what guards the endpoint."""
    security = None
    if host in LOOPBACK_HOSTS:
        security = TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
            allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
        )
    managers = {
        name: StreamableHTTPSessionManager(
            app=build_mcp_server(orchestrator, tenant=tenant, tools=name),
            stateless=True,
            security_settings=security,
        )
        for name in TOOL_SET_NAMES
    }
    return McpHttpApp(managers)
