"""A REST request whose client goes away is cancelled: uvicorn reports the lost connection only
to an app that calls ``receive()`` again, and a handler in ``Orchestrator.call`` never does, so
without this a dropped request ran its cell to the cell's timeout and the session's next call
waited for it. Cancelling the handler cancels the call, which interrupts its cell as a timeout
would (state kept), the way a cancelled MCP request does.

Invariants: one task (the pump) is the only reader of the server's ``receive``; it hands the
body on through a one-message buffer, so the app's reads keep their back-pressure, and after the
last body message it only waits for ``http.disconnect``. A disconnect before the app has sent the
end of its response cancels the app; one after (uvicorn reports a finished response as a
disconnect) changes nothing. The app's own exceptions leave as they are.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# One body message waits for the app while the pump reads the next: the pump keeps running
# while an app reads its body, and a body is never buffered whole here.
BODY_BUFFER_MESSAGES: Final = 1
DISCONNECT: Final[Message] = {"type": "http.disconnect"}


def _is_last_body(message: Message) -> bool:
    return message["type"] != "http.request" or not message.get("more_body", False)


class CancelOnDisconnect:
    """ASGI middleware: the handling of a request that ``applies`` is cancelled when its client
    disconnects before the response ends."""

    def __init__(self, app: ASGIApp, applies: Callable[[Scope], bool]) -> None:
        self.app = app
        self.applies = applies

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.applies(scope):
            await self.app(scope, receive, send)
            return
        await _Watched(self.app).run(scope, receive, send)


class _Watched:
    """One request: the app's call, and the pump that watches its connection."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.responded = False
        self.disconnected = anyio.Event()

    async def run(self, scope: Scope, receive: Receive, send: Send) -> None:
        sender, receiver = anyio.create_memory_object_stream[Message](BODY_BUFFER_MESSAGES)

        async def app_receive() -> Message:
            return await self._app_receive(receiver)

        async def app_send(message: Message) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                self.responded = True
            await send(message)

        # A plain asyncio task, not an anyio task group: a task group costs ~75 µs a request
        # (measured), a tenth of REST's latency budget over stdio (1 ms). The HTTP server is
        # uvicorn's, so the loop is asyncio's.
        with receiver, anyio.CancelScope() as app_scope:
            pump = asyncio.get_running_loop().create_task(self._pump(receive, sender, app_scope))
            try:
                await self.app(scope, app_receive, app_send)
            finally:
                pump.cancel()

    async def _app_receive(self, receiver: MemoryObjectReceiveStream[Message]) -> Message:
        try:
            return await receiver.receive()
        except anyio.EndOfStream:  # the body was handed over whole, or the client left first
            await self.disconnected.wait()
            return DISCONNECT

    async def _pump(
        self,
        receive: Receive,
        sender: MemoryObjectSendStream[Message],
        app_scope: anyio.CancelScope,
    ) -> None:
        try:
            with sender:
                message = await receive()
                while message["type"] != "http.disconnect":
                    await sender.send(message)
                    if _is_last_body(message):
                        break
                    message = await receive()
            while message["type"] != "http.disconnect":
                message = await receive()
        finally:
            # A disconnect, or the server's receive failing (no body or disconnect will come):
            # either way the app has no one to answer.
            self.disconnected.set()
            if not self.responded:
                app_scope.cancel()
