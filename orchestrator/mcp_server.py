"""MCP over the tool layer: the four tools of ``orchestrator.tools``, with their exact JSON schemas,
served with the official ``mcp`` SDK over stdio (``sbx mcp``) or streamable HTTP (``sbx serve``).
No logic of its own: a call goes to ``Orchestrator.call`` and its ``ToolResult`` comes back as the
structured content (``success`` first; ``error_type`` and ``error_message`` on failure), its text
rendering as text content, and ``isError`` from ``is_error``: true only when the call itself
failed (``CALL_FAILURES``), never for what user code did (docs/tool-contract.md).

Public API:

- ``build_mcp_server(orchestrator, *, tenant)``: the SDK's low-level ``Server``.
- ``serve_stdio(orchestrator, *, tenant="local")``: serve one client on stdin/stdout until EOF
  (``run_stdio(server)`` does it for any server, the forwarding front of ``mcp_forward`` too).
  Stdin is read only once readable, never in a thread a cancel must wait for, so a signal
  handler can stop it while the client still holds the pipe open.
- ``streamable_http_app(orchestrator, *, tenant, host=...)``: a ``McpHttpApp``, an ASGI app that
  serves the MCP endpoint on whatever path routes to it, plus ``run()``, the lifespan that must be
  entered around serving (once per app). The HTTP layer mounts it at ``/mcp`` as a route, not a
  ``Mount`` (a Mount would answer ``/mcp`` with a redirect to ``/mcp/``)::

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
sbx sessions, addressed by ``session_id`` and owned by tenants, so nothing is gained by tying it to
an MCP session, and there is no MCP session id another key holder could reuse.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from contextvars import ContextVar
from typing import IO, TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from orchestrator.tools import TOOLS, Tool

if TYPE_CHECKING:
    from orchestrator.orchestrator import Orchestrator

__all__ = [
    "McpHttpApp",
    "TenantResolver",
    "build_mcp_server",
    "current_http_request",
    "mcp_tool",
    "run_stdio",
    "serve_stdio",
    "server_version",
    "streamable_http_app",
]

SERVER_NAME = "sbx"
INSTRUCTIONS = (
    "Hardened sandbox sessions, each its own container. Create one with python_repl execute, "
    "terminal run or terminal start without session_id; the answer carries the session_id to pass "
    "to every later call (files and process need it). End it with python_repl destroy. Every "
    "result is structured content with `success`, and `error_type`/`error_message` on failure."
)
UNKNOWN_TOOL = f"unknown tool; the tools are: {', '.join(TOOLS)}"
READ_ONLY_OPERATIONS_META = "sbx/readOnlyOperations"
# A stdin read asks for at most this much; a frame longer than this arrives in several reads.
STDIN_CHUNK_BYTES = 1 << 16
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})

TenantResolver = Callable[[], str | None]
"""Answers the tenant of the tool call being served, or None to refuse it (see the module doc)."""

_http_request: ContextVar[Request | None] = ContextVar("sbx_mcp_http_request", default=None)


def current_http_request() -> Request | None:
    """The HTTP request that carried the tool call being served; None on stdio or outside one."""
    return _http_request.get()


def build_mcp_server(orchestrator: Orchestrator, *, tenant: TenantResolver) -> Server[Any]:
    """An MCP server exposing the tools of ``orchestrator.tools`` on ``orchestrator``."""
    listing = types.ListToolsResult(tools=[mcp_tool(tool) for tool in TOOLS.values()])
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
        task = ctx.request.headers.get("x-sbx-task") if isinstance(ctx.request, Request) else None
        # Omitted arguments are an empty object: the tool layer then names the missing operation.
        arguments = params.arguments or {}
        result = await orchestrator.call(params.name, arguments, tenant=caller, task=task)
        if params.name not in TOOLS:  # called all the same, so the audit log records it
            raise MCPError(types.INVALID_PARAMS, UNKNOWN_TOOL)
        return types.CallToolResult(
            content=[types.TextContent(text=result.text)],
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
    """A tool of the contract as MCP lists it: schemas, title, hints (see ``Tool``), and the read
    operations under ``_meta``, since MCP's hints describe a whole tool."""
    return types.Tool(
        name=tool.name,
        title=tool.title or None,
        description=tool.description,
        input_schema=tool.input_schema(),
        output_schema=tool.output_schema(),
        annotations=types.ToolAnnotations(
            title=tool.title or None,
            read_only_hint=tool.read_only,
            destructive_hint=not tool.read_only,
            idempotent_hint=tool.idempotent,
            open_world_hint=tool.open_world,
        ),
        _meta={READ_ONLY_OPERATIONS_META: sorted(tool.read_only_operations)},
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


def server_version() -> str:
    """The version of sbx installed, as servers announce it."""
    try:
        return importlib.metadata.version("sbx")
    except importlib.metadata.PackageNotFoundError:
        return ""


# -- stdio ------------------------------------------------------------------------------------


async def serve_stdio(orchestrator: Orchestrator, *, tenant: str = "local") -> None:
    """Serve one MCP client on this process's stdin/stdout until stdin ends; every call is made
    as ``tenant``. While serving, fd 1 points at stderr so nothing but MCP frames reaches stdout."""
    await run_stdio(build_mcp_server(orchestrator, tenant=lambda: tenant))


async def run_stdio(server: Server[Any]) -> None:
    """Serve ``server`` to one MCP client on this process's stdin/stdout until stdin ends."""
    async with stdio_server(stdin=_StdinLines(sys.stdin)) as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


class _StdinLines(anyio.AsyncFile[str]):
    """fd 0 as lines for ``stdio_server``, read only once readable. The SDK's default reads in a
    worker thread, and a cancelled thread read is waited for: with the client's pipe still open,
    a SIGTERM would then hang until the next frame arrived."""

    def __init__(self, stdin: IO[str], fd: int = 0) -> None:
        super().__init__(stdin)
        self._fd = fd

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

    async def _read(self) -> bytes:
        try:
            await anyio.wait_readable(self._fd)
        except PermissionError:
            # A regular file or /dev/null cannot be polled, and never blocks a read either.
            await anyio.lowlevel.checkpoint()
        return os.read(self._fd, STDIN_CHUNK_BYTES)


# -- streamable HTTP --------------------------------------------------------------------------


class McpHttpApp:
    """The MCP streamable HTTP endpoint as an ASGI app; ``run()`` must be entered around serving."""

    def __init__(self, session_manager: StreamableHTTPSessionManager) -> None:
        self.session_manager = session_manager
        self._asgi = StreamableHTTPASGIApp(session_manager)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._asgi(scope, receive, send)

    @contextlib.asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        """The lifespan: requests are served only inside it; it can be entered once."""
        async with self.session_manager.run():
            yield


def streamable_http_app(
    orchestrator: Orchestrator, *, tenant: TenantResolver, host: str = "127.0.0.1"
) -> McpHttpApp:
    """The MCP endpoint for ``sbx serve``. ``host`` is the address the server listens on: on a
    loopback address, requests whose Host or Origin header names another site are refused (DNS
    rebinding); elsewhere the API key is what guards the endpoint."""
    security = None
    if host in LOOPBACK_HOSTS:
        security = TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
            allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
        )
    manager = StreamableHTTPSessionManager(
        app=build_mcp_server(orchestrator, tenant=tenant),
        stateless=True,
        security_settings=security,
    )
    return McpHttpApp(manager)
