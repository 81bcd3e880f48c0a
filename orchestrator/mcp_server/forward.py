"""``sandhold mcp --connect URL``: MCP on stdio in front of a running ``sandhold serve``. Every
``tools/list`` and ``tools/call`` goes to the server's ``/mcp`` endpoint with an API key, and its
answer (or its JSON-RPC error) comes back unchanged; sessions live in the server, so they outlive
the stdio process. This is the set-up for clients that start a server per call
(langchain-mcp-adapters' ``get_tools()``): each process is cheap (no engine, no image, no
orchestrator), and the second one finds the sessions the first one made.

Public API:

- ``RemoteSandhold(url, *, key, task=None)``: the calls, one MCP client connection per call over a
  shared HTTP connection pool. A call that cannot reach the server answers the tool contract's
  ``backend_unavailable`` (``isError``), so the front keeps serving while the server restarts.
- ``serve_stdio_forwarding(remote)``: serve one stdio client through ``remote`` until EOF.
- ``mcp_endpoint(url)``: ``http://host:port`` (or ``.../mcp``) as the endpoint URL.

One client connection per call, not one for the process: the SDK's client ends itself on the
first transport failure, and the server's MCP endpoint is stateless anyway (each POST is a fresh
MCP connection there). After the first call the protocol version is known, so later calls adopt
it without a discovery round trip.
"""

from __future__ import annotations

import contextlib
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server import Server, ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from orchestrator.errors import InvalidArgumentError
from orchestrator.mcp_server.handshake import INSTRUCTIONS, SERVER_NAME, EarlyAnswer, server_version
from orchestrator.mcp_server.server import run_stdio
from orchestrator.tools._text import render_text

__all__ = ["RemoteSandhold", "mcp_endpoint", "serve_stdio_forwarding"]

# Reaching the server and sending a request take at most this long on any network a person
# would point this at; an answer may take as long as its cell (see ``answer_timeout``).
CONNECT_TIMEOUT = 10.0
# The longest silence to wait through for an answer: the default policy's longest command
# (300 s) and a margin; a call that names a longer timeout_s gets that plus the margin.
ANSWER_TIMEOUT = 330.0
ANSWER_MARGIN = 30.0
# A timeout_s beyond a day is refused by every policy; no wait is made longer than that.
MAX_TIMEOUT_S = 86_400.0
TASK_HEADER = "X-Sandhold-Task"


def mcp_endpoint(url: str) -> str:
    """The MCP endpoint of the server at ``url`` (``http(s)://host:port``, optionally ``/mcp``)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InvalidArgumentError(f"--connect must be http(s)://host:port, got {url!r}")
    path = parts.path.rstrip("/")
    if not path.endswith("/mcp"):
        path += "/mcp"
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def answer_timeout(arguments: dict[str, Any]) -> float:
    """How long to wait for the answer to a call that may itself wait ``timeout_s``."""
    given = arguments.get("timeout_s")
    if isinstance(given, int | float) and not isinstance(given, bool) and given > 0:
        return max(ANSWER_TIMEOUT, min(float(given), MAX_TIMEOUT_S) + ANSWER_MARGIN)
    return ANSWER_TIMEOUT


class RemoteSandhold:
    """The tools of the ``sandhold serve`` at ``url``, called with ``key`` (and ``task``, if
    any)."""

    def __init__(self, url: str, *, key: str, task: str | None = None) -> None:
        self.endpoint = mcp_endpoint(url)
        self._headers = {"Authorization": f"Bearer {key}"}
        if task:
            self._headers[TASK_HEADER] = task
        self._http: httpx2.AsyncClient | None = None
        self._mode = "auto"

    @contextlib.asynccontextmanager
    async def open(self) -> AsyncIterator[RemoteSandhold]:
        """The HTTP connection pool, for as long as the front serves."""
        timeout = httpx2.Timeout(CONNECT_TIMEOUT, read=None)  # reads: bounded per call
        async with httpx2.AsyncClient(headers=self._headers, timeout=timeout) as http:
            self._http = http
            try:
                yield self
            finally:
                self._http = None

    async def list_tools(self) -> types.ListToolsResult:
        try:
            async with self._client() as client:
                return await client.list_tools()
        except Exception as exc:
            failure = _leaf(exc)
            if _is_transport(failure):
                raise MCPError(types.INTERNAL_ERROR, self._cannot_reach(failure)) from None
            raise failure from None

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        try:
            async with self._client() as client:
                timeout = answer_timeout(arguments)
                return await client.call_tool(name, arguments, read_timeout_seconds=timeout)
        except Exception as exc:
            failure = _leaf(exc)
            if _is_transport(failure):
                return self._unavailable(name, arguments, failure)
            raise failure from None

    @contextlib.asynccontextmanager
    async def _client(self) -> AsyncIterator[Client]:
        if self._http is None:
            raise RuntimeError("RemoteSandhold.open() must be entered first")
        transport = streamable_http_client(self.endpoint, http_client=self._http)
        async with Client(transport, mode=self._mode) as client:
            if client.protocol_version in MODERN_PROTOCOL_VERSIONS:
                self._mode = client.protocol_version
            yield client

    def _cannot_reach(self, exc: Exception) -> str:
        return f"cannot reach sandhold at {self.endpoint}: {exc or type(exc).__name__}"

    def _unavailable(
        self, name: str, arguments: dict[str, Any], exc: Exception
    ) -> types.CallToolResult:
        operation = arguments.get("operation")
        structured = {
            "success": False,
            "operation": operation if isinstance(operation, str) else None,
            "error_type": "backend_unavailable",
            "error_message": self._cannot_reach(exc),
        }
        return types.CallToolResult(
            content=[types.TextContent(text=render_text(name, structured))],
            structured_content=structured,
            is_error=True,
        )


def _leaf(exc: Exception) -> Exception:
    """The one failure inside the SDK's task-group exception groups: an MCP error from the
    server then passes through as itself (the same JSON-RPC error a direct client gets)."""
    while isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _is_transport(exc: Exception) -> bool:
    return isinstance(exc, httpx2.TransportError | OSError)


def build_forwarding_server(remote: RemoteSandhold) -> Server[Any]:
    """An MCP server whose every listing and call is ``remote``'s."""

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return await remote.list_tools()

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        return await remote.call_tool(params.name, params.arguments or {})

    return Server(
        SERVER_NAME,
        version=server_version(),
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


async def serve_stdio_forwarding(
    remote: RemoteSandhold, *, early: EarlyAnswer | None = None
) -> None:
    """Serve one MCP client on stdin/stdout through ``remote`` until stdin ends; ``early`` is
    what ``mcp_handshake.answer_initialize_early`` read and answered already."""
    async with remote.open():
        await run_stdio(build_forwarding_server(remote), early=early)
