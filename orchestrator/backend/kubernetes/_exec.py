"""An exec in a Pod through the API server's websocket channel protocol: one websocket per exec,
each binary message a channel byte and its bytes (0 stdin, 1 stdout, 2 stderr, 3 the exec's
final status, 4 a terminal resize; ``v5`` adds 255, which closes a channel: stdin's end).

``v5.channel.k8s.io`` is asked for first and ``v4.channel.k8s.io`` taken where it is all the
server offers (1.20 offers nothing newer); on ``v4`` the end of stdin is the relay's frame
(``_relay``), since the protocol cannot close stdin.

Invariants: ``receive`` has one reader at a time and gives None once the websocket has closed,
after the status (channel 3) has been read, so the exit code is known when the stream ends;
``aclose`` is idempotent and never raises. A websocket that breaks without a status is an exec
whose end we did not see: its exit code stays None, and the caller asks the Pod's state (the
backend's ``container_state``) to tell a removed Pod from a lost connection.
"""

from __future__ import annotations

import contextlib
import json
import logging
from typing import Any

import anyio
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from orchestrator.backend.kubernetes._relay import FRAME
from orchestrator.errors import BackendError, BackendUnavailableError, ContainerNotFoundError

__all__ = ["PROTOCOL_V4", "PROTOCOL_V5", "WebSocketExec", "exit_code_of", "refused_exec"]

PROTOCOL_V5 = "v5.channel.k8s.io"
PROTOCOL_V4 = "v4.channel.k8s.io"
STDIN, STDOUT, STDERR, STATUS, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255
# Opening an exec is the API server asking kubelet asking the runtime: ~70 ms here; past this
# one of them is stuck.
OPEN_TIMEOUT = 30.0
# The largest message taken from the server: kubelet sends output in chunks of a few KiB; a
# status is a few hundred bytes.
MAX_MESSAGE = 1024 * 1024
# Closing is a close frame each way; the server's answer is not worth waiting long for.
CLOSE_TIMEOUT = 2.0

log = logging.getLogger(__name__)
_GONE = ("not running", "completed pod", "container not found", "is not running")
_UNREACHABLE = "error dialing backend"


def exit_code_of(status: dict[str, Any]) -> int:
    """The exit code in an exec's final status (``metav1.Status``)."""
    if status.get("status") == "Success":
        return 0
    for cause in (status.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode":
            with contextlib.suppress(TypeError, ValueError):
                return int(cause.get("message"))
    # The runtime could not start the command at all (no such file, not executable).
    message = str(status.get("message", ""))
    return 127 if "not found" in message or "no such file" in message else 126


class WebSocketExec:
    """``ExecStream`` over one websocket; ``framed`` when stdin goes through the relay's frames
    (``v4``), so ``send_eof`` can end it."""

    def __init__(self, exec_id: str, ws: ClientConnection, *, framed: bool) -> None:
        self.exec_id = exec_id
        self._ws = ws
        self._framed = framed
        self._eof_sent = False
        self._closed = False
        self.exit_code: int | None = None
        self.ended = anyio.Event()

    @property
    def protocol(self) -> str | None:
        return self._ws.subprotocol

    async def send(self, data: bytes) -> None:
        if self._eof_sent or self._closed:
            raise anyio.ClosedResourceError
        if not data:
            return
        payload = FRAME.pack(len(data)) + data if self._framed else data
        try:
            await self._ws.send(bytes([STDIN]) + payload)
        except ConnectionClosed as exc:
            raise anyio.BrokenResourceError from exc

    async def send_eof(self) -> None:
        if self._eof_sent or self._closed:
            return
        self._eof_sent = True
        message = bytes([STDIN]) + FRAME.pack(0) if self._framed else bytes([CLOSE, STDIN])
        with contextlib.suppress(ConnectionClosed):
            await self._ws.send(message)

    async def resize(self, *, rows: int, cols: int) -> None:
        message = json.dumps({"Width": cols, "Height": rows}).encode()
        try:
            await self._ws.send(bytes([RESIZE]) + message)
        except ConnectionClosed as exc:
            raise BackendError("the exec has ended") from exc

    async def receive(self) -> tuple[int, bytes] | None:
        while not self._closed:
            try:
                message = await self._ws.recv()
            except ConnectionClosed:
                self._finish()
                return None
            if isinstance(message, str) or not message:
                continue  # a v4 server sends binary only; anything else is not ours to read
            channel, data = message[0], message[1:]
            if channel in (STDOUT, STDERR) and data:
                return channel, data
            if channel == STATUS and data:
                self._read_status(data)
        return None

    def _read_status(self, data: bytes) -> None:
        try:
            status = json.loads(data)
        except ValueError:
            log.warning("exec %s: a status that is not JSON", self.exec_id)
            return
        if isinstance(status, dict):
            self.exit_code = exit_code_of(status)

    def _finish(self) -> None:
        self.ended.set()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._finish()
        with anyio.move_on_after(CLOSE_TIMEOUT, shield=True), contextlib.suppress(Exception):
            await self._ws.close()


def refused_exec(status: int, body: bytes) -> BackendError:
    """The error for an exec's upgrade the API server refused with ``status`` and ``body`` (a
    ``Status`` in JSON, or kubelet's words in plain text)."""
    text = body.decode(errors="replace")[:300]
    if status == 404:
        return ContainerNotFoundError(f"no such Pod for an exec: {text}")
    if status in (401, 403):
        return BackendError(f"the API server refused the exec ({status}): {text}")
    # The Pod is there but its container is not (killed, ended): kubelet's words for it.
    if status in (400, 500) and any(words in text for words in _GONE):
        return ContainerNotFoundError(f"the Pod does not run: {text}")
    # The API server cannot reach the Pod's kubelet (the node is down or cut off): for now
    # unavailable; the backend asks whether the node is lost (then the session is).
    if status in (500, 502, 503) and _UNREACHABLE in text:
        return BackendUnavailableError(f"the Pod's node does not answer: {text}")
    return BackendError(f"the API server answered the exec with {status}: {text}")


async def open_websocket(
    url: str, *, ssl_context: Any, headers: dict[str, str]
) -> ClientConnection:
    """The exec's websocket, ``v5`` asked for first; the API server's refusals translated
    (404: the Pod is gone; a connection error: the API server does not answer)."""
    from websockets.asyncio.client import connect

    try:
        with anyio.fail_after(OPEN_TIMEOUT):
            return await connect(
                url,
                ssl=ssl_context,
                additional_headers=headers,
                subprotocols=[PROTOCOL_V5, PROTOCOL_V4],  # type: ignore[list-item]
                compression=None,
                proxy=None,
                max_size=MAX_MESSAGE,
                open_timeout=None,
                ping_interval=None,
                close_timeout=CLOSE_TIMEOUT,
            )
    except InvalidStatus as exc:
        body = bytes(exc.response.body or b"")
        raise refused_exec(exc.response.status_code, body) from None
    except TimeoutError:
        raise BackendUnavailableError(
            f"the API server did not open an exec within {OPEN_TIMEOUT:.0f} s"
        ) from None
    except (OSError, InvalidHandshake) as exc:
        raise BackendUnavailableError(f"the API server does not answer: {exc}") from None
