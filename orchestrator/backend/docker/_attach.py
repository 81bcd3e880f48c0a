"""An attached exec stream over the engine's own socket, driven by anyio rather than a thread.

The REPL round trip is sub-millisecond; a thread hop per read would double it. So the exec is
created through the SDK (in a thread, like every other call) and started here: one HTTP request
upgraded to a raw stream, read and written asynchronously for the life of the exec.

Invariants: a stream is used by one reader at a time; frames are parsed with a bounded header and
never trust the engine's sizes beyond ``MAX_FRAME``; ``aclose`` is idempotent and never raises.

A stream that breaks is told apart by asking the engine: if it does not answer a ping, the engine
went away under the stream (dockerd stopped or restarted) and the caller gets
``BackendUnavailableError``, never a hang and never "the process ended", which would be a lie
while it may still run; if the engine answers, the exec's own end closed the stream, reported as
before (``receive`` gives None, ``send`` raises ``BrokenResourceError``) so callers replace what
they lost once the engine is back.
"""

from __future__ import annotations

import contextlib
import json
import logging
import struct

import anyio
import anyio.abc

from orchestrator.backend.docker._client import ENGINE_HINT
from orchestrator.backend.docker._endpoint import EngineEndpoint
from orchestrator.errors import BackendError, BackendUnavailableError

# The engine splits output into frames of at most 32 KiB; anything far larger is not the engine.
MAX_FRAME = 1024 * 1024
MAX_RESPONSE_HEADER = 16 * 1024
# Connecting and upgrading is local; a second means the engine is stuck, not slow.
CONNECT_TIMEOUT = 10.0
# A ping is the cheapest thing the engine answers (no locks); a live engine does in milliseconds,
# and this bounds how long a broken stream takes to be reported when the socket still accepts
# (socket activation holds it while dockerd is down).
PING_TIMEOUT = 5.0
_PING = b"GET /_ping HTTP/1.1\r\nHost: docker\r\nConnection: close\r\n\r\n"
_HEADER = struct.Struct(">BxxxL")

log = logging.getLogger(__name__)


async def engine_answers(endpoint: EngineEndpoint) -> bool:
    """Whether the engine answers a ping right now (an own connection, closed after)."""
    try:
        with anyio.fail_after(PING_TIMEOUT):
            sock = await endpoint.connect()
            async with sock:
                await sock.send(_PING)
                head = await sock.receive()
    except (
        BackendUnavailableError,
        OSError,
        TimeoutError,
        anyio.EndOfStream,
        anyio.BrokenResourceError,
    ) as exc:
        log.debug("the engine at %s does not answer a ping: %r", endpoint.url, exc)
        return False
    return head.split(b"\r\n", 1)[0].split(b" ")[1:2] == [b"200"]


class AttachedExec:
    """stdin in, ``(stream, bytes)`` out; with a TTY every chunk is reported as stdout."""

    def __init__(
        self, exec_id: str, sock: anyio.abc.ByteStream, *, tty: bool, endpoint: EngineEndpoint
    ) -> None:
        self.exec_id = exec_id
        self._sock = sock
        self._endpoint = endpoint
        self._tty = tty
        self._buffer = bytearray()
        self._closed = False

    @classmethod
    async def start(cls, endpoint: EngineEndpoint, exec_id: str, *, tty: bool) -> AttachedExec:
        sock = await endpoint.connect()
        try:
            body = json.dumps({"Detach": False, "Tty": tty}).encode()
            request = (
                f"POST /v{endpoint.api_version}/exec/{exec_id}/start HTTP/1.1\r\n"
                "Host: docker\r\nContent-Type: application/json\r\n"
                "Connection: Upgrade\r\nUpgrade: tcp\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            ).encode() + body
            with anyio.fail_after(CONNECT_TIMEOUT):
                await sock.send(request)
                stream = cls(exec_id, sock, tty=tty, endpoint=endpoint)
                await stream._read_response_head()
            return stream
        except (OSError, TimeoutError, anyio.EndOfStream, anyio.BrokenResourceError) as exc:
            await sock.aclose()
            raise BackendUnavailableError(
                f"the engine at {endpoint.url} did not start exec {exec_id[:12]}"
            ) from exc
        except BaseException:
            await sock.aclose()
            raise

    async def _read_response_head(self) -> None:
        while b"\r\n\r\n" not in self._buffer:
            if len(self._buffer) > MAX_RESPONSE_HEADER:
                raise BackendError("engine sent an oversized response header")
            self._buffer += await self._sock.receive()
        head, _, rest = bytes(self._buffer).partition(b"\r\n\r\n")
        status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or parts[1] not in ("101", "200"):
            raise BackendError(f"engine refused to start exec: {status_line} {rest[:200]!r}")
        self._buffer = bytearray(rest)

    async def send(self, data: bytes) -> None:
        try:
            await self._sock.send(data)
        except (OSError, anyio.BrokenResourceError) as exc:
            await self._fail_if_engine_gone(exc)
            raise

    async def send_eof(self) -> None:
        try:
            await self._sock.send_eof()
        except NotImplementedError:
            # anyio cannot half-close a TLS stream; the engine would need TLS close_notify
            # while the read side stays open.
            raise BackendUnavailableError(
                "closing an exec's stdin over a TLS connection to the engine is not supported yet",
                hint="reach the engine over unix:// (or tcp:// through a local TLS tunnel)",
            ) from None
        except (OSError, anyio.BrokenResourceError) as exc:
            await self._fail_if_engine_gone(exc)
            raise

    async def _fill(self, size: int) -> bool:
        while len(self._buffer) < size:
            try:
                chunk = await self._sock.receive()
            except anyio.ClosedResourceError:
                return False
            except (anyio.EndOfStream, anyio.BrokenResourceError, OSError) as exc:
                await self._fail_if_engine_gone(exc)
                return False
            self._buffer += chunk
        return True

    async def _fail_if_engine_gone(self, exc: BaseException) -> None:
        """The stream broke: raise if the engine went away, return if the exec itself ended."""
        if self._closed or await engine_answers(self._endpoint):
            return
        raise BackendUnavailableError(
            f"lost the Docker engine during exec {self.exec_id[:12]}: it does not answer",
            hint=ENGINE_HINT,
        ) from exc

    async def receive(self) -> tuple[int, bytes] | None:
        """The next chunk, or None once the exec's output has ended."""
        if self._tty:
            if not self._buffer and not await self._fill(1):
                return None
            data, self._buffer = bytes(self._buffer), bytearray()
            return 1, data
        if not await self._fill(_HEADER.size):
            return None
        stream, size = _HEADER.unpack_from(self._buffer)
        if size > MAX_FRAME or stream not in (0, 1, 2):
            raise BackendError(f"malformed stream frame (stream {stream}, {size} bytes)")
        if not await self._fill(_HEADER.size + size):
            return None
        data = bytes(self._buffer[_HEADER.size : _HEADER.size + size])
        del self._buffer[: _HEADER.size + size]
        return stream, data

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            with contextlib.suppress(OSError):
                await self._sock.aclose()
