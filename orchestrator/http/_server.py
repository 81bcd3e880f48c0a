"""The HTTP server of ``sandhold serve``: uvicorn's request handling behind an accept loop of our
own, which holds every connection to the limits of ``HttpLimitsConfig`` (see ``_connections``).

Why an accept loop of our own: asyncio's, when the process runs out of descriptors, logs a
traceback and retries every second for as long as that lasts (one attack grew a log to 85 MB),
and it takes every connection it is offered. This one refuses an address past its share with
a 429 written straight to the socket, takes an idle connection's place at capacity, stops
accepting while every connection is in a request (the kernel's backlog holds the rest), and,
out of descriptors, lowers its capacity and pauses instead of logging tracebacks.

``TCP_NODELAY`` is set on every connection: a listener made by ``socket.create_server`` has
``proto`` 0, so asyncio never sets it, and Nagle's algorithm held the end of each response for
the client's delayed ACK: ~44 ms per response on a kept-alive connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import math
import socket
import struct
import sys
import time
from collections.abc import Callable
from typing import Any, Final, cast

import uvicorn
from uvicorn.config import STARTUP_FAILURE
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from orchestrator.http._connections import Connection, ConnectionTable, Refusal, Room
from orchestrator.http._limits import HttpLimitsConfig

log = logging.getLogger(__name__)

# Connections taken per readiness callback: asyncio's own batch size, bounded so that the
# requests already in hand are served between batches.
ACCEPT_BATCH: Final = 128
# How long accepting pauses once descriptors ran out (asyncio's own delay): a connection that
# ends or is evicted frees one sooner, and then accepting resumes at once.
ACCEPT_RETRY_DELAY: Final = 1.0
# How often idle deadlines are checked: every timeout holds to within this.
SWEEP_INTERVAL: Final = 0.5
# accept() failing for want of descriptors or memory: the process, not the client, is short.
OUT_OF_RESOURCES: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# accept() failing for one connection that went away first; the next may be fine.
CONNECTION_GONE: Final = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EPERM})


def set_nodelay(transport: asyncio.BaseTransport) -> None:
    """Send each write at once (no Nagle) on a TCP transport; anything else is left alone."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _canned(status: int, reason: str, error_type: str, message: str) -> bytes:
    """A whole response, written to a socket no protocol was made for; the connection closes."""
    body = json.dumps({"success": False, "error_type": error_type, "error_message": message})
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\nretry-after: 1\r\n\r\n"
    )
    return (head + body).encode()


TOO_MANY_FROM_CLIENT: Final = _canned(
    429, "Too Many Requests", "rate_limited", Refusal.CLIENT_SHARE.value
)
ALL_BUSY: Final = _canned(
    503, "Service Unavailable", "busy", "every connection this server holds is in a request"
)


def _refuse(sock: socket.socket, response: bytes) -> None:
    """Answer and close without waiting: the response fits any socket buffer; what the client
    already sent is read first, so the close is a FIN and not a reset that could eat it."""
    with contextlib.suppress(OSError):
        sock.setblocking(False)
        sock.recv(65536)
    with contextlib.suppress(OSError):
        sock.send(response)
    sock.close()


class ConnectionReset(Exception):
    """Raised by an application in the middle of its response: the connection is reset (a TCP
    RST), not closed. A client reads a reset as the peer gone, a close mid-response as a
    malformed answer; E2B's SDK probes a sandbox's health only after the former, as its proxy
    resets the stream of a sandbox killed under a command."""


