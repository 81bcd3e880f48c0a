"""The HTTP server's connection handling, on a real loopback listener made as ``sandhold serve``
makes it (``socket.create_server``, whose ``proto`` is 0): no engine needed, the app is a stub. The
limits under a flood are tested against ``sandhold serve`` itself
(tests/docker/test_serve_limits.py)."""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import AsyncIterator

import anyio
import anyio.abc
import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from orchestrator.http import HttpLimitsConfig, HttpServer

pytestmark = pytest.mark.anyio

# A loopback request to a stub app answers in milliseconds; this only bounds a hang.
REQUEST_TIMEOUT = 10


async def hello(request: Request) -> Response:
    return JSONResponse({"hello": "world"})


@contextlib.asynccontextmanager
async def serving(
    limits: HttpLimitsConfig | None = None,
) -> AsyncIterator[tuple[HttpServer, str]]:
    listener = socket.create_server(("127.0.0.1", 0))
    app = Starlette(routes=[Route("/", hello)])
    server = HttpServer(app, limits=limits or HttpLimitsConfig(), log_level="warning")
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


async def test_an_address_past_its_share_is_answered_429_and_closed() -> None:
    limits = HttpLimitsConfig(max_connections=10, max_connections_per_client=2)
    with anyio.fail_after(REQUEST_TIMEOUT):
        async with serving(limits) as (server, url):
            port = int(url.rsplit(":", 1)[1])
            held = [await anyio.connect_tcp("127.0.0.1", port) for _ in range(2)]
            refused = await anyio.connect_tcp("127.0.0.1", port)
            answer = b""
            with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
                while True:
                    answer += await refused.receive()
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 429 ")
            assert json.loads(body)["error_type"] == "rate_limited"
            # The two it holds still answer.
            await held[0].send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert b"200 OK" in await held[0].receive()
            for stream in [*held, refused]:
                await stream.aclose()
            assert server.connections.statistics()["refused"] == 1


async def test_a_request_head_trickled_past_the_header_timeout_is_cut() -> None:
    limits = HttpLimitsConfig(header_timeout=0.5, keep_alive_timeout=0.3)
    with anyio.fail_after(REQUEST_TIMEOUT):
        async with serving(limits) as (_, url):
            port = int(url.rsplit(":", 1)[1])
            async with await anyio.connect_tcp("127.0.0.1", port) as slow:
                await slow.send(b"GET / HTTP/1.1\r\n")
                await trickle_until_cut(slow)


async def trickle_until_cut(stream: anyio.abc.SocketStream) -> None:
    """A slowloris client: one header byte every 0.1 s, never the end of the head; returns once
    the server has closed the connection (and never answered it)."""
    try:
        while True:
            await stream.send(b"X")
            with anyio.move_on_after(0.1):
                assert not await stream.receive()
    except (anyio.EndOfStream, anyio.BrokenResourceError):
        return
