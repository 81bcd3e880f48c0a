"""How ``sbx serve`` holds its TCP connections: uvicorn's HTTP/1.1 protocol, with ``TCP_NODELAY``
set on every connection it accepts.

Why: a listener made by ``socket.create_server`` has ``proto`` 0, so the sockets it accepts have
it too, and asyncio sets ``TCP_NODELAY`` only on sockets whose ``proto`` is TCP. Without it,
Nagle's algorithm holds the last segment of a response until the client's delayed ACK (~40 ms)
on every kept-alive connection: ``/healthz`` took 44 ms, an execute 48 ms against 1.4 ms over
stdio (``bench/http_latency.py``).
"""

from __future__ import annotations

import asyncio
import socket

from uvicorn.protocols.http.h11_impl import H11Protocol


def set_nodelay(transport: asyncio.BaseTransport) -> None:
    """Send each write at once (no Nagle) on a TCP transport; anything else is left alone."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class HttpProtocol(H11Protocol):
    """uvicorn's h11 protocol (pinned, whatever else is installed) on a no-delay connection."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        set_nodelay(transport)
        super().connection_made(transport)