def reset(transport: asyncio.BaseTransport) -> None:
    """Drop the connection with a RST: no linger, then abort (no FIN, nothing flushed)."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    cast(asyncio.WriteTransport, transport).abort()


class HttpProtocol(H11Protocol):
    """uvicorn's h11 protocol (pinned, whatever else is installed) on a no-delay connection,
    telling the connection table when its connection goes into a request and out of it, and
    resetting it when the application raises ``ConnectionReset``."""

    def __init__(
        self,
        config: uvicorn.Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        connection: Connection | None = None,
        table: ConnectionTable | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._tracked = connection
        self._table = table
        self.app = self._resetting(self.app)

    def _resetting(self, app: Any) -> Any:
        async def resetting(scope: Any, receive: Any, send: Any) -> None:
            try:
                await app(scope, receive, send)
            except ConnectionReset:
                reset(self.transport)
                if self.cycle is not None:  # gone by our hand: uvicorn has nothing to close
                    self.cycle.disconnected = True

        return resetting

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        set_nodelay(transport)
        super().connection_made(transport)
        if self._tracked is not None and self._table is not None:
            self._table.attach(self._tracked, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self._tracked is not None and self._table is not None:
            self._table.release(self._tracked)

    def data_received(self, data: bytes) -> None:
        if self._tracked is not None and not self._tracked.busy:
            self._tracked.partial = True
        super().data_received(data)
        self._note()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._note()

    def _note(self) -> None:
        if self._tracked is not None and self._table is not None:
            in_request = self.cycle is not None and not self.cycle.response_complete
            self._table.note(self._tracked, busy=in_request)


class Acceptor(asyncio.AbstractServer):
    """Accepts on one listening socket into a ``ConnectionTable`` (which it sweeps)."""

    def __init__(
        self,
        listener: socket.socket,
        table: ConnectionTable,
        make_protocol: Callable[[Connection], asyncio.Protocol],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        listener.setblocking(False)
        self._listener = listener
        self._table = table
        self._make_protocol = make_protocol
        self._loop = loop
        self._pending: set[asyncio.Task[None]] = set()
        self._reading = self._closed = self._waiting_for_room = False
        self._short_of_descriptors = False
        self._retry: asyncio.TimerHandle | None = None
        self._closed_event = asyncio.Event()
        self._sweeper = loop.call_later(SWEEP_INTERVAL, self._sweep)
        table.on_release = self._room_made
        self._resume()

    def _resume(self) -> None:
        self._retry = None
        if not self._closed and not self._reading:
            self._loop.add_reader(self._listener.fileno(), self._on_readable)
            self._reading = True

    def _pause(self) -> None:
        if self._reading:
            self._loop.remove_reader(self._listener.fileno())
            self._reading = False

    def _room_made(self) -> None:
        if self._waiting_for_room:
            self._waiting_for_room = False
            self._resume()

    def _on_readable(self) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                sock, address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno not in CONNECTION_GONE:
                    self._accept_failed(exc)
                    return
                continue
            self._short_of_descriptors = False
            room = self._admit(sock, address)
            if room is Room.NONE:
                self._pause()
                self._waiting_for_room = True
                return
            if room is Room.MADE:
                # The evicted one's descriptor is freed when the loop next turns: one eviction
                # per turn keeps the descriptors in use at the capacity, and the listener
                # stays readable, so accepting resumes at once.
                return

    def _admit(self, sock: socket.socket, address: Any) -> Room | None:
        """Hold the connection, answer it 429 (its address is past its share) or 503 (every
        connection is in a request); what making room for it took (None: refused first)."""
        client = str(address[0]) if isinstance(address, tuple) else "local"
        if self._table.over_share(client):
            log.warning("refused a connection from %s: %s", client, Refusal.CLIENT_SHARE.value)
            _refuse(sock, TOO_MANY_FROM_CLIENT)
            return None
        room = self._table.make_room()
        admitted = self._table.admit(client) if room is not Room.NONE else None
        if not isinstance(admitted, Connection):
            _refuse(sock, ALL_BUSY)
            return Room.NONE
        task = self._loop.create_task(self._connect(sock, admitted))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return room

    async def _connect(self, sock: socket.socket, connection: Connection) -> None:
        try:
            await self._loop.connect_accepted_socket(lambda: self._make_protocol(connection), sock)
        except OSError:  # the client went away before its transport was made
            self._table.release(connection)
            sock.close()

    def _accept_failed(self, exc: OSError) -> None:
        """Pause instead of spinning or logging a traceback per attempt; out of descriptors, also
        hold fewer connections from now on, so it does not happen again."""
        self._pause()
        if exc.errno in OUT_OF_RESOURCES:
            if not self._short_of_descriptors:
                self._short_of_descriptors = True
                held = len(self._table)
                self._table.shrink()
                log.warning(
                    "out of descriptors with %d connections open (%s): holding at most %d from "
                    "now on; accepting again within %.1f s",
                    held, exc.strerror, self._table.capacity, ACCEPT_RETRY_DELAY,
                )  # fmt: skip
            self._waiting_for_room = True
        else:
            log.warning("accepting a connection failed (%s); retrying", exc)
        self._retry = self._loop.call_later(ACCEPT_RETRY_DELAY, self._resume)

    def _sweep(self) -> None:
        self._table.expire()
        self._sweeper = self._loop.call_later(SWEEP_INTERVAL, self._sweep)

    # asyncio.AbstractServer (uvicorn's shutdown calls close and wait_closed)
    def close(self) -> None:
        self._closed = True
        self._closed_event.set()
        self._pause()
        self._sweeper.cancel()
        if self._retry is not None:
            self._retry.cancel()

    async def wait_closed(self) -> None:
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def is_serving(self) -> bool:
        return not self._closed

    async def start_serving(self) -> None:
        self._resume()

    async def serve_forever(self) -> None:
        await self._closed_event.wait()


class HttpServer(uvicorn.Server):
    """uvicorn serving ``app`` on the listening sockets given to ``serve``, within ``limits``."""

    def __init__(self, app: Any, *, limits: HttpLimitsConfig, **options: Any) -> None:
        config = uvicorn.Config(
            app,
            http=HttpProtocol,
            ws="none",
            # Limits are per connecting address: a header anyone can send must not choose
            # whose share a connection spends.
            proxy_headers=False,
            timeout_keep_alive=math.ceil(limits.keep_alive_timeout),
            **options,
        )
        super().__init__(config)
        self.limits = limits
        self.connections = ConnectionTable(limits, time.monotonic)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        if not sockets:
            raise ValueError("HttpServer serves the listening sockets it is given")
        await self.lifespan.startup()
        if self.lifespan.should_exit:
            sys.exit(STARTUP_FAILURE)
        loop = asyncio.get_running_loop()
        acceptors = [Acceptor(sock, self.connections, self._protocol, loop) for sock in sockets]
        self.servers = cast(list[asyncio.base_events.Server], acceptors)
        self.started = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        log.info("connections: %s", json.dumps(self.connections.statistics()))
        await super().shutdown(sockets)

    def _protocol(self, connection: Connection) -> HttpProtocol:
        return HttpProtocol(
            config=self.config,
            server_state=self.server_state,
            app_state=self.lifespan.state,
            connection=connection,
            table=self.connections,
        )
