"""The MCP streamable HTTP app, served by uvicorn on loopback and driven by the MCP SDK's own
client, against real containers: the same listing, scenario and wrong arguments as over stdio,
and every call made as the tenant its own HTTP request resolves to."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator, Callable

import anyio
import httpx2
import pytest
import uvicorn
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client
from starlette.applications import Starlette
from starlette.routing import Route

from orchestrator._api import Orchestrator
from orchestrator.images import ImageBuildResult
from orchestrator.mcp_server.server import McpHttpApp, current_http_request, streamable_http_app
from tests.docker.test_mcp_stdio import (
    SCENARIO_TIMEOUT,
    check_tool_listing,
    check_wrong_arguments,
    ok,
    run_scenario,
)
from tests.docker.test_python_repl import config

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

TENANT = "http-tenant"
# uvicorn waits this long for open connections when the test stops it.
GRACEFUL_SHUTDOWN_TIMEOUT = 5
# Generous for a call that creates a session on a loaded machine; the scenario has its own bound.
HTTP_TIMEOUT = 60.0


@pytest.fixture
async def orch(worker_image: ImageBuildResult) -> AsyncIterator[Orchestrator]:
    async with Orchestrator(config(worker_image.tag)) as orchestrator:
        yield orchestrator


def http_app(mcp: McpHttpApp) -> Starlette:
    """The app as the HTTP layer is told to build it: a route at /mcp, the lifespan around it."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with mcp.run():
            yield

    return Starlette(routes=[Route("/mcp", mcp)], lifespan=lifespan)


@contextlib.asynccontextmanager
async def serving(
    orchestrator: Orchestrator, tenant: Callable[[], str | None]
) -> AsyncIterator[str]:
    """uvicorn on a loopback port bound before it starts (so no wait for readiness); the URL."""
    app = http_app(streamable_http_app(orchestrator, tenant=tenant))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_level="warning",
            lifespan="on",
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_TIMEOUT,
        )
    )
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(server.serve, [sock])
            try:
                yield f"http://127.0.0.1:{port}/mcp"
            finally:
                server.should_exit = True
    finally:
        sock.close()


def client_with_key(url: str, key: str | None) -> contextlib.AbstractAsyncContextManager[Client]:
    @contextlib.asynccontextmanager
    async def connect() -> AsyncIterator[Client]:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=HTTP_TIMEOUT) as http,
            Client(streamable_http_client(url, http_client=http)) as client,
        ):
            yield client

    return connect()


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_the_scenario_runs_over_streamable_http_as_the_resolved_tenant(
    orch: Orchestrator, mode: str
) -> None:
    with anyio.fail_after(SCENARIO_TIMEOUT):
        async with serving(orch, lambda: TENANT) as url, Client(url, mode=mode) as client:
            await check_tool_listing(client)
            await run_scenario(client)
            await check_wrong_arguments(client)
            kept = await ok(client, "python_repl", operation="execute", code="1")
            owned = [s["session_id"] for s in orch.list_sessions(tenant=TENANT)]
            assert owned == [kept["session_id"]]
            assert orch.list_sessions() == []  # nothing was made as the orchestrator's own tenant


async def test_each_call_is_made_as_the_tenant_its_http_request_resolves_to(
    orch: Orchestrator,
) -> None:
    tenants = {"Bearer key-a": "alice", "Bearer key-b": "bob"}

    def tenant_of_request() -> str | None:
        request = current_http_request()
        assert request is not None
        return tenants.get(request.headers.get("authorization", ""))

    with anyio.fail_after(SCENARIO_TIMEOUT):
        async with (
            serving(orch, tenant_of_request) as url,
            client_with_key(url, "key-a") as alice,
            client_with_key(url, "key-b") as bob,
            client_with_key(url, "wrong") as nobody,
        ):
            sid = (await ok(alice, "python_repl", operation="execute", code="x = 1"))["session_id"]
            theirs = await bob.call_tool(
                "python_repl", {"operation": "execute", "session_id": sid, "code": "x"}
            )
            assert theirs.is_error and isinstance(theirs.structured_content, dict)
            assert theirs.structured_content["error_type"] == "session_not_found"
            with pytest.raises(MCPError, match="unauthenticated"):
                await nobody.call_tool("python_repl", {"operation": "list_sessions"})
            assert [s["session_id"] for s in orch.list_sessions(tenant="alice")] == [sid]
            assert orch.list_sessions(tenant="bob") == []
