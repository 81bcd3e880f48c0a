"""The HTTP server's connection handling, on a real loopback listener made as ``sbx serve`` makes
it (``socket.create_server``, whose ``proto`` is 0): no engine needed, the app is a stub."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator

import anyio
import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from orchestrator.http import HttpProtocol

pytestmark = pytest.mark.anyio

# A loopback request to a stub app answers in milliseconds; this only bounds a hang.
REQUEST_TIMEOUT = 10


async def hello(request: Request) -> Response:
    return JSONResponse({"hello": "world"})


@contextlib.asynccontextmanager
async def serving() -> AsyncIterator[tuple[uvicorn.Server, str]]:
    listener = socket.create_server(("127.0.0.1", 0))
    config = uvicorn.Config(
        Starlette(routes=[Route("/", hello)]), http=HttpProtocol, log_level="warning"
    )
    server = uvicorn.Server(config)
    port = listener.getsockname()[1]
    with listener:
        async with anyio.create_task_group() as group:
            group.start_soon(server.serve, [listener])
            try:
                yield server, f"http://127.0.0.1:{port}"
            finally:
                server.should_exit = True


async def test_every_accepted_connection_sends_without_delay() -> None:
    with anyio.fail_after(REQUEST_TIMEOUT):
        async with serving() as (server, url), httpx.AsyncClient(base_url=url) as http:
            assert (await http.get("/")).json() == {"hello": "world"}
            connections = list(server.server_state.connections)
            assert connections
            for connection in connections:
                sock = connection.transport.get_extra_info("socket")
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
